"""Drafting and verification rules, all on the device. A verification reads back from the device
once (its `.tolist()` of the accepted length and tokens); drafting and sampling read nothing back.

- T = 0: greedy exact match against the verifier's argmax.
- `rejection`: speculative sampling; accept d_i with probability min(1, p_i(d_i)/q_i(d_i)),
  on rejection sample from norm(max(0, p_i - q_i)); bonus from p when all are accepted.
- `match`: sample v_i ~ p_i, accept while v_i == d_i, emit the v's.
Both sampling rules preserve the verifier's distribution p exactly.

Sampling is by a blocked inverse CDF (`inverse_cdf`): row i's token is the first whose cumulative
probability exceeds u_i times the row's total, u_i a float32 uniform of the response's own
generator (one per row: `uniforms`). The vocabulary is cut into blocks of about its square root
(`vocabulary_block`); the cumulative sum runs over the blocks' masses, then inside the one block
the target falls in, both in float64. It picks token j with probability p_j / sum(p) to the
uniform's resolution of 2^-24 and the float32 rounding of a block's mass (the rounding p_j itself
carries), never a zero-probability token, and needs one random number per row (the exponential
race before it drew one per vocabulary entry), so a batch (packedss.decoding.batched_ops) draws
every request's uniforms from its own generator and samples every row of a round in one
operation. No (rows, vocabulary) float64 copy is made: a cumulative sum over the whole vocabulary
in float64 (the sampler before this one) wrote two of them, 16 bytes per row and entry.
Nothing reads the device back (`torch.multinomial` checks its input, two syncs per draw on CUDA).
SAMPLER names this rule in the identity of the jobs that draw by it (docs/records.md).

Near-ties (docs/records.md): at T = 0 every emitted token is the argmax of one verifier row; where
that row's top-2 logit margin is within NEAR_TIE_ULPS units in the last place of the logits' dtype
at the top logit's magnitude, another call shape's rounding can pick the other token.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from packedss.decoding.rows import Rows, concatenated

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
    """softmax(logits / T), computed in at least float32 (at T = 1 without the division, which
    would only copy the logits: x / 1 is x exactly)."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return torch.softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)


SAMPLER = "blocked-inverse-cdf"  # how a sampled token is drawn (module docstring)
EXPONENTIAL_RACE = "exponential-race"  # the draw SDAR's native decoder and S2D2 keep (exponential_race)


def uniforms(count: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """`count` float32 uniforms in [0, 1) of `generator`'s stream: one per row a draw samples."""
    return torch.rand(count, generator=generator, device=device)


def vocabulary_block(vocabulary: int) -> int:
    """The blocks `inverse_cdf` cuts a vocabulary into: the smallest power of two not below its
    square root (32 for 1,024 entries, 512 for 151,936)."""
    return 1 << (max(vocabulary - 1, 1).bit_length() + 1) // 2


# Below a positive float64 total by at least one unit in its last place: the largest remainder a
# block's own cumulative sum holds strictly.
BELOW_ONE = 1.0 - 2.0**-51


def inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Row i's token: the first whose cumulative probability exceeds uniform[i] x the row's total.
    The block is the first whose cumulative mass (block sums in the probabilities' dtype,
    accumulated in float64) exceeds the target, and so has mass; inside it, the target's remainder is clamped below the
    block's own float64 total, so the token found has probability above zero. Every step is the
    row's own: a row's token does not depend on the rows drawn beside it."""
    rows, vocabulary = probs.shape
    block = vocabulary_block(vocabulary)
    whole = vocabulary // block
    ragged = whole * block < vocabulary
    masses = probs[:, : whole * block].reshape(rows, whole, block).sum(dim=-1)
    if ragged:
        masses = torch.cat([masses, probs[:, whole * block :].sum(dim=-1, keepdim=True)], dim=1)
    # starts[:, b]: the mass before block b, from 0; its last column is the row's total
    starts = torch.nn.functional.pad(masses.double(), (1, 0)).cumsum_(dim=-1)
    target = uniform.double().mul_(starts[:, -1]).unsqueeze_(1)
    chosen = torch.searchsorted(starts, target, right=True).clamp_(max=masses.shape[1]).sub_(1)
    remainder = target - starts.gather(1, chosen)  # >= 0: the block's start is at most the target
    columns = torch.arange(block, device=probs.device).add(chosen, alpha=block)
    if ragged:  # the last block's columns past the vocabulary: no token, no mass
        past = columns >= vocabulary
        columns = columns.clamp_(max=vocabulary - 1)
        inside = probs.gather(1, columns).masked_fill_(past, 0)
    else:
        inside = probs.gather(1, columns)
    inside = inside.double().cumsum_(dim=-1)
    remainder = torch.minimum(remainder, inside[:, -1:] * BELOW_ONE)
    offset = torch.searchsorted(inside, remainder, right=True).clamp_(max=block - 1)
    return columns.gather(1, offset).squeeze_(1)


def sample_tokens(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One sample per row of a (R, V) matrix of probabilities (rows need not sum to 1)."""
    return inverse_cdf(probs, uniforms(probs.shape[0], generator, probs.device))


def exponential_race(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One sample per row as argmax_i p_i / E_i, E_i ~ Exp(1) from `generator`: one draw per
    vocabulary entry. The SDAR block-diffusion schedules' sampler (packedss.decoding.blockdiff),
    kept so their records keep the stream they were made with (in a batch each request's race is
    drawn from its own generator: packedss.decoding.block_steps)."""
    race = torch.empty_like(probs).exponential_(generator=generator)
    # An Exp(1) draw of exactly 0 (probability below 1e-38) would make 0/0 for a zero probability.
    race.clamp_(min=torch.finfo(race.dtype).tiny)
    return (probs / race).argmax(dim=-1)


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


def first_token(logits: torch.Tensor, sampling: Sampling) -> Emitted:
    """`next_token` and its read-back: the one token a row emits, as an `Emitted` list."""
    token = next_token(logits, sampling)
    return Emitted(token.tolist(), token)


def _accepted_prefix(accept: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of a bool vector, as a 0-d tensor."""
    return accept.to(torch.long).cumprod(dim=0).sum()


class Emitted(list):
    """The tokens one verification emits (a plain list of ints to every reader), plus `last`:
    the last of them as a (1,) long tensor still on the device, so that the next call can be
    built without copying a host integer back to the device (a CUDA synchronization), and
    `deciding`: the verifier rows, row i the one that decided emitted token i."""

    def __init__(self, tokens: list[int], last: torch.Tensor, deciding: torch.Tensor | None = None):
        super().__init__(tokens)
        self.last = last
        self.deciding = deciding


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
    synchronization is the read-back of the accepted length and tokens (`.tolist()`); at T > 0
    the draws (`sample_tokens`) read nothing back. Each verification draws m + 1 uniforms of the
    response's generator at once: `match` one per verifier row, `rejection` one per draft's test
    and one for the correction or bonus."""
    m = drafts.shape[0]
    if sampling.greedy:
        verified = verifier_logits.argmax(dim=-1)
        h = _accepted_prefix(verified[:m] == drafts)
        out = torch.cat([h.view(1), verified]).tolist()
        return Emitted(out[1 : out[0] + 2], verified.index_select(0, h.view(1)), verifier_logits)
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
    uniform = uniforms(m + 1, sampling.generator, p.device)
    h = _accepted_prefix(uniform[:m] * q_draft < p_draft)
    # Row h of [q; 0]: the residual norm(max(0, p_h - q_h)) on rejection, p_m itself for the bonus.
    q_ext = torch.cat([draft_probs, torch.zeros_like(p[:1])])
    p_h = p.index_select(0, h.view(1))
    residual = (p_h - q_ext.index_select(0, h.view(1))).clamp_(min=0)
    mass = residual.sum(dim=-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(p.dtype).tiny), p_h)
    last = inverse_cdf(residual, uniform[m:])
    out = torch.cat([h.view(1), drafts, last]).tolist()
    h_int = out[0]
    return Emitted(out[1 : 1 + h_int] + [out[-1]], last)


NEAR_TIE_ULPS = 8


def near_tie_threshold(top, dtype: torch.dtype):
    """NEAR_TIE_ULPS units in the last place of `dtype` at the magnitude of the top logits `top`
    (at least at magnitude 1): bf16 about 0.06 at a logit of 1 and 0.5 at 10, float16 1/128 and
    1/16, float32 1e-6 and 8e-6. `top` is a tensor, or a float32 NumPy array (the batched
    readout's on a CPU, packedss.decoding.batched_ops._Greedy), and so is the threshold."""
    # The largest power of 2 not above |top|, its float32 mantissa cleared (+-inf counts as the
    # largest finite float32; NaN gives inf, against which a NaN margin is never a near-tie).
    if isinstance(top, np.ndarray):
        magnitude = np.abs(top.astype(np.float32, copy=False)).clip(1.0, np.finfo(np.float32).max)
        power = (magnitude.view(np.int32) & 0x7F800000).view(np.float32)
    else:
        magnitude = top.float().abs().clamp(min=1.0, max=torch.finfo(torch.float32).max)
        power = (magnitude.view(torch.int32) & 0x7F800000).view(torch.float32)
    return NEAR_TIE_ULPS * torch.finfo(dtype).eps * power


class DecidedMargins(NamedTuple):
    """In a batch (packedss.decoding.batched_ops): the top-2 margins of the rows that decided a
    verification's emitted tokens, Rows of the round's margins on the device, and their near-tie
    flags, read back already with the round's accepted tokens."""

    margins: Rows
    near: list[int]


class NearTies:
    """The top-2 logit margins of the rows that decided a response's emitted tokens (T = 0), kept
    on the device while decoding and read back once, by `read`, when the response is done. In a
    batch the flags come with each round's read-back, so only the near-ties' margins are kept,
    and a response without any reads nothing back at its end."""

    def __init__(self) -> None:
        self.indexes: list[int] = []  # output index (position in output_ids) of each row
        self.top2: list = []  # per note, (rows, 2) top logits; in a batch, a near-tie's margin (Rows)
        self.dtype: torch.dtype | None = None

    def note(self, indexes, rows) -> None:
        """Row k of `rows` (V logits) decided the token at output index indexes[k]. In a batch,
        `rows` are DecidedMargins."""
        if type(rows) is DecidedMargins:
            if any(rows.near):
                for k, index in enumerate(indexes):
                    if rows.near[k]:
                        self.indexes.append(index)
                        self.top2.append(rows.margins[k : k + 1])
            return
        indexes = list(indexes)
        self.indexes += indexes
        self.top2.append(rows[: len(indexes)].topk(2, dim=-1).values)
        self.dtype = rows.dtype

    def read(self, outputs: int) -> list[list]:
        """[output index, margin] of every near-tie among the first `outputs` output positions."""
        if not self.top2:
            return []
        if type(self.top2[0]) is Rows:  # the near-ties' margins (batched)
            margins = concatenated(self.top2, self.top2[0].source.device).tolist()
            return [[i, m] for i, m in zip(self.indexes, margins) if i < outputs]
        top2 = torch.cat(self.top2).float()
        margin = top2[:, 0] - top2[:, 1]
        near = margin <= near_tie_threshold(top2[:, 0], self.dtype)
        margins, flags = torch.stack([margin, near.float()]).tolist()
        return [[i, m] for i, m, f in zip(self.indexes, margins, flags) if f and i < outputs]


def question_seed(seed: int, question_id: str, sample: int = 0) -> int:
    """The seed of one response's generator: a hash of (run seed, question, sample index), so
    every response draws the same random numbers whatever ran before it."""
    key = f"{seed}:{question_id}" if sample == 0 else f"{seed}:{question_id}:{sample}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
