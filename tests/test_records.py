"""Record files: schema validation, torn-tail repair, the exclusive writer lock."""

from __future__ import annotations

import json

import pytest

from packedss.errors import PackedSSError
from packedss.job import IDENTITY_FIELDS, JobSpec
from packedss.records import (RECORD_FIELDS, RESUME_KEEPS_IT, RecordWriter, bad_line_warning, read_records,
                              repair_torn_tail, validate_record)

GOOD = {
    "model": "tiny", "family": "nemotron", "task": "arith", "task_config": {"name": "arith"}, "sample": 0,
    "schedule": "packed", "width": 2, "block": 3, "temperature": 0.0,
    "verify": "greedy", "order": None, "seed": 0, "repeat": 0, "config_hash": "abc", "code_version": "x",
    "device": "cpu", "dtype": "float32", "versions": {}, "question_id": "q1", "prompt_tokens": 4,
    "output_tokens": 4, "output_text": "1 2", "finish_reason": "eos", "output_hash": "h", "nfe_total": 3,
    "nfe_prefill": 1, "iterations": 2, "accepted": [2, 2], "rows_evaluated": [7, 6, 6], "rows_useful": [7, 5, 5],
    "draft_proposed": 2, "draft_accepted": 2, "truncated_tokens": 1, "wall_s": 0.5, "model_s": 0.4,
    "nonmodel_s": 0.1, "extracted_answer": "2", "correct": True, "grader": {"name": "numeric"},
    "checkpoint": "assets/tiny", "checkpoint_dir": "assets/tiny", "chat": False, "end_of_turn": [], "lora": False,
    "lora_path": None, "threads": 1, "compile": "none", "timing": "sync", "cost_model": None, "warmup_decode": True,
    "data_dir": None,
    "pad_verify": True, "native_window": None, "max_new_tokens": 64, "lossy": False, "concurrency": 1,
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


def _spec(**changes) -> JobSpec:
    fields = {k: GOOD[k] for k in IDENTITY_FIELDS if k in GOOD} | {"end_of_turn": ()}
    return JobSpec(**(fields | changes))


def test_record_path_layout(tmp_path):
    spec = _spec(width=8, seed=3)
    assert spec.record_path(tmp_path) == tmp_path / f"tiny/arith/packed-W8-T0-s3-{spec.config_hash}.jsonl"
    sampled = _spec(schedule="linear", pad_verify=None, temperature=1.0, verify="match", order="confidence")
    assert sampled.record_path(tmp_path).name == f"linear-W2-T1-match-confidence-s0-{sampled.config_hash}.jsonl"
    special = _spec(pad_verify=False, lora=True, compile="default")
    assert special.record_path(tmp_path).name.startswith("packed-nopad-lora-W2-T0-s0-compiled-default-")
    assert _spec(schedule="ar", width=0, block=1, pad_verify=None).record_path(tmp_path).name.startswith("ar-T0-s0-")


@pytest.mark.parametrize(
    "change",
    [{"max_new_tokens": 16}, {"dtype": "float16"}, {"compile": "default"}, {"checkpoint": "other"}, {"device": "cuda"},
     {"task_config": {"name": "arith", "split": "train"}}, {"native_window": 4}, {"timing": "events"}, {"threads": 2},
     {"data_dir": "/data"}, {"chat": True}, {"warmup_decode": False}, {"lora_path": "lora"},
     {"sampler": "inverse-cdf"}],
)  # fmt: skip
def test_jobs_that_differ_in_any_identity_field_never_share_a_file(tmp_path, change):
    assert _spec(**change).record_path(tmp_path) != _spec().record_path(tmp_path)
    assert _spec(**change).config_hash != _spec().config_hash


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
        assert writer.resume("abc").done == {("q1", 0, 0)}  # (question, sample, repeat)
        assert writer.resume("other").done == set()


def test_a_resume_counts_only_sound_records_and_names_each_bad_line(tmp_path):
    """A bad middle line is kept, named with its file and line in the readers' one wording, and not
    counted as done, so the response it held is decoded again: a record of this job that fails its
    checks as well as a line that is not JSON."""
    path = tmp_path / "r.jsonl"
    lines = [json.dumps(GOOD), "{garbled", json.dumps(GOOD | {"question_id": "q2", "nfe_total": 9}),
             json.dumps(GOOD | {"question_id": "q3"})]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    with RecordWriter(path) as writer:
        resume = writer.resume("abc")
        again = writer.resume("abc")  # a job's later pass (multi-turn tasks) names them once only
    assert again.done == resume.done and again.bad_lines == []
    assert resume.done == {("q1", 0, 0), ("q3", 0, 0)}
    assert [(bad.path, bad.line) for bad in resume.bad_lines] == [(path, 2), (path, 3)]
    assert resume.warnings() == [bad_line_warning(bad, RESUME_KEEPS_IT) for bad in resume.bad_lines]
    assert resume.warnings()[0] == (f"warning: bad record line skipped: {path}:2: not JSON (Expecting property name "
                                    f"enclosed in double quotes); {RESUME_KEEPS_IT}")  # fmt: skip
    assert path.read_text() == "\n".join(lines) + "\n"  # the resume changes nothing


def test_grade_attempts_is_an_optional_field():
    """Records written before the timeout retry have no grade_attempts, and are still sound."""
    assert "grade_attempts" not in RECORD_FIELDS
    attempts = [{"status": "timeout", "duration_s": 10.0, "alone": False}, {"status": "passed", "duration_s": 0.3, "alone": True}]
    assert validate_record(GOOD | {"grade_attempts": attempts}) == validate_record(GOOD) == []


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
