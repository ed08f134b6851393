"""Drafting and verification rules (all on the device; one host sync per verification).

- T = 0: greedy exact match against the verifier's argmax.
- `rejection`: speculative sampling; accept d_i with probability min(1, p_i(d_i)/q_i(d_i)),
  on rejection sample from norm(max(0, p_i - q_i)); bonus from p when all are accepted.
- `match`: sample v_i ~ p_i, accept while v_i == d_i, emit the v's.
Both sampling rules preserve the verifier's distribution p exactly.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

VERIFY_RULES = ("rejection", "match")  # the rules a run can choose at T > 0
GREEDY = "greedy"  # the rule recorded at T = 0, where both rules reduce to exact match


@dataclass(frozen=True)
class Sampling:
    temperature: float
    rule: str  # one of VERIFY_RULES; ignored at T = 0
    generator: torch.Generator | None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T), computed in at least float32."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return torch.softmax(logits / temperature, dim=-1)


def sample_tokens(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One sample per row of a (R, V) probability matrix."""
    return torch.multinomial(probs, 1, generator=generator).view(-1)


def propose(draft_logits: torch.Tensor, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draft tokens from the drafter's logits (W, V), plus the distribution q they were sampled
    from (None when greedy)."""
    if sampling.greedy:
        return draft_logits.argmax(dim=-1), None
    q = probabilities(draft_logits, sampling.temperature)
    return sample_tokens(q, sampling.generator), q


def next_token(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The verifier's own token from one row of logits (V,): argmax at T = 0, else a sample."""
    if sampling.greedy:
        return logits.argmax(dim=-1).view(1)
    return sample_tokens(probabilities(logits.view(1, -1), sampling.temperature), sampling.generator)


def _accepted_prefix(accept: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of a bool vector, as a 0-d tensor."""
    return accept.to(torch.long).cumprod(dim=0).sum()


class Emitted(list):
    """The tokens one verification emits (a plain list of ints to every reader), plus `last`:
    the last of them as a (1,) long tensor still on the device, so that the next call can be
    built without copying a host integer back to the device (a CUDA synchronization)."""

    def __init__(self, tokens: list[int], last: torch.Tensor):
        super().__init__(tokens)
        self.last = last


def last_token(emitted: list[int], device: torch.device) -> torch.Tensor:
    """The last emitted token as a (1,) device tensor (no copy when `verify` made it)."""
    last = getattr(emitted, "last", None)
    if last is None:  # a list from elsewhere (e.g. a replaced verifier in a test)
        last = torch.tensor(emitted[-1:], dtype=torch.long, device=device)
    return last


def verify(
    verifier_logits: torch.Tensor,
    drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    sampling: Sampling,
) -> list[int]:
    """Verify m drafts with m+1 verifier rows (row i predicts the position of draft i+1; row m
    gives the bonus). Returns the emitted tokens: the h accepted drafts and one more token
    (correction or bonus), so 1 <= len <= m+1, as an `Emitted` list. The one host-device
    synchronization is the read-back of the accepted length and tokens (`.tolist()`)."""
    m = drafts.shape[0]
    if sampling.greedy:
        verified = verifier_logits.argmax(dim=-1)
        h = _accepted_prefix(verified[:m] == drafts)
        out = torch.cat([h.view(1), verified]).tolist()
        return Emitted(out[1 : out[0] + 2], verified.index_select(0, h.view(1)))
    p = probabilities(verifier_logits, sampling.temperature)
    if sampling.rule == "match":
        verified = sample_tokens(p, sampling.generator)
        h = _accepted_prefix(verified[:m] == drafts)
        out = torch.cat([h.view(1), verified]).tolist()
        return Emitted(out[1 : out[0] + 2], verified.index_select(0, h.view(1)))
    if sampling.rule != "rejection":
        raise ValueError(f"unknown verification rule {sampling.rule!r}; valid: {VERIFY_RULES}")
    rows = torch.arange(m, device=drafts.device)
    p_draft = p[rows, drafts]
    q_draft = draft_probs[rows, drafts]
    uniform = torch.rand(m, generator=sampling.generator, device=p.device, dtype=p.dtype)
    h = _accepted_prefix(uniform * q_draft < p_draft)
    # Row h of [q; 0]: the residual norm(max(0, p_h - q_h)) on rejection, p_m itself for the bonus.
    q_ext = torch.cat([draft_probs, torch.zeros_like(p[:1])])
    p_h = p.index_select(0, h.view(1))
    residual = (p_h - q_ext.index_select(0, h.view(1))).clamp_(min=0)
    mass = residual.sum(dim=-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(p.dtype).tiny), p_h)
    last = sample_tokens(residual, sampling.generator)
    out = torch.cat([h.view(1), drafts, last]).tolist()
    h_int = out[0]
    return Emitted(out[1 : 1 + h_int] + [out[-1]], last)


def question_seed(seed: int, question_id: str, sample: int = 0) -> int:
    """The seed of one response's generator: a hash of (run seed, question, sample index), so
    every response draws the same random numbers whatever ran before it."""
    key = f"{seed}:{question_id}" if sample == 0 else f"{seed}:{question_id}:{sample}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
