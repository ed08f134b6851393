"""Acceptance analytics on real records of the shipped tiny model (run.py, offline, CPU): the
identities that tie the profiles and latencies to the records. Skipped until the tiny model is in
assets/models/tiny; kept small (3 questions, 40 tokens)."""

import sys
from pathlib import Path

import numpy as np
import pytest

from packedss.analysis import load_results
from packedss.analysis.acceptance import acceptance_profiles, response_latency
from tests import bad_inputs

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "assets" / "models" / "tiny"
SCHEDULES = ("ar", "linear", "quadratic", "packed")
pytestmark = pytest.mark.xdist_group("tiny-acceptance-runs")  # one xdist worker runs the module's sweep once


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-acceptance")
    done = bad_inputs.run(
        [sys.executable, str(ROOT / "run.py"), "-m", "model=tiny", "task=arith", f"schedule={','.join(SCHEDULES)}",
         "width=8", "temperature=0,1", "limit=3", "max_new_tokens=40", "device=cpu", "progress=false",
         f"out_dir={folder / 'records'}"], folder,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return load_results(folder, n_resamples=199)


@pytest.mark.skipif(not (TINY / "config.json").exists(), reason="tiny model not trained yet (assets/models/tiny)")
def test_profiles_of_tiny_runs_satisfy_the_record_identities(tiny_results):
    responses = tiny_results.per_response
    profiles = acceptance_profiles(responses, 199)
    assert len(profiles) == 2 * len(SCHEDULES) and tiny_results.loaded.bad_lines == []
    for profile in profiles:
        identity, counts = profile["identity"], profile["counts"]
        run = responses[(responses["schedule"] == identity["schedule"]) & (responses["temperature"] == identity["temperature"])]
        drafts = np.concatenate([np.asarray(h) for h in run["accepted_drafts"]])
        assert sum(profile["emitted_histogram"]) == counts["iterations"] == run["iterations"].sum() == len(drafts)
        emitted = sum(k * n for k, n in enumerate(profile["emitted_histogram"]))
        assert emitted == counts["tokens_emitted"] == (run["output_tokens"] - 1 + run["truncated_tokens"]).sum()
        if identity["width"]:  # AR reads no W: no draft depths
            assert profile["marginal"]["estimate"][0] == pytest.approx(float(np.mean(drafts >= 1)))
        assert sum(profile["draft_length_histogram"]) == counts["iterations"]
        assert counts["draft_proposed"] == run["draft_proposed"].sum()
        assert counts["draft_accepted"] == run["draft_accepted"].sum()
        if identity["schedule"] in ("linear", "quadratic"):
            assert profile["drafted_share"] == [1.0] * 8  # a full W-token draft every iteration
        if identity["schedule"] == "ar":
            assert counts["draft_proposed"] == 0 and profile["emitted_histogram"][1] == counts["iterations"]
            assert identity["width"] == 0 and profile["marginal"]["estimate"] == []
    packed = [p for p in profiles if p["identity"]["schedule"] == "packed"]
    assert all(p["draft_length_histogram"][8] == 0 and p["draft_length_histogram"][7] >= 1 for p in packed)  # W-1 at most
    assert len({tuple(p["marginal"]["estimate"]) for p in profiles if p["counts"]["draft_proposed"]}) > 1


@pytest.mark.skipif(not (TINY / "config.json").exists(), reason="tiny model not trained yet (assets/models/tiny)")
def test_latency_of_tiny_runs_adds_up_to_the_wall_time(tiny_results):
    for _, record in tiny_results.loaded.frame.iterrows():
        ttft, times, tokens = response_latency(record)
        assert len(times) == record["iterations"] and tokens == list(record["accepted"])
        assert ttft + sum(times) == pytest.approx(record["wall_s"], rel=1e-9)
        assert ttft >= record["call_model_s"][0] > 0
