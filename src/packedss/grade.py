"""Re-grade existing records in place: ``python -m packedss.grade RECORDS.jsonl [more ...]``.

Each record carries the task config it was produced with (`task_config`); its score fields
``extracted_answer``, ``correct`` and ``grader`` are rewritten by that task's grader. The file is
rewritten through `packedss.records.rewrite_records`: atomically, under the writers' lock (a file
that a running job holds is refused), every other line kept byte for byte. Lines that are not
gradable records are reported as FILE:LINE and kept.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from packedss.errors import PackedSSError
from packedss.records import rewrite_records
from packedss.tasks import config_from_dict, load_task


def regrade_file(path: str | Path, data_dir: Optional[str] = None, workers: Optional[int] = None, log=print) -> dict:
    """Re-grade one records file in place. Returns counts (graded, correct, scored, skipped)."""
    counts = {"graded": 0, "correct": 0, "scored": 0, "skipped": 0}

    def skip(number: int, reason: str) -> None:
        log(f"{path}:{number}: kept unchanged ({reason})", file=sys.stderr)
        counts["skipped"] += 1

    def update(lines: list[tuple[int, dict | None]]) -> dict[int, dict]:
        groups: dict[str, list[tuple[int, dict]]] = {}
        for number, record in lines:
            if record is None:
                skip(number, "not a JSON object")
            elif not all(key in record for key in ("question_id", "output_text")):
                skip(number, "not a record with question_id and output_text")
            elif "task_config" not in record:
                skip(number, "the record has no task_config (written by an older version); rerun its job")
            else:
                groups.setdefault(json.dumps(record["task_config"], sort_keys=True), []).append((number, record))
        replaced = {}
        for members in groups.values():
            task = load_task(config_from_dict(members[0][1]["task_config"]), data_dir)
            by_id = {q.question_id: q for q in task.questions()}
            gradable = []
            for number, record in members:
                question = by_id.get(str(record["question_id"]))
                if question is None:
                    skip(number, f"question {record['question_id']!r} is not in task {task.name}")
                else:
                    gradable.append((number, record, question))
            grades = task.grade_many([(q, r["output_text"] or "") for _, r, q in gradable], workers=workers)
            for (number, record, _), grade in zip(gradable, grades):
                replaced[number] = {**record, **grade.record_fields(task.cfg.grader)}
                counts["graded"] += 1
                counts["correct"] += bool(grade.correct)
                counts["scored"] += grade.correct is not None
        return replaced

    rewrite_records(path, update)
    return counts


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packedss.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="records files (JSON lines)")
    parser.add_argument("--data-dir", default=None, help="local data directory (formats: docs/data.md)")
    parser.add_argument("--workers", type=int, default=None, help="parallel sandboxes for code tasks (default: CPUs)")
    args = parser.parse_args(argv)
    status = 0
    for name in args.files:
        try:
            counts = regrade_file(name, data_dir=args.data_dir, workers=args.workers)
        except FileNotFoundError:
            print(f"{name}: no such file", file=sys.stderr)
            status = 2
            continue
        except PackedSSError as err:
            print(f"{name}: {err}", file=sys.stderr)
            status = 2
            continue
        accuracy = f", {counts['correct']}/{counts['scored']} correct" if counts["scored"] else ""
        print(f"{name}: re-graded {counts['graded']} records{accuracy}; {counts['skipped']} lines kept unchanged")
    return status


if __name__ == "__main__":
    sys.exit(main())
