"""The SDAR family's schedules (docs/schedules.md §17): a block-diffusion model whose mask rows
predict their own position, and whose AR mode is block size 1 (a mask at i that sees the clean
tokens before it predicts the token at i).

- `ar`, `linear`, `packed`: the LTR schedules with SDAR's verifier, query rows after the clean
  ones (packedss.decoding.queried). Lossless: they emit what `ar` emits.
- `sdar-native`: the release's block diffusion (JetAstra/SDAR generate.py): aligned blocks of B
  tokens, low-confidence dynamic remasking at 0.85 in B steps, a commit call per block.
- `s2d2`: S2D2's self-speculation (phymhan/S2D2 SDAR/generate_ssd_policy.py) with AR-like caching:
  draft calls, 2B-row verify calls of the first masked span with its rejection rule, and the
  score-threshold routing policy. Lossy.
Every iteration of every schedule here is a fixed number of calls; `sdar-native` and `s2d2` make
one call per iteration, whichever kind it is (`call_kinds` in the record).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from packedss.decoding.calls import Call, CallModel, Layout, Planned, Role, Rule, block_segment, causal_segment, layout_of, pack
from packedss.decoding.block_steps import denoise, s2d2_draft, s2d2_verify
from packedss.decoding.driver import Decoder, Host, LTRSettings, Steps
from packedss.decoding.queried import _queries, _QueriedAR, _QueriedLinear, _QueriedPacked
from packedss.decoding.rows import uploaded
from packedss.decoding.schedules import _mask_tokens
from packedss.decoding.trace import StopCheck
from packedss.decoding.verify import EXPONENTIAL_RACE


# ---- block diffusion: aligned blocks of B tokens ----


def block_causal_prefill(prompt: torch.Tensor, block: int) -> Call:
    """The prompt's whole blocks, each row seeing its own block and the blocks before it."""
    rows, device = prompt.shape[0], prompt.device
    index = torch.arange(rows, device=device) // block
    roles = torch.full((rows,), int(Role.VERIFY), dtype=torch.uint8, device=device)
    return Call(prompt, torch.arange(rows, device=device), roles, index[None, :] <= index[:, None], useful=rows,
                drafts=0, read_from=rows - 1)  # fmt: skip


@functools.lru_cache(maxsize=64)
def _layout(kind: str, block: int, causal_rows: int, device: torch.device) -> Layout:
    """`denoise`: a block whose first `causal_rows` rows are causal and whose other rows see the
    whole block; `commit_full`/`commit_causal`: a finished block, block-causal or token-causal;
    `verify`: S2D2's 2B rows, [filled block (causal) | B queries, query j seeing filled rows < j]."""
    zeros = torch.zeros(block, dtype=torch.long, device=device)
    if kind == "commit_causal":
        return layout_of(pack([causal_segment(zeros, 0)]))
    if kind in ("denoise", "commit_full"):
        call = pack([block_segment(zeros, 0)])
        if not causal_rows:
            return layout_of(call)
        attend = call.attend.clone()
        attend[:causal_rows] = torch.ones(block, block, dtype=torch.bool, device=device).tril_()[:causal_rows]
        return Layout(call.roles, attend, block, block, Rule.CUSTOM)
    clean = causal_segment(zeros, 0)
    queries = _queries(block, 0, 0, device)
    sees = {(1, 0): torch.ones(block, block, dtype=torch.bool, device=device).tril_(-1)}
    return layout_of(pack([clean, queries], sees))


@functools.lru_cache(maxsize=64)
def _offsets(block: int, copies: int, device: torch.device) -> torch.Tensor:
    """Positions minus the block's first: 0..B-1, `copies` times (S2D2's verify repeats them)."""
    return torch.arange(block, device=device).repeat(copies)


def transfer_counts(block: int, steps: int) -> list[int]:
    """Tokens each denoising step must resolve at least: B spread evenly over the steps."""
    return [block // steps + (1 if k < block % steps else 0) for k in range(steps)]


class _BlockDiffusion(Decoder):
    """Aligned blocks of B = W + 1 tokens: a prefill of the prompt's whole blocks, then one call
    per iteration on the current block, whose tokens are emitted when its commit call writes it."""

    settings: LTRSettings
    lossy = True
    sampler = EXPONENTIAL_RACE
    steps_per_block: int | None = None  # denoising steps S (None: B, as both paper configurations)
    threshold = 0.85  # low_confidence_dynamic's confidence threshold (the release's default)
    commit_layout = "commit_full"

    def __init__(self, model: CallModel, prompt: Sequence[int], settings: LTRSettings, stop_check: StopCheck | None):
        super().__init__(model, prompt, settings, stop_check)
        self.block = settings.width + 1
        self.prefilled = len(self.prompt) // self.block * self.block
        self.transfers = transfer_counts(self.block, self.steps_per_block or self.block)
        self.resolved: list[int] = []  # tokens each call resolved (the prefill's first)
        self.kinds: list[str] = []
        self.start_block(self.prefilled)

    def start_block(self, start: int) -> None:
        known = self.prompt[start : start + self.block]
        tokens = known + [self.model.mask_token_id] * (self.block - len(known))
        self.start, self.step_index = start, 0
        self.tokens = uploaded(tokens, self.model.device)
        self.open = [False] * len(known) + [True] * (self.block - len(known))  # still masked, on the host
        self.unresolved = self.block - len(known)

    def masked(self) -> torch.Tensor:
        return self.tokens == self.model.mask_token_id

    def call_of(self, kind: str, causal_rows: int = 0, drafts: torch.Tensor | None = None) -> Planned:
        """A call on the current block; `verify` fills its masks with `drafts` and adds B queries."""
        device = self.model.device
        layout = _layout(kind, self.block, causal_rows, device)
        if kind != "verify":
            return Planned(layout, _offsets(self.block, 1, device), [self.tokens], self.start)
        filled = torch.where(self.masked(), drafts, self.tokens)
        queries = _mask_tokens(self.block, self.model.mask_token_id, device)
        return Planned(layout, _offsets(self.block, 2, device), [filled, queries], self.start)

    def counted(self, kind: str, resolved: int) -> None:
        self.kinds.append(kind)
        self.resolved.append(resolved)
        self.produced += resolved
        self.unresolved -= resolved

    def prefill_call(self) -> Call:
        return block_causal_prefill(uploaded(self.prompt[: self.prefilled], self.model.device), self.block)

    def prefill(self) -> Steps:
        if not self.prefilled:  # a prompt shorter than a block: its first block's first call
            return (yield from self.step())
        yield self.prefill_call()
        self.model.commit(self.prefilled)
        self.counted("prefill", 0)
        return False

    def commit_block(self) -> Steps:
        """Write the finished block into the cache and emit its generated tokens."""
        yield self.call_of(self.commit_layout)
        self.model.commit(self.block)
        self.counted("commit", 0)
        tokens = self.tokens.tolist()[max(0, len(self.prompt) - self.start) :]
        done = self.emitter.emit(tokens)
        self.start_block(self.start + self.block)
        return done

    def extra(self) -> dict:
        return {"resolved": self.resolved, "call_kinds": self.kinds}


class _SDARNative(_BlockDiffusion):
    name = "sdar-native"
    batched_steps = True  # its host work is the Host step `denoise` on the logits it gets

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return width + 1

    def step(self) -> Steps:
        if not self.unresolved:
            return (yield from self.commit_block())
        logits = yield self.call_of("denoise")
        self.model.commit(0)
        count = min(self.transfers[self.step_index], self.unresolved)
        self.step_index += 1
        self.tokens, resolved = yield Host(denoise, logits, self.tokens, count, self.threshold, self.model.mask_token_id,
                                           self.settings.sampling)  # fmt: skip
        self.counted("denoise", resolved)
        return False


class _S2D2(_BlockDiffusion):
    """S2D2 on SDAR with AR-like caching (--cache_ver --draft_ver): token-causal prefill and
    commits, the block's resolved prefix causal in draft calls. A draft call proposes every masked
    row; the policy then either verifies the first masked span in the next call or resolves by
    the release's remasking at once."""

    name = "s2d2"
    penalty = 1.0  # c (paper Config-A, B = 4); `s2d2-always` has c = 0 (Config-B, B = 16)
    score_threshold = 0.0  # tau: verify when the score is at least this
    commit_layout = "commit_causal"
    batched_steps = True  # its host work is Host steps on the logits it slices
    draws_at_greedy = True  # its acceptance test draws uniforms at every temperature

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return 2 * (width + 1)

    def __init__(self, *args):
        super().__init__(*args)
        self.pending = None  # a draft awaiting verification: (span, proposal, the drafter's probs)

    def prefill_call(self) -> Call:
        prompt = uploaded(self.prompt[: self.prefilled], self.model.device)
        return pack([causal_segment(prompt, 0)], read_from=self.prefilled - 1)

    def step(self) -> Steps:
        if not self.unresolved:
            return (yield from self.commit_block())
        if self.pending is not None:
            return (yield from self.verify_span())
        first_masked = self.open.index(True)
        end = first_masked
        while end < self.block and self.open[end]:
            end += 1
        span = range(first_masked, end)  # the first contiguous masked span
        logits = yield self.call_of("denoise", first_masked)
        self.model.commit(0)
        count = min(self.transfers[self.step_index], self.unresolved)
        drafted = yield Host(s2d2_draft, logits, self.tokens, span, count, self.penalty, self.score_threshold,
                             self.threshold, self.model.mask_token_id, self.settings.sampling)  # fmt: skip
        if drafted.resolved is None:
            self.pending = (span, drafted.proposal, drafted.probs)
            self.counted("draft", 0)
            return False
        self.step_index += 1
        self.tokens = drafted.tokens
        for position in drafted.resolved:
            self.open[position] = False
        self.counted("draft", len(drafted.resolved))
        return False

    def verify_span(self) -> Steps:
        """The 2B-row call [block filled with the drafts | B queries], verified by `s2d2_verify`."""
        span, proposal, probs = self.pending
        self.pending = None
        logits = yield self.call_of("verify", drafts=proposal)
        self.model.commit(0)
        self.tokens, resolved, accepted = yield Host(s2d2_verify, logits, self.tokens, span, proposal, probs, self.block,
                                                     self.model.mask_token_id, self.settings.sampling)  # fmt: skip
        self.open[span.start : span.start + resolved] = [False] * resolved
        self.draft_proposed += len(span)
        self.draft_accepted += accepted
        self.step_index += 1
        self.counted("verify", resolved)
        return False


class _S2D2Always(_S2D2):
    """S2D2 with always-on verification (c = 0: the score is never below tau = 0)."""

    name = "s2d2-always"
    penalty = 0.0


SDAR_DECODERS: tuple[type[Decoder], ...] = (_QueriedAR, _QueriedLinear, _QueriedPacked, _SDARNative, _S2D2, _S2D2Always)
