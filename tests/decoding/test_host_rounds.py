"""Host work per round: the heap is frozen while decodes run (packedss.decoding.driver.FrozenHeap),
at C = 1 and in a batch, and unfrozen when the last one ends, however it ends; a batched greedy
response without near-ties reads nothing back when it ends; scripts/bench_concurrency.py prints
its regime and the ratio line of each schedule, and with --phases a round's host time split by the
engine's phases (packedss.benchmark.phases), each phase holding its own work only."""

from __future__ import annotations

import gc
import re
import runpy
import time

import pytest
import torch

from packedss.benchmark.phases import PHASES, engine_phases
from packedss.decoding import LTRSettings, Sampling, decode_ltr
from packedss.decoding.driver import Response, schedule_named
from packedss.decoding.engine import Request, decode_batched
from packedss.decoding.schedules import LTR_DECODERS
from packedss.decoding.verify import verify
from packedss.models.batched import BatchedCalls
from packedss.models.nemotron import load_nemotron
from packedss.paths import PROJECT_ROOT
from tests.decoding.test_batching import _ToyBatch, _toy_requests
from tests.decoding.test_syncs import counting_read_backs
from tests.toy_ltr import ToyLTRModel

GREEDY = Sampling(0.0, "rejection", None)


class _FreezeWatch(ToyLTRModel):
    """A toy model that notes, at every call, how many objects the collector has frozen."""

    def __init__(self):
        super().__init__(vocab=8, seed=1)
        self.frozen: list[int] = []

    def run(self, call):
        self.frozen.append(gc.get_freeze_count())
        return super().run(call)


def test_a_decode_alone_runs_on_a_frozen_heap_and_unfreezes_it():
    assert gc.get_freeze_count() == 0
    model = _FreezeWatch()
    out = decode_ltr(model, [1, 2, 3], LTRSettings("packed", 3, 12, (), GREEDY))
    assert len(model.frozen) == out.nfe_total
    assert min(model.frozen) > 1000  # the modules, torch, the tests' own objects
    assert gc.get_freeze_count() == 0


class _FreezeWatchBatch(_ToyBatch):
    def __init__(self, slots, fail_at=None):
        super().__init__(slots, fail_at)
        self.frozen: list[int] = []

    def run(self, batch):
        self.frozen.append(gc.get_freeze_count())
        return super().run(batch)


def test_a_batch_runs_on_a_frozen_heap_until_its_last_decode_ends():
    first, second = _FreezeWatchBatch(2), _FreezeWatchBatch(2)
    one, other = decode_batched(first, _toy_requests(3), 2), decode_batched(second, _toy_requests(3), 2)
    next(one)
    next(other)  # two batches in progress, interleaved: the heap stays frozen until both end
    list(one)
    assert gc.get_freeze_count() > 0
    list(other)
    assert gc.get_freeze_count() == 0
    assert min(first.frozen + second.frozen) > 1000


def test_a_failed_batch_unfreezes_the_heap():
    with pytest.raises(RuntimeError, match="fell over"):
        list(decode_batched(_FreezeWatchBatch(3, fail_at=2), _toy_requests(5), 3))
    assert gc.get_freeze_count() == 0


def test_a_batched_response_without_near_ties_reads_nothing_back_when_it_ends(monkeypatch):
    """The near-tie flags come back with each round's verification, so a response whose deciding
    rows held none reads nothing more at its end (its near-ties' margins only when it has some)."""
    from packedss.decoding import verify as verify_module

    monkeypatch.setattr(verify_module, "NEAR_TIE_ULPS", 0.0)  # a margin of 0 only: none here
    settings = LTRSettings("packed", 4, 6, (), GREEDY)
    decoder = schedule_named(LTR_DECODERS, "packed")
    prompts = [[5, 17, 33], [9, 4], [61, 62, 63, 7]]

    def requests():
        return [Request(k, lambda m, k=k: Response(m, prompts[k], settings, None, decoder)) for k in range(3)]

    executor = BatchedCalls(load_nemotron(PROJECT_ROOT / "assets" / "models" / "tiny", dtype="float32"), 3)
    list(decode_batched(executor, requests(), 3))  # layouts and biases built once
    calls = []
    run = executor.run
    executor.run = lambda batch: calls.append(batch) or run(batch)
    with counting_read_backs(monkeypatch) as counts:
        finished = [out for _, out in decode_batched(executor, requests(), 3)]
    assert all(out.extra["near_ties"] == [] for out in finished)
    assert len(counts) <= len(calls), (counts, len(calls))  # one per round (the first call's none)


def bench_concurrency(capsys, args: list[str]) -> list[str]:
    """scripts/bench_concurrency.py's output lines for `args` (it must succeed)."""
    bench = runpy.run_path(str(PROJECT_ROOT / "scripts" / "bench_concurrency.py"))
    threads = torch.get_num_threads()
    try:
        assert bench["main"](args) == 0
    finally:
        torch.set_num_threads(threads)
    return capsys.readouterr().out.splitlines()


def test_bench_concurrency_prints_its_regime_and_a_ratio_line_per_schedule(capsys):
    lines = bench_concurrency(capsys, ["--schedules", "linear,ar", "--concurrency", "2,1", "--limit", "3", "--repeats", "2"])
    assert re.match(r"regime: tiny, arith, 3 questions, W=8, greedy, eager calls, float32, 1 intra-op thread\(s\), "
                    r"cpu \(.+, \d+ cores\), torch .+, 2 turns per level, load average [\d.]+ at the start$", lines[0])  # fmt: skip
    number = r"([\d.]+)"
    for schedule in ("linear", "ar"):
        turns = [line for line in lines if line.startswith(f"  {schedule} ")]
        assert len(turns) == 4  # two turns of C = 1 and C = 2, taken in rotation
        assert [re.search(r"C=(\d)", line).group(1) for line in turns] == ["1", "2", "1", "2"]
        hosts = {c: [float(re.search(r"host ms per round +" + number, line).group(1)) for line in turns if f"C={c} " in line]
                 for c in (1, 2)}  # fmt: skip
        (summary,) = [line for line in lines if line.startswith(f"{schedule}: ")]
        found = re.search(rf"; host ms per round C=1 {number}, C=2 {number}; host ms per round C=2/C=1: {number} "
                          rf"\(rotations {number}-{number}, median {number}\)$", summary)  # fmt: skip
        least = [float(found.group(1)), float(found.group(2))]
        assert least == pytest.approx([min(hosts[1]), min(hosts[2])], abs=1e-3)  # each level's least turn
        # The ratio is printed to 0.1, from least values the line rounds to 1e-3 ms.
        ratio, rounding = least[1] / least[0], least[1] / least[0] * 0.0005 * (1 / least[0] + 1 / least[1])
        assert float(found.group(3)) == pytest.approx(ratio, abs=0.051 + rounding)
        assert all(value > 0 for value in least)
        # Each rotation's C = 2 turn over its C = 1 turn, the turns here rounded to 1e-3 ms.
        rotations = sorted(two / one for one, two in zip(hosts[1], hosts[2]))
        printed = [float(found.group(k)) for k in (4, 5, 6)]
        expected = [rotations[0], rotations[-1], sum(rotations) / 2]
        slack = [0.051 + r * 0.0005 * (1 / min(hosts[1]) + 1 / min(hosts[2])) for r in expected]
        assert all(p == pytest.approx(e, abs=s) for p, e, s in zip(printed, expected, slack)), (printed, expected)
        rows = {c: [float(re.search(r"model us per row +" + number, line).group(1)) for line in turns if f"C={c} " in line]
                for c in (1, 2)}  # fmt: skip
        found = re.search(rf"^{schedule}: model us per evaluated row C=1 {number}, C=2 {number} \(C=2/C=1: {number}\);", summary)
        assert [float(found.group(1)), float(found.group(2))] == pytest.approx([min(rows[1]), min(rows[2])], abs=0.01)


def test_bench_concurrency_times_the_coroutines_beside_the_lanes(capsys, monkeypatch):
    """--coroutines adds a turn per C > 1 with every request as its coroutine, in the rotation, and
    a line per schedule of its least host ms per round beside the lanes'."""
    from packedss.decoding import engine

    batched, lockstep = engine.decode_batched, []

    def recorded(executor, requests, concurrency, lanes=True):
        lockstep.append(lanes)
        return batched(executor, requests, concurrency, lanes)

    monkeypatch.setattr(engine, "decode_batched", recorded)
    lines = bench_concurrency(capsys, ["--schedules", "linear", "--concurrency", "1,2", "--limit", "3", "--repeats", "2",
                                       "--coroutines"])  # fmt: skip
    turns = [line.split()[1:3] for line in lines if line.startswith("  linear ")]
    assert turns == [["C=1", "rounds"], ["C=2", "rounds"], ["C=2", "coroutines"]] * 2
    assert lockstep == [True, False] * 3  # the warm-ups, then two rotations: lanes, then coroutines
    hosts = [float(re.search(r"host ms per round +([\d.]+)", line).group(1)) for line in lines if line.startswith("  linear ")]
    (line,) = [line for line in lines if line.startswith("linear: as coroutines, ")]
    found = re.fullmatch(r"linear: as coroutines, host ms per round C=2 ([\d.]+) \(CPU [\d.]+; lanes / coroutines ([\d.]+)\); "
                         r"host ms per round C=2/C=1: ([\d.]+)", line)  # fmt: skip
    coroutines, lanes, one = min(hosts[2::3]), min(hosts[1::3]), min(hosts[0::3])
    assert float(found.group(1)) == pytest.approx(coroutines, abs=1e-3)
    # The line's ratio is of unrounded times, to 0.01; the turns' times here are rounded to 1e-3 ms.
    rounding = lanes / coroutines * 0.0005 * (1 / lanes + 1 / coroutines)
    assert float(found.group(2)) == pytest.approx(lanes / coroutines, abs=0.0051 + rounding)
    assert float(found.group(3)) == pytest.approx(coroutines / one, rel=0.05, abs=0.06)


@pytest.mark.parametrize("schedule", ["ar", "packed"])
def test_a_rounds_logits_are_let_go_before_the_next_batched_call(schedule):
    """Nothing of the engine keeps a round's logits once its host steps are done (the round's
    argmax cache included), so the next batched call's logits do not come on top of them."""
    import weakref

    model = load_nemotron(PROJECT_ROOT / "assets" / "models" / "tiny", dtype="float32")
    executor = BatchedCalls(model, 3)
    earlier, alive = [], []
    run = executor.run

    def watched(batch):
        alive.append(sum(ref() is not None for ref in earlier))
        logits = run(batch)
        earlier.append(weakref.ref(logits))
        return logits

    executor.run = watched
    settings = LTRSettings(schedule, 4, 10, (), GREEDY)
    decoder = schedule_named(LTR_DECODERS, schedule)
    prompts = [[5, 17, 33], [9, 4], [61, 62, 63, 7], [40, 41]]
    requests = [Request(k, lambda m, k=k: Response(m, prompts[k], settings, None, decoder)) for k in range(4)]
    list(decode_batched(executor, requests, 3))
    assert len(alive) > 5 and alive == [0] * len(alive)
    assert all(ref() is None for ref in earlier)  # nor after the batch


def test_bench_concurrency_replays_the_host_work_alone(capsys):
    """--replay adds a line per schedule: each level's host ms per round with the recorded logits
    replayed, no forward pass (scripts/bench_concurrency.py), and its ratio."""
    lines = bench_concurrency(capsys, ["--schedules", "packed", "--concurrency", "1,3", "--limit", "4", "--repeats", "2",
                                       "--replay"])  # fmt: skip
    (line,) = [line for line in lines if line.startswith("packed: replayed host ms per round (no forward pass) ")]
    found = re.search(r"C=1 ([\d.]+), C=3 ([\d.]+); C=3/C=1: ([\d.]+)$", line)
    one, three = float(found.group(1)), float(found.group(2))
    assert 0 < one and 0 < three
    assert float(found.group(3)) == pytest.approx(three / one, rel=0.05, abs=0.06)


def _burn(seconds: float) -> None:
    """Spend `seconds` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.mark.parametrize("lockstep", [False, True])
def test_engine_phases_put_each_piece_of_a_round_in_its_own_phase(lockstep, monkeypatch):
    """A decoder's stop check runs in its own Python; a batched verification's launch and finish
    in theirs; a lanes' round's readout in the launch (lanes make their results in their own
    Python): CPU time added to one of them lands in that phase alone (packedss.benchmark.phases)."""
    from packedss.decoding import batched_ops, engine

    counts = {"stop checks": 0, "verification waves": 0, "readouts": 0}

    def slow_stop(tokens, new):
        counts["stop checks"] += 1
        _burn(0.002)
        return None

    decoder = schedule_named(LTR_DECODERS, "linear")
    requests = [Request(k, lambda m, k=k: Response(m, [1, 2, 3][: 1 + k], LTRSettings("linear", 3, 6, (), GREEDY),
                                                   slow_stop, decoder))
                for k in range(3)]  # fmt: skip
    verifications, readout = batched_ops.BATCHED[verify], engine.Readout

    def slow_verifications(args, device):
        counts["verification waves"] += 1
        _burn(0.006)
        read, finish = verifications(args, device)
        return read, lambda values: _burn(0.006) or finish(values)

    def slow_readout(logits, deciding, confident=None):
        counts["readouts"] += 1
        _burn(0.006)
        return readout(logits, deciding, confident)

    list(decode_batched(_ToyBatch(3), _toy_requests(3), 3, lockstep))  # first calls' set-up (layouts, ops) out of the way
    monkeypatch.setitem(batched_ops.BATCHED, verify, slow_verifications)
    monkeypatch.setattr(engine, "Readout", slow_readout)
    with engine_phases() as ns:
        list(decode_batched(_ToyBatch(3), requests, 3, lockstep))
    ms = {phase: ns[phase] / 1e6 for phase in PHASES}
    stops, waves, readouts = counts["stop checks"], counts["verification waves"], counts["readouts"]
    assert stops >= 6 and (readouts >= 4 if lockstep else waves >= 2)
    assert (waves if lockstep else readouts) == 0
    # Each phase holds its added work, and less than 5 ms besides (the toy decode's own work, about
    # 1 ms here), while work leaking from another phase would add at least 6 ms.
    assert 2 * stops <= ms["decoders' own Python"] < 2 * stops + 5
    launched = 6 * (readouts if lockstep else waves)
    assert launched <= ms["batched steps' launch"] < launched + 5
    assert 6 * waves <= ms["their finish"] < 6 * waves + 5
    assert ms["call assembly"] + ms["meters' shares"] < 5


def test_engine_phases_restore_the_engine_when_the_block_ends():
    from packedss.decoding import batched_ops
    from packedss.decoding.engine import _Engine
    from packedss.decoding.trace import Meter

    before = (_Engine.batch, _Engine.advance_all, _Engine.step_lanes, _Engine.readout, Meter.share,
              dict(batched_ops.BATCHED))  # fmt: skip
    with pytest.raises(RuntimeError, match="fell over"):
        with engine_phases():
            assert _Engine.batch is not before[0] and batched_ops.BATCHED[verify] is not before[5][verify]
            list(decode_batched(_ToyBatch(3, fail_at=2), _toy_requests(5), 3))
    assert (_Engine.batch, _Engine.advance_all, _Engine.step_lanes, _Engine.readout, Meter.share,
            dict(batched_ops.BATCHED)) == before  # fmt: skip


def test_bench_concurrency_splits_a_round_by_phase(capsys):
    """--phases adds a line per schedule and C > 1 whose phases and rest add up to its round."""
    args = ["--schedules", "linear", "--concurrency", "1,2,3", "--limit", "3", "--repeats", "1", "--phases"]
    lines = [line for line in bench_concurrency(capsys, args) if "by phase" in line]
    assert [line.split(" host")[0] for line in lines] == ["linear: C=2", "linear: C=3"]
    for line in lines:
        body, round_ms = re.fullmatch(r".* by phase: (.*) \(round ([\d.]+)\)", line).groups()
        cells = dict(cell.rsplit(" ", 1) for cell in body.split(", "))
        assert list(cells) == [*PHASES, "the rest"], line
        values = [float(value) for value in cells.values()]
        # Greedy Linear-SS's requests are lanes, which make their results in their own Python.
        assert all(value > 0 for phase, value in zip(PHASES, values) if phase != "their finish")
        assert cells["their finish"] == "0.000"
        assert sum(values) == pytest.approx(float(round_ms), abs=0.004)
