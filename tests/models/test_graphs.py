"""The CUDA-graph regime's proof, on a CPU: the warm-up runs every (rows, window) graph
WARM_RUNS times (the trees' warm-up, the recording, three replays), timed calls carry their graph
replays and cudagraph skips per call, and a timed call that compiles fails the run. On a CPU
model.compile=reduce-overhead runs as default; the tests switch the path's mode back after
construction so that its CUDA-graph bookkeeping runs on the CPU graphs."""

from __future__ import annotations

import collections

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling, decode_ltr
from packedss.errors import PackedSSError
from packedss.models import graphs
from packedss.models.nemotron import load_nemotron
from packedss.models.static import StaticCalls, enable_static, end_warmup
from packedss.paths import PROJECT_ROOT

PROMPT = [5, 17, 33, 8, 91, 12, 7]
pytestmark = pytest.mark.xdist_group("graph-model")  # one xdist worker compiles graph_model once


@pytest.fixture(scope="module")
def graph_model():
    model = enable_static(load_nemotron(PROJECT_ROOT / "assets" / "models" / "tiny", dtype="float32"), "default", 32)
    model.static.mode = "reduce-overhead"
    runs = collections.Counter()
    original = model.static._run_compiled

    def counted(key, inputs):
        runs[key] += 1
        return original(key, inputs)

    model.static._run_compiled = counted
    settings = LTRSettings("ar", 1, 12, (), Sampling(0.0, "rejection", None))
    decode_ltr(model, PROMPT, settings)  # the warm-up: the one-row call is compiled
    warm = dict(runs)
    end_warmup(model)
    return model, settings, warm


def test_the_warm_up_runs_every_graph_five_times(graph_model):
    model, _, warm = graph_model
    graph_keys = {(rows, lora, window) for (rows, lora), windows in model.static._graphs.items() for window in windows}
    assert graph_keys and graph_keys == set(warm)
    assert all(count >= graphs.WARM_RUNS for count in warm.values())


def test_timed_calls_carry_their_replays_and_skips(graph_model):
    model, settings, _ = graph_model
    out = decode_ltr(model, PROMPT, settings)
    assert len(out.extra["graph_replays"]) == len(out.extra["cudagraph_skips"]) == out.nfe_total
    assert set(out.extra["cudagraph_skips"]) == {0}
    assert set(out.extra["graph_replays"]) == {0}  # a CPU graph is no CUDA graph


def test_replays_are_counted_at_the_cuda_graph():
    events = graphs.graph_events()
    before = events.replays
    with pytest.raises(Exception):
        torch.cuda.CUDAGraph.replay(object())  # not a graph: the replay itself fails, after the count
    assert events.replays == before + 1


def test_a_timed_call_that_compiles_fails_the_run(graph_model, monkeypatch):
    model, settings, _ = graph_model
    original = StaticCalls._run

    def compiling(self, call, bias, lora):
        torch.compile(lambda x: x * 3 - 1, backend="eager")(torch.ones(2))  # a fresh frame: dynamo compiles it
        return original(self, call, bias, lora)

    monkeypatch.setattr(StaticCalls, "_run", compiling)
    with pytest.raises(PackedSSError, match=r"timed \d+-row call .* compiled 1 and recorded 0 CUDA graphs") as err:
        decode_ltr(model, PROMPT, settings)
    assert "\n" not in str(err.value)
