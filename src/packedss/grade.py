"""Re-grade existing records in place: ``python -m packedss.grade RECORDS.jsonl [more ...]``.

Each record (one JSON object per line) needs ``task``, ``question_id`` and ``output_text``;
its score fields ``extracted_answer``, ``correct`` and ``grader`` are rewritten with the
task's grader (task config: ``conf/task/<task>.yaml``; mbpp's variant and arith's split are
read from the question ids). Every other field and every line that is not a gradable
record is kept byte for byte; lines that fail to parse are reported as FILE:LINE.
Each file is rewritten atomically (temporary file in the same directory, flush + fsync,
``os.replace``): a crash or a grader error leaves the old file intact. A file that a
running job is still appending to (it holds the writer's lock) is refused with a clear error.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Optional

from packedss.errors import PackedSSError

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def _task_key(rec: dict) -> tuple:
    """(task name, config overrides) for a record, from its task name and question id."""
    name = rec["task"]
    qid = str(rec["question_id"])
    if name == "mbpp":
        return name, (("variant", "original" if qid.startswith("mbpp/") else "plus"),)
    if name == "arith":
        parts = qid.split("/")
        if len(parts) == 3 and parts[2].isdigit():
            return name, (("split", parts[1]),)
    return name, ()


def _load(name: str, overrides: tuple, needed_ids: set, data_dir: Optional[str]):
    from packedss.tasks import load_task, load_task_config

    extra = dict(overrides)
    if name == "arith":  # generate enough questions to cover every recorded index
        top = max(int(q.rsplit("/", 1)[-1]) for q in needed_ids if q.rsplit("/", 1)[-1].isdigit())
        cfg0 = load_task_config(name, **extra)
        extra["n"] = max(cfg0.n or 0, top + 1)
    task = load_task(load_task_config(name, **extra), data_dir)
    return task, {q.question_id: q for q in task.questions()}


def regrade_file(path: str | os.PathLike, data_dir: Optional[str] = None, workers: Optional[int] = None, log=print) -> dict:
    """Re-grade one records file in place (atomically). Returns counts."""
    path = Path(path)
    with open(path, "rb") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PackedSSError(f"{path}: a running job is writing this file; re-grade it when the job is done") from None
        return _regrade_locked(path, fh.readlines(), data_dir, workers, log)


def _regrade_locked(path: Path, raw_lines: list[bytes], data_dir, workers, log) -> dict:
    records: dict[int, dict] = {}
    skipped = 0
    for i, raw in enumerate(raw_lines):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw.decode("utf-8"))
            if not isinstance(rec, dict) or not all(k in rec for k in ("task", "question_id", "output_text")):
                raise ValueError("not a record with task, question_id and output_text")
        except (ValueError, UnicodeDecodeError) as exc:
            log(f"{path}:{i + 1}: kept unchanged (cannot parse: {str(exc)[:120]})", file=sys.stderr)
            skipped += 1
            continue
        records[i] = rec

    groups: dict[tuple, list[int]] = {}
    for i, rec in records.items():
        groups.setdefault(_task_key(rec), []).append(i)

    new_lines = list(raw_lines)
    graded = correct = scored = 0
    for (name, overrides), idxs in groups.items():
        task, by_id = _load(name, overrides, {str(records[i]["question_id"]) for i in idxs}, data_dir)
        items, where = [], []
        for i in idxs:
            q = by_id.get(str(records[i]["question_id"]))
            if q is None:
                log(f"{path}:{i + 1}: kept unchanged (question {records[i]['question_id']!r} not in task {name})", file=sys.stderr)
                skipped += 1
                continue
            items.append((q, records[i]["output_text"] or ""))
            where.append(i)
        grades = task.grade_many(items, workers=workers)
        for i, g in zip(where, grades):
            rec = records[i]
            rec.update(g.record_fields(task.cfg.grader))
            end = b"\n" if raw_lines[i].endswith(b"\n") else b""
            new_lines[i] = json.dumps(rec, ensure_ascii=False).encode("utf-8") + end
            graded += 1
            correct += bool(g.correct)
            scored += g.correct is not None
    _atomic_write(path, new_lines)
    return {"graded": graded, "correct": correct, "scored": scored, "skipped": skipped}


def _atomic_write(path: Path, lines: list[bytes]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            for line in lines:
                fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        except OSError:
            pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m packedss.grade", description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="records files (JSON lines)")
    ap.add_argument("--data-dir", default=None, help="local data directory (formats of ../shared/data)")
    ap.add_argument("--workers", type=int, default=None, help="parallel sandboxes for code tasks (default: CPUs)")
    args = ap.parse_args(argv)
    status = 0
    for f in args.files:
        try:
            c = regrade_file(f, data_dir=args.data_dir, workers=args.workers)
        except FileNotFoundError:
            print(f"{f}: no such file", file=sys.stderr)
            status = 2
            continue
        except PackedSSError as exc:
            print(f"{f}: {exc}", file=sys.stderr)
            status = 2
            continue
        acc = f", {c['correct']}/{c['scored']} correct" if c["scored"] else ""
        print(f"{f}: re-graded {c['graded']} records{acc}; {c['skipped']} lines kept unchanged")
    return status


if __name__ == "__main__":
    sys.exit(main())
