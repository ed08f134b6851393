"""A SIGTERM that arrives while the runner writes a record waits for the record: the job stops
right after it, with that record complete on disk."""

from __future__ import annotations

import os
import signal

import pytest
from hydra import compose, initialize_config_dir

from packedss.config import register_configs
from packedss.paths import CONF_DIR
from packedss.preemption import Preempted
from packedss.records import RecordWriter, read_records
from packedss.runner import run_job


def test_sigterm_while_a_record_is_written_stops_the_job_after_it(model_overrides, tmp_path, monkeypatch, hub_offline):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*model_overrides, "schedule=linear", "width=4", "limit=4",
                                                       "max_new_tokens=16", "warmup=false", f"out_dir={tmp_path / 'out'}"])  # fmt: skip
    append = RecordWriter.append
    appended = []

    def append_signalled(writer, record):
        if len(appended) == 1:  # the second record: the signal arrives as it is written
            os.kill(os.getpid(), signal.SIGTERM)
        append(writer, record)
        appended.append(record["question_id"])

    monkeypatch.setattr(RecordWriter, "append", append_signalled)
    with pytest.raises(Preempted, match="stopped by SIGTERM"):
        run_job(cfg)
    assert len(appended) == 2  # the write in flight finished; the job stopped before the next question
    [path] = (tmp_path / "out").rglob("*.jsonl")
    records, bad = read_records(path)
    assert bad == [] and [r["question_id"] for r in records] == appended
