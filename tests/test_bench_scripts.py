"""The benchmark scripts run end to end on a tiny configuration (they are not timed here: a
benchmark is never a unit test). Checks what they report, not how fast anything is."""

from __future__ import annotations

import importlib
import json
import math
import sys

import pytest

from packedss.config import PROJECT_ROOT
from tests.conftest import write_random_nemotron_with_tokenizer

sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
bench_calls = importlib.import_module("bench_calls")
bench_schedules = importlib.import_module("bench_schedules")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_nemotron_with_tokenizer(tmp_path_factory.mktemp("bench-model"))


def test_bench_calls_times_every_call_shape(tmp_path, capsys):
    out = tmp_path / "calls.json"
    argv = ["--shape", "test", "--device", "cpu", "--blocks", "2,3", "--prefix", "1,5", "--warmup", "1",
            "--iters", "2", "--attn", "sdpa,eager", "--json", str(out)]  # fmt: skip
    assert bench_calls.main(argv) == 0
    printed = capsys.readouterr().out
    assert "Per-iteration model time" in printed
    report = json.loads(out.read_text())
    assert set(report["runs"]) == {"sdpa", "eager"}
    for run in report["runs"].values():
        calls = {(c["prefix"], c["block"], c["kind"]): c for c in run["calls"]}
        assert len(calls) == 2 * 2 * 4
        for (prefix, block, kind), c in calls.items():
            expected = {"linear-draft": block, "linear-verify": block, "packed": 2 * block,
                        "quadratic": block * (block + 1)}[kind]  # fmt: skip
            assert c["rows"] == expected, (kind, block)
            assert c["iters"] == 2 and 0 < c["min_ms"] <= c["median_ms"]
        for it in run["per_iteration"]:
            key = (it["prefix"], it["block"])
            draft, verify = calls[key + ("linear-draft",)], calls[key + ("linear-verify",)]
            assert it["linear"] == pytest.approx(draft["median_ms"] + verify["median_ms"])
            assert it["ratio_2B_B"] == pytest.approx(calls[key + ("packed",)]["median_ms"] / verify["median_ms"])


def test_bench_calls_reports_a_failing_attention_implementation(capsys):
    argv = ["--shape", "test", "--device", "cpu", "--blocks", "2", "--prefix", "1", "--iters", "1",
            "--attn", "no_such_attention"]  # fmt: skip
    assert bench_calls.main(argv) == 1
    assert "attn=no_such_attention failed" in capsys.readouterr().out


def test_bench_schedules_interleaves_and_compares(checkpoint, tmp_path, capsys):
    out = tmp_path / "schedules.json"
    argv = ["--model", str(checkpoint), "--task", "arith", "--limit", "3", "--warmup", "1",
            "--schedules", "ar,linear,quadratic,packed", "--width", "3", "--max-new-tokens", "12",
            "--dtype", "float64", "--n-resamples", "200", "--json", str(out)]  # fmt: skip
    assert bench_schedules.main(argv) == 0
    printed = capsys.readouterr().out
    for label in ("AR", "Linear-SS", "Quadratic-SS", "Packed-SS"):
        assert f"| {label} |" in printed
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [r["schedule"] for r in rows[:4]] == ["ar", "linear", "quadratic", "packed"]  # interleaved per question
    assert len(rows) == 4 * 3 and len({r["question_id"] for r in rows}) == 3
    table = {r["Schedule"]: r for r in report["table"]}
    for label, r in table.items():
        assert r["Match (%)"] == 100.0, label  # float64 greedy: every schedule equals AR
        assert 0.0 <= r["Non-model (%)"] < 100.0
        assert r["Tokens/s"] > 0 and r["Model ms/iter"] > 0
    assert table["AR"]["Tokens/NFE"] == pytest.approx(sum(r["output_tokens"] for r in rows[:: 4]) /
                                                       sum(r["nfe_total"] for r in rows[:: 4]))  # fmt: skip
    assert table["Linear-SS"]["Tok/s vs Linear-SS"] == "1"
    packed = table["Packed-SS"]
    assert packed["_low"] <= packed["_ratio"] <= packed["_high"] and math.isfinite(packed["_ratio"])
    assert packed["Tok/s vs Linear-SS"].startswith(f"{packed['_ratio']:.3f} [")


def test_bench_schedules_on_random_weights_of_a_shape_with_replay(checkpoint, tmp_path, capsys):
    out = tmp_path / "random.json"
    argv = ["--model", str(checkpoint), "--shape", "test", "--limit", "2", "--schedules", "linear,packed",
            "--max-new-tokens", "6", "--no-grade", "--n-resamples", "100", "--replay", "--json", str(out)]  # fmt: skip
    assert bench_schedules.main(argv) == 0
    printed = capsys.readouterr().out
    assert "random test weights" in printed and "| Packed-SS |" in printed and "Decoder us/iter" in printed
    table = json.loads(out.read_text())["table"]
    assert [r["Schedule"] for r in table] == ["Linear-SS", "Packed-SS"]
    assert all(0 < r["Decoder us/iter"] < 1e6 for r in table)


def test_replay_reproduces_the_decode_without_the_model(checkpoint):
    from packedss.decoding import DecodeSettings, Sampling, decode
    from packedss.models.nemotron import load_nemotron

    model = load_nemotron(checkpoint, dtype="float64")
    settings = DecodeSettings("packed", 3, 10, model.eos_token_ids, Sampling(0.0, "rejection", None))
    recorder = bench_schedules._Recorder(model)
    real = decode(recorder, [5, 9, 11, 30, 7], settings)
    replay = bench_schedules._Replay(recorder.log, model.device, model.mask_token_id)
    again = decode(replay, [5, 9, 11, 30, 7], settings)
    assert again.tokens == real.tokens and again.nfe_total == real.nfe_total == replay.index


def test_bench_schedules_rejects_an_unknown_schedule(checkpoint):
    with pytest.raises(SystemExit, match="unknown schedules"):
        bench_schedules.main(["--model", str(checkpoint), "--schedules", "linear,fast"])
