"""Load JSONL records into one pandas frame.

Every line is validated with `packedss.records.read_records`; a bad line is reported (file and
line number) and skipped, never dropped silently. Warm-up records (`warmup: true`) are excluded
and counted. Optional fields are given their defaults so that every frame has the same columns.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from packedss.records import RECORD_FIELDS, BadLine, read_records

log = logging.getLogger(__name__)

# Optional record fields and their values when a record does not carry them.
OPTIONAL_DEFAULTS = {
    "family": "ltr",
    "lossy": False,
    "lora": False,
    "warmup": False,
    "pad_verify": None,
    "lora_rows_selected": None,
    "lora_rows_evaluated": None,
    "call_model_s": None,
}

# Columns that identify one run (one configuration); a question's records within a run differ
# only in `repeat`.
RUN_KEYS = ("model", "task", "schedule", "width", "temperature", "verify", "order", "seed", "family", "lora", "pad_verify")


@dataclass
class Loaded:
    """The sound records of a set of files and what was left out."""

    frame: pd.DataFrame
    bad_lines: list[BadLine] = field(default_factory=list)
    warmup_skipped: int = 0
    duplicates_skipped: int = 0
    files: list[Path] = field(default_factory=list)

    def report(self) -> str:
        lines = [f"{len(self.frame)} records from {len(self.files)} files"]
        if self.warmup_skipped:
            lines.append(f"{self.warmup_skipped} warm-up records excluded")
        if self.duplicates_skipped:
            lines.append(f"{self.duplicates_skipped} duplicate records (same run, question, repeat) skipped")
        for bad in self.bad_lines:
            lines.append(f"bad line skipped: {bad}")
        return "\n".join(lines)


def find_record_files(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """JSONL files named directly, or found recursively under the given directories (sorted)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*.jsonl") if p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"no such records file or directory: {path}")
    return files


def _normalise(frame: pd.DataFrame) -> pd.DataFrame:
    for name, default in OPTIONAL_DEFAULTS.items():
        if name not in frame:
            frame[name] = [default] * len(frame)
        elif default is not None:
            frame[name] = frame[name].where(frame[name].notna(), default)
    frame["lora"] = frame["lora"].astype(bool)
    frame["lossy"] = frame["lossy"].astype(bool)
    frame["width"] = frame["width"].astype(int)
    frame["temperature"] = frame["temperature"].astype(float)
    frame["seed"] = frame["seed"].astype(int)
    frame["repeat"] = frame["repeat"].astype(int)
    frame["question_id"] = frame["question_id"].astype(str)
    # verify only matters when T > 0, order only for the any-order family: keep them as strings
    # ("" when absent) so that they group cleanly.
    frame["verify"] = np.where(frame["temperature"] > 0, frame["verify"].fillna("").astype(str), "")
    frame["order"] = frame["order"].fillna("").astype(str)
    # pad_verify only changes Packed-SS: "true" / "false" there, "" for every other schedule.
    padded = frame["pad_verify"].map(lambda v: "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(bool(v)).lower())
    frame["pad_verify"] = padded.where(frame["schedule"] == "packed", "")
    for name in ("output_tokens", "nfe_total", "nfe_prefill", "iterations"):
        frame[name] = frame[name].astype(int)
    for name in ("wall_s", "model_s", "nonmodel_s"):
        frame[name] = frame[name].astype(float)
    # correct: True/False, or None for speed-only tasks -> float 1/0/NaN
    frame["correct_f"] = frame["correct"].map(lambda v: np.nan if v is None else float(bool(v))).astype(float)
    return frame


def empty_frame() -> pd.DataFrame:
    columns = list(RECORD_FIELDS) + list(OPTIONAL_DEFAULTS) + ["source", "correct_f"]
    return pd.DataFrame({name: pd.Series(dtype=object) for name in columns})


def load_records(paths: str | Path | Iterable[str | Path]) -> Loaded:
    """All sound, non-warm-up records of the given files/directories in one frame."""
    files = find_record_files(paths)
    rows: list[dict] = []
    bad: list[BadLine] = []
    warmup = 0
    for path in files:
        records, file_bad = read_records(path)
        bad.extend(file_bad)
        for bad_line in file_bad:
            log.warning("bad record line skipped: %s", bad_line)
        for record in records:
            if record.get("warmup"):
                warmup += 1
                continue
            rows.append(record | {"source": str(path)})
    if not rows:
        return Loaded(empty_frame(), bad, warmup, 0, files)
    frame = _normalise(pd.DataFrame(rows))
    keys = list(RUN_KEYS) + ["question_id", "repeat"]
    duplicated = frame.duplicated(subset=keys, keep="first")
    for _, row in frame[duplicated].iterrows():
        log.warning("duplicate record skipped: %s (question %s, repeat %s)", row["source"], row["question_id"], row["repeat"])
    frame = frame[~duplicated].reset_index(drop=True)
    return Loaded(frame, bad, warmup, int(duplicated.sum()), files)
