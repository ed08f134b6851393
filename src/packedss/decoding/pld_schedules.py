"""`pld`, prompt lookup decoding, on every family whose AR mode can verify a draft
(docs/schedules.md §18): each iteration looks the draft up in the context (packedss.decoding.pld)
and makes one call that verifies the last token plus the draft with the family's own verifier.
Lossless: it emits what the family's `ar` emits.

- Nemotron: the causal rows [last@n, d_1..d_m]; row i predicts n+i+1.
- SDAR: those clean rows and their m+1 queries MASK@n+1..n+m+1 (packedss.decoding.queried).
- SetDLM, order=ltr: the correction p, the clean draft rows by position and m+1 mask queries,
  query j seeing the clean rows before it (a Linear-SS verify call without its draft call)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from packedss.decoding.anyorder import _SetDecoder, _verify_layout
from packedss.decoding.calls import CallModel
from packedss.decoding.driver import AnyOrderSettings, Host, Steps
from packedss.decoding.pld import lookup_draft, point_mass, room_for_drafts, verify_lookup
from packedss.decoding.queried import _QueriedAR, _verify_shape
from packedss.decoding.rows import materialized, uploaded
from packedss.decoding.schedules import _causal_shape, _LTRDecoder
from packedss.decoding.trace import StopCheck

NAME = "pld"


class _LTRLookup(_LTRDecoder):
    """PLD on Nemotron: one causal call of 1 + m rows per iteration (m <= W)."""

    name = NAME

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return width + 1

    def __init__(self, model: CallModel, prompt: Sequence[int], settings, stop_check: StopCheck | None):
        super().__init__(model, prompt, settings, stop_check)
        self.context = list(self.prompt)  # the prompt and every token emitted so far

    def emit(self, tokens: list[int]) -> bool:
        self.context += tokens
        return super().emit(tokens)

    def lookup(self) -> list[int]:
        s = self.settings
        room = room_for_drafts(s.width, s.max_new_tokens, self.produced)
        return lookup_draft(self.context, room, s.max_ngram, s.eos_token_ids)

    def prefill(self) -> Steps:
        return (yield from self.prefill_prompt())

    def verify_call(self, drafts: torch.Tensor) -> Steps:
        """The call verifying [last, drafts]; returns the m+1 verifier rows."""
        logits = yield _causal_shape(drafts.shape[0] + 1, self.model.device).call([self.last, drafts], self.position)
        return logits

    def step(self) -> Steps:
        drafts = uploaded(self.lookup(), self.model.device)
        logits = yield from self.verify_call(drafts)
        emitted = yield Host(verify_lookup, logits, drafts, self.settings.sampling)  # batched across requests
        done = self.verified(emitted, drafts.shape[0])
        self.position += len(emitted)
        return done


class _QueriedLookup(_LTRLookup):
    """PLD on SDAR: the clean rows [last, d_1..d_m] and their m+1 queries, 2(m+1) rows."""

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return 2 * (width + 1)

    def prefill(self) -> Steps:
        return (yield from _QueriedAR.prefill(self))

    def verify_call(self, drafts: torch.Tensor) -> Steps:
        m = drafts.shape[0]
        shape = _verify_shape(m, self.model.mask_token_id, self.model.device)
        logits = yield shape.call([self.last, drafts, *shape.masks], self.position)
        return logits[m + 1 :]


class _SetLookup(_SetDecoder):
    """PLD on a set model in left-to-right order: [p | d_1..d_m | m+1 queries] per iteration."""

    name = NAME

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return 2 * width + 2  # p + m + (m + 1) with m <= W

    def __init__(self, model: CallModel, prompt: Sequence[int], settings: AnyOrderSettings,
                 stop_check: StopCheck | None):  # fmt: skip
        if settings.order != "ltr":
            raise ValueError(f"schedule {NAME} verifies left to right: order must be ltr, got {settings.order!r}")
        super().__init__(model, prompt, settings, stop_check)

    def step(self) -> Steps:
        s, start, p = self.settings, self.contiguous, len(self.pending)
        context = self.prompt + self.emitter.tokens  # left to right, every resolved token is emitted
        drafts = lookup_draft(context, room_for_drafts(s.width, s.max_new_tokens, self.produced), s.max_ngram,
                              s.eos_token_ids)  # fmt: skip
        m = len(drafts)
        sigma = list(range(start, start + m + 1))
        self.drafts = {start + k: (token, None) for k, token in enumerate(drafts)}
        layout = _verify_layout(p, m, m + 1, self.model.device)
        logits = yield from self.run("verify", self.pending, sigma[:m], drafts, layout, sigma, m + 1)
        if m and not s.sampling.greedy:
            q = point_mass(materialized(self.clean_rows(m)), logits.shape[-1], logits.dtype)
            self.drafts = {position: (token, q[k]) for k, (position, token) in enumerate(zip(sigma, drafts))}
        _, done, _ = yield from self.verify_ranks(sigma, logits[p + m :])
        return done


# The pld schedule of each family (packedss.families appends it to the family's schedules).
LOOKUP_DECODERS = {"nemotron": _LTRLookup, "setdlm": _SetLookup, "sdar": _QueriedLookup}
