"""Greedy exactness: every lossless LTR schedule emits the AR greedy sequence token for token (float64)."""

from __future__ import annotations

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling, decode_ltr

WIDTHS = (1, 2, 3, 4, 8, 16)
VARIANTS = (("linear", True), ("quadratic", True), ("packed", True), ("packed", False))
GREEDY = Sampling(temperature=0.0, rule="rejection", generator=None)


def _cases(count: int = 20, seed: int = 0):
    """Random prompts with varied lengths and caps; half of them get an EOS that the AR
    output actually emits, so both stops are exercised."""
    generator = torch.Generator().manual_seed(seed)
    cases = []
    for index in range(count):
        length = int(torch.randint(1, 14, (1,), generator=generator))
        prompt = torch.randint(4, 40, (length,), generator=generator).tolist()
        cap = int(torch.randint(8, 40, (1,), generator=generator))
        cases.append((index, prompt, cap))
    return cases


@pytest.fixture(scope="module")
def references(tiny_model):
    refs = {}
    for index, prompt, cap in _cases():
        free = decode_ltr(tiny_model, prompt, LTRSettings("ar", 1, cap, (), GREEDY))
        eos = (free.tokens[len(free.tokens) // 2],) if index % 2 else ()
        ar = decode_ltr(tiny_model, prompt, LTRSettings("ar", 1, cap, eos, GREEDY))
        refs[index] = (prompt, cap, eos, ar)
    return refs


def test_references_exercise_both_stops(references):
    reasons = {ar.finish_reason for _, _, _, ar in references.values()}
    assert reasons == {"eos", "max_tokens"}


@pytest.mark.parametrize("schedule,pad_verify", VARIANTS, ids=[f"{s}-pad{int(p)}" for s, p in VARIANTS])
def test_lossless_schedules_equal_ar_greedy(tiny_model, references, schedule, pad_verify):
    multi_token_iterations = 0
    for width in WIDTHS:
        for index, (prompt, cap, eos, ar) in references.items():
            settings = LTRSettings(schedule, width, cap, eos, GREEDY, pad_verify=pad_verify)
            out = decode_ltr(tiny_model, prompt, settings)
            assert out.tokens == ar.tokens, f"{schedule} W={width} prompt #{index} diverged from AR"
            assert out.finish_reason == ar.finish_reason
            multi_token_iterations += sum(a > 1 for a in out.accepted)
    # The random model repeats itself often enough that accepted drafts are exercised too.
    assert multi_token_iterations > 0
