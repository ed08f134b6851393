"""The SDAR family on the other call paths: batched at C > 1 (packedss.decoding.engine over
packedss.models.batched) and on the static compiled path, every schedule, token for token and
call for call equal to decoding alone on the eager path."""

from __future__ import annotations

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling
from packedss.decoding.driver import run_alone
from packedss.families import FAMILIES
from packedss.models.sdar import load_sdar
from packedss.models.static import end_warmup, enable_static, static_capacity
from tests.decoding.test_batching import _check, _requests
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
    alone, _ = _check(model, _requests(SDAR.decoders, _settings(schedule), _pairs(concurrency)), concurrency)
    assert len({len(out.tokens) for out in alone.values()}) > 2  # they do finish at different times


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_sampled_batched_sdar_decoding_draws_each_requests_own_samples(checkpoint, schedule):
    model = load_sdar(checkpoint, dtype="float32")
    alone, _ = _check(model, _requests(SDAR.decoders, _settings(schedule, 1.0), _pairs(3)), 3)
    greedy = _requests(SDAR.decoders, _settings(schedule), _pairs(3))
    assert any(run_alone(r.start(model)).tokens != alone[r.key].tokens for r in greedy)  # they did sample


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
