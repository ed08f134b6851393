#!/usr/bin/env python
"""Write records whose outputs are the code data sets' own reference solutions, for
`python -m packedss.grade` to grade: every one must come out correct, however loaded the machine.

One records file per data set under --out (humaneval.jsonl: HumanEval's 164, mbpp-plus.jsonl:
MBPP+'s 378, mbpp-original.jsonl: MBPP's 500), each line a record with the task config of
conf/task/ and --data-dir as its data directory, the reference solution as a fenced output and
no score yet. Several folders graded side by side show whether a verdict depends on the load
(docs/sandbox.md §8):

    python scripts/reference_records.py --data-dir ../shared/data --out /tmp/references/1
    python -m packedss.grade /tmp/references/1
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from packedss.errors import ArgumentParser, PackedSSError, run_cli, run_reporting
from packedss.records import encode_record
from packedss.tasks import DataUnavailable, load_task, load_task_config
from packedss.tasks.code import canonical_output

#: (file name, task, task config overrides)
DATA_SETS = (("humaneval.jsonl", "humaneval", {}), ("mbpp-plus.jsonl", "mbpp", {"variant": "plus"}),
             ("mbpp-original.jsonl", "mbpp", {"variant": "original"}))  # fmt: skip


def reference_records(task_name: str, overrides: dict, data_dir: Path) -> list[dict]:
    """One unscored record per question of the task, its output the question's reference solution."""
    cfg = load_task_config(task_name, **overrides)
    try:
        questions = load_task(cfg, str(data_dir)).questions()
    except DataUnavailable as err:
        raise PackedSSError(err.message("--data-dir DIR")) from None
    fields = {"task": task_name, "task_config": dataclasses.asdict(cfg), "data_dir": str(data_dir)}
    return [fields | {"question_id": q.question_id, "output_text": f"```python\n{canonical_output(q)}\n```\n",
                      "extracted_answer": None, "correct": None, "grader": None} for q in questions]  # fmt: skip


def write(out: Path, data_dir: Path) -> None:
    if not data_dir.is_dir():
        raise PackedSSError(f"--data-dir {data_dir}: no such folder; name the folder that holds the code data sets")
    existing = [name for name, _, _ in DATA_SETS if (out / name).exists()]
    if existing:
        raise PackedSSError(f"--out {out} already holds {', '.join(existing)}; choose another folder or remove them")
    batches = [(name, reference_records(task, overrides, data_dir.resolve())) for name, task, overrides in DATA_SETS]
    out.mkdir(parents=True, exist_ok=True)  # only once every data set loaded
    for name, records in batches:
        (out / name).write_bytes(b"".join(map(encode_record, records)))
        print(f"{out / name}: {len(records)} reference solutions")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="scripts/reference_records.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, type=Path, help="the data sets (docs/data.md)")
    parser.add_argument("--out", required=True, type=Path, help="folder to write the three records files in")
    args = parser.parse_args(argv)
    return run_reporting(lambda: write(args.out, args.data_dir))


if __name__ == "__main__":
    run_cli(main)
