"""Concurrency C: up to C responses decode together, each model call carrying every active
request's rows (continuous batching), in one thread.

Every request's decoder is the coroutine it is at C = 1 (packedss.decoding.driver.Response): it
yields each call and each Host step and receives their results. The engine advances all of them in
lockstep rounds. In a round:

1. host waves: every request waiting on a Host step gets its result; the same step of every
   request runs at once where it has a batched form (packedss.decoding.batched_ops, greedy
   decoding), with one read-back for the wave, and one request at a time otherwise (T > 0: each
   request's own generator);
2. requests that ended leave their slots, and the next requests take them at once;
3. one batched call (CallBatch) runs every request's call; each gets its own logits back.

A request's prefill thus rides in the next batched call beside the others' decode calls.

Greedy AR, Linear-SS and Packed-SS requests (the Nemotron family's, SDAR's and the any-order
family's) are lanes instead (packedss.decoding.lockstep, set_lockstep): no
coroutine and no host wave; after each batched call the round's
logits are read once (`readout`) and every lane steps on the values read (`step_lanes`) to its
next call. Lanes and coroutines can share a round; `decode_batched(..., lockstep=False)` runs
every request as its coroutine.

Time: a batched call's model time is shared among its requests in proportion to their rows. The
host time between two batched calls is shared equally among the requests that worked in it, since
their host steps now run together. So a request's wall time is its shares of both, and the
requests' wall times add up to the job's (less the time the caller spends between results). Its
latency is read on the job's clock, from the start of the batched call holding its first call to
the end of the one holding its last.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch

from packedss.decoding.batched_ops import BATCHED, end_round, read_back
from packedss.decoding.calls import Call, Layout, Listed, Planned
from packedss.decoding.driver import FrozenHeap, Host, Response
from packedss.decoding.lockstep import Lane, Readout, steps_in_lockstep
from packedss.decoding.set_lockstep import SetLane, set_steps_in_lockstep
from packedss.decoding.rows import Rows, concatenated, materialized, shifted, uploaded
from packedss.decoding.trace import Decoded


class Entry(NamedTuple):
    """One request's call in a batched call: its slot, layout, rows (`start` is its first row in
    the batch) and the rows before `read_from` whose logits are not returned."""

    slot: int
    layout: Layout
    rows: int
    read_from: int
    start: int


@dataclass(frozen=True)
class CallBatch:
    """One call of each of several request slots: their tokens and positions, concatenated."""

    entries: list[Entry]
    tokens: torch.Tensor
    positions: torch.Tensor

    def call(self, k: int) -> Call:
        """Entry k's call, on its own."""
        entry = self.entries[k]
        rows, layout = slice(entry.start, entry.start + entry.rows), entry.layout
        return Call(self.tokens[rows], self.positions[rows], layout.roles, layout.attend, useful=layout.useful,
                    drafts=layout.drafts, read_from=entry.read_from, rule=layout.rule)  # fmt: skip


class BatchExecutor(Protocol):
    """What batched decoding needs from a model (packedss.models.executors): request slots, each
    with its own cache, and one forward pass for one call of each of several slots."""

    device: torch.device
    mask_token_id: int
    # Seconds charged for the last batched call (a cost twin's model), None: its own run time.
    charged_s: float | None

    def run(self, batch: CallBatch) -> torch.Tensor:
        """Run each entry's call on its slot's cache in one forward pass; the logits of every
        entry's read rows, entry after entry."""

    def commit(self, slot: int, rows: int) -> None: ...

    def reset(self, slot: int) -> None: ...

    def call_stats(self, slot: int) -> dict[str, int]: ...

    def synchronize(self) -> None: ...


@dataclass(frozen=True)
class Request:
    """One response to decode: `key` names it for the caller; `start(model)` makes its Response
    on a CallModel (e.g. `lambda model: Response(model, prompt, settings, stop, schedule)`)."""

    key: Any
    start: Callable[[Any], Response]


class SlotModel:
    """The CallModel a request's decoder sees: its commits and resets go to its own slot (its
    calls go to the engine, which batches them)."""

    def __init__(self, executor: BatchExecutor, slot: int):
        self.executor, self.slot = executor, slot
        self.device, self.mask_token_id = executor.device, executor.mask_token_id
        self.call_stats: dict[str, int] = {}

    def run(self, call: Call) -> torch.Tensor:
        raise RuntimeError("a batched request's calls run through the engine")

    def commit(self, rows: int) -> None:
        self.executor.commit(self.slot, rows)

    def reset(self) -> None:
        self.executor.reset(self.slot)

    def synchronize(self) -> None:
        """Nothing to wait for: the engine synchronizes after each batched call."""


class _Slot:
    __slots__ = ("index", "request", "steps", "send", "meter", "rows", "lane", "op", "decoded", "host_s",
                 "first_call_start", "last_call_end")  # fmt: skip

    def __init__(self, index: int, request: Request, response: Response, lane: Lane | SetLane | None):
        self.index, self.request = index, request
        self.steps, self.send, self.meter = response.steps, response.steps.send, response.meter
        self.rows = response.decoder.batched_steps  # its results as Rows (else as tensors)
        self.lane = lane  # its flat state, stepped by the engine (else its coroutine runs)
        self.op = None
        self.decoded: Decoded | None = None
        self.host_s = 0.0
        self.first_call_start: float | None = None
        self.last_call_end = 0.0

    def close(self) -> None:
        """End its decode early, dropping its slot's cache."""
        if self.lane is not None:
            self.lane.close()
        else:
            self.steps.close()


class _Engine:
    def __init__(self, executor: BatchExecutor, lockstep: bool = True):
        self.executor = executor
        self.lockstep = lockstep  # greedy AR, Linear-SS and Packed-SS as Lanes (packedss.decoding.lockstep)
        self.excluded = 0.0  # time off the job's clock: the caller's, and a cost twin's deciding model's
        self.mark = self.now()  # the start of the host time not shared yet
        self.working: dict[int, _Slot] = {}  # the slots that worked since `mark`, by index
        self.confident_lanes = False  # a SetLane started: rounds read the confidences lanes ask for

    def now(self) -> float:
        return time.perf_counter() - self.excluded

    def start(self, index: int, request: Request) -> _Slot:
        response = request.start(SlotModel(self.executor, index))
        lane = self.lane_of(response.decoder) if self.lockstep else None
        if lane is not None:
            slot = _Slot(index, request, response, lane)
            slot.op = slot.lane.call()
            self.working[index] = slot
            return slot
        slot = _Slot(index, request, response, None)
        self.advance(slot, None)
        return slot

    def lane_of(self, decoder) -> Lane | SetLane | None:
        """The lane `decoder` steps as (None: it runs as its coroutine)."""
        if steps_in_lockstep(decoder):
            return Lane(decoder)
        if set_steps_in_lockstep(decoder):
            self.confident_lanes = True
            return SetLane(decoder)
        return None

    def advance(self, slot: _Slot, result) -> None:
        self.advance_all([slot], [result])

    def settle(self) -> None:
        """Share the host time since `mark` equally among the slots that worked in it."""
        if not self.working:
            return
        now = self.now()
        share = (now - self.mark) / len(self.working)
        for slot in self.working.values():
            slot.host_s += share
        self.mark = now
        self.working.clear()

    def host_wave(self, slots: list[_Slot]) -> None:
        """The Host step every slot waits on: batched where it can be, with one read-back."""
        groups: dict[tuple, list[_Slot]] = {}
        for slot in slots:
            op = slot.op
            launch = BATCHED.get(op.fn)
            if launch is None:
                self.advance(slot, op.fn(*map(materialized, op.args)))
                continue
            sampling = op.args[-1]
            key = (launch, sampling.temperature, sampling.rule)
            members = groups.get(key)
            if members is None:
                groups[key] = [slot]
            else:
                members.append(slot)
        launched, reads = [], []
        for (launch, *_), members in groups.items():
            read, finish = launch([slot.op.args for slot in members], self.executor.device)
            launched.append((members, finish, 0 if read is None else len(read)))
            if read is not None:
                reads.append(read)
        values = []
        if reads:
            values = (reads[0] if len(reads) == 1 else torch.cat(reads)).tolist()
            read_back()
        start = 0
        for members, finish, size in launched:
            self.advance_all(members, finish(values if len(launched) == 1 else values[start : start + size]))
            start += size

    def advance_all(self, slots: list[_Slot], results: Iterable) -> None:
        """Send each slot its result; keep its next step, or its Decoded when it ended."""
        working = self.working
        for slot, result in zip(slots, results):
            working[slot.index] = slot
            try:
                slot.op = slot.send(result)
            except StopIteration as stop:
                slot.op, slot.decoded = None, stop.value

    def call(self, slots: list[_Slot]) -> None:
        """One batched call of every slot's pending call; each slot gets its logits."""
        batch = self.batch(slots)
        executor = self.executor
        end_round()
        self.settle()
        started, clock = self.now(), time.perf_counter()
        logits = executor.run(batch)
        executor.synchronize()
        elapsed = time.perf_counter() - clock
        charged = elapsed if executor.charged_s is None else executor.charged_s
        self.excluded += elapsed - charged
        ended = self.mark = self.now()
        entries, call_stats = batch.entries, executor.call_stats
        requests, total, read, coroutines, results, lanes = len(entries), batch.tokens.shape[0], 0, [], [], []
        per_row = charged / total
        for slot, entry in zip(slots, entries):
            rows = entry.rows
            count = rows - entry.read_from
            if slot.lane is not None:
                lanes.append((slot, read, count))
            else:
                coroutines.append(slot)
                results.append(Rows(logits, read, read + count) if slot.rows else logits[read : read + count])
            read += count
            slot.meter.share(rows, entry.layout.useful, call_stats(entry.slot), requests, total, per_row * rows)
            if slot.first_call_start is None:
                slot.first_call_start = started
            slot.last_call_end = ended
        if lanes:
            deciding = [slot.lane.deciding(start, count) for slot, start, count in lanes]
            confident = ([slot.lane.confident(start, count) for slot, start, count in lanes] if self.confident_lanes
                         else None)  # fmt: skip
            round_readout = self.readout(logits, deciding, confident)
            round_readout.values = round_readout.read.tolist()
            self.step_lanes(lanes, round_readout)
        self.advance_all(coroutines, results)

    @staticmethod
    def readout(logits: torch.Tensor, deciding: list[tuple[int, int]],
                confident: list[tuple[int, int]] | None) -> Readout:  # fmt: skip
        """The round's argmax, the near-tie flags and margins of its lanes' deciding rows
        (`deciding`: each lane's first read row and its deciding rows) and the confidences of the
        rows set lanes order a block by (`confident`, alike; None: no lane asks), on the device."""
        return Readout(logits, deciding, confident)

    def step_lanes(self, lanes: list[tuple[_Slot, int, int]], round_readout: Readout) -> None:
        """Step each lane on its rows of the round (`(slot, first read row, rows read)`): its
        next call, or its Decoded when it ended."""
        working = self.working
        for k, (slot, start, count) in enumerate(lanes):
            working[slot.index] = slot
            lane = slot.lane
            decoded = lane.step(round_readout, start, count, k)
            if decoded is None:
                slot.op = lane.call()
            else:
                slot.op, slot.decoded = None, decoded

    def batch(self, slots: list[_Slot]) -> CallBatch:
        """The CallBatch of every slot's pending call, in a fixed number of tensor operations."""
        entries, tokens, positions, shifts, start = [], [], [], [], 0
        listed: list[tuple[int, int, Listed]] = []  # the listed calls, their places among the parts
        for slot in slots:
            op = slot.op
            kind = type(op)
            if kind is Planned:
                rows, layout, read_from = op.offsets.shape[0], op.layout, 0
                tokens += op.parts
                positions.append(op.offsets)
                shifts.append(op.position)
            elif kind is Listed:
                rows, layout, read_from = len(op.ids) >> 1, op.layout, op.read_from
                listed.append((len(tokens), len(positions), op))
                tokens.append(None)  # its Rows of the round's copy, below
                positions.append(None)
                shifts.append(0)
            else:
                rows, read_from = op.rows, op.read_from
                layout = Layout(op.roles, op.attend, op.rows_useful, op.draft_rows, op.rule)
                tokens.append(op.tokens)
                positions.append(op.positions)
                shifts.append(0)
            entries.append(Entry(slot.index, layout, rows, read_from, start))
            start += rows
        device = self.executor.device
        if listed:
            copy = self.upload([op for *_, op in listed], device)
            if len(listed) == len(entries):  # every call listed: the copy holds the tokens, then the positions
                return CallBatch(entries, copy[:start], copy[start:])
            half = copy.shape[0] // 2
            for token_place, position_place, op in listed:
                tokens[token_place] = op.uploaded
                positions[position_place] = Rows(copy, half + op.start, half + op.start + (len(op.ids) >> 1))
        position_ids = shifted(concatenated(positions, device), shifts, [e.rows for e in entries], device)
        return CallBatch(entries, concatenated(tokens, device), position_ids)

    @staticmethod
    def upload(listed: list[Listed], device: torch.device) -> torch.Tensor:
        """Copy the ids of every call of `listed` to the device at once: all of their tokens, then
        all of their positions. Each call's tokens are then its rows of the copy (Listed.copy, .start)."""
        host_tokens: list[int] = []
        host_positions: list[int] = []
        for op in listed:
            rows = len(op.ids) >> 1
            op.start = len(host_tokens)
            host_tokens += op.ids[:rows]
            host_positions += op.ids[rows:]
        copy = uploaded(host_tokens + host_positions, device)
        for op in listed:
            op.copy = copy
        return copy

    def result(self, slot: _Slot) -> Decoded:
        """The slot's Decoded (its own, fresh from its meter), with its times on the job's clock."""
        decoded = slot.decoded
        decoded.wall_s, decoded.nonmodel_s = decoded.model_s + slot.host_s, slot.host_s
        decoded.latency_s = slot.last_call_end - slot.first_call_start if slot.first_call_start is not None else 0.0
        return decoded


def decode_batched(executor: BatchExecutor, requests: Iterable[Request], concurrency: int,
                   lockstep: bool = True) -> Iterator[tuple[Request, Decoded]]:  # fmt: skip
    """Decode `requests` at most `concurrency` at a time on `executor`'s slots (continuous
    batching); yields each (request, decoded) when it finishes, in the order they finish. Slot k
    of the executor serves one request at a time. An error in a decoder, or a signal, ends the
    batch and is raised here; closing the iterator early ends it too. Either way every unfinished
    request's coroutine is closed, which drops its slot's cache. With `lockstep` (the default),
    greedy AR, Linear-SS and Packed-SS requests (Nemotron's and SDAR's) are stepped on flat state
    (packedss.decoding.lockstep), with the same records; without it every request runs as its
    coroutine (the reference the lockstep tests compare with)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    engine = _Engine(executor, lockstep)
    queue = iter(requests)
    slots: list[_Slot | None] = [None] * concurrency
    try:
        with FrozenHeap():
            for index in range(concurrency):
                request = next(queue, None)
                slots[index] = None if request is None else engine.start(index, request)
            while True:
                active = [slot for slot in slots if slot is not None]
                waiting = [slot for slot in active if type(slot.op) is Host]
                if waiting:
                    engine.host_wave(waiting)
                    continue
                finished = [slot for slot in active if slot.decoded is not None]
                if finished:
                    engine.settle()
                    done = [(slot.request, engine.result(slot)) for slot in finished]
                    for slot in finished:
                        slots[slot.index] = None
                    paused = time.perf_counter()
                    yield from done
                    engine.excluded += time.perf_counter() - paused
                    for slot in finished:
                        request = next(queue, None)
                        slots[slot.index] = None if request is None else engine.start(slot.index, request)
                    continue
                if not active:
                    return
                engine.call(active)
    finally:
        end_round()
        for slot in slots:
            if slot is not None:
                slot.close()
