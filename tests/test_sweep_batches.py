"""A sweep launched one job per batch (hydra.sweeper.max_batch_size=1) keeps every batch's
failures: a failing middle job makes the sweep exit 1 with its summary, as in one batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from packedss.paths import PROJECT_ROOT
from packedss.records import read_records
from tests.test_runner import record_file


def run_sweep(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    return subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", "hydra/sweeper=packedss", *args,
         f"hydra.sweep.dir={tmp_path}/multirun"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900,
    )  # fmt: skip


def _write_gsm8k(directory: Path, questions: int) -> None:
    directory.mkdir()
    rows = [{"question": f"Tom has {i} apples and buys 2 more. How many?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"}
            for i in range(questions)]  # fmt: skip
    (directory / "gsm8k_test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_middle_job_that_fails_in_its_own_batch_is_in_the_summary(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    _write_gsm8k(data, 2)  # no math500 file: the middle job fails when it loads its data
    result = run_sweep(["hydra.sweeper.max_batch_size=1", "model=tiny", "task=gsm8k,math500,arith", "limit=2",
                        "max_new_tokens=16", f"data_dir={data}", f"out_dir={out}"], tmp_path)  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    for task in ("gsm8k", "arith"):  # the batches after the failing one ran
        records, bad = read_records(record_file(out / "tiny" / task, "packed-W8-T0-s0.jsonl"))
        assert bad == [] and len(records) == 2, task
    summary = result.stderr[result.stderr.index("1 of 3 jobs failed") :]
    assert "#1 model=tiny task=math500" in summary
    assert "math500_test.jsonl" in summary
    assert (f"rerun: {sys.executable} {PROJECT_ROOT / 'run.py'} model=tiny task=math500 limit=2 max_new_tokens=16 "
            f"data_dir={data} out_dir={out}") in summary  # fmt: skip
    # one line per job ended, in order, batch after batch
    progress = [line.split(",")[0] for line in result.stderr.splitlines() if line.startswith("sweep: ")]
    assert progress == [f"sweep: {n} of 3 jobs done" for n in range(4)]
