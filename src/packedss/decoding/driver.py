"""Settings and the one driver every schedule runs under: check, reset, prefill, iterate, finish.

A schedule is a `Decoder` with `prefill` and `step`; the driver owns the loop, the per-iteration
token counts and the cache reset, so both families (LTR and any-order) share them.

Decoders are coroutines: `prefill` and `step` are generators that yield every model call (a
`Call`, or a `Planned` one) and every `Host` step of host work, and receive what it gives back
(a call's logits, the step's result). A `Response` wraps one decode as such a coroutine. Alone
(`drive`, C = 1), `run_alone` runs each call on the model through the response's meter and each
Host step as the plain function call it names. The batch engine (packedss.decoding.engine) runs
many responses' coroutines side by side and the same step of every request at once.
"""

from __future__ import annotations

import gc
from abc import ABC, abstractmethod
from collections.abc import Container, Generator, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

from packedss.decoding.calls import Call, CallModel
from packedss.decoding.pld import DEFAULT_MAX_NGRAM
from packedss.decoding.trace import Decoded, Emitter, Meter, StopCheck
from packedss.decoding.verify import SAMPLER, Emitted, NearTies, Sampling, propose, verify

ORDERS = ("ltr", "confidence")


@dataclass(frozen=True)
class DecodeSettings:
    """What every schedule of either family needs to decode one response."""

    schedule: str
    width: int  # W
    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    sampling: Sampling
    timing: str = "sync"  # how model time is measured on CUDA: "sync" or "events" (see trace.Meter)
    max_ngram: int = DEFAULT_MAX_NGRAM  # pld: the longest n-gram of the context looked up (others read none)

    def check(self, prompt: Sequence[int]) -> None:
        """The checks made before the first call (ValueError with the valid range)."""
        if self.width < 1:
            raise ValueError(f"width must be >= 1, got {self.width}")
        if self.max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {self.max_ngram}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if len(prompt) < 1:
            raise ValueError("the prompt must hold at least one token")


@dataclass(frozen=True)
class LTRSettings(DecodeSettings):
    pad_verify: bool = True  # packed: pad the verify segment to B rows (2B rows per call)

    @property
    def block(self) -> int:
        """B = W + 1: the LTR draft block [last, W masks]."""
        return self.width + 1


@dataclass(frozen=True)
class AnyOrderSettings(DecodeSettings):
    order: str = "ltr"  # verification order: "ltr" or "confidence" (native ignores it)
    native_window: int | None = None  # native: the window it decodes (None: W)
    confidence_threshold: float = 0.9  # native: also resolve every proposal at least this confident

    def check(self, prompt: Sequence[int]) -> None:
        super().check(prompt)
        if self.order not in ORDERS:
            raise ValueError(f"unknown verification order {self.order!r}; valid: {ORDERS}")


class Host:
    """A step of host work a decoder hands to its driver: `fn(*args)`, whose result is sent back.
    The function is looked up where the decoder names it, so a test that replaces it (e.g. the
    schedules' `verify`) replaces what runs."""

    __slots__ = ("fn", "args")

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args


Steps = Generator  # a decoder's coroutine: yields calls and Host steps, receives their results


class Proposals(NamedTuple):
    """Draft tokens at some positions and the distribution q each was sampled from (None when greedy)."""

    positions: list[int]
    tokens: torch.Tensor  # (len(positions),) long, on the device
    probs: torch.Tensor | None  # (len(positions), V)


def proposals_ahead(
    draft_logits: torch.Tensor, positions: Sequence[int], resolved: Container[int], sampling: Sampling
) -> Proposals:
    """One call ahead: a call's draft rows propose for `positions` conditioned on the prefix before
    the call's own verification. The proposals at positions that verification resolved are dropped;
    the rest are the next draft. Every row is proposed, so the random stream does not depend on
    what was resolved."""
    tokens, probs = propose(draft_logits, sampling)
    keep = [k for k, position in enumerate(positions) if position not in resolved]
    first = keep[0] if keep else len(positions)
    if keep == list(range(first, len(positions))):  # a suffix (always so left to right): a view
        index = slice(first, None)
    else:
        index = torch.tensor(keep, dtype=torch.long, device=tokens.device)
    return Proposals([positions[k] for k in keep], tokens[index], None if probs is None else probs[index])


def verify_ahead(verifier_logits: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor | None,
                 draft_logits: torch.Tensor, first: int, sampling: Sampling) -> tuple[Emitted, Proposals]:
    """Packed-SS's two steps of one call: `verify` of the drafts, then `proposals_ahead` of the
    call's draft rows, which propose for first..first+W-1 (W = len(draft_logits)), less the
    positions the emitted tokens took (first.. onwards: the draft's first positions). One Host
    step, so a batch runs both in one wave; the random stream is the two steps', in their order."""
    emitted = verify(verifier_logits, drafts, draft_probs, sampling)
    width = len(draft_logits)
    masks, taken = range(first, first + width), range(first, first + len(emitted))
    return emitted, proposals_ahead(draft_logits, masks, taken, sampling)


class Decoder(ABC):
    """One response in progress. A schedule implements `prefill` and `step` (each returns True when
    decoding must stop) and counts in `produced` every token it emits or resolves, including
    tokens a stop later discards.

    The class is also the schedule's one description: its name, its calls per iteration, whether
    it reads W, the rows of its largest call, and the paper's rows-per-iteration formula (Table 2).
    The record checks, the tables, the plan and the static cache read them here."""

    name: ClassVar[str]
    calls_per_iteration: ClassVar[int] = 1  # model calls per iteration after prefill (nfe = 1 + calls x iterations)
    uses_width: ClassVar[bool] = True  # False: decodes the same response at every W (LTR AR)
    lossy: ClassVar[bool] = False  # not meant to equal the AR output (native decoding)
    reads_pad_verify: ClassVar[bool] = False  # its calls change with the settings' pad_verify
    draws_at_greedy: ClassVar[bool] = False  # draws random numbers at T = 0 too (S2D2's acceptance test)
    sampler: ClassVar[str] = SAMPLER  # how its sampled tokens are drawn (packedss.decoding.verify)
    rows_formula: ClassVar[str] = ""  # the paper's rows per iteration (Table 2); "" where it gives none
    # Its host work is Host steps on logits it only slices: in a batch it gets Rows (rows.py), not tensors.
    batched_steps: ClassVar[bool] = False

    @staticmethod
    @abstractmethod
    def largest_call_rows(width: int) -> int:
        """The most rows one call has at width W (a prefill attaches no more to the prompt)."""

    @staticmethod
    def rows_per_iteration(width: int) -> int | None:
        """`rows_formula` evaluated at width W (None where the paper gives no formula)."""
        return None

    def __init__(self, model: CallModel, prompt: Sequence[int], settings: DecodeSettings, stop_check: StopCheck | None):
        self.model = model
        self.settings = settings
        self.prompt = list(prompt)
        self.meter = Meter(model, settings.timing)
        self.emitter = Emitter(settings.max_new_tokens, settings.eos_token_ids, stop_check)
        self.produced = 0
        self.draft_proposed = 0  # drafts verified
        self.draft_accepted = 0  # drafts accepted
        # The margins of the rows that decided each emitted token: lossless greedy decoding only,
        # whose output the divergence audit compares with AR's.
        self.ties = NearTies() if settings.sampling.greedy and not self.lossy else None

    def note(self, indexes, rows: torch.Tensor) -> None:
        """Row k of `rows` decided the emitted token at output index indexes[k] (see NearTies)."""
        if self.ties is not None and rows is not None:
            self.ties.note(indexes, rows)

    @abstractmethod
    def prefill(self) -> Steps:
        """The first call: write the prompt and produce the first token(s). Returns True when
        decoding must stop."""

    @abstractmethod
    def step(self) -> Steps:
        """One iteration after prefill; returns True when decoding must stop."""

    def extra(self) -> dict:
        """Family-specific record fields."""
        return {}


def schedule_named(decoders: Sequence[type[Decoder]], name: str) -> type[Decoder]:
    """The schedule of `decoders` called `name` (ValueError listing the valid names)."""
    for decoder in decoders:
        if decoder.name == name:
            return decoder
    raise ValueError(f"unknown schedule {name!r}; valid: {', '.join(d.name for d in decoders)}")


class Response:
    """One response to decode with `schedule` on a fresh cache of `model`, as a coroutine: `steps`
    yields each call and Host step, and returns the Decoded; `meter` counts and times its calls.
    The cache is dropped again however decoding ends (also when `steps` is closed early)."""

    def __init__(self, model: CallModel, prompt: Sequence[int], settings: DecodeSettings,
                 stop_check: StopCheck | None, schedule: type[Decoder]):  # fmt: skip
        settings.check(prompt)
        model.reset()
        try:
            self.decoder = schedule(model, prompt, settings, stop_check)
        except BaseException:
            model.reset()
            raise
        self.meter = self.decoder.meter
        self.steps = _steps(model, self.decoder, len(prompt))


def _steps(model: CallModel, decoder: Decoder, prompt_tokens: int) -> Steps:
    try:
        # Per iteration after prefill: tokens produced, drafts verified, drafts accepted.
        accepted: list[int] = []
        drafted: list[int] = []
        accepted_drafts: list[int] = []
        done = yield from decoder.prefill()
        while not done:
            before = (decoder.produced, decoder.draft_proposed, decoder.draft_accepted)
            done = yield from decoder.step()
            accepted.append(decoder.produced - before[0])
            drafted.append(decoder.draft_proposed - before[1])
            accepted_drafts.append(decoder.draft_accepted - before[2])
        return finished(decoder, prompt_tokens, accepted, drafted, accepted_drafts)
    finally:
        model.reset()


def finished(decoder: Decoder, prompt_tokens: int, accepted: list[int], drafted: list[int],
             accepted_drafts: list[int]) -> Decoded:  # fmt: skip
    """The record of a decode that ended, from its decoder and its per-iteration counts."""
    emitter = decoder.emitter
    # Produced tokens that are not in the output: cut by a stop, or produced beyond it.
    truncated_tokens = decoder.produced - len(emitter.tokens)
    extra = decoder.extra()
    if decoder.ties is not None:
        extra["near_ties"] = decoder.ties.read(len(emitter.tokens))
    return decoder.meter.finish(emitter, prompt_tokens, accepted, drafted, accepted_drafts, truncated_tokens, extra)


class FrozenHeap:
    """`with FrozenHeap():` around a decode. While decodes run, Python's cyclic garbage collector
    leaves alone the objects that existed before the first of them began (gc.freeze: the model,
    the tokenizer, the libraries' modules, half a million objects on tiny). A full collection then
    walks only what the decodes made instead of the whole heap (a pause of a few hundred
    milliseconds, inside whichever round it came in). The heap is unfrozen when the last decode
    ends (docs/concurrency.md §2)."""

    running = 0  # decodes in progress

    def __enter__(self) -> None:
        if not FrozenHeap.running:
            gc.freeze()
        FrozenHeap.running += 1

    def __exit__(self, *exception) -> None:
        FrozenHeap.running -= 1
        if not FrozenHeap.running:
            gc.unfreeze()


def run_alone(response: Response) -> Decoded:
    """Drive one response to its end: each call runs on the model through its meter, each Host
    step is its function called."""
    steps, meter = response.steps, response.meter
    result = None
    try:
        with FrozenHeap():
            while True:
                op = steps.send(result)
                if type(op) is Host:
                    result = op.fn(*op.args)
                else:
                    result = meter.run(op if isinstance(op, Call) else op.build())
    except StopIteration as stop:
        return stop.value
    finally:
        steps.close()


def drive(
    model: CallModel,
    prompt: Sequence[int],
    settings: DecodeSettings,
    stop_check: StopCheck | None,
    schedule: type[Decoder],
) -> Decoded:
    """Decode one response with `schedule` on a fresh cache, dropped again however decoding ends."""
    return run_alone(Response(model, prompt, settings, stop_check, schedule))
