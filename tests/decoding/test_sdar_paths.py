"""The SDAR family on the other call paths: batched at C > 1 (packedss.decoding.engine over
packedss.models.batched) and on the static compiled path, every schedule, token for token and
call for call equal to decoding alone on the eager path."""

from __future__ import annotations

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling
from packedss.decoding.batched_ops import BATCHED
from packedss.decoding.block_steps import denoise, s2d2_draft, s2d2_verify
from packedss.decoding.driver import run_alone
from packedss.decoding.rows import Rows
from packedss.families import FAMILIES
from packedss.models.sdar import load_sdar
from packedss.models.static import end_warmup, enable_static, static_capacity
from tests.decoding.test_batched_anyorder import _check_records
from tests.decoding.test_batching import _requests
from tests.decoding.test_batching import _pairs as _ltr_pairs
from tests.sdar_fixtures import SDAR_EOS, write_random_sdar

SDAR = FAMILIES["sdar"]
SCHEDULES = SDAR.schedules


def _pairs(concurrency):
    """The LTR batching tests' prompts and caps, their tokens in this vocabulary."""
    return [([3 + t % 58 for t in prompt], cap) for prompt, cap in _ltr_pairs(concurrency)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_sdar(tmp_path_factory.mktemp("sdar-paths"), seed=1)


def _settings(schedule: str, temperature: float = 0.0):
    def settings(cap, key):
        generator = torch.Generator().manual_seed(1000 + key)
        return LTRSettings(schedule, 3, cap, (SDAR_EOS,), Sampling(temperature, "rejection", generator))

    return settings


@pytest.mark.parametrize("concurrency", [3, 16])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_batched_sdar_decoding_equals_one_at_a_time(checkpoint, schedule, concurrency):
    model = load_sdar(checkpoint, dtype="float32")
    alone, _ = _check_records(model, _requests(SDAR.decoders, _settings(schedule), _pairs(concurrency)), concurrency)
    assert len({len(out.tokens) for out in alone.values()}) > 2  # they do finish at different times


@pytest.mark.parametrize("concurrency", [3, 16])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_sampled_batched_sdar_decoding_draws_each_requests_own_samples(checkpoint, schedule, concurrency):
    model = load_sdar(checkpoint, dtype="float32")
    alone, _ = _check_records(model, _requests(SDAR.decoders, _settings(schedule, 1.0), _pairs(concurrency)), concurrency)
    greedy = _requests(SDAR.decoders, _settings(schedule), _pairs(concurrency))
    assert any(run_alone(r.start(model)).tokens != alone[r.key].tokens for r in greedy)  # they did sample


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_batched_denoising_step_gives_each_block_what_it_gets_alone(temperature):
    """`denoise` of several blocks at once (sdar-native's Host step): the remasking's both paths
    (enough rows above the threshold, else the top count, with ties), counts of 1 and more, and
    at T = 1 each block's exponential race from its own generator."""
    generator = torch.Generator().manual_seed(4)
    blocks, block, vocabulary, mask = 9, 5, 30, 3
    logits = (torch.randn(blocks * block, vocabulary, generator=generator) * 3).round()
    logits[::7] *= 10  # some rows confident enough for the threshold
    tokens = [torch.where(torch.rand(block, generator=generator) < 0.6, mask, 7) for _ in range(blocks)]
    for k in range(blocks):
        tokens[k][k % block] = mask  # every block has a masked row
    counts = [1 + k % 3 for k in range(blocks)]

    def args(k, seed):
        sampling = Sampling(temperature, "rejection", torch.Generator().manual_seed(seed + k))
        return (Rows(logits, k * block, (k + 1) * block), tokens[k], min(counts[k], int((tokens[k] == mask).sum())),
                0.85, mask, sampling)  # fmt: skip

    read, finish = BATCHED[denoise]([args(k, 50) for k in range(blocks)], torch.device("cpu"))
    together = finish(read.tolist())
    for k, (new, resolved) in enumerate(together):
        alone_logits, *rest = args(k, 50)
        want, want_resolved = denoise(alone_logits.tensor(), *rest)
        assert torch.equal(new, want) and resolved == want_resolved


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_s2d2_steps_give_each_block_what_it_gets_alone(temperature):
    """`s2d2_draft` and `s2d2_verify` of several blocks at once: both routes of the score (a
    penalty of 0 and of 2), spans of different lengths, drafts accepted and rejected (each
    rejected one resampled from its own generator, after its uniforms)."""
    generator = torch.Generator().manual_seed(8)
    blocks, block, vocabulary, mask = 10, 5, 30, 3
    logits = (torch.randn(blocks * 2 * block, vocabulary, generator=generator) * 2).round()
    tokens = [torch.where(torch.rand(block, generator=generator) < 0.7, mask, 9) for _ in range(blocks)]
    for k in range(blocks):
        tokens[k][k % block] = mask

    def span_of(k):
        first = int((tokens[k] == mask).to(torch.uint8).argmax())
        end = first + int((tokens[k][first:] == mask).to(torch.long).cumprod(dim=0).sum())
        return range(first, end)

    def draft(k, seed):
        sampling = Sampling(temperature, "rejection", torch.Generator().manual_seed(seed + k))
        rows = Rows(logits, 2 * block * k, 2 * block * k + block)
        return (rows, tokens[k], span_of(k), 1 + k % 2, 2.0 * (k % 2), 0.0, 0.85, mask, sampling)

    read, finish = BATCHED[s2d2_draft]([draft(k, 60) for k in range(blocks)], torch.device("cpu"))
    together = finish(read.tolist())
    for k, got in enumerate(together):
        rows, *rest = draft(k, 60)
        want = s2d2_draft(rows.tensor(), *rest)
        assert got.resolved == want.resolved and torch.equal(got.tokens, want.tokens)
        assert torch.equal(got.proposal, want.proposal) and torch.equal(got.probs, want.probs)
    assert {got.resolved is None for got in together} == {True, False}  # both routes taken

    def verify_args(k, seed):
        proposal, probs = together[k].proposal, together[k].probs
        sampling = Sampling(temperature, "rejection", torch.Generator().manual_seed(seed + k))
        return (Rows(logits, 2 * block * k, 2 * block * (k + 1)), tokens[k], span_of(k), proposal, probs, block, mask,
                sampling)  # fmt: skip

    read, finish = BATCHED[s2d2_verify]([verify_args(k, 90) for k in range(blocks)], torch.device("cpu"))
    verified = finish(read.tolist())
    for k, (new, resolved, accepted) in enumerate(verified):
        rows, *rest = verify_args(k, 90)
        want_tokens, want_resolved, want_accepted = s2d2_verify(rows.tensor(), *rest)
        assert torch.equal(new, want_tokens) and (resolved, accepted) == (want_resolved, want_accepted)
    assert any(accepted < len(span_of(k)) for k, (_, _, accepted) in enumerate(verified))  # some rejected


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_sdar_decodes_on_the_static_path_equal_eager_decodes(checkpoint, schedule):
    eager = load_sdar(checkpoint, dtype="float64")
    prompts, max_new, width = [[5, 9, 11, 30, 7], [4, 4, 12], list(range(4, 20))], 24, 3
    largest = SDAR.schedule(schedule).largest_call_rows(width)
    static = enable_static(load_sdar(checkpoint, dtype="float64"), "default",
                           static_capacity(max(map(len, prompts)), max_new, largest))  # fmt: skip
    end_warmup(static)
    settings = LTRSettings(schedule, width, max_new, (SDAR_EOS,), Sampling(0.0, "rejection", torch.Generator().manual_seed(0)))
    for prompt in prompts:
        a = SDAR.decode(eager, prompt, settings)
        settings.sampling.generator.manual_seed(0)
        b = SDAR.decode(static, prompt, settings)
        settings.sampling.generator.manual_seed(0)
        assert (b.tokens, b.rows_evaluated) == (a.tokens, a.rows_evaluated)
        assert max(b.rows_evaluated[1:]) <= largest
