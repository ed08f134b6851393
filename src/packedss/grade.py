"""Re-grade existing records in place: ``python -m packedss.grade RECORDS [more ...]``, each a
records file or a folder of them (read recursively).

Each record carries the task config it was produced with (`task_config`) and the data directory
its questions came from (`data_dir`; null: the hub or a packaged copy), so re-grading works
offline without flags; ``--data-dir DIR`` reads every task's data from DIR instead. Its score
fields ``extracted_answer``, ``correct`` and ``grader`` are rewritten by that task's grader. Every
task is loaded before the first file is touched: a data error changes no file. A file is
rewritten through `packedss.records.rewrite_records`: atomically, under the writers' lock (a
file that a running job holds is refused), every other line kept byte for byte. Lines that are
not gradable records are kept and named in one warning each, worded as the analysis and run.py's
resume word a bad record line (`packedss.records.bad_line_warning`). A code program that times
out runs once more, alone, before its verdict counts (docs/sandbox.md §8); the summary line
counts those second attempts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

from packedss.errors import ArgumentParser, PackedSSError, run_cli, run_reporting
from packedss.records import BadLine, bad_line_warning, iter_lines, rewrite_records
from packedss.tasks import DataUnavailable, config_from_dict, load_task

#: (task config, data directory) -> (task, its questions by id)
Tasks = dict[tuple[str, Optional[str]], tuple]


def record_files(names: list[str]) -> list[Path]:
    """The records files named, and those under the folders named (sorted), each once."""
    files: list[Path] = []
    for name in names:
        path = Path(name)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
            if not found:
                raise PackedSSError(f"{name}: no records files (*.jsonl) under this folder; name records files or their folder")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise PackedSSError(f"{name}: no such file or folder; name records files (JSON lines) or their folder")
    return list(dict.fromkeys(files))


def gradable(record: dict) -> Optional[str]:
    """Why a JSON object cannot be re-graded; None when it can."""
    if not all(key in record for key in ("question_id", "output_text")):
        return "not a record with question_id and output_text"
    if "task_config" not in record:
        return "the record has no task_config (written by an older version); rerun its job"
    return None


def task_for(record: dict, data_dir: Optional[str], tasks: Tasks) -> tuple:
    """The record's task and its questions by id, loaded once per (task config, data directory)."""
    source = data_dir if data_dir is not None else record.get("data_dir")
    key = (json.dumps(record["task_config"], sort_keys=True), source)
    if key not in tasks:
        try:
            task = load_task(config_from_dict(record["task_config"]), source)
            tasks[key] = (task, {q.question_id: q for q in task.questions()})
        except DataUnavailable as err:
            raise PackedSSError(err.message("--data-dir DIR")) from None
    return tasks[key]


def load_tasks(path: Path, data_dir: Optional[str], tasks: Tasks) -> None:
    """Load the tasks of every gradable record of a file into `tasks` (reads, writes nothing).
    A file with lines but not one gradable record is not a records file: refused."""
    first_bad, any_record = None, False
    for number, record, error in iter_lines(path):
        reason = error or gradable(record)
        if not reason:
            task_for(record, data_dir, tasks)
            any_record = True
        elif first_bad is None:
            first_bad = f"line {number}: {reason}"
    if first_bad is not None and not any_record:
        raise PackedSSError(f"{path} is not a records file ({first_bad}, and no line is a record); "
                            "name records files written by run.py (JSON lines) or their folder")  # fmt: skip


#: what grade does with a line it cannot re-grade
KEPT_UNCHANGED = "kept unchanged, not re-graded"


def regrade_file(path: str | Path, data_dir: Optional[str] = None, workers: Optional[int] = None, log=print,
                 tasks: Optional[Tasks] = None) -> dict:  # fmt: skip
    """Re-grade one records file in place. Returns counts (graded, correct, scored, skipped, and
    retried/retried_passed: programs that timed out and ran again alone, and those then passed)."""
    counts = {"graded": 0, "correct": 0, "scored": 0, "skipped": 0, "retried": 0, "retried_passed": 0}
    tasks = {} if tasks is None else tasks

    def skip(number: int, reason: str) -> None:
        log(bad_line_warning(BadLine(Path(path), number, reason), KEPT_UNCHANGED), file=sys.stderr)
        counts["skipped"] += 1

    def update(lines: list[tuple[int, dict | None, str]]) -> dict[int, dict]:
        groups: dict[int, tuple] = {}  # id(task) -> (task, questions by id, [(line number, record)])
        for number, record, error in lines:
            reason = error or gradable(record)
            if reason:
                skip(number, reason)
                continue
            task, by_id = task_for(record, data_dir, tasks)
            groups.setdefault(id(task), (task, by_id, []))[2].append((number, record))
        replaced = {}
        for task, by_id, members in groups.values():
            pending = []
            for number, record in members:
                question = by_id.get(str(record["question_id"]))
                if question is None:
                    skip(number, f"question {record['question_id']!r} is not in task {task.name}")
                else:
                    pending.append((number, record, question))
            grades = task.grade_many([(q, r["output_text"] or "") for _, r, q in pending], workers=workers)
            for (number, record, _), grade in zip(pending, grades):
                replaced[number] = {**record, **grade.record_fields(task.cfg.grader)}
                add_grade(counts, grade)
        return replaced

    rewrite_records(path, update)
    return counts


def add_grade(counts: dict, grade) -> None:
    """One re-graded record in a file's counts."""
    counts["graded"] += 1
    counts["correct"] += bool(grade.correct)
    counts["scored"] += grade.correct is not None
    if grade.attempts and len(grade.attempts) > 1:
        counts["retried"] += 1
        counts["retried_passed"] += bool(grade.correct)


def summary(path: Path, counts: dict) -> str:
    """The line `grade` prints for a file."""
    accuracy = f", {counts['correct']}/{counts['scored']} correct" if counts["scored"] else ""
    if counts["retried"]:
        accuracy += (f" ({counts['retried']} timed out and ran again alone, {counts['retried_passed']} of them "
                     "then passed)")  # fmt: skip
    return f"{path}: re-graded {counts['graded']} records{accuracy}; {counts['skipped']} lines kept unchanged"


def main(argv: Optional[list[str]] = None) -> int:
    parser = ArgumentParser(prog="python -m packedss.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="records files (JSON lines) or folders of them")
    parser.add_argument("--data-dir", default=None,
                        help="local data directory (formats: docs/data.md); default: each record's data_dir")  # fmt: skip
    parser.add_argument("--workers", type=int, default=None, help="parallel sandboxes for code tasks (default: CPUs)")
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        parser.error(f"invalid --workers {args.workers}: must be >= 1")
    return run_reporting(lambda: regrade(args.files, args.data_dir, args.workers))


def regrade(names: list[str], data_dir: Optional[str], workers: Optional[int]) -> int:
    files = record_files(names)
    tasks: Tasks = {}
    for path in files:
        load_tasks(path, data_dir, tasks)
    for path in files:
        print(summary(path, regrade_file(path, data_dir=data_dir, workers=workers, tasks=tasks)))
    return 0


if __name__ == "__main__":
    run_cli(main)
