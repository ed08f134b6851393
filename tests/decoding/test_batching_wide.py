"""Concurrency C = 64, with few tokens per response: every request's output equals its C = 1
output in float32, for every schedule of the three families, greedy and at T = 1 (the LTR and
SDAR families' host steps are batched at both, and the any-order family's)."""

from __future__ import annotations

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling
from packedss.decoding.anyorder import ANYORDER_DECODERS, AnyOrderSettings
from packedss.decoding.schedules import LTR_DECODERS
from packedss.families import FAMILIES
from packedss.models.sdar import load_sdar
from tests.decoding.test_batching import PROMPTS, _check, _requests
from tests.sdar_fixtures import SDAR_EOS, write_random_sdar

WIDE = 64
# 68 requests (more than the slots, so the last ones join a batch in progress), 2-4 tokens each.
PAIRS = [(PROMPTS[k % 6][k % 4 :] + [k + 20], 2 + k % 3) for k in range(68)]


def _sampling(temperature: float, rule: str, key: int) -> Sampling:
    """Each request's own generator (S2D2 draws at T = 0 too)."""
    return Sampling(temperature, rule, torch.Generator().manual_seed(5000 + key))


@pytest.mark.parametrize("temperature, rule", [(0.0, "rejection"), (1.0, "rejection"), (1.0, "match")])
@pytest.mark.parametrize("schedule", [d.name for d in LTR_DECODERS])
def test_64_batched_ltr_requests_equal_one_at_a_time(tiny, schedule, temperature, rule):
    settings = lambda cap, key: LTRSettings(schedule, 4, cap, (2,), _sampling(temperature, rule, key))  # noqa: E731
    _check(tiny, _requests(LTR_DECODERS, settings, PAIRS), WIDE)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("schedule", [d.name for d in ANYORDER_DECODERS])
def test_64_batched_anyorder_requests_equal_one_at_a_time(tiny_set, schedule, temperature):
    order = "confidence" if schedule in ("linear", "packed") else "ltr"
    settings = lambda cap, key: AnyOrderSettings(schedule, 4, cap, (2,), _sampling(temperature, "rejection", key),  # noqa: E731
                                                 order=order)  # fmt: skip
    _check(tiny_set, _requests(ANYORDER_DECODERS, settings, PAIRS), WIDE)


@pytest.fixture(scope="module")
def sdar(tmp_path_factory):
    return load_sdar(write_random_sdar(tmp_path_factory.mktemp("sdar-wide"), seed=1), dtype="float32")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("schedule", FAMILIES["sdar"].schedules)
def test_64_batched_sdar_requests_equal_one_at_a_time(sdar, schedule, temperature):
    pairs = [([3 + t % 58 for t in prompt], cap) for prompt, cap in PAIRS]
    settings = lambda cap, key: LTRSettings(schedule, 3, cap, (SDAR_EOS,), _sampling(temperature, "rejection", key))  # noqa: E731
    _check(sdar, _requests(FAMILIES["sdar"].decoders, settings, pairs), WIDE)
