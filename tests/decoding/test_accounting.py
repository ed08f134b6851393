"""Row and NFE accounting per call, and the record identities of docs/records.md §3."""

from __future__ import annotations

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling, decode_ltr

GREEDY = Sampling(temperature=0.0, rule="rejection", generator=None)
PROMPTS = [[5, 9, 11, 30], [7], [12, 13, 14, 15, 16, 17, 18, 19, 20]]


def _identities(out, calls_per_iteration):
    assert 1 + sum(out.accepted) - out.truncated_tokens == len(out.tokens)
    assert out.nfe_total == out.nfe_prefill + calls_per_iteration * out.iterations
    assert len(out.rows_evaluated) == out.nfe_total == len(out.rows_useful)
    assert out.nfe_prefill == 1
    assert out.iterations == len(out.accepted)
    assert out.nonmodel_s == pytest.approx(out.wall_s - out.model_s)
    assert 0 < out.model_s <= out.wall_s
    assert out.draft_accepted == sum(out.accepted) - out.iterations
    # Per iteration: an LTR verification emits its accepted drafts and one more token.
    assert out.accepted_drafts == [a - 1 for a in out.accepted]
    assert len(out.drafted) == out.iterations and sum(out.drafted) == out.draft_proposed


@pytest.mark.parametrize("width", [1, 3, 8])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_ar_and_linear_rows(tiny_model, prompt, width):
    ar = decode_ltr(tiny_model, prompt, LTRSettings("ar", width, 20, (), GREEDY))
    assert ar.rows_evaluated == [len(prompt)] + [1] * ar.iterations
    assert ar.accepted == [1] * ar.iterations
    assert ar.drafted == [0] * ar.iterations
    _identities(ar, 1)
    out = decode_ltr(tiny_model, prompt, LTRSettings("linear", width, 20, (), GREEDY))
    block = width + 1
    assert out.rows_evaluated == [len(prompt)] + [block, block] * out.iterations
    assert out.rows_useful == out.rows_evaluated
    assert out.drafted == [width] * out.iterations
    _identities(out, 2)


@pytest.mark.parametrize("width", [1, 3, 8])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_quadratic_rows(tiny_model, prompt, width):
    out = decode_ltr(tiny_model, prompt, LTRSettings("quadratic", width, 20, (), GREEDY))
    block = width + 1
    assert out.rows_evaluated == [len(prompt) + block] + [block * (block + 1)] * out.iterations
    assert out.drafted == [width] * out.iterations  # a full W-token draft every iteration
    _identities(out, 1)


@pytest.mark.parametrize("pad_verify", [True, False])
@pytest.mark.parametrize("width", [1, 3, 8])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_packed_rows(tiny_model, prompt, width, pad_verify):
    out = decode_ltr(tiny_model, prompt, LTRSettings("packed", width, 20, (), GREEDY, pad_verify=pad_verify))
    block = width + 1
    # Draft sizes: W-1 after prefill (which emits one token), then W - A_{t-1} (never negative).
    draft_sizes, previous = [], 1
    for emitted in out.accepted:
        draft_sizes.append(max(width - previous, 0))
        previous = emitted
    real_rows = [1 + m + block for m in draft_sizes]
    assert out.rows_useful == [len(prompt) + block] + real_rows
    expected = [2 * block] * out.iterations if pad_verify else real_rows
    assert out.rows_evaluated == [len(prompt) + block] + expected
    assert out.drafted == draft_sizes
    _identities(out, 1)


def test_truncation_is_counted(tiny_model):
    free = decode_ltr(tiny_model, PROMPTS[0], LTRSettings("packed", 8, 40, (), GREEDY))
    cap = 5
    out = decode_ltr(tiny_model, PROMPTS[0], LTRSettings("packed", 8, cap, (), GREEDY))
    assert out.tokens == free.tokens[:cap]
    assert out.finish_reason == "max_tokens"
    assert 1 + sum(out.accepted) - out.truncated_tokens == cap


def test_stop_check_cuts_and_counts(tiny_model):
    free = decode_ltr(tiny_model, PROMPTS[2], LTRSettings("linear", 4, 30, (), GREEDY))
    target = free.tokens[6]
    first = free.tokens.index(target)

    def stop_at_target(tokens, new):
        for k in range(len(tokens) - new, len(tokens)):
            if tokens[k] == target:
                return k + 1
        return None

    for schedule in ("ar", "linear", "quadratic", "packed"):
        out = decode_ltr(tiny_model, PROMPTS[2], LTRSettings(schedule, 4, 30, (), GREEDY), stop_check=stop_at_target)
        assert out.tokens == free.tokens[: first + 1]
        assert out.finish_reason == "stop"
        assert 1 + sum(out.accepted) - out.truncated_tokens == len(out.tokens)


def test_bad_settings_are_refused(tiny_model):
    with pytest.raises(ValueError, match="width"):
        decode_ltr(tiny_model, [5], LTRSettings("packed", 0, 5, (), GREEDY))
    with pytest.raises(ValueError, match="schedule"):
        decode_ltr(tiny_model, [5], LTRSettings("bogus", 2, 5, (), GREEDY))
    with pytest.raises(ValueError, match="prompt"):
        decode_ltr(tiny_model, [], LTRSettings("ar", 2, 5, (), GREEDY))


def test_sampled_runs_are_reproducible(tiny_model):
    def run(seed):
        sampling = Sampling(1.0, "rejection", torch.Generator().manual_seed(seed))
        return decode_ltr(tiny_model, PROMPTS[0], LTRSettings("packed", 4, 20, (), sampling)).tokens

    assert run(3) == run(3)
