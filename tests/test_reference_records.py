"""scripts/reference_records.py: records of the code sets' reference solutions, which
`python -m packedss.grade` grades correct; bad input ends in one error line and writes nothing."""

from __future__ import annotations

import json

import pytest

from packedss.grade import regrade_file
from tests.bad_inputs import SHARED_DATA, error_line, script

needs_data = pytest.mark.skipif(not all((SHARED_DATA / name).is_file() for name in
                                        ("HumanEval.jsonl.gz", "MbppPlus.jsonl.gz", "mbpp.jsonl")),
                                reason="../shared/data lacks a code data set")  # fmt: skip


@needs_data
def test_one_record_per_reference_solution_and_graded_correct(tmp_path):
    result = script("reference_records.py", ["--data-dir", str(SHARED_DATA), "--out", str(tmp_path / "refs")], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    counts = {}
    for name, count in (("humaneval.jsonl", 164), ("mbpp-plus.jsonl", 378), ("mbpp-original.jsonl", 500)):
        lines = (tmp_path / "refs" / name).read_text().splitlines()
        counts[name] = len(lines)
        first = tmp_path / f"first-{name}"
        first.write_text(lines[0] + "\n")
        assert regrade_file(first)["correct"] == 1, name
        record = json.loads(first.read_text())
        assert record["correct"] is True and [a["status"] for a in record["grade_attempts"]] == ["passed"], record
    assert counts == {"humaneval.jsonl": 164, "mbpp-plus.jsonl": 378, "mbpp-original.jsonl": 500}


@pytest.mark.parametrize("arguments, expected", [
    (["--data-dir", "nowhere", "--out", "refs"], "--data-dir nowhere: no such folder"),
    (["--data-dir", "."], "the following arguments are required: --out"),
    (["--data-dir", "empty", "--out", "refs"], "pass --data-dir DIR holding HumanEval.jsonl.gz"),
])  # fmt: skip
def test_bad_input_is_one_line_and_writes_nothing(arguments, expected, tmp_path):
    (tmp_path / "empty").mkdir()
    line = error_line(script("reference_records.py", arguments, tmp_path))
    assert expected in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_files_already_there_are_not_overwritten(tmp_path):
    (tmp_path / "refs").mkdir()
    (tmp_path / "refs" / "humaneval.jsonl").write_text("graded before\n")
    line = error_line(script("reference_records.py", ["--data-dir", str(tmp_path), "--out", str(tmp_path / "refs")], tmp_path))
    assert "already holds humaneval.jsonl; choose another folder or remove them" in line, line
    assert (tmp_path / "refs" / "humaneval.jsonl").read_text() == "graded before\n"
