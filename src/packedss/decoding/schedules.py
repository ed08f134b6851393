"""The LTR schedules (docs/schedules.md §1-§10) on one decoding core: ar, linear, quadratic, packed.

Positions are 0-based: the prompt occupies 0..L-1 and n is the position of the last
emitted token, which is never in the KV cache at the start of an iteration. An AR
row at position j predicts j+1; a mask row of a draft block at position i predicts i.
Every call is built so that the rows a schedule commits are a prefix of its rows.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from packedss.decoding.calls import (
    Call,
    CallModel,
    Layout,
    Listed,
    Planned,
    Role,
    Rule,
    causal_segment,
    draft_block,
    layout_of,
    pack,
    pad_segment,
)
from packedss.decoding.driver import (
    Decoder,
    Host,
    LTRSettings,
    Steps,
    drive,
    proposals_ahead,
    schedule_named,
    verify_ahead,
)
from packedss.decoding.rows import Rows, uploaded
from packedss.decoding.trace import Decoded, StopCheck
from packedss.decoding.verify import first_token, last_token, propose, verify


@dataclass(frozen=True)
class _Shape:
    """An LTR call shape: its layout, each row's position minus n, and the runs of constant MASK
    tokens among its rows (each run its own tensor, shared by every call of the shape). Building a
    call is then one `cat` for the tokens and one add for the positions (Planned.build), or a part
    of a batched call's."""

    layout: Layout
    offsets: torch.Tensor
    masks: tuple[torch.Tensor, ...]

    def call(self, tokens: list, position: int) -> Planned | Listed:
        """The call of token parts `tokens` (Rows, tensors, host lists of ints, and the shape's mask
        runs, in row order) at n = `position`: Listed, on the host, when every part is on the host
        (a lane's, packedss.decoding.lockstep) or the round read it back (in a batch: Rows with
        values), so that the engine copies it with the round's other listed calls; else Planned."""
        ids: list[int] = []
        for part in tokens:
            if type(part) is list:
                ids += part
                continue
            if type(part) is Rows and part.values is not None:
                ids += part.values
                continue
            # Alone (C = 1) the first part, the last token, is a tensor: a Planned call, and the
            # shape's host integers are never read.
            run = self.host[1].get(id(part)) if ids else None
            if run is None:
                return Planned(self.layout, self.offsets, tokens, position)
            ids += run
        ids += map(position.__add__, self.host[0])
        return Listed(self.layout, ids, 0)

    @functools.cached_property
    def host(self) -> tuple[list[int], dict[int, list[int]]]:
        """The offsets, and each mask run by its tensor's id, as host integers: read once per shape,
        by its first call (on a CUDA device, a synchronization of that call alone)."""
        return self.offsets.tolist(), {id(mask): mask.tolist() for mask in self.masks}


@functools.lru_cache(maxsize=64)
def _mask_tokens(count: int, mask_token_id: int, device: torch.device) -> torch.Tensor:
    """`count` MASK tokens, one tensor per count (shared: never written to)."""
    return torch.full((count,), mask_token_id, dtype=torch.long, device=device)


def _prefill_call(prompt: torch.Tensor, block: Sequence[torch.Tensor] = (), at: int = 0, sees: int = 0) -> Call:
    """A prefill: the prompt's L rows (causal), then, if `block` has parts, a draft block of their
    tokens at positions at.. that sees the prompt's first `sees` rows and the whole block. Logits
    come back from the prompt's last row on. Its positions, roles and attention depend only on the
    prompt's length and the block's, so they are built once per shape (`_prefill_layout`) and a
    prefill costs one `cat` of its tokens."""
    length = prompt.shape[0]
    rows = length + sum(part.shape[0] for part in block)
    positions, layout = _prefill_layout(length, rows, at, sees, prompt.device)
    tokens = torch.cat([prompt, *block]) if block else prompt
    return Call(tokens, positions, layout.roles, layout.attend, useful=rows, drafts=layout.drafts,
                read_from=length - 1, rule=layout.rule)  # fmt: skip


def _prefill_listed(prompt: list[int], block: list[int], at: int, sees: int, device: torch.device) -> Listed:
    """`_prefill_call` of a prompt and a block given as host integers, as a Listed call."""
    length, rows = len(prompt), len(prompt) + len(block)
    _, layout = _prefill_layout(length, rows, at, sees, device)
    return Listed(layout, [*prompt, *block, *_prefill_positions(length, rows, at)], length - 1)


def _prefill_positions(length: int, rows: int, at: int) -> list[int]:
    """A prefill's positions: the prompt's 0..L-1, then its block's at.. (`_prefill_call`)."""
    return [*range(length), *range(at, at + rows - length)]


@functools.lru_cache(maxsize=256)
def _prefill_layout(length: int, rows: int, at: int, sees: int, device: torch.device) -> tuple[torch.Tensor, Layout]:
    """The positions and layout of `_prefill_call`'s call of a prompt of `length` tokens and
    `rows` rows in all (shared by every prefill of that shape: never written to)."""
    positions = uploaded(_prefill_positions(length, rows, at), device)
    if rows == length:
        attend = torch.ones(length, length, dtype=torch.bool, device=device).tril_()
        roles = torch.full((length,), int(Role.VERIFY), dtype=torch.uint8, device=device)
        return positions, Layout(roles, attend, length, 0, Rule.CAUSAL)
    roles = torch.full((rows,), int(Role.DRAFT), dtype=torch.uint8, device=device)
    roles[:length] = int(Role.VERIFY)
    attend = torch.ones(rows, rows, dtype=torch.bool, device=device).tril_()
    attend[length:, sees:length] = False
    attend[length:, length:] = True
    return positions, Layout(roles, attend, rows, rows - length)


def _shape(call: Call, *masks: torch.Tensor) -> _Shape:
    """The shape of a call built at n = 0."""
    return _Shape(layout_of(call), call.positions, masks)


@functools.lru_cache(maxsize=256)
def _causal_shape(rows: int, device: torch.device) -> _Shape:
    return _shape(pack([causal_segment(torch.zeros(rows, dtype=torch.long, device=device), 0)]))


@functools.lru_cache(maxsize=256)
def _draft_shape(width: int, mask_token_id: int, device: torch.device) -> _Shape:
    anchor = torch.zeros(1, dtype=torch.long, device=device)
    call = pack([draft_block(anchor, 0, width, mask_token_id)])
    return _shape(call, _mask_tokens(width, mask_token_id, device))


@functools.lru_cache(maxsize=256)
def _packed_shape(m: int, width: int, mask_token_id: int, pad_verify: bool, device: torch.device) -> _Shape:
    segments = [causal_segment(torch.zeros(m + 1, dtype=torch.long, device=device), 0)]
    padding = width - m if pad_verify and width > m else 0
    if padding:
        segments.append(pad_segment(padding, mask_token_id, 0, device))
    segments.append(draft_block(torch.zeros(1, dtype=torch.long, device=device), 0, width, mask_token_id))
    # Token rows after the verify segment: padding masks, then the block's anchor and W masks.
    return _shape(pack(segments), _mask_tokens(padding, mask_token_id, device), _mask_tokens(width, mask_token_id, device))


@functools.lru_cache(maxsize=64)
def _quadratic_shape(block: int, mask_token_id: int, device: torch.device) -> _Shape:
    k_of_row = torch.arange(block, device=device).repeat_interleave(block)  # (B*B,)
    r_of_row = torch.arange(block, device=device).repeat(block)
    rows = block + block * block
    attend = torch.zeros(rows, rows, dtype=torch.bool, device=device)
    attend[:block, :block] = torch.ones(block, block, dtype=torch.bool, device=device).tril_()
    attend[block:, :block] = torch.arange(block, device=device)[None, :] <= k_of_row[:, None]
    attend[block:, block:] = k_of_row[:, None] == k_of_row[None, :]
    offsets = torch.cat([torch.arange(block, device=device), 1 + k_of_row + r_of_row])
    roles = torch.full((rows,), int(Role.DRAFT), dtype=torch.uint8, device=device)
    roles[:block] = int(Role.VERIFY)
    return _Shape(Layout(roles, attend, rows, block * block), offsets, (_mask_tokens(block * block, mask_token_id, device),))


def _quadratic_plan(last, drafts, position: int, mask_token_id: int, device: torch.device) -> Planned:
    shape = _quadratic_shape(len(drafts) + 1, mask_token_id, device)
    return shape.call([last, drafts, *shape.masks], position)


def quadratic_call(last: torch.Tensor, drafts: torch.Tensor, position: int, mask_token_id: int) -> Call:
    """B verify rows [last@n, d_1..d_W] (causal) followed by B draft blocks; block k holds B
    masks at n+k+1..n+k+B that see the cache, verify rows 0..k and their own block."""
    return _quadratic_plan(last.view(1), drafts, position, mask_token_id, last.device).build()


def _packed_plan(last, drafts, position: int, width: int, mask_token_id: int, pad_verify: bool,
                 device: torch.device) -> Planned:  # fmt: skip
    return _packed_of(_packed_shape(len(drafts), width, mask_token_id, pad_verify, device), last, drafts, position)


def _packed_of(shape: _Shape, last, drafts, position: int) -> Planned:
    """The packed call of `shape` (the `_packed_shape` of len(drafts) drafts) at n = `position`."""
    padding, block = shape.masks
    return shape.call([last, drafts, padding, last, block], position)


def packed_call(
    last: torch.Tensor, drafts: torch.Tensor, position: int, width: int, mask_token_id: int, pad_verify: bool
) -> Call:
    """Verify rows [last@n, d_1..d_m] (causal), optional padding to B rows, then the draft
    block [last@n, MASK@n+1..n+W] that sees the cache and its own block only."""
    return _packed_plan(last.view(1), drafts, position, width, mask_token_id, pad_verify, last.device).build()


class _LTRDecoder(Decoder):
    """State shared by the LTR schedules: the last emitted token (on the device) and its position n."""

    settings: LTRSettings
    last: torch.Tensor  # (1,) long; set by prefill
    batched_steps = True

    def __init__(self, model: CallModel, prompt: Sequence[int], settings: LTRSettings, stop_check: StopCheck | None):
        super().__init__(model, prompt, settings, stop_check)
        self.position = len(self.prompt)

    @functools.cached_property
    def prompt_ids(self) -> torch.Tensor:
        """The prompt on the device, copied by the prefill that reads it (a lane's is built on the host)."""
        return uploaded(list(self.prompt), self.model.device)

    def emit(self, tokens: list[int]) -> bool:
        self.produced += len(tokens)
        return self.emitter.emit(tokens)

    def prefill_prompt(self) -> Steps:
        """Prefill without a draft: the prompt's last row gives the first token."""
        logits = yield _prefill_call(self.prompt_ids)
        self.model.commit(len(self.prompt))
        return (yield from self.first(logits[-1:]))

    def first(self, row) -> Steps:
        """Emit the token the verifier row `row` (one row of logits) gives."""
        emitted = yield Host(first_token, row, self.settings.sampling)
        self.last = emitted.last
        self.note([self.produced], row if emitted.deciding is None else emitted.deciding)
        return self.emit(emitted)

    def verified(self, emitted: list[int], drafts: int) -> bool:
        """Commit and emit what a verification of `drafts` drafts emitted."""
        self.last = last_token(emitted, self.model.device)
        self.note(range(self.produced, self.produced + len(emitted)), getattr(emitted, "deciding", None))
        self.model.commit(len(emitted))
        self.draft_proposed += drafts
        self.draft_accepted += len(emitted) - 1
        return self.emit(emitted)


class _AR(_LTRDecoder):
    name = "ar"
    uses_width = False  # one row per call whatever W: every W decodes the same response
    rows_formula = "1"

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return 1

    @staticmethod
    def rows_per_iteration(width: int) -> int:
        return 1

    @functools.cached_property
    def shape(self) -> _Shape:
        return _causal_shape(1, self.model.device)

    def prefill(self) -> Steps:
        return (yield from self.prefill_prompt())

    def step(self) -> Steps:
        logits = yield self.shape.call([self.last], self.position)
        self.model.commit(1)
        self.position += 1
        return (yield from self.first(logits[:1]))


class _Linear(_LTRDecoder):
    name = "linear"
    calls_per_iteration = 2  # a draft call, then a verify call
    rows_formula = "2B"

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return width + 1

    @staticmethod
    def rows_per_iteration(width: int) -> int:
        return 2 * (width + 1)

    @functools.cached_property
    def draft_shape(self) -> _Shape:
        return _draft_shape(self.settings.width, self.model.mask_token_id, self.model.device)

    @functools.cached_property
    def verify_shape(self) -> _Shape:
        return _causal_shape(self.settings.block, self.model.device)

    def prefill(self) -> Steps:
        return (yield from self.prefill_prompt())

    def step(self) -> Steps:
        sampling, position = self.settings.sampling, self.position
        logits = yield self.draft_shape.call([self.last, *self.draft_shape.masks], position)
        self.model.commit(0)
        drafts, draft_probs = yield Host(propose, logits[1:], sampling)
        logits = yield self.verify_shape.call([self.last, drafts], position)
        emitted = yield Host(verify, logits, drafts, draft_probs, sampling)
        done = self.verified(emitted, self.settings.width)
        self.position += len(emitted)
        return done


class _Quadratic(_LTRDecoder):
    name = "quadratic"
    rows_formula = "B(B+1)"

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return (width + 1) * (width + 2)

    @staticmethod
    def rows_per_iteration(width: int) -> int:
        return (width + 1) * (width + 2)

    def prefill(self) -> Steps:
        length, block, sampling = len(self.prompt), self.settings.block, self.settings.sampling
        # Prefill with the first draft attached: B masks at L..L+B-1 that see the whole prompt.
        # Logits of the prompt's last row and the block's (rows L-1..).
        masks = _mask_tokens(block, self.model.mask_token_id, self.model.device)
        logits = yield _prefill_call(self.prompt_ids, [masks], at=length, sees=length)
        self.model.commit(length)
        done = yield from self.first(logits[0:1])
        self.drafts, self.draft_probs = yield Host(propose, logits[2:], sampling)  # positions L+1..L+W
        return done

    def step(self) -> Steps:
        block, sampling = self.settings.block, self.settings.sampling
        logits = yield _quadratic_plan(self.last, self.drafts, self.position, self.model.mask_token_id, self.model.device)
        emitted = yield Host(verify, logits[:block], self.drafts, self.draft_probs, sampling)
        done = self.verified(emitted, self.settings.width)
        # Block h saw exactly the accepted prefix; its first mask sits at the correction's position.
        start = block + (len(emitted) - 1) * block
        self.drafts, self.draft_probs = yield Host(propose, logits[start + 1 : start + block], sampling)
        self.position += len(emitted)
        return done


class _Packed(_LTRDecoder):
    name = "packed"
    reads_pad_verify = True
    rows_formula = "2B"

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return 2 * (width + 1)

    @staticmethod
    def rows_per_iteration(width: int) -> int:
        return 2 * (width + 1)

    def prefill(self) -> Steps:
        length, width, sampling = len(self.prompt), self.settings.width, self.settings.sampling
        # Prefill with the first draft attached: the block [x_{L-1}@L-1, MASK@L..L+W-1] sees the
        # prompt before its anchor, exactly as a separate draft call would after the prompt.
        # Logits of the prompt's last row and the block's (rows L-1..).
        masks = _mask_tokens(width, self.model.mask_token_id, self.model.device)
        logits = yield _prefill_call(self.prompt_ids, [self.prompt_ids[-1:], masks], at=length - 1, sees=length - 1)
        self.model.commit(length)
        done = yield from self.first(logits[0:1])
        first = range(length, length + 1)  # the first token's position
        self.drafts = yield Host(proposals_ahead, logits[2:], range(length, length + width), first, sampling)
        return done

    @functools.cached_property
    def shapes(self) -> list[_Shape]:
        """The call shape of each draft count m = 0..W, indexed by m (an iteration's lookup is then
        an index, not the shape cache's six-part key)."""
        s, model = self.settings, self.model
        return [_packed_shape(m, s.width, model.mask_token_id, s.pad_verify, model.device) for m in range(s.width + 1)]

    def step(self) -> Steps:
        s, n = self.settings, self.position
        drafts = self.drafts
        m = len(drafts.tokens)
        logits = yield _packed_of(self.shapes[m], self.last, drafts.tokens, n)
        # The draft block's masks sit at n+1..n+W; the emitted tokens take n+1..n+A.
        emitted, self.drafts = yield Host(verify_ahead, logits[: m + 1], drafts.tokens, drafts.probs,
                                          logits[-s.width :], n + 1, s.sampling)  # fmt: skip
        done = self.verified(emitted, m)
        self.position += len(emitted)
        return done


LTR_DECODERS: tuple[type[Decoder], ...] = (_AR, _Linear, _Quadratic, _Packed)
LTR_SCHEDULES = tuple(decoder.name for decoder in LTR_DECODERS)


def decode_ltr(
    model: CallModel,
    prompt: Sequence[int],
    settings: LTRSettings,
    stop_check: StopCheck | None = None,
) -> Decoded:
    """Decode one response with the chosen LTR schedule."""
    return drive(model, prompt, settings, stop_check, schedule_named(LTR_DECODERS, settings.schedule))
