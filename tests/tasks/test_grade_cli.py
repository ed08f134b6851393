"""python -m packedss.grade: in-place, atomic re-grading."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from packedss import grade as grade_cli
from packedss.tasks import load_task, load_task_config


def _task_config(name, **overrides):
    return dataclasses.asdict(load_task_config(name, **overrides))


def _records(n=6):
    qs = load_task(load_task_config("arith"), None).questions(limit=n)
    rows = []
    for i, q in enumerate(qs):
        out = q.metadata["solution"] if i % 2 == 0 else "#### 100000"
        rows.append({"task": "arith", "task_config": _task_config("arith"), "question_id": q.question_id,
                     "output_text": out, "schedule": "packed", "extracted_answer": None, "correct": None,
                     "grader": None, "note": "héllo ✓"})  # fmt: skip
    return rows


def test_regrades_in_place_and_keeps_bad_lines(tmp_path, h, capsys):
    path = h.write_jsonl(tmp_path / "r.jsonl", _records())
    with open(path, "ab") as fh:
        fh.write(b'{"torn": \n')
        fh.write(b"not json at all\n")
    rc = grade_cli.main([str(path)])
    assert rc == 0
    err = capsys.readouterr().err
    assert f"{path}:7" in err and f"{path}:8" in err
    lines = path.read_bytes().split(b"\n")
    assert lines[6] == b'{"torn": ' and lines[7] == b"not json at all"
    recs = [json.loads(l) for l in lines[:6]]
    assert [r["correct"] for r in recs] == [True, False] * 3
    assert recs[0]["extracted_answer"] is not None and recs[0]["grader"]["name"] == "numeric"
    assert recs[0]["note"] == "héllo ✓" and recs[0]["schedule"] == "packed"
    original = list(_records()[0])
    assert list(recs[0])[: len(original)] == original  # field order kept; new score fields go last
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]  # no temp files left


def test_grader_crash_leaves_the_file_byte_identical(tmp_path, h, monkeypatch):
    path = h.write_jsonl(tmp_path / "r.jsonl", _records())
    before = path.read_bytes()
    from packedss.tasks import core

    calls = {"n": 0}
    real = core.Task.grade

    def flaky(self, q, out):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("grader died mid-way")
        return real(self, q, out)

    monkeypatch.setattr(core.Task, "grade", flaky)
    with pytest.raises(RuntimeError):
        grade_cli.regrade_file(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]


def test_crash_during_write_leaves_the_old_file(tmp_path, h, monkeypatch):
    path = h.write_jsonl(tmp_path / "r.jsonl", _records())
    before = path.read_bytes()

    def boom(src, dst):
        raise OSError("disk gone")

    from packedss import records

    monkeypatch.setattr(records.os, "replace", boom)
    with pytest.raises(OSError):
        grade_cli.regrade_file(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]


def test_cli_subprocess_with_code_and_speed_tasks(tmp_path, h, shared_data):
    he = load_task(load_task_config("humaneval"), str(shared_data)).questions(limit=2)
    humaneval, writingbench = _task_config("humaneval"), _task_config("writingbench")
    mbpp = _task_config("mbpp", variant="original")
    rows = [
        {"task_config": humaneval, "question_id": he[0].question_id, "output_text": he[0].metadata["canonical_solution"]},
        {"task_config": humaneval, "question_id": he[1].question_id, "output_text": "    import os\n    os._exit(0)\n"},
        {"task_config": writingbench, "question_id": "writingbench/1", "output_text": "an essay"},
        {"task_config": mbpp, "question_id": "mbpp/11", "output_text": "def remove_Occ(s, ch):\n    return s.replace(ch, '', 1)[::-1].replace(ch, '', 1)[::-1]\n"},
    ]
    path = h.write_jsonl(tmp_path / "r.jsonl", rows)
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "packedss.grade", str(path), "--data-dir", str(shared_data)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    recs = [json.loads(l) for l in path.read_text().splitlines()]
    assert [r["correct"] for r in recs] == [True, False, None, True]
    assert recs[0]["grader"]["status"] == "passed" and recs[1]["grader"]["status"] == "failed"


def test_missing_file_exit_code(tmp_path):
    assert grade_cli.main([str(tmp_path / "nope.jsonl")]) == 2


def test_regrade_refuses_a_file_a_job_is_writing(tmp_path):
    from packedss.errors import PackedSSError
    from packedss.grade import regrade_file
    from packedss.records import RecordWriter

    path = tmp_path / "r.jsonl"
    with RecordWriter(path) as writer:
        writer.append({"task_config": _task_config("arith"), "question_id": "arith/test/0", "output_text": "#### 3"})
        with pytest.raises(PackedSSError, match="a running job is writing"):
            regrade_file(path)
    assert regrade_file(path)["graded"] == 1


def test_a_record_without_its_task_config_is_kept_and_reported(tmp_path, h, capsys):
    rows = _records(2)
    del rows[1]["task_config"]
    path = h.write_jsonl(tmp_path / "r.jsonl", rows)
    assert grade_cli.regrade_file(path)["skipped"] == 1
    assert (f"warning: bad record line skipped: {path}:2: the record has no task_config (written by an older "
            "version); rerun its job; kept unchanged, not re-graded") in capsys.readouterr().err
    assert json.loads(path.read_text().splitlines()[1]) == rows[1]


def test_code_records_name_the_active_sandbox_protections(shared_data):
    task = load_task(load_task_config("humaneval"), str(shared_data))
    question = task.questions(limit=1)[0]
    fields = task.grade(question, question.metadata["canonical_solution"]).record_fields("humaneval")
    assert fields["correct"] is True
    assert fields["sandbox"]["rlimits"] is True and "fs" in fields["sandbox"]
    arith = load_task(load_task_config("arith"), None)
    assert arith.grade(arith.questions(limit=1)[0], "#### 1").record_fields("numeric")["sandbox"] is None
