"""JSONL records: one line per (question, configuration, repeat), appended, flushed and fsynced
as soon as the question finishes. Resume skips recorded (question_id, repeat) pairs of the same
config hash; a torn last line (a crash mid-write) is detected and cut off; an exclusive lock
keeps two jobs from writing the same file."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packedss.errors import PackedSSError

IDENTITY_FIELDS = (
    "model", "task", "schedule", "width", "block", "temperature", "verify", "order", "seed", "repeat",
    "config_hash", "code_version", "device", "dtype", "versions", "question_id",
)  # fmt: skip
OUTPUT_FIELDS = ("prompt_tokens", "output_tokens", "output_text", "finish_reason", "output_hash")
COST_FIELDS = (
    "nfe_total", "nfe_prefill", "iterations", "accepted", "rows_evaluated", "rows_useful",
    "draft_proposed", "draft_accepted", "truncated_tokens",
)  # fmt: skip
TIME_FIELDS = ("wall_s", "model_s", "nonmodel_s")
SCORE_FIELDS = ("extracted_answer", "correct", "grader")
RECORD_FIELDS = IDENTITY_FIELDS + OUTPUT_FIELDS + COST_FIELDS + TIME_FIELDS + SCORE_FIELDS
FINISH_REASONS = ("eos", "max_tokens", "stop")


def record_path(out_dir, model, task, schedule, width, temperature, verify, order, seed) -> Path:
    """<out_dir>/<model>/<task>/<schedule>-W<width>-T<temperature>[-<verify>][-<order>]-s<seed>.jsonl
    (verify only when T > 0, order only for the any-order family)."""
    name = f"{schedule}-W{width}-T{temperature:g}"
    if temperature > 0:
        name += f"-{verify}"
    if order:
        name += f"-{order}"
    return Path(out_dir) / model / task / f"{name}-s{seed}.jsonl"


def config_hash(identity: dict) -> str:
    """A short, stable hash of everything that determines a job's outputs."""
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def output_hash(token_ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(token_ids, separators=(",", ":")).encode()).hexdigest()


def validate_record(record: dict) -> list[str]:
    """Problems with a record's schema and its identities (empty when it is sound)."""
    problems = [f"missing field {name!r}" for name in RECORD_FIELDS if name not in record]
    if problems:
        return problems
    if record["finish_reason"] not in FINISH_REASONS:
        problems.append(f"finish_reason {record['finish_reason']!r} not in {FINISH_REASONS}")
    if len(record["rows_evaluated"]) != record["nfe_total"]:
        problems.append("len(rows_evaluated) != nfe_total")
    if len(record["rows_useful"]) != record["nfe_total"]:
        problems.append("len(rows_useful) != nfe_total")
    if record.get("family", "ltr") == "ltr":
        if 1 + sum(record["accepted"]) - record["truncated_tokens"] != record["output_tokens"]:
            problems.append("1 + sum(accepted) - truncated_tokens != output_tokens")
        calls_per_iteration = 2 if record["schedule"] == "linear" else 1
        if record["nfe_total"] != record["nfe_prefill"] + calls_per_iteration * record["iterations"]:
            problems.append("nfe_total != nfe_prefill + calls after prefill")
    if abs(record["wall_s"] - record["model_s"] - record["nonmodel_s"]) > 1e-6:
        problems.append("nonmodel_s != wall_s - model_s")
    return problems


@dataclass(frozen=True)
class BadLine:
    path: Path
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


def iter_lines(path: Path) -> Iterator[tuple[int, dict | None, str]]:
    """(line number, parsed record or None, error) for each non-empty line."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                yield number, None, f"not JSON ({err.msg})"
                continue
            if not isinstance(value, dict):
                yield number, None, "not a JSON object"
                continue
            yield number, value, ""


def read_records(path: str | Path, validate: bool = True) -> tuple[list[dict], list[BadLine]]:
    """All sound records of a file, and the lines that are not (reported, never silently dropped)."""
    path = Path(path)
    records, bad = [], []
    for number, record, error in iter_lines(path):
        if record is None:
            bad.append(BadLine(path, number, error))
            continue
        problems = validate_record(record) if validate else []
        if problems:
            bad.append(BadLine(path, number, "; ".join(problems)))
            continue
        records.append(record)
    return records, bad


def repair_torn_tail(path: str | Path) -> int:
    """Cut a torn last line (no trailing newline, or not parseable JSON) left by a crash mid-write.
    Returns the number of bytes removed."""
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    if not data:
        return 0
    keep = len(data)
    if not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
    else:
        start = data.rfind(b"\n", 0, len(data) - 1) + 1
        try:
            json.loads(data[start:])
        except (json.JSONDecodeError, UnicodeDecodeError):
            keep = start
    if keep == len(data):
        return 0
    with open(path, "r+b") as handle:
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
    return len(data) - keep


class RecordWriter:
    """Appends records to one file under an exclusive lock (a second job on the same file fails)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.path, "a+b")  # noqa: SIM115 - held for the writer's lifetime
        try:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._handle.close()
            raise PackedSSError(
                f"another job is writing {self.path}; wait for it to finish or choose another out_dir"
            ) from None
        self.repaired_bytes = repair_torn_tail(self.path)

    def done_keys(self, config_hash_value: str) -> set[tuple[str, int]]:
        """(question_id, repeat) pairs already recorded under this config hash."""
        records, _ = read_records(self.path, validate=False)
        return {(r["question_id"], r["repeat"]) for r in records if r.get("config_hash") == config_hash_value}

    def append(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        self._handle.write(line.encode("utf-8"))
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        if not self._handle.closed:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
