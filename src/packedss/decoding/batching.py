"""Concurrency C: up to C responses decode together, each model call carrying every active
request's rows (continuous batching).

Every request runs the same decoder as at C = 1 (`drive`, unchanged), on its own slot of a batch
executor: its own cache, positions and attention rule. The decoders advance in lockstep rounds.
In a round each active request runs its host-side work up to its next call (in slot order, one
at a time), then one batched call runs all of their calls, and each gets its own logits back. A
request that finishes leaves its slot at the end of the round, and the next request takes the
slot at once: its prefill rides in the next batched call with the others' decode calls. So
requests join and leave independently; a static batch would instead wait for its slowest
request before the next C start.

The decoders keep their own control flow: each runs in a thread that holds the turn only
between two of its calls (a baton, never two at once), so a request's host work, its random
stream and its calls are exactly those it makes alone. A batched call's time is shared among its
requests in proportion to their rows: a request's model time is its share, its non-model time
its own host work, so the requests' wall times add up to the job's. Its latency is read on the
job's clock, from the start of the batched call holding its first call to the end of the one
holding its last.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from packedss.decoding.calls import Call
from packedss.decoding.trace import Decoded


class BatchExecutor(Protocol):
    """What batched decoding needs from a model (packedss.models.batched): request slots, each
    with its own cache, and one forward pass for one call of each of several slots."""

    device: torch.device
    mask_token_id: int
    # Seconds charged for the last batched call (a cost twin's model), None: its own run time.
    charged_s: float | None

    def run(self, items: Sequence[tuple[int, Call]]) -> list[torch.Tensor]:
        """Run each (slot, call) on its slot's cache in one forward pass; their logits in order."""

    def commit(self, slot: int, rows: int) -> None: ...

    def reset(self, slot: int) -> None: ...

    def call_stats(self, slot: int) -> dict[str, int]: ...

    def synchronize(self) -> None: ...


@dataclass(frozen=True)
class Request:
    """One response to decode: `key` names it for the caller; `decode(model)` decodes it on a
    CallModel (e.g. `lambda model: drive(model, prompt, settings, stop, schedule)`)."""

    key: Any
    decode: Callable[[Any], Decoded]


class _Aborted(BaseException):
    """Ends a request's thread when the batch stops early (an error or a signal elsewhere)."""


class _Clock:
    """The job's clock: host seconds less the time a cost twin's deciding model took (which is
    not the job's, as in trace.Meter)."""

    def __init__(self):
        self.excluded = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.excluded


class _Slot:
    """The CallModel a request's decoder sees: its calls go to the batch, its commits and resets
    to its own slot. `charged_s` is its share of its last batched call's time (the meter counts
    that as the call's model time and leaves the rest of the wait out of the request's wall)."""

    def __init__(self, batch: _Batch, slot: int, request: Request):
        self.batch, self.slot, self.request = batch, slot, request
        executor = batch.executor
        self.device, self.mask_token_id = executor.device, executor.mask_token_id
        self.call_stats: dict[str, int] = {}
        self.charged_s = 0.0
        self.first_call_start: float | None = None
        self.last_call_end = 0.0
        self.pending: Call | None = None
        self.logits: torch.Tensor | None = None
        self.result: Decoded | None = None
        self.error: BaseException | None = None
        self.finished = False
        self._turn = threading.Semaphore(0)
        self._yielded = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._main, daemon=True, name=f"request-slot-{slot}")

    # The decoder's side (its own thread).
    def run(self, call: Call) -> torch.Tensor:
        self.pending = call
        self._pass_turn()
        logits, self.logits = self.logits, None
        return logits

    def commit(self, rows: int) -> None:
        self.batch.executor.commit(self.slot, rows)

    def reset(self) -> None:
        self.batch.executor.reset(self.slot)

    def synchronize(self) -> None:
        """Nothing to wait for: the batch synchronizes after each batched call."""

    def _pass_turn(self) -> None:
        self._yielded.release()
        self._turn.acquire()
        if self.batch.aborted:
            raise _Aborted

    def _main(self) -> None:
        self._turn.acquire()
        try:
            if not self.batch.aborted:
                self.result = self.request.decode(self)
        except _Aborted:
            pass
        except BaseException as err:  # handed to the batch's thread, which raises it
            self.error = err
        finally:
            self.finished = True
            self._yielded.release()

    # The batch's side (the caller's thread).
    def resume(self) -> None:
        """Let the decoder run up to its next call, or to its end."""
        if not self._thread.is_alive() and not self.finished:
            self._thread.start()
        self._turn.release()
        self._yielded.acquire()


class _Batch:
    def __init__(self, executor: BatchExecutor):
        self.executor = executor
        self.aborted = False
        self.clock = _Clock()

    def call(self, slots: list[_Slot]) -> None:
        """One batched call of every slot's pending call."""
        executor = self.executor
        items = [(slot.slot, slot.pending) for slot in slots]
        started = self.clock.now()
        host_started = time.perf_counter()
        logits = executor.run(items)
        executor.synchronize()
        elapsed = time.perf_counter() - host_started
        charged = elapsed if executor.charged_s is None else executor.charged_s
        self.clock.excluded += elapsed - charged
        ended = self.clock.now()
        rows = sum(call.rows for _, call in items)
        for slot, out in zip(slots, logits):
            call = slot.pending
            slot.pending, slot.logits = None, out
            slot.charged_s = charged * call.rows / rows
            # The executor states the rows it evaluated when they are not the calls' (padding).
            slot.call_stats = {"call_requests": len(items), "call_batch_rows": rows} | executor.call_stats(slot.slot)
            if slot.first_call_start is None:
                slot.first_call_start = started
            slot.last_call_end = ended


def decode_batched(executor: BatchExecutor, requests: Iterable[Request], concurrency: int) -> Iterator[tuple[Request, Decoded]]:
    """Decode `requests` at most `concurrency` at a time on `executor`'s slots (continuous
    batching); yields each (request, decoded) when it finishes, in the order they finish. Slot k
    of the executor serves one request at a time. An error in a decoder ends the batch and is
    raised here; so does closing the iterator early, after the other requests' threads end."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    batch = _Batch(executor)
    queue = iter(requests)
    slots: list[_Slot | None] = [None] * concurrency

    def start(index: int) -> _Slot | None:
        request = next(queue, None)
        if request is None:
            return None
        slot = _Slot(batch, index, request)
        slot.resume()  # runs to its first call (the prefill)
        return slot

    try:
        for index in range(concurrency):
            slots[index] = start(index)
        while True:
            done = []
            for index, slot in enumerate(slots):
                while slot is not None and slot.finished:
                    if slot.error is not None:
                        raise slot.error
                    done.append((slot.request, _on_job_clock(slot)))
                    slot = slots[index] = start(index)
            yield from done
            waiting = [slot for slot in slots if slot is not None]
            if not waiting:
                return
            batch.call(waiting)
            for slot in waiting:
                slot.resume()
    finally:
        batch.aborted = True
        for slot in slots:
            if slot is not None and not slot.finished:
                slot.resume()  # raises _Aborted in its thread, which ends


def _on_job_clock(slot: _Slot) -> Decoded:
    decoded = slot.result
    latency = slot.last_call_end - slot.first_call_start if slot.first_call_start is not None else 0.0
    return replace(decoded, latency_s=latency)
