"""The benchmark scripts run end to end on a tiny configuration (they are not timed here: a
benchmark is never a unit test). Checks what they report, not how fast anything is. The two
--compile tests compile two small shapes each."""

from __future__ import annotations

import json
import math
import runpy
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from packedss.benchmark.calls import SHAPES, random_adapter, shape_config
from packedss.benchmark.floors import Products, linear_weights
from packedss.benchmark.replay import BatchReplay, Replay, recording
from packedss.decoding.trace import RecordingModel
from packedss.paths import PROJECT_ROOT
from tests.conftest import write_random_nemotron_with_tokenizer

bench_calls = SimpleNamespace(**runpy.run_path(str(PROJECT_ROOT / "scripts" / "bench_calls.py")))
bench_schedules = SimpleNamespace(**runpy.run_path(str(PROJECT_ROOT / "scripts" / "bench_schedules.py")))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_nemotron_with_tokenizer(tmp_path_factory.mktemp("bench-model"))


def test_bench_calls_times_every_call_shape(tmp_path, capsys):
    out = tmp_path / "calls.json"
    argv = ["--shape", "test", "--device", "cpu", "--blocks", "2,3", "--prefix", "1,5", "--warmup", "1",
            "--iters", "2", "--attn", "sdpa,eager", "--stream-mib", "1", "--json", str(out)]  # fmt: skip
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
            "--attn", "no_such_attention", "--stream-mib", "1"]  # fmt: skip
    assert bench_calls.main(argv) == 1
    assert "attn=no_such_attention failed" in capsys.readouterr().out


def test_bench_calls_compares_compiled_with_eager_calls(tmp_path, capsys):
    out = tmp_path / "compiled.json"
    argv = ["--shape", "test", "--device", "cpu", "--blocks", "1", "--prefix", "3", "--warmup", "1",
            "--iters", "2", "--compile", "default", "--stream-mib", "1", "--json", str(out)]  # fmt: skip
    assert bench_calls.main(argv) == 0
    printed = capsys.readouterr().out
    run = json.loads(out.read_text())["runs"]["packedss"]
    # B = 1: the AR and linear calls have 1 row, the packed and quadratic calls 2: two graphs.
    assert set(run["compile_s"]) == {"C=3: 1 rows", "C=3: 2 rows"}
    assert sorted((c["kind"], c["rows"]) for c in run["calls"]) == [
        ("ar", 1), ("linear-draft", 1), ("linear-verify", 1), ("packed", 2), ("quadratic", 2)]  # fmt: skip
    for c in run["calls"]:
        assert c["ratio"] == pytest.approx(c["compiled_ms"] / c["eager_ms"])
        assert c["products_ms"] > 0 and c["products_ratio"] == pytest.approx(c["products_ms"] / c["eager_ms"])
    assert ("| C | W | call | rows | eager ms | compiled ms | products ms | floor ms | compiled / eager | "
            "products / eager | eager / floor | compiled / floor |") in printed  # fmt: skip
    assert f"compiled/eager median per-call ratio: {run['median_ratio']:.2f}" in printed
    for c in run["calls"]:
        assert c["compiled_floor"] == pytest.approx(c["compiled_ms"] / c["floor_ms"])
        assert c["eager_floor"] == pytest.approx(c["eager_ms"] / c["floor_ms"])
    # The median over R = 1, B and 2B (quadratic's B(B+1) rows left out).
    shown = sorted(c["compiled_floor"] for c in run["calls"] if c["kind"] != "quadratic")
    assert run["compiled_floor_median"] == pytest.approx((shown[1] + shown[2]) / 2)
    last = printed.strip().splitlines()[-1]
    assert last == f"compiled/floor median per-call ratio: {run['compiled_floor_median']:.2f}"


def test_bench_schedules_interleaves_and_compares(checkpoint, tmp_path, capsys):
    out = tmp_path / "schedules.json"
    argv = ["--model", str(checkpoint), "--task", "arith", "--limit", "3", "--warmup", "1",
            "--schedules", "ar,linear,quadratic,packed", "--width", "3", "--max-new-tokens", "12", "--stream-mib", "1",
            "--dtype", "float64", "--n-resamples", "200", "--json", str(out)]  # fmt: skip
    assert bench_schedules.main(argv) == 0
    printed = capsys.readouterr().out
    for label in ("AR", "Linear-SS", "Quadratic-SS", "Packed-SS"):
        assert f"| {label} |" in printed
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [r["schedule"] for r in rows[:4]] == ["ar", "linear", "quadratic", "packed"]  # interleaved per question
    assert {r["regime"] for r in rows} == {"eager"} and report["compile_s"] == {}
    assert len(rows) == 4 * 3 and len({r["question_id"] for r in rows}) == 3
    table = {r["Schedule"]: r for r in report["table"]}
    for label, r in table.items():
        assert r["Match (%)"] == 100.0, label  # float64 greedy: every schedule equals AR
        assert r["Model ms/call"] > 0 and r["Regime"] == "eager"
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
            "--max-new-tokens", "6", "--no-grade", "--n-resamples", "100", "--replay", "--stream-mib", "1", "--json", str(out)]  # fmt: skip
    assert bench_schedules.main(argv) == 0
    printed = capsys.readouterr().out
    assert "random test weights" in printed and "| Packed-SS |" in printed and "Decoder us/iter" in printed
    table = json.loads(out.read_text())["table"]
    assert [r["Schedule"] for r in table] == ["Linear-SS", "Packed-SS"]
    assert all(0 < r["Decoder us/iter"] < 1e6 for r in table)


def test_bench_schedules_puts_compiled_rows_next_to_eager_rows(checkpoint, tmp_path, capsys):
    out = tmp_path / "compiled.json"
    argv = ["--model", str(checkpoint), "--limit", "3", "--schedules", "ar,packed", "--width", "2",
            "--max-new-tokens", "8", "--dtype", "float64", "--compile", "default", "--n-resamples", "200", "--stream-mib", "1",
            "--json", str(out)]  # fmt: skip
    assert bench_schedules.main(argv) == 0
    printed = capsys.readouterr().out
    assert "| Packed-SS | compiled:default |" in printed and "compile time per shape" in printed
    report = json.loads(out.read_text())
    # AR's 1-row call and packed's 2B = 6-row call, each compiled in the warm-up.
    assert set(report["compile_s"]["compiled:default"]) == {"ar W=2 1 rows", "packed W=2 6 rows"}
    assert [(r["schedule"], r["regime"]) for r in report["rows"][:4]] == [
        ("ar", "eager"), ("ar", "compiled:default"), ("packed", "eager"), ("packed", "compiled:default")]  # fmt: skip
    table = {(r["Schedule"], r["Regime"]): r for r in report["table"]}
    assert len(table) == 4
    for (label, regime), r in table.items():
        assert r["Match (%)"] == 100.0
        if regime == "eager":
            assert math.isnan(r["= eager (%)"]) and "Tok/s vs eager" not in r or isinstance(r.get("Tok/s vs eager"), float)
        else:
            assert r["= eager (%)"] == 100.0 and r["Compiled calls (%)"] == 100.0, label
            # No CUDA graph can replay on a CPU: the column says so instead of a number.
            assert r["CUDA-graph calls (%)"] == "n/a" and r["Graph skips"] == "n/a", label
            assert r["_vs_eager_low"] <= r["_vs_eager"] <= r["_vs_eager_high"]
    assert "| Compiled calls (%) | CUDA-graph calls (%) | Graph skips |" in printed


def test_replay_reproduces_the_decode_without_the_model(checkpoint):
    from packedss.decoding import LTRSettings, Sampling, decode_ltr
    from packedss.models.nemotron import load_nemotron

    model = load_nemotron(checkpoint, dtype="float64")
    settings = LTRSettings("packed", 3, 10, model.eos_token_ids, Sampling(0.0, "rejection", None))
    recorder = RecordingModel(model)
    real = decode_ltr(recorder, [5, 9, 11, 30, 7], settings)
    replay = Replay([logits for _, logits in recorder.calls], model.device, model.mask_token_id)
    again = decode_ltr(replay, [5, 9, 11, 30, 7], settings)
    assert again.tokens == real.tokens and again.nfe_total == real.nfe_total == replay.index


def test_batch_replay_reproduces_a_batched_decode_without_the_model():
    """BatchReplay hands each batched call the logits recorded for it: the same responses, every
    recorded call used once; a log recorded for other prompts is refused at its first call."""
    from packedss.decoding import LTRSettings, Sampling
    from packedss.decoding.driver import Response, schedule_named
    from packedss.decoding.engine import Request, decode_batched
    from packedss.decoding.schedules import LTR_DECODERS
    from packedss.models.batched import BatchedCalls
    from packedss.models.nemotron import load_nemotron

    model = load_nemotron(PROJECT_ROOT / "assets" / "models" / "tiny", dtype="float32")
    settings = LTRSettings("packed", 4, 12, model.eos_token_ids, Sampling(0.0, "rejection", None))
    packed = schedule_named(LTR_DECODERS, "packed")

    def decode(executor, prompts):
        requests = [Request(k, lambda m, p=p: Response(m, p, settings, None, packed)) for k, p in enumerate(prompts)]
        done = {request.key: out for request, out in decode_batched(executor, requests, 3)}
        return [done[k] for k in range(len(prompts))]

    prompts = [[5, 17, 33, 8, 91], [9, 4], [61, 62, 63, 64], [7, 7, 7]]
    executor = BatchedCalls(model, 3)
    with recording(executor) as log:
        real = decode(executor, prompts)
    assert executor.run.__func__ is BatchedCalls.run  # the recording ended with the block
    replay = BatchReplay(log, model.device, model.mask_token_id)
    again = decode(replay, prompts)
    assert [out.tokens for out in again] == [out.tokens for out in real]
    assert [out.call_requests for out in again] == [out.call_requests for out in real]
    assert replay.index == len(log) > 0
    with pytest.raises(RuntimeError, match="not the decode that was recorded"):
        decode(BatchReplay(log, model.device, model.mask_token_id), [[5, 17, 33, 8, 91, 2, 2, 2], [1], [2], [3]])


def test_bench_schedules_rejects_an_unknown_schedule(checkpoint):
    with pytest.raises(SystemExit, match="unknown schedules"):
        bench_schedules.main(["--model", str(checkpoint), "--schedules", "linear,fast"])


def test_products_are_every_linear_layer_and_the_head_on_the_call_rows():
    config = shape_config("test", None)
    adapter = random_adapter(config, torch.device("cpu"), torch.float32)
    products = Products(adapter, 5)
    layers = SHAPES["test"]["num_hidden_layers"]
    assert len(products.weights) == 7 * layers + 1  # q, k, v, o, gate, up, down per layer; the head
    assert products.weights[-1] is adapter.head.weight
    assert [x.shape for x in products.inputs] == [(5, w.shape[1]) for w in products.weights]
    assert products.seconds([products.one(None)])[0] > 0


def test_the_floor_streams_the_models_weight_shapes_past_the_cache_and_prints_per_call():
    from packedss.benchmark.calls import bench, render
    from packedss.benchmark.floors import RawRead, Stream, floor_entries

    adapter = random_adapter(shape_config("test", None), torch.device("cpu"), torch.float32)
    own = linear_weights(adapter)
    stream = Stream(adapter, 2**20)
    assert stream.weight_bytes == sum(w.numel() * 4 for w in own) < 2**20 <= stream.bytes
    assert stream.weights[: len(own)] == own  # the model's own weights first, then copies of them
    assert {tuple(w.shape) for w in stream.weights} == {tuple(w.shape) for w in own}
    assert all(w.dtype == torch.float32 for w in stream.weights)
    assert stream.bytes - 2**20 < max(w.numel() * 4 for w in own)  # no more copies than needed
    assert RawRead(adapter, stream.bytes).bytes == stream.bytes
    assert stream.gbs(0.5) == pytest.approx(stream.bytes / 0.5 / 1e9)
    big = Stream(adapter, 0)
    assert big.weights == own and big.bytes == big.weight_bytes
    assert set(floor_entries(adapter, 2**20)) == {("floor",), ("raw",), ("copy",)}
    results = bench(adapter, [2], [3], 0, 2, 2**20)
    for r in results:
        assert r["floor_ms"] == pytest.approx(1000 * r["weight_bytes"] / (r["stream_gbs"] * 1e9))
        assert r["floor_ratio"] == pytest.approx(r["median_ms"] / r["floor_ms"]) and r["raw_gbs"] > 0
    printed = render(results, "header")
    assert "| C | B | call | rows | ms | floor ms | call / floor | achieved (floor / call) |" in printed
    assert "eager/floor median per-call ratio (R = B, 2B):" in printed.splitlines()[-1]


def test_bench_calls_cuts_a_shape_to_its_layers_and_refuses_a_bad_count(tmp_path, capsys):
    out = tmp_path / "calls.json"
    argv = ["--shape", "test", "--layers", "1", "--device", "cpu", "--blocks", "2", "--prefix", "1", "--warmup", "0",
            "--iters", "1", "--stream-mib", "1", "--json", str(out)]  # fmt: skip
    assert bench_calls.main(argv) == 0
    run = json.loads(out.read_text())["runs"]["packedss"]
    config = shape_config("test", None, 1)
    adapter = random_adapter(config, torch.device("cpu"), torch.float32)
    assert run["params"] == sum(p.numel() for p in adapter.backbone.parameters()) + adapter.head.weight.numel()
    assert run["calls"][0]["weight_bytes"] == sum(w.numel() * 4 for w in linear_weights(adapter))
    capsys.readouterr()
    from packedss.errors import run_reporting

    assert run_reporting(lambda: bench_calls.main(["--shape", "test", "--layers", "3"])) == 2
    assert capsys.readouterr().err.strip() == "error: invalid layer count 3 for shape test; valid: 1..2"


def test_bench_schedules_times_the_same_decodes_on_a_cost_twin_per_width(checkpoint, tmp_path, capsys):
    from packedss.benchmark.schedules import predict

    out = tmp_path / "cost.json"
    argv = ["--model", str(checkpoint), "--limit", "3", "--schedules", "ar,linear,packed", "--width", "2,3",
            "--max-new-tokens", "10", "--cost-shape", "test", "--cost-layers", "1", "--cost-dtype", "bfloat16",
            "--n-resamples", "200", "--stream-mib", "1", "--no-grade", "--json", str(out)]  # fmt: skip
    status = bench_schedules.main(argv)
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    cost = "cost:test:1L:bfloat16:cpu"
    assert {(r["regime"], r["width"]) for r in report["rows"]} == {(g, w) for g in ("eager", cost) for w in (2, 3)}
    table = {(r["Schedule"], r["Regime"], r["W"]): r for r in report["table"]}
    assert len(table) == 3 * 2 * 2
    for (label, regime, width), r in table.items():
        assert r["Match (%)"] == 100.0
        if regime == cost:  # the very same decodes: outputs, NFE
            assert r["= eager (%)"] == 100.0 and r["NFE"] == table[(label, "eager", width)]["NFE"]
            assert r["Floor ms/call"] == pytest.approx(report["floors"][cost]["floor_ms"])
        else:
            assert r["Floor ms/call"] == pytest.approx(next(iter(report["floors"].values()))["floor_ms"])
        assert r["Floor / call (%)"] == pytest.approx(100 * r["Floor ms/call"] / r["Model ms/call"])
    frame = pd.DataFrame(report["rows"])
    checks = {(c["regime"], c["width"]): c for c in report["checks"]}
    assert set(checks) == {(g, w) for g in ("eager", cost) for w in (2, 3)}
    for (regime, width), c in checks.items():
        assert c["predicted"] == pytest.approx(predict(frame, regime, width))
        assert c["measured"] == pytest.approx(table[("Packed-SS", regime, width)]["_ratio"])
        assert c["within"] == (abs(c["measured"] / c["predicted"] - 1) <= 0.03)
    assert status == (0 if all(c["within"] for (g, _), c in checks.items() if g == cost) else 1)
    first = checks[(cost, 2)]
    assert printed.strip().splitlines()[-1] == (
        f"packed/linear tokens/s: {first['measured']:.3f} [{first['low']:.3f}, {first['high']:.3f}] at W=2 "
        f"(cost twin test:1L:bfloat16:cpu); predicted from NFE and call time: {first['predicted']:.3f}")  # fmt: skip


def test_the_prediction_is_prefills_plus_the_median_call_time_per_row_count_and_question():
    from packedss.benchmark.schedules import predict

    rows = [  # q1 linear: 2 calls of 3 rows after prefill; packed: 1 call of 6 rows, 1 of 3; tokens 4 each
        {"regime": "r", "width": 2, "question_id": "q1", "schedule": "linear", "output_tokens": 4, "prefill_s": 1.0,
         "call_rows": [5, 3, 3], "call_s": [1.0, 2.0, 4.0]},
        {"regime": "r", "width": 2, "question_id": "q1", "schedule": "packed", "output_tokens": 4, "prefill_s": 2.0,
         "call_rows": [7, 6, 3], "call_s": [2.0, 5.0, 9.0]},
        # q2 (a slower machine): its calls are costed by its own medians, not q1's
        {"regime": "r", "width": 2, "question_id": "q2", "schedule": "linear", "output_tokens": 2, "prefill_s": 1.0,
         "call_rows": [5, 3], "call_s": [1.0, 20.0]},
        {"regime": "r", "width": 2, "question_id": "q2", "schedule": "packed", "output_tokens": 2, "prefill_s": 1.0,
         "call_rows": [7, 6], "call_s": [1.0, 30.0]},
        {"regime": "other", "width": 2, "question_id": "q1", "schedule": "packed", "output_tokens": 4, "prefill_s": 9.0,
         "call_rows": [7, 6], "call_s": [9.0, 99.0]},
    ]  # fmt: skip
    # q1: median of the 3-row calls (2, 4, 9) = 4: linear 1 + 4 + 4 = 9 s, packed 2 + 5 + 4 = 11 s
    # q2: linear 1 + 20 = 21 s, packed 1 + 30 = 31 s
    assert predict(pd.DataFrame(rows), "r", 2) == pytest.approx((6 / 42) / (6 / 30))


def test_bench_schedules_refuses_a_bad_cost_shape_with_one_line(checkpoint, capsys):
    from packedss.errors import run_reporting

    assert run_reporting(lambda: bench_schedules.main(["--model", str(checkpoint), "--cost-shape", "nemotron3b",
                                                       "--cost-layers", "99"])) == 2  # fmt: skip
    assert capsys.readouterr().err.strip() == "error: invalid layer count 99 for shape nemotron3b; valid: 1..26"


def test_bench_calls_times_a_prefill_with_the_last_rows_logits_against_every_rows(tmp_path, capsys):
    from packedss.benchmark.calls import Prefill

    adapter = random_adapter(shape_config("test", None), torch.device("cpu"), torch.float32)
    tokens = torch.arange(4, 24)
    for read_from, rows in ((19, 1), (0, 20)):
        prefill = Prefill(adapter, tokens, read_from)
        assert prefill.call.read_from == read_from and adapter.run(prefill.call).shape == (rows, 64)
        adapter.commit(20)
        assert prefill.seconds([prefill.one(None)])[0] > 0 and adapter.cached_rows == 0  # reset, then committed 0
    out = tmp_path / "prefill.json"
    argv = ["--shape", "test", "--prefill", "30", "--warmup", "0", "--iters", "2", "--json", str(out)]
    assert bench_calls.main(argv) == 0
    result = json.loads(out.read_text())["runs"]["packedss"]["prefill"]
    assert result["prefill"] == 30 and result["ratio"] == pytest.approx(result["last_row_ms"] / result["every_row_ms"])
    assert "prefill of 30 tokens" in capsys.readouterr().out


def test_cuda_graph_calls_count_the_calls_after_prefill_that_replayed_a_graph():
    from packedss.benchmark.schedules import graph_replay_cells, graph_replays

    # The prefill (index 0) replays nothing; of the 4 later calls one ran without a graph.
    assert graph_replays({"graph_replays": [0, 1, 2, 0, 1], "cudagraph_skips": [0, 0, 0, 1, 0]}, 5) == (4, 3, 1)
    assert graph_replays({"graph_replays": [0, 1, 1]}, 3) == (2, 2, 0)
    assert graph_replays({"graph_replays": [2, 0, 1], "cudagraph_skips": [3, 0, 0]}, 3) == (2, 1, 0)  # prefill left out
    assert graph_replays({}, 3) == (None, None, None)  # eager, default mode, or a CPU: nothing counted
    assert graph_replays({"graph_replays": [1, 1]}, 3) == (None, None, None)  # not one entry per call
    run = pd.DataFrame({"counted_calls": [4, 2], "replay_calls": [3, 2], "graph_skips": [1, 0]})
    assert graph_replay_cells(run) == (pytest.approx(100 * 5 / 6), 1.0)
    run.loc[1, "replay_calls"] = None
    assert graph_replay_cells(run) == ("n/a", "n/a")


class _GraphAdapter:
    """A model that reports graph replays per call, as a static twin under CUDA graphs does."""

    device = torch.device("cpu")

    def __init__(self, replays):
        self.replays, self.call_stats = list(replays), {}

    def run(self, call):
        self.call_stats = {"graph_replays": self.replays.pop(0), "cudagraph_skips": 0}

    def synchronize(self):
        pass

    def commit(self, rows):
        pass


def test_the_call_timer_keeps_each_calls_graph_replays_and_nothing_on_the_eager_path():
    from packedss.benchmark.floors import Timer

    timer = Timer(_GraphAdapter([2, 0, 1]))
    for _ in range(3):
        timer.one(None)
    assert timer.replays == [2, 0, 1] and timer.skips == [0, 0, 0]
    eager = Timer(random_adapter(shape_config("test", None), torch.device("cpu"), torch.float32))
    eager.adapter.reset()
    from packedss.benchmark.calls import iteration_calls

    eager.one(iteration_calls(eager.adapter, 2, 0, ("ar",))["ar"])
    assert eager.replays == [] and eager.skips == []


def test_the_hbm_floor_is_the_weight_bytes_at_the_device_copy_bandwidth():
    from packedss.benchmark.floors import DeviceCopy, RawRead, achieved_gbs, floor_entries, floor_fields

    adapter = random_adapter(shape_config("test", None), torch.device("cpu"), torch.float32)
    raw = RawRead(adapter, 2**20)
    copy = DeviceCopy(raw, max_bytes=2**19)
    assert copy.bytes == 2**19 and copy.target.shape == copy.source.shape
    copy.target.zero_()
    copy.seconds([copy.one(None)])
    assert bool((copy.target == 1).all())  # it really copies
    assert copy.gbs(0.5) == pytest.approx(2 * 2**19 / 0.5 / 1e9)  # read + write
    entries = floor_entries(adapter, 2**20)
    times = {("floor",): [0.004, 0.002, 0.003], ("raw",): [0.001], ("copy",): [0.001, 0.003, 0.002]}
    fields = floor_fields(entries, times)
    stream, copy = entries[("floor",)][0], entries[("copy",)][0]
    assert fields["copy_gbs"] == pytest.approx(2 * copy.bytes / 0.002 / 1e9)
    assert fields["hbm_weights_ms"] == pytest.approx(1000 * stream.weight_bytes / (fields["copy_gbs"] * 1e9))
    assert fields["floor_ms"] == pytest.approx(1000 * stream.weight_bytes / (stream.bytes / 0.003))
    assert achieved_gbs(4e9, 2.0) == pytest.approx(2000.0)


def test_a_calls_hbm_floor_counts_its_weights_its_kv_read_and_the_kv_a_masked_call_repeats():
    from types import SimpleNamespace

    from packedss.benchmark.calls import SHAPES, traffic_fields
    from packedss.benchmark.floors import call_traffic
    from packedss.decoding.calls import Rule

    # the 8B shape's config without its 16 GB of weights: a stand-in adapter with one bfloat16 parameter
    config = SimpleNamespace(**SHAPES["nemotron8b"])
    weight = torch.zeros(1, dtype=torch.bfloat16)
    adapter = SimpleNamespace(backbone=SimpleNamespace(config=config, parameters=lambda: iter([weight])),
                              device=torch.device("cuda"))  # fmt: skip
    moved = call_traffic(adapter, 15_900_000_000, 1024 + 64, repeats=True)
    assert moved["kv_read"] == 34 * 2 * 8 * 128 * 2 * 1088 and round(moved["kv_read"] / 1e9, 2) == 0.15
    assert moved["kv_repeat"] == 2 * 34 * 2 * 32 * 128 * 2 * 1088 and round(moved["kv_repeat"] / 1e9, 2) == 1.21
    assert moved["total"] == 15_900_000_000 + moved["kv_read"] + moved["kv_repeat"]
    assert call_traffic(adapter, 10, 1088, repeats=False)["kv_repeat"] == 0
    fields = {"weight_bytes": 15_900_000_000, "copy_gbs": 4000.0}
    masked = SimpleNamespace(rows=64, rule=Rule.CUSTOM)
    causal = SimpleNamespace(rows=32, rule=Rule.CAUSAL)
    out = traffic_fields(adapter, fields, masked, 1024, compiled_ms=5.0, eager_ms=40.0)
    assert out["traffic"] == moved and out["eager_traffic"] == moved  # Packed-SS's call is masked on both paths
    assert out["compiled_hbm_floor_ms"] == pytest.approx(1000 * moved["total"] / 4e12) and out["compiled_hbm"] == pytest.approx(
        5.0 / out["compiled_hbm_floor_ms"])  # fmt: skip
    verify = traffic_fields(adapter, fields, causal, 1024, compiled_ms=5.0, eager_ms=40.0)
    assert verify["traffic"]["kv_repeat"] > 0 and verify["eager_traffic"]["kv_repeat"] == 0  # eager: SDPA's own causal
    adapter.device = torch.device("cpu")  # a CPU's kernels take the grouped heads as they are
    assert traffic_fields(adapter, fields, masked, 1024, 5.0, 40.0)["traffic"]["kv_repeat"] == 0


class _CudaLog:
    """Stand-ins for CUDA's events and synchronize that log what happens, in order."""

    def __init__(self, monkeypatch):
        self.log: list[str] = []
        log = self.log

        class Event:
            def __init__(self, enable_timing=False):
                self.at = None

            def record(self):
                self.at = len(log)
                log.append("record")

            def elapsed_time(self, end):
                return float(end.at - self.at)

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("synchronize"))


class _CudaAdapter:
    """A model on a (pretended) CUDA device whose calls log themselves."""

    device = torch.device("cuda")

    def __init__(self, log):
        self.log, self.call_stats = log, {}

    def run(self, call):
        self.log.append(f"run {call}")

    def commit(self, rows):
        pass


def test_every_timed_cuda_call_and_piece_of_work_starts_on_a_drained_device(monkeypatch):
    from packedss.benchmark.floors import TimedWork, Timer, round_robin

    cuda = _CudaLog(monkeypatch)
    timer = Timer(_CudaAdapter(cuda.log))

    class Work(TimedWork):
        def __init__(self):
            self.timer = timer

        def _run(self):
            cuda.log.append("run work")

    times = round_robin({"a": (timer, "a"), "b": (timer, "b"), "work": (Work(), None)}, warmup=1, iters=2)
    assert set(times) == {"a", "b", "work"} and all(len(v) == 2 for v in times.values())
    rounds = [["synchronize", "record", f"run {what}", "record"] for what in ("a", "b", "work")] * 3
    timed = [entry for one in rounds for entry in one]
    assert cuda.log[: len(timed)] == timed
    assert set(cuda.log[len(timed) :]) == {"synchronize"}  # then the events are read


def test_bench_schedules_runs_with_the_runners_exact_reductions(monkeypatch):
    from packedss.benchmark import schedules

    class Loaded(Exception):
        pass

    def load(*args):
        raise Loaded

    monkeypatch.setattr(schedules, "load", load)
    matmul, flags = torch.backends.cuda.matmul, ("allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction")
    before = ({flag: getattr(matmul, flag) for flag in flags}, torch.backends.cudnn.allow_tf32,
              torch.get_float32_matmul_precision())  # fmt: skip
    for flag in flags:
        setattr(matmul, flag, True)
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    try:
        with pytest.raises(Loaded):
            schedules.run(schedules.BenchSettings(device="cpu"))
        assert not any(getattr(matmul, flag) for flag in flags)
        assert not torch.backends.cudnn.allow_tf32 and torch.get_float32_matmul_precision() == "highest"
    finally:
        for flag, value in before[0].items():
            setattr(matmul, flag, value)
        torch.backends.cudnn.allow_tf32 = before[1]
        torch.set_float32_matmul_precision(before[2])


def test_compiled_calls_are_compiled_block_by_block_and_reported_after_each(tmp_path):
    from packedss.benchmark.calls import bench_compiled, call_rows, iteration_calls

    adapter = random_adapter(shape_config("test", None), torch.device("cpu"), torch.float32)
    adapter.reset()
    for block in (1, 2, 3):
        built = iteration_calls(adapter, block, 4, ("ar", "linear-draft", "linear-verify", "packed", "quadratic"))
        assert {kind: call.rows for kind, call in built.items()} == {kind: call_rows(kind, block) for kind in built}
    seen = []
    results, compile_s = bench_compiled(adapter, "default", [1, 2], [3], 0, 1, 2**20, rows={2, 4},
                                        on_result=lambda r, c: seen.append((list(r), dict(c))))  # fmt: skip
    first, second = seen
    assert {(r["block"], r["kind"]) for r in first[0]} == {(1, "packed"), (1, "quadratic")}  # 2 rows at B = 1
    assert sorted(first[1]) == ["C=3: 2 rows"]  # B = 2's 4-row call is compiled only when B = 2 comes
    assert {(r["block"], r["kind"]) for r in second[0]} - {(r["block"], r["kind"]) for r in first[0]} == {
        (2, "linear-draft"), (2, "linear-verify"), (2, "packed")}  # fmt: skip
    assert sorted(compile_s) == ["C=3: 2 rows", "C=3: 4 rows"] and second[0] == results


def test_bench_sampler_times_both_draws_on_the_same_rows_and_measures_their_peaks(capsys, tmp_path):
    """Its rows agree with the whole vocabulary's draw (random rows, fixed seeds: no boundary is
    hit), and the peak a whole-vocabulary draw adds over 2,048 x 1,000 rows is at least its two
    float64 copies, 31 MiB, while the blocked draw's stays far below it. --json holds the same
    figures, with the regime line's words, for gpu_check.sh's `sampler` step."""
    bench = runpy.run_path(str(PROJECT_ROOT / "scripts" / "bench_sampler.py"))
    written = tmp_path / "sampler.json"
    assert bench["main"](["--vocab", "1000", "--rows", "2048", "--repeats", "2", "--json", str(written)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("regime: one draw, softmax rows of float32, cpu (") and "1 intra-op thread(s)" in lines[0]
    [result] = json.loads(lines[-1])
    report = json.loads(written.read_text())
    assert report == {"regime": lines[0].removeprefix("regime: "), "device": "cpu", "results": [result], "done": True}
    assert (result["vocab"], result["rows"], result["agree"]) == (1000, 2048, 1.0)
    assert lines[1].startswith(f"V=1000 R=2048: whole {result['ms']['whole']:.3f} ms, blocked {result['ms']['blocked']:.3f} ms")
    peaks = result["peak_mib"]
    assert peaks["whole"] >= 30 and peaks["blocked"] < peaks["whole"] / 8, peaks
