"""A preempted job (SIGTERM from the cluster) stops at a record boundary and its rerun resumes:
exactly one record per question, none torn."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from packedss.paths import PROJECT_ROOT
from packedss.records import read_records
from tests.test_runner import offline_env, record_file, run_py


def test_sigterm_mid_run_then_rerun_gives_one_record_per_question(model_overrides, tmp_path):
    questions = 12
    args = [*model_overrides, "schedule=linear", "width=4", f"limit={questions}", "max_new_tokens=96",
            "warmup=false", f"out_dir={tmp_path / 'out'}"]  # fmt: skip
    target, directory = None, tmp_path / "out" / "tiny" / "arith"
    process = subprocess.Popen(
        [sys.executable, str(PROJECT_ROOT / "run.py"), *args, f"hydra.run.dir={tmp_path}/h1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=offline_env(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        target = target or (directory.is_dir() and record_file(directory, "linear-W4-T0-s0.jsonl"))
        if target and target.read_bytes().count(b"\n") >= 2:
            process.send_signal(signal.SIGTERM)
            break
        time.sleep(0.005)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode not in (0, -signal.SIGTERM), "the job was not stopped by its own handler"
    assert "stopped by SIGTERM" in stderr
    kept, bad = read_records(target)
    assert bad == [] and 2 <= len(kept) < questions  # whole records only, the one in flight abandoned
    run_py(args, tmp_path)
    records, bad = read_records(target)
    assert bad == []
    assert sorted(r["question_id"] for r in records) == sorted({r["question_id"] for r in records})
    assert len(records) == questions
