"""Prompt lookup decoding (PLD): the draft is read from the context itself, with no drafter call
(docs/schedules.md §18). The rule is that of transformers' PromptLookupCandidateGenerator
(`generate(prompt_lookup_num_tokens=k, max_matching_ngram_size=n)`): for n-gram sizes from n down
to 1, find the earliest earlier occurrence of the context's last n-gram in the whole context
(prompt and generated tokens); the draft is the tokens that follow it, at most k and not past the
context's end, cut before the first EOS. No match: no draft.

The draft is deterministic, so as a proposal distribution it is the point mass on each draft
token: speculative sampling then accepts d with probability p(d) and, on rejection, samples from
p with d removed (`verify_lookup`), which keeps the verifier's distribution exactly."""

from __future__ import annotations

from collections.abc import Container, Sequence

import torch

from packedss.decoding.verify import Sampling, verify

# transformers' defaults: PromptLookupCandidateGenerator(num_output_tokens=10, max_matching_ngram_size=2).
DEFAULT_DRAFT_TOKENS = 10
DEFAULT_MAX_NGRAM = 2


def lookup_draft(context: Sequence[int], draft_tokens: int, max_ngram: int = DEFAULT_MAX_NGRAM,
                 eos_token_ids: Container[int] = ()) -> list[int]:  # fmt: skip
    """The PLD draft for `context`: at most `draft_tokens` tokens, [] when no n-gram matches."""
    if draft_tokens < 1 or max_ngram < 1:
        return []
    context = list(context)
    length = len(context)
    for size in range(min(max_ngram, length - 1), 0, -1):
        start = _first_occurrence(context, context[length - size :], length - size)
        if start is not None:
            follow = context[start + size : min(start + size + draft_tokens, length)]
            return _before_eos(follow, eos_token_ids)
    return []


def _first_occurrence(context: list[int], ngram: list[int], end: int) -> int | None:
    """The first start < `end` where `ngram` occurs in `context`; the candidates are found by
    list.index of its first token (C speed), not by slicing at every start."""
    start = 0
    while True:
        try:
            start = context.index(ngram[0], start, end)
        except ValueError:
            return None
        if context[start : start + len(ngram)] == ngram:
            return start
        start += 1


def _before_eos(draft: list[int], eos_token_ids: Container[int]) -> list[int]:
    """The draft up to its first EOS, exclusive (the verifier must emit an EOS itself)."""
    for k, token in enumerate(draft):
        if token in eos_token_ids:
            return draft[:k]
    return draft


def room_for_drafts(width: int, max_new_tokens: int, produced: int) -> int:
    """The draft length: k = W, less what the output cap leaves after the verifier's own token."""
    return max(0, min(width, max_new_tokens - produced - 1))


def point_mass(drafts: torch.Tensor, vocabulary: int, dtype: torch.dtype) -> torch.Tensor:
    """(m, V): the distribution a deterministic draft was 'sampled' from, one-hot per row."""
    if dtype not in (torch.float32, torch.float64):
        dtype = torch.float32  # what verify's probabilities are computed in
    q = torch.zeros(drafts.shape[0], vocabulary, dtype=dtype, device=drafts.device)
    return q.scatter_(1, drafts.view(-1, 1), 1.0)


def verify_lookup(verifier_logits: torch.Tensor, drafts: torch.Tensor, sampling: Sampling) -> list[int]:
    """`verify` of a deterministic draft: its q is the point mass (the rejection rule's residual is
    then p without the rejected token); greedy and `match` read no q."""
    q = None
    if not sampling.greedy and sampling.rule == "rejection":
        q = point_mass(drafts, verifier_logits.shape[-1], verifier_logits.dtype)
    return verify(verifier_logits, drafts, q, sampling)
