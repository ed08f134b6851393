"""Load JSONL records into one pandas frame.

Every line is validated with `packedss.records.read_records`; a bad line is reported (file and
line number, in `packedss.records.bad_line_warning`'s words) and skipped, never dropped silently. Warm-up records (`warmup: true`) are excluded
and counted. Optional fields are given their defaults so that every frame has the same columns.

A second record of the same run, question, sample and repeat is a duplicate: the first one read
is kept. A lossy schedule (native decoding) does not verify, so it has no verification order:
its runs under several orders decode the same responses, and only the run of the family's first
order present is kept (the others are counted, not silently merged), so that no comparison
counts a question-sample twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from packedss.families import FAMILIES
from packedss.job import IDENTITY_FIELDS
from packedss.records import RECORD_FIELDS, BadLine, bad_line_warning, read_records

log = logging.getLogger(__name__)

# Optional record fields and their values when a record does not carry them.
OPTIONAL_DEFAULTS = {
    "sample": 0,
    "task_config": None,
    "lossy": False,
    "lora": False,
    "warmup": False,
    "pad_verify": None,
    "lora_rows_selected": None,
    "lora_rows_evaluated": None,
    "call_model_s": None,
    "native_window": None,
    "concurrency": 1,
    "sampler": None,
    "max_ngram": None,
}

# The identity fields that the tables key and label rows by; a question's records within a run
# differ only in `sample` and `repeat`.
TABLE_KEYS = ("model", "task", "schedule", "width", "temperature", "verify", "order", "seed", "family", "lora",
              "pad_verify", "native_window", "max_ngram", "concurrency")  # fmt: skip
# Every other field of the job's identity (packedss.job: checkpoint, dtype, compile mode, output
# cap, ...) is summed up in the `config` column: "" where it takes one value for every run of the
# folder with the same TABLE_KEYS, else the `field=value` pairs of the fields that differ (a
# table shows it as a column then), and `cost_model` whenever a cost twin timed a run. So runs
# that differ in anything are separate rows, and a comparison pairs only runs of one config.
CONFIG_FIELDS = tuple(name for name in IDENTITY_FIELDS if name not in TABLE_KEYS + ("block", "lossy"))
RUN_KEYS = TABLE_KEYS + ("config",)


@dataclass
class Loaded:
    """The sound records of a set of files and what was left out."""

    frame: pd.DataFrame
    bad_lines: list[BadLine] = field(default_factory=list)
    warmup_skipped: int = 0
    duplicates_skipped: int = 0
    unverified_orders_skipped: int = 0
    files: list[Path] = field(default_factory=list)

    def report(self) -> str:
        return "\n".join(self.summary() + self.warnings())

    def warnings(self) -> list[str]:
        """One line per bad line, worded as every reader of record files words it."""
        return [bad_line_warning(bad) for bad in self.bad_lines]

    def summary(self) -> list[str]:
        """The records read, and those left out (warm-up, duplicates, second orders)."""
        lines = [f"{len(self.frame)} records from {len(self.files)} files"]
        if self.warmup_skipped:
            lines.append(f"{self.warmup_skipped} warm-up records excluded")
        if self.duplicates_skipped:
            lines.append(f"{self.duplicates_skipped} duplicate records (same run, question, sample, repeat) skipped")
        if self.unverified_orders_skipped:
            lines.append(
                f"{self.unverified_orders_skipped} records of a lossy schedule (native) under a second verification "
                "order skipped: it has no order, one run per setting is kept"
            )
        return lines


def find_record_files(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """JSONL files named directly, or found recursively under the given directories (sorted); a
    file reached through two of the given paths is read once."""
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
    first_of: dict[Path, Path] = {}
    for file in files:
        first_of.setdefault(file.resolve(), file)
    return list(first_of.values())


def normalise(frame: pd.DataFrame) -> pd.DataFrame:
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
    frame["concurrency"] = frame["concurrency"].astype(int)
    frame["sample"] = frame["sample"].astype(int)
    frame["repeat"] = frame["repeat"].astype(int)
    frame["question_id"] = frame["question_id"].astype(str)
    # verify only matters when T > 0, order only for families with orders: keep them as strings
    # ("" when absent) so that they group cleanly.
    frame["verify"] = np.where(frame["temperature"] > 0, frame["verify"].fillna("").astype(str), "")
    frame["order"] = frame["order"].fillna("").astype(str)
    # pad_verify: "true" / "false" where the schedule reads it (the spec records None elsewhere).
    frame["pad_verify"] = frame["pad_verify"].map(lambda v: "" if _absent(v) else str(bool(v)).lower())
    frame["native_window"] = frame["native_window"].map(lambda v: 0 if _absent(v) else int(v)).astype(int)
    frame["max_ngram"] = frame["max_ngram"].map(lambda v: 0 if _absent(v) else int(v)).astype(int)  # pld's n; 0 elsewhere
    frame["sampler"] = frame["sampler"].map(lambda v: None if _absent(v) else str(v))
    frame["config"] = _config_labels(frame)
    for name in ("output_tokens", "nfe_total", "nfe_prefill", "iterations"):
        frame[name] = frame[name].astype(int)
    for name in ("wall_s", "model_s", "nonmodel_s"):
        frame[name] = frame[name].astype(float)
    # correct: True/False, or None for speed-only tasks -> float 1/0/NaN
    frame["correct_f"] = frame["correct"].map(lambda v: np.nan if v is None else float(bool(v))).astype(float)
    return frame


def _absent(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def _canonical(value) -> str:
    """A value as the config column shows it: its JSON, or a short digest of a long one (a task config)."""
    if isinstance(value, str):
        return value
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 48 else "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:8]


def _config_labels(frame: pd.DataFrame) -> pd.Series:
    """The `config` column: the CONFIG_FIELDS that differ between runs of equal TABLE_KEYS, as
    `field=value` pairs (a field a record lacks reads as null)."""
    values = pd.DataFrame(
        {name: frame[name].map(_canonical) if name in frame else "null" for name in CONFIG_FIELDS}, index=frame.index
    )
    keyed = values.join(frame[list(TABLE_KEYS)].astype(str))
    differing = [name for name in CONFIG_FIELDS if (keyed.groupby(list(TABLE_KEYS))[name].nunique() > 1).any()]
    if "cost_model" not in differing and (values["cost_model"] != "null").any():
        differing.append("cost_model")  # a twin's time is never the model's own: always named
    if not differing:
        return pd.Series("", index=frame.index)
    return values[differing].apply(lambda row: ", ".join(f"{name}={row[name]}" for name in differing), axis=1)


def empty_frame() -> pd.DataFrame:
    columns = list(RECORD_FIELDS) + list(OPTIONAL_DEFAULTS) + ["source", "correct_f", "config"]
    return pd.DataFrame({name: pd.Series(dtype=object) for name in columns})


def load_records(paths: str | Path | Iterable[str | Path]) -> Loaded:
    """All sound, non-warm-up records of the given files/directories in one frame."""
    files = find_record_files(paths)
    rows: list[dict] = []
    bad: list[BadLine] = []
    warmup = 0
    for path in files:
        records, file_bad = read_records(path)
        bad.extend(file_bad)  # reported by the caller (Loaded.report), not logged: printed once
        for record in records:
            if record.get("warmup"):
                warmup += 1
                continue
            rows.append(record | {"source": str(path)})
    if not rows:
        return Loaded(empty_frame(), bad, warmup, files=files)
    frame = normalise(pd.DataFrame(rows))
    keys = list(RUN_KEYS) + ["question_id", "sample", "repeat"]
    duplicated = frame.duplicated(subset=keys, keep="first")
    for _, row in frame[duplicated].iterrows():
        log.warning("duplicate record skipped: %s (question %s, sample %s, repeat %s)", row["source"], row["question_id"], row["sample"], row["repeat"])
    frame = frame[~duplicated].reset_index(drop=True)
    second_order = _unverified_second_orders(frame)
    for _, row in frame[second_order].iterrows():
        log.warning("native record under a second order skipped: %s (order %s)", row["source"], row["order"])
    frame = frame[~second_order].reset_index(drop=True)
    return Loaded(frame, bad, warmup, int(duplicated.sum()), int(second_order.sum()), files)


def _order_rank(family: str, order: str) -> int:
    orders = FAMILIES[family].orders if family in FAMILIES else ()
    return orders.index(order) if order in orders else len(orders)


def _unverified_second_orders(frame: pd.DataFrame) -> pd.Series:
    """Records of a lossy schedule whose run (everything but the order) also ran under an
    earlier order of its family: True for the records to leave out."""
    lossy = frame[frame["lossy"]]
    drop = pd.Series(False, index=frame.index)
    if lossy.empty:
        return drop
    setting = [k for k in RUN_KEYS if k != "order"]
    for _, run in lossy.groupby(setting, sort=False, dropna=False):
        orders = sorted(run["order"].unique(), key=lambda o: (_order_rank(run["family"].iloc[0], o), o))
        drop[run.index[run["order"] != orders[0]]] = True
    return drop
