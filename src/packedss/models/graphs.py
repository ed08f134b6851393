"""What the CUDA-graph regime (model.compile=reduce-overhead) really did in each call.

Inductor's CUDA-graph trees run a compiled graph's first call eagerly (their warm-up), record it
on the second and replay it from then on; they fall back to running it without a graph, with at
most a log line, when inductor skipped CUDA graphs for it at compile time (counted in
`torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]`) or when its inputs keep failing
the recording's invariants. torch counts no replays, so `GraphEvents` counts them itself, at
`torch.cuda.CUDAGraph.replay`, beside the recordings and compilations that dynamo's compilation
callbacks announce (`CallbackTrigger.CUDAGRAPH_RECORDING`, and every other trigger: a
compilation). The static path (packedss.models.static) reads them around each call: a record
carries per call `graph_replays` and `cudagraph_skips`, and a timed call that compiled or
recorded a graph fails the run.
"""

from __future__ import annotations

import functools

import torch
from torch._dynamo.callback import CallbackTrigger, callback_handler
from torch._dynamo.utils import counters

from packedss.errors import PackedSSError

# Runs of each (rows, window) graph in the warm-up: the trees' eager warm-up, the recording, and
# three replays, so that no timed call is the first replay of a graph either.
WARM_RUNS = 5


class GraphEvents:
    """Process-wide counts of graph replays, graph recordings, compilations and cudagraph skips."""

    def __init__(self) -> None:
        self.replays = 0
        self.recordings = 0
        self.compilations = 0

    def started(self, args) -> None:
        if args.callback_trigger == CallbackTrigger.CUDAGRAPH_RECORDING:
            self.recordings += 1
        else:
            self.compilations += 1

    def snapshot(self) -> tuple[int, int, int, int]:
        return (self.replays, self.recordings, self.compilations, counters["inductor"]["cudagraph_skips"])


@functools.cache
def graph_events() -> GraphEvents:
    """The one GraphEvents of the process, counting from its first use."""
    events = GraphEvents()
    callback_handler.register_start_callback(events.started)
    replay = torch.cuda.CUDAGraph.replay

    @functools.wraps(replay)
    def counted_replay(graph) -> None:
        events.replays += 1
        replay(graph)

    torch.cuda.CUDAGraph.replay = counted_replay
    return events


def timed_call_stats(before: tuple[int, int, int, int], rows: int) -> dict[str, int]:
    """The call's `graph_replays` and `cudagraph_skips` since `before` (a snapshot); a timed call
    that compiled or recorded a graph is an error (PackedSSError, one line)."""
    replays, recordings, compilations, skips = (b - a for a, b in zip(before, graph_events().snapshot()))
    if recordings or compilations:
        raise PackedSSError(
            f"a timed {rows}-row call under model.compile=reduce-overhead compiled {compilations} and recorded "
            f"{recordings} CUDA graphs after the warm-up; its time would include them (rerun with a warm-up decode "
            "of the same shapes, or model.compile=default)"
        )
    return {"graph_replays": replays, "cudagraph_skips": skips}
