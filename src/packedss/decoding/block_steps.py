"""The SDAR block-diffusion decoders' host steps (packedss.decoding.blockdiff), alone and for every
request of a round at once: `denoise` (sdar-native's denoising step), `s2d2_draft` and
`s2d2_verify` (S2D2's draft and verify calls). Alone each is the plain function of one block. In a
batch (packedss.decoding.engine) the same step of every request runs here at once, with one
read-back: one softmax over every request's rows, each request's random draws from its own
generator as many and in the order alone (an exponential race of V draws per row, S2D2's
uniforms per drafted row, a rejected draft's race after them), and each block's remasking from
one comparison and each distinct count's top-k (docs/concurrency.md §2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from packedss.decoding.batched_anyorder import float_bits, floats_of
from packedss.decoding.batched_ops import BATCHED
from packedss.decoding.rows import concatenated, materialized, uploaded
from packedss.decoding.verify import Sampling, exponential_race, probabilities


def distributions(logits: torch.Tensor, temperature: float, mask_token_id: int) -> torch.Tensor:
    """softmax(logits / T), at T = 0 softmax(logits) (S2D2's greedy reading), with no mass on the
    mask token: a block position is never resolved to MASK, so every block finishes within its
    steps. (The releases leave the mask logit, and a row that proposes MASK stays masked: with
    steps to spare they spend one more denoise call on it, at the block's last step generate.py
    reads past its step schedule and raises IndexError, and S2D2's verifier mostly rejects a mask
    draft and resamples it; docs/schedules.md §17.)"""
    logits = logits.clone()
    logits[:, mask_token_id] = -torch.inf
    return probabilities(logits, temperature or 1.0)


def denoised(logits: torch.Tensor, temperature: float, generator,
             mask_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Each row's token (argmax at T = 0, else a sample), its probability, and the rows'
    distributions (`distributions`)."""
    probs = distributions(logits, temperature, mask_token_id)
    tokens = probs.argmax(dim=-1) if temperature == 0 else exponential_race(probs, generator)
    return tokens, probs.gather(-1, tokens[:, None])[:, 0], probs


def low_confidence_dynamic(confidence: torch.Tensor, masked: torch.Tensor, count: int, threshold: float) -> torch.Tensor:
    """The release's remasking: every masked row above the threshold when there are at least
    `count` of them, else the `count` most confident masked rows."""
    confidence = torch.where(masked, confidence, -torch.inf)
    high = confidence > threshold
    if int(high.sum()) >= count:
        return high
    chosen = torch.zeros_like(masked)
    chosen[confidence.topk(count).indices] = True
    return chosen


def denoise(logits: torch.Tensor, tokens: torch.Tensor, count: int, threshold: float, mask_token_id: int,
            sampling: Sampling) -> tuple[torch.Tensor, int]:  # fmt: skip
    """One denoising step of a block (`tokens`, MASK where unresolved) from its call's logits:
    each row's proposal, then low-confidence dynamic remasking of at least `count` rows. The
    block's new tokens and how many it resolved."""
    proposal, confidence, _ = denoised(logits, sampling.temperature, sampling.generator, mask_token_id)
    chosen = low_confidence_dynamic(confidence, tokens == mask_token_id, count, threshold)
    return torch.where(chosen, proposal, tokens), int(chosen.sum())


def _proposed_blocks(args: Sequence[tuple], block: int, counts: list[int], threshold: float, mask: int,
                     device: torch.device):  # fmt: skip
    """Every request's block at once (args[k][0] its logits, args[k][1] its tokens, its Sampling
    last): one softmax over every row, each row's proposal (at T > 0 each request's exponential
    race from its own generator, V draws per row as alone), and the remasking of every block from
    one comparison and each distinct count's top-k. The distributions, the proposals and the
    rows each block's remasking resolves, (requests, B)."""
    requests, sampling = len(args), args[0][-1]
    probs = distributions(concatenated([a[0] for a in args], device), sampling.temperature, mask)
    if sampling.temperature == 0:
        proposal = probs.argmax(dim=-1)
    else:
        race = torch.empty_like(probs)
        for k, a in enumerate(args):
            race[k * block : (k + 1) * block].exponential_(generator=a[-1].generator)
        proposal = (probs / race.clamp_(min=torch.finfo(race.dtype).tiny)).argmax(dim=-1)
    tokens = torch.stack([a[1] for a in args])
    confidence = torch.where(tokens == mask, probs.gather(-1, proposal[:, None]).view(requests, block), -torch.inf)
    high = confidence > threshold
    chosen = torch.zeros_like(high)
    for count in sorted(set(counts)):  # each distinct count's most confident rows, as topk alone
        rows = uploaded([k for k, c in enumerate(counts) if c == count], device)
        top = confidence.index_select(0, rows).topk(count, dim=1).indices
        chosen[rows[:, None], top] = True
    chosen = torch.where((high.sum(dim=1) >= uploaded(counts, device))[:, None], high, chosen)
    return probs, proposal, tokens, chosen


def _denoised_blocks(args: Sequence[tuple], device: torch.device):
    """`denoise` of every request's block at once (`_proposed_blocks`). Read back: how many each
    block resolved."""
    block = len(args[0][1])
    if any(len(a[1]) != block for a in args):  # blocks of different sizes: one at a time
        results = [denoise(materialized(a[0]), *a[1:]) for a in args]
        return None, lambda values: results
    _, proposal, tokens, chosen = _proposed_blocks(args, block, [a[2] for a in args], args[0][3], args[0][4], device)
    new = torch.where(chosen, proposal.view(len(args), block), tokens).unbind(0)
    return chosen.sum(dim=1), lambda values: list(zip(new, values))


def _acceptance_estimates(probs: torch.Tensor) -> torch.Tensor:
    """Each row's `soft_entropy_negexp` acceptance estimate exp(-H / log V)."""
    entropy = -(probs * probs.clamp(min=1e-12).log()).sum(dim=-1) / math.log(probs.shape[-1])
    return torch.exp(-entropy)


def verify_score(probs: torch.Tensor, penalty: float) -> float:
    """S2D2's `difference_static` score with the `soft_entropy_negexp` estimator: the expected
    accepted length sum_k prod_{i<=k} exp(-H_i / log V) of the span, minus the penalty c."""
    return float(_acceptance_estimates(probs).cumprod(dim=0).sum()) - penalty


class Drafted(NamedTuple):
    """A draft call's outcome: each row's proposal and distribution, then either `resolved` None
    (the span waits for a verify call; `tokens` unchanged) or the positions the remasking
    resolved and the block's new tokens."""

    proposal: torch.Tensor
    probs: torch.Tensor
    resolved: list[int] | None
    tokens: torch.Tensor


def s2d2_draft(logits, tokens: torch.Tensor, span: range, count: int, penalty: float, score_threshold: float,
               threshold: float, mask_token_id: int, sampling: Sampling) -> Drafted:  # fmt: skip
    """S2D2's draft call: every row's proposal; at a span score (`verify_score`) of at least the
    threshold tau the span waits for a verify call, else the release's remasking resolves at least
    `count` rows at once."""
    proposal, confidence, probs = denoised(materialized(logits), sampling.temperature, sampling.generator, mask_token_id)
    if verify_score(probs[span.start : span.stop], penalty) >= score_threshold:
        return Drafted(proposal, probs, None, tokens)
    chosen = low_confidence_dynamic(confidence, tokens == mask_token_id, count, threshold)
    resolved = [k for k, flag in enumerate(chosen.tolist()) if flag]
    return Drafted(proposal, probs, resolved, torch.where(chosen, proposal, tokens))


def _s2d2_drafts(args: Sequence[tuple], device: torch.device):
    """`s2d2_draft` of every request's block at once (`_proposed_blocks`), each span's score from
    the rows' entropies of one pass. Read back: every score's bits, every block's resolved rows."""
    block = len(args[0][1])
    if any(len(a[1]) != block for a in args):  # blocks of different sizes: one at a time
        results = [s2d2_draft(*a) for a in args]
        return None, lambda values: results
    requests, (*_, threshold, mask, _) = len(args), args[0]
    probs, proposal, tokens, chosen = _proposed_blocks(args, block, [a[3] for a in args], threshold, mask, device)
    alpha = _acceptance_estimates(probs)
    scores = torch.stack([alpha[k * block + a[2].start : k * block + a[2].stop].cumprod(dim=0).sum()
                          for k, a in enumerate(args)])  # fmt: skip
    new = torch.where(chosen, proposal.view(requests, block), tokens).unbind(0)
    proposals, distributions_ = proposal.view(requests, block).unbind(0), probs.view(requests, block, -1).unbind(0)

    def finish(values: list[int]) -> list:
        out = []
        for k, (a, score) in enumerate(zip(args, floats_of(values[:requests], scores.dtype))):
            if score - a[4] >= a[5]:
                out.append(Drafted(proposals[k], distributions_[k], None, a[1]))
            else:
                flags = values[requests + k * block : requests + (k + 1) * block]
                out.append(Drafted(proposals[k], distributions_[k], [j for j, flag in enumerate(flags) if flag], new[k]))
        return out

    return torch.cat([float_bits(scores), chosen.view(-1).long()]), finish


def s2d2_verify(logits, tokens: torch.Tensor, span: range, proposal: torch.Tensor, probs: torch.Tensor, block: int,
                mask_token_id: int, sampling: Sampling) -> tuple[torch.Tensor, int, int]:  # fmt: skip
    """S2D2's verify call [block filled with the drafts | B queries]: the span's drafts are
    accepted while u < min(1, q/p), and the first rejected one is resampled from norm((q - p)+)
    (q the verifier's, p the drafter's; no bonus token). The block's new tokens, the tokens
    resolved and the drafts accepted."""
    logits = materialized(logits)
    rows = torch.arange(span.start, span.stop, device=logits.device)
    drafts = proposal[rows]
    q = distributions(logits[block + rows], sampling.temperature, mask_token_id)
    p = probs[rows]
    ratio = _acceptance_ratios(q, p, drafts)
    uniform = torch.rand(len(rows), generator=sampling.generator, device=logits.device, dtype=ratio.dtype)
    accepted = int((uniform < ratio).to(torch.long).cumprod(dim=0).sum())
    return (*_resampled(tokens, span, drafts, q, p, accepted, sampling.generator), accepted)


def _acceptance_ratios(q: torch.Tensor, p: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """Each draft's acceptance probability min(1, q(d) / p(d)) (q the verifier's rows, p the drafter's)."""
    picked = torch.arange(len(drafts), device=drafts.device)
    return (q[picked, drafts] / p[picked, drafts].clamp(min=1e-12)).clamp(max=1.0)


def _resampled(tokens, span: range, drafts, q, p, accepted: int, generator) -> tuple[torch.Tensor, int]:
    """The block's tokens with the span's accepted drafts and, after a rejection, the resampled one."""
    resolved = drafts.clone()
    if accepted < len(span):
        residual = (q[accepted] - p[accepted]).clamp(min=0)
        residual = torch.where(residual.sum() > 0, residual, q[accepted])
        resolved[accepted] = exponential_race(residual[None, :], generator)[0]
        resolved = resolved[: accepted + 1]
    tokens = tokens.clone()
    tokens[span.start : span.start + len(resolved)] = resolved
    return tokens, len(resolved)


def _s2d2_verifications(args: Sequence[tuple], device: torch.device):
    """`s2d2_verify` of every request at once: one softmax over every request's span queries, the
    ratios of all drafts, each request's uniforms from its own generator; after the read-back of
    the acceptance tests, each rejected draft's race from its own generator (drawn after its
    uniforms, as alone)."""
    block, mask, sampling = args[0][5], args[0][6], args[0][-1]
    spans = [a[2] for a in args]
    q = distributions(concatenated([a[0][block + s.start : block + s.stop] for a, s in zip(args, spans)], device),
                      sampling.temperature, mask)  # fmt: skip
    drafts = concatenated([a[3][s.start : s.stop] for a, s in zip(args, spans)], device)
    p = concatenated([a[4][s.start : s.stop] for a, s in zip(args, spans)], device)
    ratio = _acceptance_ratios(q, p, drafts)
    uniform = torch.cat([torch.rand(len(s), generator=a[-1].generator, device=device, dtype=ratio.dtype)
                         for a, s in zip(args, spans)])  # fmt: skip

    def finish(values: list[int]) -> list:
        out, start = [], 0
        for a, s in zip(args, spans):
            accepted = 0
            while accepted < len(s) and values[start + accepted]:
                accepted += 1
            here = slice(start, start + len(s))
            out.append((*_resampled(a[1], s, drafts[here], q[here], p[here], accepted, a[-1].generator), accepted))
            start += len(s)
        return out

    return (uniform < ratio).long(), finish


# The engine finds a Host step's batched form by its function.
BATCHED.update({denoise: _denoised_blocks, s2d2_draft: _s2d2_drafts, s2d2_verify: _s2d2_verifications})
