"""Per-response bookkeeping: emitted tokens, stops, and every cost field of a record (docs/records.md §2)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from packedss.decoding.calls import Call, CallModel

# (tokens emitted so far, how many of them are new) -> how many tokens to keep when a
# stop string was completed by one of the new tokens, else None.
StopCheck = Callable[[Sequence[int], int], "int | None"]


@dataclass
class Decoded:
    """One response and what it cost. Per iteration after prefill: `accepted` holds the tokens
    emitted (the prefill call emits the first token), so that
    1 + sum(accepted) - truncated_tokens == len(tokens); `drafted` the drafts its verification
    checked and `accepted_drafts` how many of them it accepted (their sums are `draft_proposed`
    and `draft_accepted`)."""

    tokens: list[int]
    finish_reason: str  # "eos" | "max_tokens" | "stop"
    prompt_tokens: int
    nfe_total: int
    nfe_prefill: int
    iterations: int
    accepted: list[int]
    drafted: list[int]
    accepted_drafts: list[int]
    rows_evaluated: list[int]
    rows_useful: list[int]
    draft_proposed: int
    draft_accepted: int
    truncated_tokens: int
    wall_s: float
    model_s: float
    nonmodel_s: float
    call_model_s: list[float]  # synchronized model time of each call (prefill first)
    # From the start of the first call to the end of the last (the job's clock at concurrency > 1).
    latency_s: float
    call_requests: list[int]  # requests each call carried (1 unless calls are batched)
    call_batch_rows: list[int]  # rows of each call over all its requests (rows_evaluated unless batched)
    extra: dict = field(default_factory=dict)  # family-specific per-call fields (e.g. any-order u, p)

    def cost_fields(self) -> dict:
        fields = asdict(self)
        fields.pop("tokens")
        fields.pop("extra")
        return fields | self.extra


class Emitter:
    """Collects emitted tokens and applies the stops: EOS, max_new_tokens, stop strings.
    Tokens emitted past a stop are discarded (the driver counts them: `Decoded.truncated_tokens`)."""

    def __init__(self, max_new_tokens: int, eos_token_ids: Sequence[int], stop_check: StopCheck | None):
        self.max_new_tokens = max_new_tokens
        self.eos = frozenset(eos_token_ids)
        self.stop_check = stop_check
        self.tokens: list[int] = []
        self.finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def emit(self, new: Sequence[int]) -> bool:
        """Append the tokens of one call; returns True when decoding must stop."""
        keep, reason = len(new), None
        if not self.eos.isdisjoint(new):
            keep, reason = next(k + 1 for k, token in enumerate(new) if token in self.eos), "eos"
        room = self.max_new_tokens - len(self.tokens)
        if keep > room or (keep == room and reason is None):
            keep, reason = room, "max_tokens"
        self.tokens.extend(new[:keep])
        if self.stop_check is not None and keep > 0:
            cut = self.stop_check(self.tokens, keep)
            if cut is not None:
                keep -= len(self.tokens) - cut
                del self.tokens[cut:]
                reason = "stop"
        self.finish_reason = reason
        return reason is not None


TIMINGS = ("sync", "events")
BATCH_STATS = ("call_requests", "call_batch_rows")


class Meter:
    """Runs calls on a model, timing each and counting rows.

    `timing="sync"` (the default): each call is timed on the host around `run` + a device
    synchronize, so model time and non-model time add up to the wall time as in the paper's
    decomposition. `timing="events"` (CUDA only): each call is bracketed by two CUDA events and
    nothing waits for the device inside an iteration except the schedule's read-back of the
    accepted length; the event times are read once, in `finish`, and a call's time is the device
    time from the moment its first kernel could start to the end of its last one.

    A model with a `charged_s` attribute (a cost twin, packedss.models.cost_twin) states after each
    call the seconds the call is charged: that is the call's model time, and the rest of the time
    spent in the call (the model that decides the tokens) is left out of the wall time too. Such a
    model is always timed on the host ("sync").

    In a batch (packedss.decoding.engine) the engine runs the calls: it counts each request's share
    of each batched call here (`share`), with the requests and rows of the whole call
    (BATCH_STATS), and sets the response's times when it ends."""

    def __init__(self, model: CallModel, timing: str = "sync"):
        if timing not in TIMINGS:
            raise ValueError(f"unknown timing {timing!r}; valid: {TIMINGS}")
        self.model = model
        self.rows_evaluated: list[int] = []
        self.rows_useful: list[int] = []
        self.call_model_s: list[float] = []
        self.call_stats: dict[str, list[int]] = {}  # the model's own per-call statistics, by name
        self.charged = hasattr(model, "charged_s")
        self.cuda = timing == "events" and torch.device(model.device).type == "cuda" and not self.charged
        self.excluded_s = 0.0  # time inside calls that is not charged to them (cost twin): not wall
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.started = time.perf_counter()
        self.call_requests: list[int] = []
        self.call_batch_rows: list[int] = []
        self._shares: list[tuple] = []  # each call's (rows, useful, requests, batch rows, stats) until finish
        self._first_call: float | None = None  # the wall clock (less excluded time) at the first call
        self._last_end = 0.0

    def run(self, call: Call) -> torch.Tensor:
        if self._first_call is None:
            self._first_call = time.perf_counter() - self.excluded_s
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            logits = self.model.run(call)
            end.record()
            self._events.append((start, end))
        else:
            start = time.perf_counter()
            logits = self.model.run(call)
            self.model.synchronize()
            elapsed = time.perf_counter() - start
            if self.charged:
                self.excluded_s += elapsed - self.model.charged_s
                elapsed = self.model.charged_s
            self.call_model_s.append(elapsed)
            self._last_end = time.perf_counter() - self.excluded_s
        self.share(call.rows, call.rows_useful, self.model.call_stats, 1, call.rows)
        return logits

    def share(self, rows: int, useful: int, stats: dict, requests: int, batch_rows: int, model_s: float | None = None) -> None:
        """Count a call of `rows` rows (`useful` of them not padding) and the model's statistics of
        it (a dict the model does not change after the call), the call one of `requests` requests
        with `batch_rows` rows in all (or the model's own `call_batch_rows`, a padded pass's); in a
        batch also the response's share of its model time, `model_s`. Kept as one tuple per call
        and spread into the per-call lists by `finish`, so a batched round's share is one append."""
        self._shares.append((rows, useful, requests, batch_rows, stats))
        if model_s is not None:
            self.call_model_s.append(model_s)

    def _spread_shares(self) -> None:
        """The per-call lists (rows, requests, the model's statistics) of the calls shared so far."""
        if not self._shares:
            return
        rows, useful, requests, batch_rows, stats = zip(*self._shares)
        self.rows_evaluated += rows
        self.rows_useful += useful
        self.call_requests += requests
        self.call_batch_rows += [own.get("call_batch_rows", total) for own, total in zip(stats, batch_rows)]
        for own in stats:
            for name, value in own.items():
                if name not in BATCH_STATS:
                    self.call_stats.setdefault(name, []).append(value)
        self._shares.clear()

    def finish(
        self,
        emitter: Emitter,
        prompt_tokens: int,
        accepted: list[int],
        drafted: list[int],
        accepted_drafts: list[int],
        truncated_tokens: int,
        extra: dict | None = None,
    ) -> Decoded:
        if self.cuda:
            self.model.synchronize()
        self._spread_shares()
        wall_s = time.perf_counter() - self.started - self.excluded_s
        latency_s = self._last_end - self._first_call if self._first_call is not None else 0.0
        if self._events:
            self.call_model_s = [start.elapsed_time(end) / 1000.0 for start, end in self._events]
            latency_s = self._events[0][0].elapsed_time(self._events[-1][1]) / 1000.0
            self._events = []
        model_s = sum(self.call_model_s)
        return Decoded(
            tokens=list(emitter.tokens),
            finish_reason=emitter.finish_reason or "max_tokens",
            prompt_tokens=prompt_tokens,
            nfe_total=len(self.rows_evaluated),
            nfe_prefill=1,
            iterations=len(accepted),
            accepted=accepted,
            drafted=drafted,
            accepted_drafts=accepted_drafts,
            rows_evaluated=self.rows_evaluated,
            rows_useful=self.rows_useful,
            draft_proposed=sum(drafted),
            draft_accepted=sum(accepted_drafts),
            truncated_tokens=truncated_tokens,
            wall_s=wall_s,
            model_s=model_s,
            nonmodel_s=wall_s - model_s,
            call_model_s=self.call_model_s,
            latency_s=latency_s,
            call_requests=self.call_requests,
            call_batch_rows=self.call_batch_rows,
            extra={**self.call_stats, **(extra or {})},
        )


class RecordingModel:
    """A CallModel that passes every call to `model` and keeps (call, logits) of each: to replay
    a decode without the model, or to look at the calls a schedule made."""

    def __init__(self, model: CallModel):
        self.model = model
        self.device = model.device
        self.mask_token_id = model.mask_token_id
        self.calls: list[tuple[Call, torch.Tensor]] = []

    @property
    def call_stats(self) -> dict[str, int]:
        return self.model.call_stats

    def run(self, call: Call) -> torch.Tensor:
        logits = self.model.run(call)
        self.calls.append((call, logits))
        return logits

    def commit(self, rows: int) -> None:
        self.model.commit(rows)

    def reset(self) -> None:
        self.model.reset()

    def synchronize(self) -> None:
        self.model.synchronize()

