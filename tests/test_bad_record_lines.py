"""A records file with a bad (corrupted) middle line: run.py's resume names it in one line, keeps
it, and decodes the response it held again; the analysis and `grade` name it in the same words
(`packedss.records.bad_line_warning`, docs/records.md §4)."""

from __future__ import annotations

import json

from packedss.grade import KEPT_UNCHANGED
from packedss.records import RESUME_KEEPS_IT, BadLine, bad_line_warning, read_records
from tests.bad_inputs import module
from tests.test_runner import run_py

GARBLED = b'{"model": "tiny", "task": "ari\x00\x00\x00\n'


def test_a_bad_middle_line_is_named_alike_by_the_resume_the_analysis_and_grade(model_overrides, tmp_path):
    out = tmp_path / "records"
    command = [*model_overrides, "limit=3", "max_new_tokens=8", f"out_dir={out}"]
    run_py(command, tmp_path)
    (path,) = out.rglob("*.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    lost = json.loads(lines[1])["question_id"]
    path.write_bytes(lines[0] + GARBLED + lines[2])

    resumed = run_py(command, tmp_path)
    bad = BadLine(path, 2, "not JSON (Invalid control character at)")
    named = [line for line in resumed.stderr.splitlines() if "bad record line" in line]
    assert named == [bad_line_warning(bad, RESUME_KEEPS_IT)], resumed.stderr[-3000:]
    assert f"{path}: 1 records written, 2 already recorded" in resumed.stdout
    # the bad line stays where it was; the response it held is recorded again, once, after it
    after = path.read_bytes().splitlines(keepends=True)
    assert after[:3] == [lines[0], GARBLED, lines[2]] and len(after) == 4
    records, bad_lines = read_records(path)
    assert [r["question_id"] for r in records][-1] == lost and len({r["question_id"] for r in records}) == 3
    assert bad_lines == [bad]

    analysed = module("packedss.analysis", [str(tmp_path), "--tables", "6", "--n-resamples", "50"], tmp_path)
    assert analysed.returncode == 0, analysed.stderr[-3000:]
    assert [line for line in analysed.stderr.splitlines() if "bad record line" in line] == [bad_line_warning(bad)]

    graded = module("packedss.grade", [str(path)], tmp_path)
    assert graded.returncode == 0, graded.stderr[-3000:]
    assert graded.stderr.splitlines() == [bad_line_warning(bad, KEPT_UNCHANGED)]
    assert f"{path}: re-graded 3 records" in graded.stdout
    assert path.read_bytes().splitlines(keepends=True)[1] == GARBLED
