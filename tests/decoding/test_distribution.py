"""Distribution preservation at T = 1: every schedule's empirical distribution over 3-token
continuations matches the exact AR distribution (by enumeration) under a chi-square test, for
`rejection` and `match`; a verifier that accepts every draft must fail the same test."""

from __future__ import annotations

import itertools

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling, decode_ltr
from packedss.decoding import driver
from packedss.decoding import schedules as schedules_module
from tests.chi_square import CONTROL_RUNS, LEVEL, accept_every_draft, chi_square_p, schedules_and_rules
from tests.toy_ltr import ToyLTRModel

PROMPT = [1, 4, 6]
LENGTH = 3
RUNS = 5000


def exact_ar_distribution(model: ToyLTRModel) -> dict[tuple[int, ...], float]:
    probs = {}
    for seq in itertools.product(range(model.vocab), repeat=LENGTH):
        p, prefix = 1.0, tuple(PROMPT)
        for token in seq:
            p *= float(torch.softmax(model.ar_logits(prefix), -1)[token])
            prefix += (token,)
        probs[seq] = p
    return probs


def sample_many(schedule: str, rule: str, width: int = 3, runs: int = RUNS) -> list[tuple[int, ...]]:
    model = ToyLTRModel()
    samples = []
    for seed in range(runs):
        sampling = Sampling(1.0, rule, torch.Generator().manual_seed(seed))
        out = decode_ltr(model, PROMPT, LTRSettings(schedule, width, LENGTH, (), sampling))
        assert len(out.tokens) == LENGTH
        samples.append(tuple(out.tokens))
    return samples


@pytest.fixture(scope="module")
def exact():
    return exact_ar_distribution(ToyLTRModel())


@pytest.mark.parametrize(("schedule", "rule"), schedules_and_rules(("linear", "quadratic", "packed")))
def test_sampled_schedules_preserve_the_ar_distribution(exact, schedule, rule):
    assert chi_square_p(sample_many(schedule, rule), exact) > LEVEL


def test_ar_samples_the_same_under_either_rule():
    """Why AR's distribution test runs under one rule (schedules_and_rules)."""
    assert sample_many("ar", "rejection", runs=200) == sample_many("ar", "match", runs=200)


@pytest.mark.parametrize("schedule", ["linear", "packed"])
def test_broken_verifier_fails_the_same_test(exact, schedule, monkeypatch):
    monkeypatch.setattr(schedules_module, "verify", accept_every_draft)
    monkeypatch.setattr(driver, "verify", accept_every_draft)  # Packed-SS's, through verify_ahead
    assert chi_square_p(sample_many(schedule, "rejection", runs=CONTROL_RUNS), exact) < LEVEL


def test_toy_drafts_are_accepted_sometimes_and_rejected_sometimes():
    model = ToyLTRModel()
    accepted = []
    for seed in range(200):
        sampling = Sampling(1.0, "rejection", torch.Generator().manual_seed(seed))
        accepted += decode_ltr(model, PROMPT, LTRSettings("linear", 3, LENGTH, (), sampling)).accepted
    assert 1 in accepted and max(accepted) > 1
