"""The batched host steps (packedss.decoding.batched_ops) give what the plain functions give each
request: the two-pass argmax and top-2 equal torch's on rows with ties; a round reads back once;
the near-tie threshold is frexp's."""

from __future__ import annotations

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling
from packedss.decoding import batched_ops, verify
from packedss.decoding.batched_ops import _Greedy
from packedss.decoding.driver import Response, schedule_named, verify_ahead
from packedss.decoding.engine import Request, decode_batched
from packedss.decoding.rows import Rows
from packedss.decoding.schedules import LTR_DECODERS
from packedss.models.batched import BatchedCalls
from packedss.models.nemotron import load_nemotron
from packedss.paths import PROJECT_ROOT
from tests.decoding.test_syncs import counting_read_backs


@pytest.mark.parametrize("vocabulary", [1024, 192, 128, 96, 100, 8])
def test_the_two_pass_argmax_and_top2_equal_torchs_with_ties(vocabulary):
    generator = torch.Generator().manual_seed(vocabulary)
    for trial in range(60):
        rows = int(torch.randint(1, 40, (), generator=generator))
        logits = torch.randn(rows, vocabulary, generator=generator)
        if trial % 2:  # few distinct values: many ties, also between blocks
            logits = (logits * 2).round() / 2
        if trial % 3 == 0:  # the largest twice, in different blocks
            at = torch.randint(0, vocabulary, (rows,), generator=generator)
            logits[torch.arange(rows), at] = 9.0
            logits[torch.arange(rows), (at + vocabulary // 2 + 1) % vocabulary] = 9.0
        greedy = _Greedy(logits)
        assert torch.equal(greedy.tokens, logits.argmax(dim=-1))
        assert torch.equal(greedy.top2, logits.topk(2, dim=-1).values)


@pytest.mark.parametrize("schedule", ["linear", "packed"])
def test_a_greedy_round_reads_back_once(schedule, monkeypatch):
    """At T = 0 every request's verification (and prefill token) of a round is one read-back;
    beyond that only each response's near-ties are read, once, when it ends."""
    model = load_nemotron(PROJECT_ROOT / "assets" / "models" / "tiny", dtype="float32")
    greedy = Sampling(0.0, "rejection", None)
    prompts = [[5, 17, 33, 8, 91, 12, 7], [9, 4], [61, 62, 63], [7, 7, 7, 7, 7], [40, 41, 42], [100, 5]]

    def requests():
        settings = [LTRSettings(schedule, 4, 8 + 3 * k, (), greedy) for k in range(len(prompts))]
        decoder = schedule_named(LTR_DECODERS, schedule)
        return [Request(k, lambda m, k=k: Response(m, prompts[k], settings[k], None, decoder)) for k in range(len(prompts))]

    executor = BatchedCalls(model, 4)
    list(decode_batched(executor, requests(), 4))  # layouts and biases built once
    calls = []
    run = executor.run
    executor.run = lambda batch: calls.append(len(batch.entries)) or run(batch)
    with counting_read_backs(monkeypatch) as counts:
        finished = list(decode_batched(executor, requests(), 4))
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
    inf, nan = float("inf"), float("nan")
    tops = torch.tensor([[inf, 3.0], [inf, inf], [-inf, -inf], [nan, 3.0], [nan, nan]])  # a row's top two
    margins = tops[:, 0] - tops[:, 1]
    assert not (margins <= verify.near_tie_threshold(tops[:, 0], dtype)).any()


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
