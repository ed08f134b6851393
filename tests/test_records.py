"""Record files: schema validation, torn-tail repair, the exclusive writer lock."""

from __future__ import annotations

import json

import pytest

from packedss.errors import PackedSSError
from packedss.records import RecordWriter, read_records, record_path, repair_torn_tail, validate_record

GOOD = {
    "model": "tiny", "family": "nemotron", "task": "arith", "task_config": {"name": "arith"}, "sample": 0,
    "schedule": "packed", "width": 2, "block": 3, "temperature": 0.0,
    "verify": "greedy", "order": None, "seed": 0, "repeat": 0, "config_hash": "abc", "code_version": "x",
    "device": "cpu", "dtype": "float32", "versions": {}, "question_id": "q1", "prompt_tokens": 4,
    "output_tokens": 4, "output_text": "1 2", "finish_reason": "eos", "output_hash": "h", "nfe_total": 3,
    "nfe_prefill": 1, "iterations": 2, "accepted": [2, 2], "rows_evaluated": [7, 6, 6], "rows_useful": [7, 5, 5],
    "draft_proposed": 2, "draft_accepted": 2, "truncated_tokens": 1, "wall_s": 0.5, "model_s": 0.4,
    "nonmodel_s": 0.1, "extracted_answer": "2", "correct": True, "grader": {"name": "numeric"},
}  # fmt: skip


def test_good_record_is_valid():
    assert validate_record(GOOD) == []


@pytest.mark.parametrize(
    "change,problem",
    [
        ({"output_tokens": 5}, "sum(accepted)"),
        ({"nfe_total": 4}, "len(rows_evaluated)"),
        ({"nonmodel_s": 0.3}, "nonmodel_s"),
        ({"finish_reason": "crash"}, "finish_reason"),
    ],
)
def test_identity_violations_are_reported(change, problem):
    assert any(problem in p for p in validate_record(GOOD | change))


def test_missing_field_is_reported():
    record = dict(GOOD)
    del record["output_hash"]
    assert validate_record(record) == ["missing field 'output_hash'"]


def test_record_path_layout(tmp_path):
    assert record_path(tmp_path, "m", "t", "packed", 8, 0.0, "greedy", None, 3) == tmp_path / "m/t/packed-W8-T0-s3.jsonl"
    assert record_path(tmp_path, "m", "t", "linear", 8, 1.0, "match", "confidence", 0).name == (
        "linear-W8-T1-match-confidence-s0.jsonl"
    )


def test_torn_last_line_is_cut(tmp_path):
    path = tmp_path / "r.jsonl"
    whole = json.dumps(GOOD) + "\n"
    path.write_text(whole + whole + json.dumps(GOOD)[:40])
    assert repair_torn_tail(path) == 40
    assert path.read_text() == whole + whole
    assert repair_torn_tail(path) == 0


def test_unparseable_last_line_with_newline_is_cut(tmp_path):
    path = tmp_path / "r.jsonl"
    whole = json.dumps(GOOD) + "\n"
    path.write_text(whole + '{"model": \n')
    repair_torn_tail(path)
    assert path.read_text() == whole


def test_bad_lines_are_reported_with_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(GOOD) + "\nnot json\n" + json.dumps(GOOD | {"nfe_total": 9}) + "\n")
    records, bad = read_records(path)
    assert len(records) == 1
    assert [b.line for b in bad] == [2, 3]
    assert str(bad[0]).startswith(f"{path}:2:")


def test_two_writers_never_share_a_file(tmp_path):
    path = tmp_path / "r.jsonl"
    with RecordWriter(path) as writer:
        writer.append(GOOD)
        with pytest.raises(PackedSSError, match="another job is writing"):
            RecordWriter(path)
    with RecordWriter(path) as writer:
        assert writer.done_keys("abc") == {("q1", 0, 0)}  # (question, sample, repeat)
        assert writer.done_keys("other") == set()


def test_append_fsyncs_the_file_after_every_record(tmp_path, monkeypatch):
    import os

    from packedss import records

    synced = []
    real_fsync = os.fsync

    def counting_fsync(fd):
        synced.append(os.fstat(fd).st_size)
        real_fsync(fd)

    monkeypatch.setattr(records.os, "fsync", counting_fsync)
    path = tmp_path / "r.jsonl"
    with RecordWriter(path) as writer:
        for k in range(3):
            writer.append(GOOD | {"question_id": f"q{k}"})
            # the file already holds every appended byte when append returns
            assert synced and synced[-1] == path.stat().st_size
    assert len(synced) == 3
