"""JSONL records (docs/records.md): one line per response (question, sample, repeat) of one
configuration, appended, flushed and fsynced as soon as the response finishes. Resume skips the
(question_id, sample, repeat) keys of the sound records of the same config hash (the file's path
and the hash come from the job's identity, packedss.job); a torn last line (a crash mid-write) is
detected and cut off; any other bad line is kept, named in one warning and not counted as done;
an exclusive lock keeps two writers off one file. This module
is the only reader and writer of record files: regrading rewrites them through `rewrite_records`."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from packedss.errors import PackedSSError
from packedss.families import FAMILIES
from packedss.job import REQUIRED_IDENTITY_FIELDS as JOB_IDENTITY_FIELDS
from packedss.preemption import slurm_attempt

# The job's identity (packedss.job), how it was run, and which response of the job a record is.
IDENTITY_FIELDS = JOB_IDENTITY_FIELDS + ("config_hash", "code_version", "versions", "question_id", "sample", "repeat")
OUTPUT_FIELDS = ("prompt_tokens", "output_tokens", "output_text", "finish_reason", "output_hash")
COST_FIELDS = (
    "nfe_total", "nfe_prefill", "iterations", "accepted", "rows_evaluated", "rows_useful",
    "draft_proposed", "draft_accepted", "truncated_tokens",
)  # fmt: skip
TIME_FIELDS = ("wall_s", "model_s", "nonmodel_s")
SCORE_FIELDS = ("extracted_answer", "correct", "grader")
RECORD_FIELDS = IDENTITY_FIELDS + OUTPUT_FIELDS + COST_FIELDS + TIME_FIELDS + SCORE_FIELDS
FINISH_REASONS = ("eos", "max_tokens", "stop")


def output_hash(token_ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(token_ids, separators=(",", ":")).encode()).hexdigest()


def encode_record(record: dict) -> bytes:
    """One record as its JSONL line (the one JSON style of every record file)."""
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def validate_record(record: dict) -> list[str]:
    """Problems with a record's schema and its identities (empty when it is sound)."""
    missing = [repr(name) for name in RECORD_FIELDS if name not in record]
    if missing:  # a junk line lacks most of them: name the first few
        named = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        return [f"missing field{'s' if len(missing) > 1 else ''} {named}"]
    problems = []
    if record["finish_reason"] not in FINISH_REASONS:
        problems.append(f"finish_reason {record['finish_reason']!r} not in {FINISH_REASONS}")
    if len(record["rows_evaluated"]) != record["nfe_total"]:
        problems.append("len(rows_evaluated) != nfe_total")
    if len(record["rows_useful"]) != record["nfe_total"]:
        problems.append("len(rows_useful) != nfe_total")
    family = FAMILIES.get(record["family"])
    if family is None:
        return problems + [f"unknown family {record['family']!r} (known: {', '.join(FAMILIES)})"]
    # The prefill call emits one token, or (any-order families) the `resolved` count of its call.
    prefill_tokens = record["resolved"][0] if "resolved" in record else 1
    if prefill_tokens + sum(record["accepted"]) - record["truncated_tokens"] != record["output_tokens"]:
        problems.append("prefill tokens + sum(accepted) - truncated_tokens != output_tokens")
    calls_per_iteration = family.calls_per_iteration.get(record["schedule"])
    if calls_per_iteration is None:
        problems.append(f"schedule {record['schedule']!r} is not one of the {family.name} family's")
    elif record["nfe_total"] != record["nfe_prefill"] + calls_per_iteration * record["iterations"]:
        problems.append("nfe_total != nfe_prefill + calls after prefill")
    if abs(record["wall_s"] - record["model_s"] - record["nonmodel_s"]) > 1e-6:
        problems.append("nonmodel_s != wall_s - model_s")
    if "drafted" in record:  # per-iteration draft counts (records written before them have none)
        problems += _draft_count_problems(record)
    return problems


def _draft_count_problems(record: dict) -> list[str]:
    drafted, accepted = record["drafted"], record.get("accepted_drafts")
    if accepted is None or not len(drafted) == len(accepted) == record["iterations"]:
        return ["len(drafted) and len(accepted_drafts) must equal iterations"]
    problems = []
    if sum(drafted) != record["draft_proposed"] or sum(accepted) != record["draft_accepted"]:
        problems.append("sum(drafted) != draft_proposed or sum(accepted_drafts) != draft_accepted")
    if any(not 0 <= a <= d or a > e for d, a, e in zip(drafted, accepted, record["accepted"])):
        problems.append("an iteration with accepted_drafts outside 0..drafted or above its emitted tokens")
    return problems


@dataclass(frozen=True)
class BadLine:
    path: Path
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


#: what run.py's resume does with a bad line (docs/records.md §4)
RESUME_KEEPS_IT = ("kept as it is and not counted as recorded: a response of this job that it held is decoded "
                   "again and appended")  # fmt: skip


def bad_line_warning(bad: BadLine, outcome: str = "") -> str:
    """The one wording of a line that is not a sound record, for every command that reads record
    files (run.py's resume, grade, the analysis): the file, the line, why, and what the command
    does about it."""
    return f"warning: bad record line skipped: {bad}" + (f"; {outcome}" if outcome else "")


def parse_line(raw: bytes) -> tuple[dict | None, str]:
    """A line's JSON object, or None and why it is not one."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 text (byte {err.start + 1})"
    except json.JSONDecodeError as err:
        return None, f"not JSON ({err.msg})"
    if not isinstance(value, dict):
        return None, "not a JSON object"
    return value, ""


def iter_lines(path: Path) -> Iterator[tuple[int, dict | None, str]]:
    """(line number, parsed record or None, error) for each non-empty line."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                yield number, *parse_line(raw)


def read_records(path: str | Path, validate: bool = True) -> tuple[list[dict], list[BadLine]]:
    """All sound records of a file, and the lines that are not (reported, never silently dropped)."""
    path = Path(path)
    records, bad = [], []
    for number, record, error in iter_lines(path):
        problems = [error] if record is None else validate_record(record) if validate else []
        if problems:
            bad.append(BadLine(path, number, "; ".join(problems)))
        else:
            records.append(record)
    return records, bad


@dataclass(frozen=True)
class Resume:
    """What a job's file already holds: the keys of its sound records of the job, and its bad lines."""

    done: set[tuple[str, int, int]]
    bad_lines: list[BadLine]
    prompt_tokens: dict[str, int]  # question_id -> the prompt length its records were decoded from

    def warnings(self) -> list[str]:
        return [bad_line_warning(bad, RESUME_KEEPS_IT) for bad in self.bad_lines]

    def check_prompts(self, path: Path, prompt_tokens: dict[str, int]) -> None:
        """The records were decoded from the prompts the job builds now (question_id -> length): a
        prompt of another length (another template, tokenizer or cut to the context) would append
        responses to other inputs under the same identity."""
        for question_id, recorded in self.prompt_tokens.items():
            built = prompt_tokens.get(question_id, recorded)
            if built != recorded:
                raise PackedSSError(
                    f"{path} holds {question_id} decoded from a prompt of {recorded} tokens, but this job builds it "
                    f"with {built}; move the file away or choose another out_dir to decode them afresh"
                )


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
    """Appends records to one file under an exclusive lock (a second job on the same file fails).
    Under SLURM each record also gets a `slurm` field: the job and the run of it (restart count)
    that wrote it, so that a requeued job's records say which part ran in which attempt."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.attempt = slurm_attempt()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._created = not self.path.exists()  # removed again on close if it stays empty
            self._handle = open(self.path, "a+b")  # noqa: SIM115 - held for the writer's lifetime
        except OSError as err:
            raise PackedSSError(
                f"cannot create the record file {self.path} ({err.strerror}); choose a writable out_dir"
            ) from None
        try:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._handle.close()
            raise PackedSSError(
                f"another job is writing {self.path}; wait for it to finish or choose another out_dir"
            ) from None
        self.repaired_bytes = repair_torn_tail(self.path)
        self._named: set[int] = set()  # the bad lines' numbers a resume returned

    def resume(self, config_hash_value: str) -> Resume:
        """The (question_id, sample, repeat) keys of the file's sound records under this config
        hash, and the lines that are not sound records (not counted as done: docs/records.md §4)
        that no earlier resume of this writer returned."""
        records, bad = read_records(self.path)
        own = [r for r in records if r.get("config_hash") == config_hash_value]
        done = {(r["question_id"], r.get("sample", 0), r["repeat"]) for r in own}
        unnamed = [line for line in bad if line.line not in self._named]  # a job's later pass names none again
        self._named.update(line.line for line in unnamed)
        return Resume(done, unnamed, {r["question_id"]: r["prompt_tokens"] for r in own})

    def append(self, record: dict) -> None:
        """Append one whole record; when a write fails (a full disk) the partial line is cut off."""
        fd = self._handle.fileno()
        end = os.fstat(fd).st_size
        data = memoryview(encode_record(record if self.attempt is None else {**record, "slurm": self.attempt}))
        try:
            while data:  # unbuffered: nothing of a failed write is left to be flushed later
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        except OSError as err:
            os.ftruncate(fd, end)
            raise PackedSSError(
                f"cannot write a record to {self.path} ({err.strerror}); free space on its disk or choose another "
                "out_dir, then rerun the same command to resume"
            ) from None

    def close(self) -> None:
        if not self._handle.closed:
            if self._created and os.fstat(self._handle.fileno()).st_size == 0:
                self.path.unlink(missing_ok=True)
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def rewrite_records(path: str | Path, update: Callable[[list[tuple[int, dict | None, str]]], dict[int, dict]]) -> int:
    """Rewrite some records of a file in place, atomically, under the writers' lock.

    `update` gets (line number, record, error) for every non-empty line (record None: the line is
    not a JSON object, and `error` says why, as `parse_line` words it) and returns the replacement
    records by line number; every other line is kept byte for byte. The new file is
    written beside the old one, fsynced and renamed over it: a crash leaves the old file intact.
    A file that a running job holds is refused. Returns the number of lines replaced."""
    path = Path(path)
    with open(path, "rb") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PackedSSError(f"{path}: a running job is writing this file; try again when the job is done") from None
        lines = handle.readlines()
        parsed = [(number, *parse_line(line)) for number, line in enumerate(lines, start=1) if line.strip()]
        replaced = update(parsed)
        for number, record in replaced.items():
            lines[number - 1] = encode_record(record)
        _replace_file(path, lines)
    return len(replaced)


def _replace_file(path: Path, lines: list[bytes]) -> None:
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.writelines(lines)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, os.stat(path).st_mode & 0o7777)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
