"""Training and decoding share one attention rule: every row the decoders evaluate sees exactly
what the row of the same kind sees in a training sequence built by packedss.training.layouts,
and the additive mask training feeds the model is the adapter's.

A row's context is the list of (token, position) rows it attends to: the KV cache plus the rows
of its call it sees (for a training sequence, an empty cache). The decoders run on toy models
with the call protocol, under a recorder that keeps every call with the cache it ran on."""

from __future__ import annotations

import random

import torch

from packedss.decoding import AnyOrderSettings, LTRSettings, Role, Sampling, decode_anyorder, decode_ltr
from packedss.decoding.calls import Call
from packedss.training.layouts import (
    DraftBlock,
    SetRows,
    collate,
    nemotron_sequence,
    sample_draft_blocks,
    set_layout,
    set_sequence,
)
from tests.anyorder_fixtures import ToySetModel
from tests.toy_ltr import ToyLTRModel

Row = tuple[int, int]  # (token, position)
LATER = [1, 2, 3]  # clean tokens after the rows under test, which those rows must not see


class Recorder:
    """A CallModel around another one that keeps each call with the committed rows it ran on."""

    def __init__(self, model):
        self.model = model
        self.device = model.device
        self.mask_token_id = model.mask_token_id
        self.call_stats = model.call_stats
        self.cache: list[Row] = []
        self.calls: list[tuple[list[Row], Call]] = []

    def run(self, call: Call) -> torch.Tensor:
        self.calls.append((list(self.cache), call))
        return self.model.run(call)

    def commit(self, rows: int) -> None:
        call = self.calls[-1][1]
        self.cache += rows_of(call)[:rows]
        self.model.commit(rows)

    def reset(self) -> None:
        self.cache = []
        self.model.reset()

    def synchronize(self) -> None:
        self.model.synchronize()


def rows_of(call: Call) -> list[Row]:
    return list(zip(call.tokens.tolist(), call.positions.tolist()))


def contexts(cache: list[Row], call: Call) -> list[list[Row]]:
    """Each row's context: the whole cache, then the rows of the call it attends to."""
    rows = rows_of(call)
    return [cache + [row for row, seen in zip(rows, sees) if seen] for sees in call.attend.tolist()]


def prefix_tokens(context: list[Row], length: int) -> list[int]:
    """The tokens of a context that holds exactly one row at each position 0..length-1."""
    assert sorted(p for _, p in context) == list(range(length)), context
    return [t for t, _ in sorted(context, key=lambda row: row[1])]


# --------------------------------------------------------------------------- Nemotron layout


def ltr_calls(schedule: str, width: int, pad_verify: bool, seed: int):
    recorder = Recorder(ToyLTRModel(vocab=8, seed=seed, agreement=2.0))
    prompt = [random.Random(seed).randrange(8) for _ in range(5)]
    sampling = Sampling(1.0, "rejection", torch.Generator().manual_seed(seed))
    decode_ltr(recorder, prompt, LTRSettings(schedule, width, 40, (), sampling, pad_verify=pad_verify))
    return recorder.calls


def ltr_block(call: Call, first: int, mask: int) -> tuple[list[int], DraftBlock]:
    """The draft block starting at row `first`: its rows, and the training block of that shape
    (a masks-only block at p..p+W sits after the anchor p-1; an anchored one starts at its anchor)."""
    rows = [k for k in range(first, call.rows) if call.roles[k] == Role.DRAFT and call.attend[first, k]]
    position = int(call.positions[first])
    masks_only = int(call.tokens[first]) == mask
    return rows, DraftBlock(position - 1 if masks_only else position, len(rows) - 1, masks_only)


def test_ltr_decoding_rows_are_training_rows():
    """Every verify row of the LTR decoders has the context of the clean row at its position in
    training, and every draft row the context of its row in the training block of the same shape
    built on the clean rows the block sees: Linear-/Packed-SS blocks [x_j @ j, MASK..] and
    Quadratic-SS blocks [MASK @ j+1..j+B]."""
    mask = ToyLTRModel(vocab=8).mask_token_id
    seen = {"verify rows": 0, "anchored blocks": 0, "masks-only blocks": 0}
    for schedule, pad_verify in (("linear", True), ("quadratic", True), ("packed", True), ("packed", False)):
        for width, seed in ((3, 0), (8, 1)):
            for cache, call in ltr_calls(schedule, width, pad_verify, seed):
                decoded = contexts(cache, call)
                roles, positions = call.roles.tolist(), call.positions.tolist()
                done: set[int] = set()
                for r, role in enumerate(roles):
                    if role == Role.VERIFY:
                        ids = prefix_tokens(decoded[r], positions[r] + 1) + LATER
                        training = contexts([], nemotron_sequence(ids, 0, [], mask).call)
                        assert sorted(decoded[r]) == sorted(training[positions[r]]), (schedule, width, r)
                        seen["verify rows"] += 1
                    elif role == Role.DRAFT and r not in done:
                        block_rows, block = ltr_block(call, r, mask)
                        done.update(block_rows)
                        own = set(rows_of(call)[k] for k in block_rows)
                        clean = [row for row in decoded[r] if row not in own]
                        # the block starts right after the clean rows it sees (at its anchor or after it)
                        ids = prefix_tokens(clean, block.sees_clean)
                        ids += ([] if block.masks_only else [int(call.tokens[r])]) + LATER
                        sequence = nemotron_sequence(ids, 0, [block], mask)
                        training = contexts([], sequence.call)[len(ids) :]
                        assert len(training) == len(block_rows)
                        for k, row in zip(block_rows, training):
                            assert sorted(decoded[k]) == sorted(row), (schedule, width, k)
                        seen["masks-only blocks" if block.masks_only else "anchored blocks"] += 1
    assert all(seen.values()), seen


def test_sampled_blocks_fit_the_decoder():
    """Training blocks: W in 1..16 (B <= 17 rows), anchored in the answer, inside the sequence."""
    rng = random.Random(3)
    for _ in range(200):
        length = rng.randint(2, 80)
        start = rng.randint(0, length - 1)
        blocks = sample_draft_blocks(length, start, rng, 0.8, 0.3)
        assert blocks
        for block in blocks:
            assert 1 <= block.width <= 16
            assert max(start - 1, 0) <= block.anchor <= length - 2


# --------------------------------------------------------------------------- set layout


def set_calls(schedule: str, order: str, seed: int):
    recorder = Recorder(ToySetModel(vocab=8, seed=seed))
    prompt = [random.Random(seed).randrange(8) for _ in range(4)]
    sampling = Sampling(1.0, "rejection", torch.Generator().manual_seed(seed))
    decode_anyorder(recorder, prompt, AnyOrderSettings(schedule, 4, 24, (), sampling, order=order))
    return len(prompt), recorder.calls


def set_rows(history: list[Row], prompt: int, query: int | None) -> SetRows:
    """The training rows with decoding order `history` (prompt first) and, when `query` is a
    position, one mask row there that sees the whole history."""
    assert [p for _, p in history[:prompt]] == list(range(prompt)), history
    answer_rows = history[prompt:]
    positions = [p - prompt for _, p in answer_rows] + ([] if query is None else [query - prompt])
    assert len(set(positions)) == len(positions), history
    answer = [0] * (max(positions, default=-1) + 1)
    for token, position in answer_rows:
        answer[position - prompt] = token
    sigma = [p - prompt for _, p in answer_rows]
    sigma += sorted(set(range(len(answer))) - set(sigma))
    masks = [] if query is None else [(query - prompt, len(answer_rows))]
    return SetRows([t for t, _ in history[:prompt]], answer, sigma, masks)


def test_set_decoding_rows_are_training_rows():
    """Every real row of the any-order decoders has the context of its training row: with the
    decoding order so far as sigma, a clean row of rank r sees the prompt and ranks <= r, a mask
    row (level c) the prompt, ranks < c and itself. The history is taken as a prefix of the cache
    and the call's rows, so a decoder row that saw anything else would not match."""
    mask = ToySetModel(vocab=8).mask_token_id
    seen = {"clean rows": 0, "mask rows": 0}
    for schedule in ("ar", "linear", "packed", "quadratic", "native"):
        for order, seed in (("ltr", 0), ("confidence", 1), ("ltr", 2)):
            prompt, calls = set_calls(schedule, order, seed)
            for cache, call in calls:
                decoded = contexts(cache, call)
                rows = rows_of(call)
                for r, role in enumerate(call.roles.tolist()):
                    if role == Role.PAD:
                        continue
                    if role == Role.VERIFY:
                        history = cache + rows[: r + 1]
                        if len(history) <= prompt:  # a prompt row: causal over the prompt
                            sequence = set_sequence(SetRows([t for t, _ in history], [], [], []), mask)
                        else:
                            sequence = set_sequence(set_rows(history, prompt, None), mask)
                        training = contexts([], sequence.call)[len(history) - 1]
                        seen["clean rows"] += 1
                    else:
                        sees = len(decoded[r]) - len(cache) - 1  # call rows it sees besides itself
                        history = cache + rows[:sees]
                        training = contexts([], set_sequence(set_rows(history, prompt, rows[r][1]), mask).call)[-1]
                        seen["mask rows"] += 1
                    assert sorted(decoded[r]) == sorted(training), (schedule, order, r)
    assert all(seen.values()), seen


def test_set_mask_rows_never_see_their_own_token():
    rng = random.Random(5)
    mask, eos = 3, 2
    for ltr, local in ((1.0, 0.0), (0.0, 1.0), (0.0, 0.0)):
        for _ in range(20):
            ids = [rng.randrange(4, 24) for _ in range(rng.randint(2, 40))] + [eos]
            start = rng.randint(1, len(ids) - 1)
            call = set_layout(ids, start, rng, mask, eos, 4, ltr, local).call
            for r, context in enumerate(contexts([], call)):
                if call.roles[r] == Role.DRAFT:
                    own = int(call.positions[r])
                    assert [t for t, p in context if p == own] == [mask], (ltr, local, r)
                    assert [p for _, p in context if p < start] == list(range(start))  # the whole prompt


# --------------------------------------------------------------------------- the additive mask


def test_training_mask_and_forward_are_the_adapters(tiny_model):
    """The batch's additive mask is BackboneAdapter.additive_mask of each sequence's call (on an
    empty cache) plus inert padding, and the training forward gives the adapter's logits."""
    rng = random.Random(7)
    sequences = []
    for length in (9, 30):
        ids = [rng.randrange(4, 40) for _ in range(length)]
        blocks = [DraftBlock(rng.randint(2, length - 2), rng.randint(1, 16), rng.random() < 0.5) for _ in range(3)]
        sequences.append(nemotron_sequence(ids, 3, blocks, tiny_model.mask_token_id))
    batch = collate(sequences, pad_id=0, dtype=torch.float64)
    with torch.no_grad():
        hidden = tiny_model.backbone(
            input_ids=batch.tokens, position_ids=batch.positions, attention_mask=batch.mask
        ).last_hidden_state
    for b, sequence in enumerate(sequences):
        call, rows = sequence.call, sequence.call.rows
        tiny_model.reset()
        reference = tiny_model.additive_mask(call)[0, 0]
        assert torch.equal(batch.mask[b, 0, :rows, :rows], reference)
        assert (batch.mask[b, 0, :rows, rows:] == torch.finfo(torch.float64).min).all()  # nobody sees padding
        logits = tiny_model.run(call)
        tiny_model.reset()
        assert torch.allclose(tiny_model.head(hidden[b, :rows]), logits, atol=1e-10), b
    assert batch.tokens.shape[1] > sequences[0].call.rows  # the first sequence was padded
