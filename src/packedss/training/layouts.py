"""Training sequences: the rows of one forward pass and their attention, built as decoding calls.

Training and decoding share one attention rule because a training sequence is a call
(packedss.decoding.calls.Call) built by the decoding core's own builders: the segment builders
and `pack` for the Nemotron layout, the any-order decoder's call builder for the set layout.
The additive mask a model receives is the call's `attend` turned into 0 / the dtype's minimum,
as BackboneAdapter.additive_mask does for a call run on an empty cache.

Nemotron layout (`tiny`), one sequence of L tokens:

  * the clean sequence (causal rows, `causal_segment`): the AR next-token loss;
  * draft blocks [x_j @ j, MASK @ j+1..j+W] that see the clean rows < j and their whole block
    (`draft_block`: the Linear-SS / Packed-SS drafter): mask row i predicts x_i;
  * pure-mask blocks [MASK @ j+1..j+B], B = W+1, that see the clean rows <= j (`block_segment`:
    the Quadratic-SS drafter), W sampled in 1..16 (B <= 17).

Set layout (`tiny-set`, a set model predicts only from MASK rows), one `set_call`:

  * the prompt as clean rows (causal);
  * the answer's clean rows in a decoding order sigma: the clean row of rank r sees the prompt
    and the answer's clean rows of rank <= r;
  * per answer position i two mask rows, each seeing the prompt, the clean rows of rank < c, and
    itself: a query row (c = rank of i: the verifier / AR query) and a draft row (c = the start
    of i's block in a random partition of sigma into blocks of 1..16 ranks: the drafts of
    Linear-/Packed-/Quadratic-SS and native).

Orders: identity (order=ltr and AR), block-local permutations of W in {8, 16} consecutive
positions (the confidence order's blocks), and full random permutations (native, any order).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from packedss.decoding.anyorder import set_call
from packedss.decoding.calls import Call, Role, Segment, block_segment, causal_segment, draft_block, pack, pad_segment

IGNORE = -100  # target of a row the loss does not read


@dataclass(frozen=True)
class TrainingSequence:
    call: Call  # rows, positions, roles and the attention rule of the forward pass
    ar_targets: torch.Tensor  # (R,) the next token for clean rows in the answer, else IGNORE
    draft_targets: torch.Tensor  # (R,) the own position's token for mask rows inside the sequence, else IGNORE


def sample_width(rng: random.Random) -> int:
    """W: 8 (35%), 16 (15%), else uniform in 1..16."""
    u = rng.random()
    if u < 0.35:
        return 8
    if u < 0.5:
        return 16
    return rng.randint(1, 16)


# --------------------------------------------------------------------------- Nemotron layout


@dataclass(frozen=True)
class DraftBlock:
    anchor: int  # j
    width: int  # W
    masks_only: bool  # True: [MASK @ j+1..j+W+1] sees clean <= j; False: [x_j @ j, MASK @ j+1..j+W] sees clean < j

    @property
    def sees_clean(self) -> int:
        """How many clean rows (positions 0..) the block sees."""
        return self.anchor + 1 if self.masks_only else self.anchor


def sample_draft_blocks(
    length: int, start: int, rng: random.Random, draft_ratio: float, mask_blocks: float
) -> list[DraftBlock]:
    """Blocks anchored in the answer (j >= start-1) until about `draft_ratio` draft rows per
    answer token are placed; a share `mask_blocks` of them pure-mask blocks."""
    first_anchor = max(start - 1, 0)
    budget = max(4, int(draft_ratio * (length - first_anchor)))
    blocks = []
    while budget > 0 and first_anchor <= length - 2:
        width = sample_width(rng)
        anchor = rng.randint(first_anchor, length - 2)
        blocks.append(DraftBlock(anchor, width, masks_only=rng.random() < mask_blocks))
        budget -= width + 1
    return blocks


def nemotron_sequence(ids: Sequence[int], start: int, blocks: Sequence[DraftBlock], mask_id: int) -> TrainingSequence:
    """The clean sequence `ids` (the AR loss from the answer at `start` on) plus `blocks`."""
    length = len(ids)
    tokens = torch.tensor(list(ids), dtype=torch.long)
    segments = [causal_segment(tokens, 0)]
    sees: dict[tuple[int, int], torch.Tensor] = {}
    columns = torch.arange(length)
    draft_targets = [IGNORE] * length
    for k, block in enumerate(blocks, start=1):
        if block.masks_only:
            masks = torch.full((block.width + 1,), mask_id, dtype=torch.long)
            segment = block_segment(masks, block.anchor + 1)
        else:
            segment = draft_block(tokens[block.anchor], block.anchor, block.width, mask_id)
        segments.append(segment)
        sees[(k, 0)] = (columns < block.sees_clean).expand(segment.rows, length)
        for r, position in enumerate(segment.positions.tolist()):
            is_anchor = r == 0 and not block.masks_only
            draft_targets.append(ids[position] if not is_anchor and position < length else IGNORE)
    call = pack(segments, sees)
    next_tokens = list(ids[1:]) + [IGNORE]
    ar_targets = [t if i >= start - 1 else IGNORE for i, t in enumerate(next_tokens)]
    ar_targets += [IGNORE] * (call.rows - length)
    return TrainingSequence(call, torch.tensor(ar_targets), torch.tensor(draft_targets))


def nemotron_layout(
    ids: Sequence[int], start: int, rng: random.Random, mask_id: int, draft_ratio: float, mask_blocks: float
) -> TrainingSequence:
    blocks = sample_draft_blocks(len(ids), start, rng, draft_ratio, mask_blocks)
    return nemotron_sequence(ids, start, blocks, mask_id)


# --------------------------------------------------------------------------- set layout


def set_order(length: int, rng: random.Random, ltr: float, local: float) -> list[int]:
    """A decoding order sigma of `length` answer positions (sigma[r] = the position of rank r):
    identity (share `ltr`), random within consecutive blocks of W in {8, 16} positions taken left
    to right (share `local`: the confidence order's blocks), else a uniform permutation."""
    sigma = list(range(length))
    u = rng.random()
    if u < ltr:
        return sigma
    if u < ltr + local:
        width = 8 if rng.random() < 0.7 else 16
        for start in range(0, length, width):
            part = sigma[start : start + width]
            rng.shuffle(part)
            sigma[start : start + width] = part
        return sigma
    rng.shuffle(sigma)
    return sigma


@dataclass(frozen=True)
class SetRows:
    prompt: list[int]  # clean prefix tokens (positions 0..P-1)
    answer: list[int]  # answer tokens by position (positions P..)
    sigma: list[int]  # decoding order: sigma[r] = answer index of rank r
    masks: list[tuple[int, int]]  # mask rows: (answer index, level c: it sees the ranks < c)


def sample_set_rows(
    ids: Sequence[int], start: int, rng: random.Random, eos_id: int, eos_tail: int, ltr: float, local: float
) -> SetRows:
    """The random choices of one set sequence: EOS tail, order, and per position a query row
    (level = its rank) and a draft row (level = the start of its block of sigma)."""
    prompt = max(start, 1)  # code chunks: the first token plays the prompt
    answer = list(ids[prompt:])
    if answer and answer[-1] == eos_id and eos_tail:
        answer += [eos_id] * rng.randint(0, eos_tail)  # the positions after EOS hold EOS
    length = len(answer)
    sigma = set_order(length, rng, ltr, local)
    rank = [0] * length
    for r, a in enumerate(sigma):
        rank[a] = r
    # Draft levels: sigma cut into blocks of random width; a draft row sees the ranks before its block.
    # Half the time a first block of 0..15 ranks (a random phase), so blocks also start mid-answer.
    level = [0] * length
    first = min(rng.randint(0, 15) if rng.random() < 0.5 else 0, length)
    while first < length:
        width = sample_width(rng)
        for k in range(first, min(length, first + width)):
            level[k] = first
        first += width
    masks = [(a, c) for a in range(length) for c in (rank[a], level[rank[a]])]
    return SetRows(list(ids[:prompt]), answer, sigma, masks)


def set_sequence(rows: SetRows, mask_id: int) -> TrainingSequence:
    """The set call of `rows`: mask row (a, c) predicts answer[a]."""
    prompt, clean = len(rows.prompt), len(rows.sigma)
    answer_positions = torch.tensor([prompt + a for a in rows.sigma], dtype=torch.long)
    mask_positions = torch.tensor([prompt + a for a, _ in rows.masks], dtype=torch.long)
    call = set_call(
        prefix_tokens=torch.tensor(rows.prompt, dtype=torch.long),
        prefix_positions=torch.arange(prompt),
        clean_tokens=torch.tensor([rows.answer[a] for a in rows.sigma], dtype=torch.long),
        clean_positions=answer_positions,
        clean_real=[True] * clean,
        mask_positions=mask_positions,
        mask_levels=[c for _, c in rows.masks],
        mask_real=[True] * len(rows.masks),
        mask_token_id=mask_id,
    )
    targets = [IGNORE] * (prompt + clean) + [rows.answer[a] for a, _ in rows.masks]
    return TrainingSequence(call, torch.full((call.rows,), IGNORE), torch.tensor(targets))


def set_layout(
    ids: Sequence[int], start: int, rng: random.Random, mask_id: int, eos_id: int, eos_tail: int, ltr: float, local: float
) -> TrainingSequence:
    return set_sequence(sample_set_rows(ids, start, rng, eos_id, eos_tail, ltr, local), mask_id)


# --------------------------------------------------------------------------- batches


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor  # (N, R)
    positions: torch.Tensor  # (N, R)
    mask: torch.Tensor  # (N, 1, R, R) additive
    ar_targets: torch.Tensor  # (N, R)
    draft_targets: torch.Tensor  # (N, R)
    draft_rows: torch.Tensor  # (N, R) bool: Role.DRAFT rows (where the proposal LoRA applies)


def additive_mask(attend: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where a row may attend, the dtype's minimum elsewhere (BackboneAdapter.additive_mask's values)."""
    return torch.where(attend, torch.tensor(0.0, dtype=dtype), torch.tensor(torch.finfo(dtype).min, dtype=dtype))


def collate(sequences: Sequence[TrainingSequence], pad_id: int, dtype: torch.dtype = torch.float32) -> Batch:
    """Stack sequences, each padded to the longest by rows of `pad_id` at position 0 that see only
    themselves (`pad_segment`) and have no target."""
    rows = max(s.call.rows for s in sequences)
    calls = []
    for s in sequences:
        call = s.call
        if call.rows < rows:
            own = Segment(call.tokens, call.positions, call.roles, call.attend)
            call = pack([own, pad_segment(rows - call.rows, pad_id, 0, call.tokens.device)])
        calls.append(call)

    def padded(values: torch.Tensor) -> torch.Tensor:
        return torch.cat([values, torch.full((rows - values.shape[0],), IGNORE, dtype=values.dtype)])

    attend = torch.stack([c.attend for c in calls])
    return Batch(
        tokens=torch.stack([c.tokens for c in calls]),
        positions=torch.stack([c.positions for c in calls]),
        mask=additive_mask(attend[:, None], dtype),
        ar_targets=torch.stack([padded(s.ar_targets) for s in sequences]),
        draft_targets=torch.stack([padded(s.draft_targets) for s in sequences]),
        draft_rows=torch.stack([c.roles == int(Role.DRAFT) for c in calls]),
    )


# --------------------------------------------------------------------------- SDAR layout


def sdar_layout(
    ids: Sequence[int], start: int, rng: random.Random, mask_id: int, block: int, eps: float = 1e-3, tries: int = 10
) -> tuple[TrainingSequence, torch.Tensor]:
    """SDAR's training sequence (JetAstra/SDAR: `block_diff_mask`, `forward_add_noise_packed`) of
    the clean sequence x_0 = `ids` whose answer starts at `start` (a code chunk, start 0, is all
    answer), for block size `block`: one call of 2n rows [x_t | x_0] at positions
    [0..n-1, 0..n-1].

    x_t is x_0 with each answer token (never a prompt token) replaced by `mask_id` with
    probability p = (1 - eps) * t + eps, t ~ U(0, 1) once per sequence; a draw that masks nothing
    is redrawn (`tries` times), then one answer token is masked. With blk = position // block:
    an x_t row sees the x_t rows of its block (bidirectional) and the x_0 rows of the blocks
    before it; an x_0 row sees the x_0 rows of its block and of the blocks before it
    (block-causal); x_0 never sees x_t. A mask row at position i predicts x_0's token at i. With
    block 1 the mask row at i sees the clean tokens < i and itself: the model's AR mode.

    Returns the sequence (draft_targets: x_0's token at the masked x_t rows, IGNORE elsewhere;
    no AR targets) and the (2n,) per-row loss weights, 1/p at the masked rows and 0 elsewhere.
    """
    length = len(ids)
    answer = list(range(start, length))
    if not answer:
        raise ValueError(f"an SDAR training sequence needs answer tokens (start {start}, length {length})")
    p = (1 - eps) * rng.random() + eps
    masked: list[int] = []
    for _ in range(tries):
        masked = [i for i in answer if rng.random() < p]
        if masked:
            break
    else:
        masked = [rng.choice(answer)]
    clean = torch.tensor(list(ids), dtype=torch.long)
    noisy = clean.clone()
    noisy[masked] = mask_id
    blocks = torch.arange(length) // block
    same_block = blocks[:, None] == blocks[None, :]
    earlier_block = blocks[:, None] > blocks[None, :]
    positions = torch.arange(length)
    halves = [
        Segment(noisy, positions, torch.full((length,), int(Role.DRAFT), dtype=torch.uint8), same_block, 0, length),
        Segment(clean, positions.clone(), torch.full((length,), int(Role.VERIFY), dtype=torch.uint8),
                same_block | earlier_block, 0, 0),  # fmt: skip
    ]
    call = pack(halves, {(0, 1): earlier_block})
    targets = torch.full((2 * length,), IGNORE, dtype=torch.long)
    targets[masked] = clean[masked]
    weights = torch.zeros(2 * length)
    weights[masked] = 1.0 / p
    return TrainingSequence(call, torch.full((2 * length,), IGNORE, dtype=torch.long), targets), weights
