"""Where a batched round's host time goes: the batch engine's phases (packedss.decoding.engine)
timed on the main thread's CPU clock, for scripts/bench_concurrency.py's `--phases`.

- call assembly: `_Engine.batch`, the batched call's tokens and positions from every request's call;
- batched steps' launch and their finish: each batched Host step (packedss.decoding.batched_ops
  BATCHED: the round's argmax, top-2 margins, samples and acceptance tests as tensor work), then
  the per-request results made from its read-back; for lanes (packedss.decoding.lockstep: greedy
  AR, Linear-SS and Packed-SS; set_lockstep: the any-order family's) the launch is the round's Readout (`_Engine.readout`) and there is
  no finish: a lane makes its results from the values read in its own Python;
- decoders' own Python: `_Engine.advance_all`, every request's coroutine from one result to its next
  call or Host step (its plans, emitter and stop check, near-tie notes, commits, record at its end),
  and `_Engine.step_lanes`, every lane's step from the round's values to its next call;
- meters' shares: each request's share of each batched call (trace.Meter.share);
- the rest: the round less the model call and the phases above (the waves' grouping and read-back,
  the results' Rows, the responses' starts, the engine's loop).

The engine's methods are wrapped on its class, and the batched steps in BATCHED, only while the
`engine_phases()` block runs; a wrapper's own cost, two clock reads a call, falls in its phase.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from packedss.decoding.batched_ops import BATCHED
from packedss.decoding.engine import _Engine
from packedss.decoding.trace import Meter

PHASES = ("call assembly", "batched steps' launch", "their finish", "decoders' own Python", "meters' shares")


def _timed(function, phase: str, ns: Counter):
    def timed(*args):
        started = time.thread_time_ns()
        try:
            return function(*args)
        finally:
            ns[phase] += time.thread_time_ns() - started

    return timed


def _timed_step(launch, ns: Counter):
    """A batched step whose launch and whose finish are timed, each in its phase."""

    def timed(args, device):
        started = time.thread_time_ns()
        try:
            read, finish = launch(args, device)
        finally:
            ns["batched steps' launch"] += time.thread_time_ns() - started
        return read, _timed(finish, "their finish", ns)

    return timed


@contextmanager
def engine_phases() -> Iterator[Counter]:
    """`with engine_phases() as ns:` the main thread's CPU nanoseconds in each of PHASES while the
    block runs (the module docstring says what each one holds)."""
    ns: Counter = Counter()
    saved = {"batch": _Engine.batch, "advance_all": _Engine.advance_all, "step_lanes": _Engine.step_lanes,
             "readout": _Engine.readout, "share": Meter.share}  # fmt: skip
    steps = dict(BATCHED)
    _Engine.batch = _timed(saved["batch"], "call assembly", ns)
    _Engine.advance_all = _timed(saved["advance_all"], "decoders' own Python", ns)
    _Engine.step_lanes = _timed(saved["step_lanes"], "decoders' own Python", ns)
    _Engine.readout = staticmethod(_timed(saved["readout"], "batched steps' launch", ns))
    Meter.share = _timed(saved["share"], "meters' shares", ns)
    BATCHED.update({function: _timed_step(launch, ns) for function, launch in steps.items()})
    try:
        yield ns
    finally:
        _Engine.batch, _Engine.advance_all, _Engine.step_lanes = saved["batch"], saved["advance_all"], saved["step_lanes"]
        _Engine.readout, Meter.share = staticmethod(saved["readout"]), saved["share"]
        BATCHED.update(steps)
