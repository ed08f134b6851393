"""The SDAR family's lossless schedules (docs/schedules.md §17): `ar`, `linear` and `packed` with
SDAR's verifier. A clean row predicts nothing, so every verification adds query rows: for m
drafts, the causal rows [last@n, d_1..d_m] and the m+1 queries MASK@n+1..n+m+1, query j seeing
clean rows 0..j and itself (the verify half of S2D2's 2L call). The drafter is the LTR draft
block [last@n, MASK@n+1..n+W], so B = W + 1. They emit what `ar` emits. The block-diffusion
schedules are packedss.decoding.blockdiff's."""

from __future__ import annotations

import functools

import torch

from packedss.decoding.calls import Call, Role, Segment, causal_segment, draft_block, pack, pad_segment
from packedss.decoding.driver import Host, Steps, proposals_ahead, verify_ahead
from packedss.decoding.schedules import _AR, _Linear, _mask_tokens, _Packed, _Shape, _shape
from packedss.decoding.verify import propose, verify


def _queries(count: int, mask_token_id: int, first_position: int, device: torch.device) -> Segment:
    """`count` query rows MASK@first.. (role VERIFY: they are the verifier's), each seeing itself."""
    tokens = torch.full((count,), mask_token_id, dtype=torch.long, device=device)
    positions = torch.arange(first_position, first_position + count, device=device)
    roles = torch.full((count,), int(Role.VERIFY), dtype=torch.uint8, device=device)
    return Segment(tokens, positions, roles, torch.eye(count, dtype=torch.bool, device=device), 0, 0)


def _verify_segments(m: int, mask_token_id: int, device: torch.device) -> tuple[list[Segment], dict]:
    """The clean rows [last@0, d_1..d_m] and their m+1 queries at 1..m+1 (query j sees clean rows
    0..j): segments 0 and 1 of a call, with the visibility to give `pack`."""
    clean = causal_segment(torch.zeros(m + 1, dtype=torch.long, device=device), 0)
    queries = _queries(m + 1, mask_token_id, 1, device)
    return [clean, queries], {(1, 0): torch.ones(m + 1, m + 1, dtype=torch.bool, device=device).tril_()}


@functools.lru_cache(maxsize=256)
def _verify_shape(m: int, mask_token_id: int, device: torch.device) -> _Shape:
    segments, sees = _verify_segments(m, mask_token_id, device)
    return _shape(pack(segments, sees), _mask_tokens(m + 1, mask_token_id, device))


@functools.lru_cache(maxsize=256)
def _packed_shape(m: int, width: int, mask_token_id: int, pad_verify: bool, device: torch.device) -> _Shape:
    segments, sees = _verify_segments(m, mask_token_id, device)
    padding = 2 * (width - 1 - m) if pad_verify else 0  # the verify part padded to 2W rows (m <= W-1)
    if padding:
        segments.append(pad_segment(padding, mask_token_id, 0, device))
    segments.append(draft_block(torch.zeros(1, dtype=torch.long, device=device), 0, width, mask_token_id))
    masks = (_mask_tokens(m + 1, mask_token_id, device), _mask_tokens(padding, mask_token_id, device),
             _mask_tokens(width, mask_token_id, device))  # fmt: skip
    return _shape(pack(segments, sees), *masks)


def queried_prefill(prompt: torch.Tensor, mask_token_id: int, width: int = 0) -> Call:
    """A prefill in AR mode: the prompt's L rows (causal), the query MASK@L that sees all of them,
    then, with `width`, the draft block [x_{L-1}@L-1, MASK@L..L+W-1] that sees the prompt before
    its anchor. Logits come back from the query on."""
    length, device = prompt.shape[0], prompt.device
    segments = [causal_segment(prompt, 0), _queries(1, mask_token_id, length, device)]
    sees = {(1, 0): torch.ones(1, length, dtype=torch.bool, device=device)}
    if width:
        segments.append(draft_block(prompt[-1:], length - 1, width, mask_token_id))
        seen = torch.zeros(width + 1, length, dtype=torch.bool, device=device)
        seen[:, : length - 1] = True
        sees[(2, 0)] = seen
    return pack(segments, sees, read_from=length)


class _QueriedAR(_AR):
    """SDAR's AR mode: [last@n, MASK@n+1] per call; the clean row is committed."""

    rows_formula = "2"

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return 2

    @staticmethod
    def rows_per_iteration(width: int) -> int:
        return 2

    @functools.cached_property
    def shape(self) -> _Shape:
        return _verify_shape(0, self.model.mask_token_id, self.model.device)

    def prefill(self) -> Steps:
        logits = yield queried_prefill(self.prompt_ids, self.model.mask_token_id)
        self.model.commit(len(self.prompt))
        return (yield from self.first(logits[0:1]))

    def step(self) -> Steps:
        logits = yield self.shape.call([self.last, *self.shape.masks], self.position)
        self.model.commit(1)
        self.position += 1
        return (yield from self.first(logits[1:2]))


class _QueriedLinear(_Linear):
    """Linear-SS on SDAR: the draft block (B rows), then the 2B-row verify call."""

    rows_formula = "3B"

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return 2 * (width + 1)

    @staticmethod
    def rows_per_iteration(width: int) -> int:
        return 3 * (width + 1)

    @functools.cached_property
    def verify_shape(self) -> _Shape:
        return _verify_shape(self.settings.width, self.model.mask_token_id, self.model.device)

    def prefill(self) -> Steps:
        return (yield from _QueriedAR.prefill(self))

    def step(self) -> Steps:
        sampling, position, width = self.settings.sampling, self.position, self.settings.width
        logits = yield self.draft_shape.call([self.last, *self.draft_shape.masks], position)
        self.model.commit(0)
        drafts, draft_probs = yield Host(propose, logits[1:], sampling)
        logits = yield self.verify_shape.call([self.last, drafts, *self.verify_shape.masks], position)
        emitted = yield Host(verify, logits[width + 1 :], drafts, draft_probs, sampling)
        done = self.verified(emitted, width)
        self.position += len(emitted)
        return done


class _QueriedPacked(_Packed):
    """Packed-SS on SDAR: [last, d_1..d_m | m+1 queries | padding to 2W | the draft block]."""

    rows_formula = "3B-2"

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return 3 * width + 1

    @staticmethod
    def rows_per_iteration(width: int) -> int:
        return 3 * width + 1

    def prefill(self) -> Steps:
        length, width, sampling = len(self.prompt), self.settings.width, self.settings.sampling
        logits = yield queried_prefill(self.prompt_ids, self.model.mask_token_id, width)
        self.model.commit(length)
        done = yield from self.first(logits[0:1])
        first = range(length, length + 1)  # the first token's position
        self.drafts = yield Host(proposals_ahead, logits[2:], range(length, length + width), first, sampling)
        return done

    def step(self) -> Steps:
        s, n = self.settings, self.position
        drafts = self.drafts
        m = len(drafts.tokens)
        shape = _packed_shape(m, s.width, self.model.mask_token_id, s.pad_verify, self.model.device)
        queries, padding, block = shape.masks
        logits = yield shape.call([self.last, drafts.tokens, queries, padding, self.last, block], n)
        # The queries' verification, then the draft block's proposals for n+1..n+W less what the
        # emitted tokens took: one Host step, so a batch runs both in one wave.
        emitted, self.drafts = yield Host(verify_ahead, logits[m + 1 : 2 * m + 2], drafts.tokens, drafts.probs,
                                          logits[-s.width :], n + 1, s.sampling)  # fmt: skip
        done = self.verified(emitted, m)
        self.position += len(emitted)
        return done
