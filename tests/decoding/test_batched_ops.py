"""The batched host steps (packedss.decoding.batched_ops) give what the plain functions give each
request: the argmax and top-2 (NumPy's on a CPU) equal torch's on rows with ties (some rows' margins alone
equal theirs among all rows); a round reads back once; the near-tie threshold is frexp's; a greedy
verification found on the host equals `verify`'s, whatever the drafts are; the calls after a
greedy round's read-back are built on the host."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from packedss.decoding import LTRSettings, Sampling
from packedss.decoding import batched_ops, verify
from packedss.decoding.batched_ops import _Greedy
from packedss.decoding.calls import Listed, Planned
from packedss.decoding.driver import Response, schedule_named, verify_ahead
from packedss.decoding import engine
from packedss.decoding.engine import Request, decode_batched
from packedss.decoding.rows import Rows
from packedss.decoding.schedules import LTR_DECODERS, _draft_shape, _packed_shape
from packedss.models.batched import BatchedCalls
from packedss.models.nemotron import load_nemotron
from packedss.paths import PROJECT_ROOT
from tests.decoding.test_syncs import counting_read_backs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("vocabulary", [1024, 192, 128, 96, 100, 8])
def test_the_argmax_and_top2_equal_torchs_with_ties(vocabulary, dtype):
    """On a CPU in float32 by NumPy (its second largest with the first set aside in the logits
    themselves, and put back), else by torch: the first largest entry and the top two, with ties
    within and across rows, -inf entries and rows of -inf only; the logits unchanged."""
    generator = torch.Generator().manual_seed(vocabulary)
    for trial in range(60):
        rows = int(torch.randint(1, 40, (), generator=generator))
        logits = torch.randn(rows, vocabulary, generator=generator)
        if trial % 2:  # few distinct values: many ties, also between blocks
            logits = (logits * 2).round() / 2
        if trial % 3 == 0:  # the largest twice, far apart
            at = torch.randint(0, vocabulary, (rows,), generator=generator)
            logits[torch.arange(rows), at] = 9.0
            logits[torch.arange(rows), (at + vocabulary // 2 + 1) % vocabulary] = 9.0
        if trial % 5 == 0:  # banned tokens, and a row with every token banned
            logits[torch.rand(rows, vocabulary, generator=generator) < 0.3] = float("-inf")
            logits[rows // 2] = float("-inf")
        logits = logits.to(dtype)
        before = logits.clone()
        greedy = _Greedy(logits)
        assert (greedy.array is not None) == (dtype == torch.float32)
        assert torch.equal(greedy.tokens, logits.argmax(dim=-1))
        assert torch.equal(torch.stack(greedy.top_two, dim=1), logits.topk(2, dim=-1).values)
        margin, near = greedy.margins
        assert torch.equal(logits, before)
        top2 = logits.topk(2, dim=-1).values.float()
        expected = top2[:, 0] - top2[:, 1]
        assert torch.equal(margin.isnan(), expected.isnan())
        assert torch.equal(margin.nan_to_num(), expected.nan_to_num())
        assert torch.equal(near, (expected <= verify.near_tie_threshold(top2[:, 0], dtype)).long())
        # Some rows' margins alone (a Packed-SS round's verifier rows on a GPU) are those rows' of all.
        index = torch.randperm(rows, generator=generator)[: max(1, rows // 3)]
        for alone, of_all in zip(greedy.margins_of(index.tolist()), (margin, near)):
            assert torch.equal(alone.nan_to_num(), of_all[index].nan_to_num())


@pytest.mark.parametrize("on_host", [True, False])
def test_a_margin_at_the_threshold_is_a_near_tie_and_one_above_it_is_not(on_host):
    """The rule's edge, by NumPy (contiguous float32 rows) and by torch (the same rows as a
    column-major view): a top-2 margin equal to the threshold is a near-tie, one of the next float
    up (or of twice the threshold) is not."""
    tops = torch.tensor([3.0, -7.5, 0.25, 1000.0])
    threshold = verify.near_tie_threshold(tops, torch.float32)
    at = tops - threshold
    above = torch.nextafter(at, torch.full_like(at, -float("inf")))
    logits = torch.full((12, 64), -5000.0)
    for k, second in enumerate([*at, *above, *(tops - 2 * threshold)]):
        logits[k, 5], logits[k, 40] = tops[k % 4], second
    if not on_host:
        logits = logits.t().contiguous().t()
    greedy = _Greedy(logits)
    assert (greedy.array is not None) == on_host
    margin, near = greedy.margins
    assert near.tolist() == [1] * 4 + [0] * 8
    assert torch.equal(margin[:4], threshold)


def test_rows_that_share_memory_are_read_by_torch():
    """Rows of an overlapping view (each row the last one shifted by an entry): the in-place top-2
    would set one row's largest aside in its neighbours too, so such logits take torch's path."""
    base = torch.randn(1200, generator=torch.Generator().manual_seed(3))
    base[0], base[5] = 10.0, 9.0  # row 0's largest, and its second: row 1's largest (row 1 starts at base[2])
    logits = base.as_strided((40, 1024), (2, 1))
    greedy = _Greedy(logits)
    assert torch.equal(greedy.tokens, logits.argmax(dim=-1))
    assert torch.equal(torch.stack(greedy.top_two, dim=1), logits.topk(2, dim=-1).values)


@pytest.mark.parametrize("schedule, lockstep", [("ar", False), ("linear", False), ("quadratic", False), ("packed", False),
                                               ("ar", True), ("linear", True), ("packed", True)])  # fmt: skip
def test_a_greedy_round_reads_back_once(schedule, lockstep, monkeypatch):
    """At T = 0 every request's verification (and prefill token) of a round is one read-back;
    beyond that only each response's near-ties are read, once, when it ends; as coroutines and as
    lanes."""
    model = load_nemotron(PROJECT_ROOT / "assets" / "models" / "tiny", dtype="float32")
    greedy = Sampling(0.0, "rejection", None)
    prompts = [[5, 17, 33, 8, 91, 12, 7], [9, 4], [61, 62, 63], [7, 7, 7, 7, 7], [40, 41, 42], [100, 5]]

    def requests():
        settings = [LTRSettings(schedule, 4, 8 + 3 * k, (), greedy) for k in range(len(prompts))]
        decoder = schedule_named(LTR_DECODERS, schedule)
        return [Request(k, lambda m, k=k: Response(m, prompts[k], settings[k], None, decoder)) for k in range(len(prompts))]

    executor = BatchedCalls(model, 4)
    list(decode_batched(executor, requests(), 4, lockstep))  # layouts and biases built once
    calls = []
    run = executor.run
    executor.run = lambda batch: calls.append(len(batch.entries)) or run(batch)
    with counting_read_backs(monkeypatch) as counts:
        finished = list(decode_batched(executor, requests(), 4, lockstep))
    assert len(counts) <= len(calls) + len(finished), (counts, calls)
    assert sum(calls) > 2 * len(calls)  # the rounds did carry several requests


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_threshold_is_ulps_at_the_top_logits_magnitude(dtype):
    """NEAR_TIE_ULPS units in the last place of `dtype` at 2^e, the largest power of 2 not above
    the top logit's magnitude (at least 1): frexp's exponent, for every finite value; and a top of
    +-inf or NaN, whose margins are inf or NaN, is never a near-tie."""
    top = torch.cat([torch.randn(20000, generator=torch.Generator().manual_seed(0)) * 300,
                     torch.tensor([0.0, -0.0, 1.0, -1.0, 2.0, 1.9999999, 2.0000002, 0.5, 3e38, -3e38, 1e-30])])  # fmt: skip
    _, exponent = torch.frexp(top.abs().clamp(min=1.0))  # top = m * 2^exponent, m in [0.5, 1)
    expected = verify.NEAR_TIE_ULPS * torch.finfo(dtype).eps * torch.exp2((exponent - 1).float())
    assert torch.equal(verify.near_tie_threshold(top, dtype), expected)
    # The same threshold of float32 NumPy tops (the batched readout's on a CPU), bit for bit.
    host = verify.near_tie_threshold(top.numpy(), dtype)
    assert host.dtype == np.float32 and torch.equal(torch.from_numpy(host), expected)
    inf, nan = float("inf"), float("nan")
    tops = torch.tensor([[inf, 3.0], [inf, inf], [-inf, -inf], [nan, 3.0], [nan, nan]])  # a row's top two
    margins = tops[:, 0] - tops[:, 1]
    assert not (margins <= verify.near_tie_threshold(tops[:, 0], dtype)).any()
    assert not (margins.numpy() <= verify.near_tie_threshold(tops[:, 0].numpy(), dtype)).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_probabilities_divide_by_the_temperature(dtype):
    """softmax(logits / T) at every T, in at least float32; at T = 1 the division is skipped, and
    that gives the bits the division gives."""
    logits = torch.randn(7, 300, generator=torch.Generator().manual_seed(3)).to(dtype)
    for temperature in (0.25, 0.7, 1.0, 1.5, 4.0):
        expected = torch.softmax(logits.float() / temperature, dim=-1)
        assert torch.equal(verify.probabilities(logits, temperature), expected), temperature
    sharper, flatter = verify.probabilities(logits, 0.5), verify.probabilities(logits, 2.0)
    assert bool((sharper.amax(dim=-1) > flatter.amax(dim=-1)).all())


def test_packed_ss_takes_a_greedy_rounds_argmax_once(monkeypatch):
    """A Packed-SS round's verifications and next drafts read one pass over the round's logits
    (its verifier rows alone are under a quarter of the rows), and each request gets what
    `verify_ahead` gives it alone."""
    requests, width, vocabulary = 6, 8, 1024
    block = 2 * (width + 1)
    generator = torch.Generator().manual_seed(11)
    logits = torch.randn(requests * block, vocabulary, generator=generator)
    drafts = torch.randint(0, vocabulary, (requests * width,), generator=generator)
    greedy = Sampling(0.0, "rejection", None)
    args = []
    for k in range(requests):
        m, base = 1 + k % 3, k * block
        args.append((Rows(logits, base, base + m + 1), Rows(drafts, k * width, k * width + m), None,
                     Rows(logits, base + width + 1, base + block), 40 + k, greedy))  # fmt: skip
    passes = []

    class Counted(batched_ops._Greedy):
        def __init__(self, rows):
            passes.append(rows.shape[0])
            super().__init__(rows)

    monkeypatch.setattr(batched_ops, "_Greedy", Counted)
    batched_ops.end_round()
    read, finish = batched_ops.BATCHED[verify_ahead](args, torch.device("cpu"))
    results = finish(read.tolist())
    batched_ops.end_round()
    assert passes == [requests * block]
    for (rows, tokens, _, draft_rows, first, sampling), (emitted, proposals) in zip(args, results):
        alone, ahead = verify_ahead(rows.tensor(), tokens.tensor(), None, draft_rows.tensor(), first, sampling)
        assert list(emitted) == list(alone)
        assert proposals.positions == ahead.positions
        assert torch.equal(proposals.tokens.tensor(), ahead.tokens)


def _drafts_as(kind: str, drafts: torch.Tensor, spans: list[tuple[int, int]]) -> list:
    """Each request's drafts (its span of `drafts`) as the engine may hand them over: Rows with
    their values read back, Rows of one source without values, or tensors."""
    if kind == "values":
        return [Rows(drafts, a, b, drafts[a:b].tolist()) for a, b in spans]
    if kind == "rows":
        return [Rows(drafts, a, b) for a, b in spans]
    return [drafts[a:b].clone() for a, b in spans]


@pytest.mark.parametrize("kind", ["values", "rows", "tensors"])
@pytest.mark.parametrize("whole", [True, False])
def test_a_greedy_verification_on_the_host_equals_verify(kind, whole):
    """Each request's emitted tokens, its last token and the near-tie flags of its deciding rows
    equal `verify` alone, for drafts that agree for a while and then do not (every h from 0 to m,
    m from 0 to W), whether the round's argmax was taken whole or row by row."""
    width, vocabulary = 6, 256
    generator = torch.Generator().manual_seed(5 + whole)
    counts = [m for m in range(width + 1) for _ in range(3)]
    block = width + 1 + (0 if whole else 40)  # rows no step asks for: the argmax is then row by row
    logits = torch.randn(len(counts) * block, vocabulary, generator=generator)
    logits[0, :2] = logits[0].max() + 1  # a tie at the top of request 0's deciding row: a near-tie
    argmax = logits.argmax(dim=-1)
    drafts, spans = [], []
    for k, m in enumerate(counts):
        agree = (m, max(m - 1, 0), 0)[k % 3]  # the first `agree` drafts pass
        tokens = argmax[k * block : k * block + m].clone()
        tokens[agree:] = (tokens[agree:] + 1) % vocabulary
        spans.append((len(drafts), len(drafts) + m))
        drafts += tokens.tolist()
    drafts = torch.tensor(drafts)
    greedy = Sampling(0.0, "rejection", None)
    args = [(Rows(logits, k * block, k * block + m + 1), d, None, greedy)
            for k, (m, d) in enumerate(zip(counts, _drafts_as(kind, drafts, spans)))]  # fmt: skip
    batched_ops.end_round()
    read, finish = batched_ops.BATCHED[verify.verify](args, torch.device("cpu"))
    results = finish(read.tolist())
    batched_ops.end_round()
    for (rows, own, _, sampling), emitted in zip(args, results):
        alone = verify.verify(rows.tensor(), own if torch.is_tensor(own) else own.tensor(), None, sampling)
        assert list(emitted) == list(alone)
        assert emitted.last.values == alone[-1:] and emitted.last.tensor().tolist() == alone[-1:]
        top2 = rows.tensor()[: len(alone)].topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        assert emitted.deciding.margins.tensor().tolist() == margin.tolist()
        assert emitted.deciding.near == (margin <= verify.near_tie_threshold(top2[:, 0], torch.float32)).long().tolist()
    assert results[0].deciding.near == [1]
    assert sorted({len(e) - 1 for e in results}) == list(range(width + 1))  # every h was taken


def test_rows_keep_their_values_when_sliced():
    source = torch.arange(10, 20)
    rows = Rows(source, 2, 8, source[2:8].tolist())
    assert rows[1:4].values == [13, 14, 15] and rows[1:4].tensor().tolist() == [13, 14, 15]
    assert Rows(source, 2, 8)[1:4].values is None


def test_a_call_whose_parts_were_read_back_is_built_on_the_host():
    """A shape's call of parts that all have values (or are its mask runs) is Listed, and builds
    the call the same parts give on the device; a part without values keeps it Planned."""
    device = torch.device("cpu")
    tokens = torch.tensor([7, 8, 9, 10, 11])
    for shape, parts in [(_draft_shape(4, 99, device), lambda last, drafts, s: [last, *s.masks]),
                         (_packed_shape(2, 4, 99, True, device), lambda last, drafts, s: [last, drafts, s.masks[0], last, s.masks[1]])]:  # fmt: skip
        last, drafts = Rows(tokens, 4, 5, [11]), Rows(tokens, 0, 2, [7, 8])
        listed = shape.call(parts(last, drafts, shape), 30)
        planned = shape.call(parts(last.tensor(), drafts.tensor(), shape), 30)
        assert type(listed) is Listed and type(planned) is Planned
        built, expected = listed.build(), planned.build()
        assert torch.equal(built.tokens, expected.tokens) and torch.equal(built.positions, expected.positions)
        assert type(shape.call(parts(Rows(tokens, 4, 5), drafts, shape), 30)) is Planned


@pytest.mark.parametrize("lockstep", [False, True])
@pytest.mark.parametrize("schedule", ["ar", "linear", "packed"])
def test_a_greedy_rounds_calls_are_built_on_the_host(schedule, lockstep):
    """After their first iteration, every call of a greedy AR, Linear-SS or Packed-SS request is
    built from the host integers the rounds read back: a batched round is one copy, no gather
    (as coroutines; lanes build every call so, their prefill too)."""
    model = load_nemotron(PROJECT_ROOT / "assets" / "models" / "tiny", dtype="float32")
    greedy = Sampling(0.0, "rejection", None)
    prompts = [[5, 17, 33, 8, 91, 12, 7], [9, 4], [61, 62, 63]]
    settings = [LTRSettings(schedule, 4, 12, (), greedy) for _ in prompts]
    decoder = schedule_named(LTR_DECODERS, schedule)
    executor = BatchedCalls(model, 3)
    kinds: list[list[type]] = []

    batch = engine._Engine.batch

    def recorded(self, slots):
        kinds.append([type(slot.op) for slot in slots])
        return batch(self, slots)

    engine._Engine.batch = recorded
    try:
        requests = [Request(k, lambda m, k=k: Response(m, prompts[k], settings[k], None, decoder)) for k in range(3)]
        list(decode_batched(executor, requests, 3, lockstep))
    finally:
        engine._Engine.batch = batch
    later = [kind for round_kinds in kinds[0 if lockstep else 3 :] for kind in round_kinds]  # past prefill and a first iteration
    assert later and all(kind is Listed for kind in later), kinds
