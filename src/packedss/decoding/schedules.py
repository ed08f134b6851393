"""The LTR schedules of SPEC §3 on one decoding core: ar, linear, quadratic, packed.

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
    Role,
    block_segment,
    causal_segment,
    draft_block,
    pack,
    pad_segment,
)
from packedss.decoding.trace import Decoded, Emitter, Meter, StopCheck, check_request
from packedss.decoding.verify import Sampling, last_token, next_token, propose, verify

LTR_SCHEDULES = ("ar", "linear", "quadratic", "packed")


@dataclass(frozen=True)
class DecodeSettings:
    schedule: str
    width: int  # W; the LTR block is B = W + 1 rows
    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    sampling: Sampling
    pad_verify: bool = True  # packed: pad the verify segment to B rows (2B rows per call)
    timing: str = "sync"  # how model time is measured on CUDA: "sync" or "events" (see Meter)

    @property
    def block(self) -> int:
        return self.width + 1


def decode(
    model: CallModel,
    prompt: Sequence[int],
    settings: DecodeSettings,
    stop_check: StopCheck | None = None,
) -> Decoded:
    """Decode one response with the chosen LTR schedule."""
    check_request(settings.schedule, LTR_SCHEDULES, settings.width, settings.max_new_tokens, prompt)
    model.reset()
    meter = Meter(model, settings.timing)
    emitter = Emitter(settings.max_new_tokens, settings.eos_token_ids, stop_check)
    prompt_ids = torch.as_tensor(list(prompt), dtype=torch.long, device=model.device)
    schedule = {"ar": _ar, "linear": _linear, "quadratic": _quadratic, "packed": _packed}[settings.schedule]
    accepted, proposed, drafted_ok = schedule(model, meter, emitter, prompt_ids, settings)
    model.reset()
    return meter.finish(emitter, len(prompt), accepted, proposed, drafted_ok)


@dataclass(frozen=True)
class _Layout:
    """The fixed part of a call of one shape: everything but the filled-in tokens and the
    position n. Built once per shape (and device) from the segment builders of `calls`, then
    shared by every call of that shape: building a call is then one `cat` for the tokens and
    one add for the positions. The tensors are shared and must never be written to."""

    offsets: torch.Tensor  # (R,) position of each row minus n
    roles: torch.Tensor
    attend: torch.Tensor
    masks: torch.Tensor  # the constant MASK tokens that follow the filled-in rows
    useful: int

    def call(self, tokens: list[torch.Tensor], position: int) -> Call:
        return Call(
            tokens=torch.cat(tokens),
            positions=self.offsets + position,
            roles=self.roles,
            attend=self.attend,
            useful=self.useful,
        )


def _layout(call: Call, position: int, masks: torch.Tensor) -> _Layout:
    return _Layout(call.positions - position, call.roles, call.attend, masks, call.rows_useful)


def _mask_tokens(count: int, mask_token_id: int, device: torch.device) -> torch.Tensor:
    return torch.full((count,), mask_token_id, dtype=torch.long, device=device)


@functools.lru_cache(maxsize=256)
def _causal_layout(rows: int, device: torch.device) -> _Layout:
    call = pack([causal_segment(torch.zeros(rows, dtype=torch.long, device=device), 0)])
    return _layout(call, 0, _mask_tokens(0, 0, device))


@functools.lru_cache(maxsize=256)
def _draft_layout(width: int, mask_token_id: int, device: torch.device) -> _Layout:
    anchor = torch.zeros(1, dtype=torch.long, device=device)
    call = pack([draft_block(anchor, 0, width, mask_token_id)])
    return _layout(call, 0, _mask_tokens(width, mask_token_id, device))


@functools.lru_cache(maxsize=256)
def _packed_layout(m: int, width: int, mask_token_id: int, pad_verify: bool, device: torch.device) -> _Layout:
    segments = [causal_segment(torch.zeros(m + 1, dtype=torch.long, device=device), 0)]
    padding = width - m
    if pad_verify and padding > 0:
        segments.append(pad_segment(padding, mask_token_id, 0, device))
    segments.append(draft_block(torch.zeros(1, dtype=torch.long, device=device), 0, width, mask_token_id))
    call = pack(segments)
    # Token rows after the verify segment: padding masks, then the block's anchor and W masks.
    pad = padding if pad_verify and padding > 0 else 0
    return _layout(call, 0, _mask_tokens(pad + width, mask_token_id, device))


@functools.lru_cache(maxsize=64)
def _quadratic_layout(block: int, mask_token_id: int, device: torch.device) -> _Layout:
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
    return _Layout(offsets, roles, attend, _mask_tokens(block * block, mask_token_id, device), rows)


def _ar(model, meter, emitter, prompt, s):
    length = prompt.shape[0]
    logits = meter.run(pack([causal_segment(prompt, 0)]))
    model.commit(length)
    last = next_token(logits[-1], s.sampling)
    layout = _causal_layout(1, model.device)
    accepted: list[int] = []
    position = length
    while not emitter.emit(last.tolist()):
        logits = meter.run(layout.call([last], position))
        model.commit(1)
        last = next_token(logits[0], s.sampling)
        accepted.append(1)
        position += 1
    return accepted, 0, 0


def _linear(model, meter, emitter, prompt, s):
    length, width = prompt.shape[0], s.width
    logits = meter.run(pack([causal_segment(prompt, 0)]))
    model.commit(length)
    last = next_token(logits[-1], s.sampling)
    draft_layout = _draft_layout(width, model.mask_token_id, model.device)
    verify_layout = _causal_layout(width + 1, model.device)
    accepted: list[int] = []
    proposed = drafted_ok = 0
    position = length
    done = emitter.emit(last.tolist())
    while not done:
        logits = meter.run(draft_layout.call([last, draft_layout.masks], position))
        model.commit(0)
        drafts, draft_probs = propose(logits[1:], s.sampling)
        logits = meter.run(verify_layout.call([last, drafts], position))
        emitted = verify(logits, drafts, draft_probs, s.sampling)
        last = last_token(emitted, model.device)
        model.commit(len(emitted))
        accepted.append(len(emitted))
        proposed += width
        drafted_ok += len(emitted) - 1
        done = emitter.emit(emitted)
        position += len(emitted)
    return accepted, proposed, drafted_ok


def quadratic_call(last: torch.Tensor, drafts: torch.Tensor, position: int, mask_token_id: int) -> Call:
    """B verify rows [last@n, d_1..d_W] (causal) followed by B draft blocks; block k holds B
    masks at n+k+1..n+k+B that see the cache, verify rows 0..k and their own block."""
    layout = _quadratic_layout(drafts.shape[0] + 1, mask_token_id, last.device)
    return layout.call([last.view(1), drafts, layout.masks], position)


def _quadratic(model, meter, emitter, prompt, s):
    length, width, block = prompt.shape[0], s.width, s.block
    masks = torch.full((block,), model.mask_token_id, dtype=torch.long, device=model.device)
    # Prefill with the first draft attached: B masks at L..L+B-1 that see the whole prompt.
    sees_prompt = torch.ones(block, length, dtype=torch.bool, device=model.device)
    call = pack([causal_segment(prompt, 0), block_segment(masks, length)], sees={(1, 0): sees_prompt})
    logits = meter.run(call)
    model.commit(length)
    last = next_token(logits[length - 1], s.sampling)
    drafts, draft_probs = propose(logits[length + 1 :], s.sampling)  # positions L+1..L+W
    accepted: list[int] = []
    proposed = drafted_ok = 0
    position = length
    done = emitter.emit(last.tolist())
    while not done:
        logits = meter.run(quadratic_call(last, drafts, position, model.mask_token_id))
        emitted = verify(logits[:block], drafts, draft_probs, s.sampling)
        last = last_token(emitted, model.device)
        model.commit(len(emitted))
        h = len(emitted) - 1
        accepted.append(len(emitted))
        proposed += width
        drafted_ok += h
        done = emitter.emit(emitted)
        # Block h saw exactly the accepted prefix; its first mask sits at the correction's position.
        start = block + h * block
        drafts, draft_probs = propose(logits[start + 1 : start + block], s.sampling)
        position += len(emitted)
    return accepted, proposed, drafted_ok


def packed_call(
    last: torch.Tensor, drafts: torch.Tensor, position: int, width: int, mask_token_id: int, pad_verify: bool
) -> Call:
    """Verify rows [last@n, d_1..d_m] (causal), optional padding to B rows, then the draft
    block [last@n, MASK@n+1..n+W] that sees the cache and its own block only."""
    m = drafts.shape[0]
    layout = _packed_layout(m, width, mask_token_id, pad_verify, last.device)
    last = last.view(1)
    pad = layout.masks.shape[0] - width
    return layout.call([last, drafts, layout.masks[:pad], last, layout.masks[pad:]], position)


def _packed(model, meter, emitter, prompt, s):
    length, width = prompt.shape[0], s.width
    # Prefill with the first draft attached: the block [x_{L-1}@L-1, MASK@L..L+W-1] sees the
    # prompt before its anchor, exactly as a separate draft call would after the prompt.
    sees_prompt = torch.ones(width + 1, length, dtype=torch.bool, device=model.device)
    sees_prompt[:, -1] = False
    block = draft_block(prompt[-1], length - 1, width, model.mask_token_id)
    logits = meter.run(pack([causal_segment(prompt, 0), block], sees={(1, 0): sees_prompt}))
    model.commit(length)
    last = next_token(logits[length - 1], s.sampling)
    proposals, proposal_probs = propose(logits[length + 1 :], s.sampling)  # positions L..L+W-1
    drafts = proposals[1:]
    draft_probs = None if proposal_probs is None else proposal_probs[1:]
    accepted: list[int] = []
    proposed = drafted_ok = 0
    position = length
    done = emitter.emit(last.tolist())
    while not done:
        m = drafts.shape[0]
        logits = meter.run(packed_call(last, drafts, position, width, model.mask_token_id, s.pad_verify))
        emitted = verify(logits[: m + 1], drafts, draft_probs, s.sampling)
        last = last_token(emitted, model.device)
        model.commit(len(emitted))
        accepted.append(len(emitted))
        proposed += m
        drafted_ok += len(emitted) - 1
        done = emitter.emit(emitted)
        # One call ahead: proposals for n+1..n+W were conditioned on P_{t-1} only; drop the
        # ones at the A_t emitted positions, the rest is the next draft.
        proposals, proposal_probs = propose(logits[-width:], s.sampling)
        drafts = proposals[len(emitted) :]
        draft_probs = None if proposal_probs is None else proposal_probs[len(emitted) :]
        position += len(emitted)
    return accepted, proposed, drafted_ok
