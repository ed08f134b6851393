"""The any-order family (SetDLM): exactness against plain decoders written here, row accounting
per call, record identities, native decoding, and distribution preservation at T = 1."""

from __future__ import annotations

import itertools

import pytest
import torch

from packedss.decoding import batched_anyorder
from packedss.decoding import AnyOrderSettings, decode_anyorder
from packedss.decoding.verify import Sampling
from packedss.models.setdlm import load_setdlm
from tests.chi_square import CONTROL_RUNS, LEVEL, accept_every_draft, chi_square_p
from tests.anyorder_fixtures import SET_EOS, ToySetModel, plain_ar, plain_confidence, write_random_setdlm

GREEDY = Sampling(0.0, "rejection", None)
PROMPTS = ([5, 9, 11, 7, 13], [20, 1, 17, 8])
N = 20


@pytest.fixture(scope="module")
def set_model(tmp_path_factory):
    return load_setdlm(write_random_setdlm(tmp_path_factory.mktemp("tiny-setdlm")), device="cpu", dtype="float64")


@pytest.fixture(scope="module")
def ltr_references(set_model):
    return {tuple(p): plain_ar(set_model, p, N) for p in PROMPTS}


def settings(schedule, width, order="ltr", n=N, eos=(), sampling=GREEDY, **kw):
    return AnyOrderSettings(schedule, width, n, eos, sampling, order=order, **kw)


# ------------------------------------------------------------------ exactness (real adapter, float64)
@pytest.mark.parametrize("width", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("schedule", ["ar", "linear", "packed", "quadratic"])
def test_ltr_schedules_equal_left_to_right_ar(set_model, ltr_references, schedule, width):
    for prompt in PROMPTS:
        out = decode_anyorder(set_model, prompt, settings(schedule, width))
        assert out.tokens == ltr_references[tuple(prompt)], (schedule, width, prompt)


def test_the_tiny_model_accepts_some_drafts_and_rejects_others(set_model):
    accepted = []
    for prompt in PROMPTS:
        accepted += decode_anyorder(set_model, prompt, settings("linear", 4)).accepted
    assert min(accepted) < 4 and max(accepted) == 4  # mixed: the exactness tests exercise both paths


@pytest.mark.parametrize("width", [2, 4, 8])
def test_confidence_order_linear_and_packed_equal_the_plain_any_order_decoder(set_model, ltr_references, width):
    differs_from_ltr = False
    for prompt in PROMPTS:
        reference = plain_confidence(set_model, prompt, N, width)
        differs_from_ltr |= reference != ltr_references[tuple(prompt)]
        for schedule in ("linear", "packed", "quadratic", "ar"):
            out = decode_anyorder(set_model, prompt, settings(schedule, width, "confidence"))
            assert out.tokens == reference, (schedule, width, prompt)
    if width > 2:
        assert differs_from_ltr  # the order really changes what is decoded


# ------------------------------------------------------------------ row accounting and records
def expected_rows(kind: str, u: int, p: int, prompt: int) -> int:
    return {
        "prefill": prompt + u,
        "ar": p + u,
        "native": p + u,
        "draft": p + u,
        "verify": 2 * u,
        "packed": p + 3 * u,
        "quadratic": p + 2 * u + u * u,
    }[kind]


def check_record(out, schedule: str, prompt_len: int, width: int) -> None:
    x = out.extra
    calls = out.nfe_total
    assert len(out.rows_evaluated) == len(out.rows_useful) == calls
    assert len(x["u"]) == len(x["p"]) == len(x["resolved"]) == len(x["call_kinds"]) == calls
    assert len(out.drafted) == len(out.accepted_drafts) == out.iterations
    assert sum(out.drafted) == out.draft_proposed and sum(out.accepted_drafts) == out.draft_accepted
    for drafted, accepted_drafts, resolved in zip(out.drafted, out.accepted_drafts, out.accepted):
        assert 0 <= accepted_drafts <= drafted <= width and accepted_drafts <= resolved
    if schedule == "native":
        assert out.draft_proposed == 0
    assert out.nfe_prefill == 1 and x["call_kinds"][0] == "prefill" and x["p"][0] == 0
    for kind, rows, useful, u, p in zip(x["call_kinds"], out.rows_evaluated, out.rows_useful, x["u"], x["p"]):
        assert rows == expected_rows(kind, u, p, prompt_len), (kind, rows, u, p)
        assert useful <= rows and 0 <= u <= width
        if schedule != "native":
            assert p in (0, 1)
    # Every resolved token is either in the output or counted as truncated.
    assert sum(x["resolved"]) == len(out.tokens) + out.truncated_tokens
    assert x["resolved"][0] + sum(out.accepted) == sum(x["resolved"])
    if schedule != "native":
        assert 1 + sum(out.accepted) - out.truncated_tokens == len(out.tokens)
        assert x["resolved"][0] == 1
    calls_per_iteration = 2 if schedule == "linear" else 1
    assert calls == 1 + calls_per_iteration * out.iterations
    assert out.draft_accepted <= out.draft_proposed
    assert x["lossless"] == (schedule != "native")


@pytest.mark.parametrize("order", ["ltr", "confidence"])
@pytest.mark.parametrize("schedule", ["ar", "linear", "packed", "quadratic", "native"])
def test_rows_per_call_follow_the_formulas_and_records_are_consistent(set_model, schedule, order):
    for width in (1, 3, 8):
        for prompt in PROMPTS:
            out = decode_anyorder(set_model, prompt, settings(schedule, width, order))
            check_record(out, schedule, len(prompt), width)
            assert len(out.tokens) == N and out.finish_reason == "max_tokens"


@pytest.mark.parametrize("order", ["ltr", "confidence"])
@pytest.mark.parametrize("schedule", ["linear", "packed", "quadratic"])
def test_p_is_zero_exactly_after_an_all_accepted_call(set_model, schedule, order):
    seen_all, seen_correction = False, False
    for prompt in PROMPTS:
        out = decode_anyorder(set_model, prompt, settings(schedule, 4, order))
        x = out.extra
        kinds, u, p, resolved = x["call_kinds"], x["u"], x["p"], x["resolved"]
        verifying = "verify" if schedule == "linear" else schedule
        calls_per_iteration = 2 if schedule == "linear" else 1
        for t in range(1, len(kinds) - 1):
            if kinds[t] != verifying or resolved[t] == 0:
                continue
            h = out.accepted_drafts[(t - 1) // calls_per_iteration]  # the iteration this call ends
            all_accepted = h == u[t]  # every open position resolved by an accepted draft
            assert resolved[t] == h + (0 if all_accepted else 1)
            assert p[t + 1] == (0 if all_accepted else 1), (t, kinds[t], u[t], resolved[t], p[t + 1])
            seen_all |= all_accepted
            seen_correction |= not all_accepted
        if schedule != "linear":  # the prefill leaves one correction to write
            assert p[1] == 1
    assert seen_correction
    # In ltr, one-call schedules always have a placeholder at the window's right end (packed: a
    # position that entered the window after its proposals were made; quadratic: the block row at
    # the corrected position is its query), so their verification always ends in a correction.
    assert seen_all == (schedule == "linear" or order == "confidence")


def test_ltr_width_is_always_full_and_u_recorded(set_model):
    x = decode_anyorder(set_model, PROMPTS[0], settings("packed", 8)).extra
    assert x["u"][1:] == [8] * (len(x["u"]) - 1)


def test_eos_stops_and_discards_what_was_resolved_after_it(set_model, ltr_references):
    reference = ltr_references[tuple(PROMPTS[0])]
    eos = reference[5]
    cut = reference.index(eos) + 1
    for schedule in ("ar", "linear", "packed", "quadratic"):
        out = decode_anyorder(set_model, PROMPTS[0], settings(schedule, 8, eos=(eos,)))
        assert out.tokens == reference[:cut] and out.finish_reason == "eos"
        check_record(out, schedule, len(PROMPTS[0]), 8)
    for schedule in ("linear", "packed"):
        out = decode_anyorder(set_model, PROMPTS[0], settings(schedule, 8, "confidence", eos=(eos,)))
        full = plain_confidence(set_model, PROMPTS[0], N, 8)
        if eos in full:
            assert out.tokens == full[: full.index(eos) + 1] and out.finish_reason == "eos"
        check_record(out, schedule, len(PROMPTS[0]), 8)


def test_stop_check_cuts_the_output(set_model, ltr_references):
    reference = ltr_references[tuple(PROMPTS[1])]

    def stop_after_seven(tokens, new):
        return 7 if len(tokens) >= 7 else None

    out = decode_anyorder(set_model, PROMPTS[1], settings("packed", 4), stop_check=stop_after_seven)
    assert out.tokens == reference[:7] and out.finish_reason == "stop"
    check_record(out, "packed", len(PROMPTS[1]), 4)


def test_default_eos_of_the_checkpoint_is_known(set_model):
    assert set_model.eos_token_ids == (SET_EOS,)


# ------------------------------------------------------------------ native
def test_native_is_lossy_and_needs_fewer_calls_than_ar(set_model):
    fewer = 0
    for prompt in PROMPTS:
        ar = decode_anyorder(set_model, prompt, settings("ar", 8))
        native = decode_anyorder(set_model, prompt, settings("native", 8, confidence_threshold=0.5))
        check_record(native, "native", len(prompt), 8)
        assert native.extra["lossless"] is False and ar.extra["lossless"] is True
        assert len(native.tokens) == N
        assert max(native.extra["resolved"]) > 1  # parallel: several tokens in one call
        fewer += native.nfe_total < ar.nfe_total
    assert fewer == len(PROMPTS)


def test_native_threshold_one_resolves_one_token_per_call(set_model):
    out = decode_anyorder(set_model, PROMPTS[0], settings("native", 8, confidence_threshold=1.1))
    assert out.extra["resolved"] == [1] * N


# ------------------------------------------------------------------ settings
@pytest.mark.parametrize(
    "bad",
    [
        dict(schedule="spiral"),
        dict(order="random"),
        dict(width=0),
        dict(n=0),
    ],
)
def test_invalid_settings_fail_with_the_valid_choices(set_model, bad):
    args = dict(schedule="packed", width=4, order="ltr", n=N) | bad
    with pytest.raises(ValueError):
        decode_anyorder(set_model, PROMPTS[0], settings(args["schedule"], args["width"], args["order"], args["n"]))


# ------------------------------------------------------------------ distribution at T = 1 (toy set model)
TOY_PROMPT = [1, 4, 6]
LENGTH = 3
RUNS = 5000


def exact_ltr_distribution(model: ToySetModel) -> dict[tuple[int, ...], float]:
    probs = {}
    base = [(t, i) for i, t in enumerate(TOY_PROMPT)]
    for seq in itertools.product(range(model.vocab), repeat=LENGTH):
        p, seen = 1.0, list(base)
        for k, token in enumerate(seq):
            position = len(TOY_PROMPT) + k
            p *= float(torch.softmax(model.logits_for(position, seen), -1)[token])
            seen.append((token, position))
        probs[seq] = p
    return probs


def sample_many(schedule: str, rule: str, width: int = 2, runs: int = RUNS) -> list[tuple[int, ...]]:
    model = ToySetModel()
    samples = []
    for seed in range(runs):
        sampling = Sampling(1.0, rule, torch.Generator().manual_seed(seed))
        out = decode_anyorder(model, TOY_PROMPT, AnyOrderSettings(schedule, width, LENGTH, (), sampling))
        samples.append(tuple(out.tokens))
    return samples


@pytest.fixture(scope="module")
def exact():
    return exact_ltr_distribution(ToySetModel())


def test_toy_model_follows_the_call_protocol_like_the_plain_rule():
    model = ToySetModel()
    greedy = decode_anyorder(model, TOY_PROMPT, AnyOrderSettings("packed", 3, 6, (), GREEDY)).tokens
    seen, plain = [(t, i) for i, t in enumerate(TOY_PROMPT)], []
    for k in range(6):
        token = int(model.logits_for(len(TOY_PROMPT) + k, seen).argmax())
        plain.append(token)
        seen.append((token, len(TOY_PROMPT) + k))
    assert greedy == plain


@pytest.mark.parametrize("rule", ["rejection", "match"])
@pytest.mark.parametrize("schedule", ["linear", "packed", "quadratic"])
def test_sampled_ltr_schedules_preserve_the_ar_distribution(exact, schedule, rule):
    assert chi_square_p(sample_many(schedule, rule), exact) > LEVEL


@pytest.mark.parametrize("schedule", ["linear", "packed"])
def test_broken_verifier_fails_the_same_test(exact, schedule, monkeypatch):
    monkeypatch.setattr(batched_anyorder, "verify", accept_every_draft)
    assert chi_square_p(sample_many(schedule, "rejection", runs=CONTROL_RUNS), exact) < LEVEL


def test_toy_drafts_are_accepted_sometimes_and_rejected_sometimes():
    accepted_drafts = []
    for seed in range(200):
        sampling = Sampling(1.0, "rejection", torch.Generator().manual_seed(seed))
        out = decode_anyorder(ToySetModel(), TOY_PROMPT, AnyOrderSettings("linear", 2, LENGTH, (), sampling))
        accepted_drafts += out.accepted_drafts  # every Linear-SS iteration ends in a verify call
    # Linear's rank-0 draft saw exactly what its query sees (q = p), so it is always accepted;
    # rank 1 is rejected sometimes and accepted sometimes.
    assert min(accepted_drafts) >= 1 and 1 in accepted_drafts and 2 in accepted_drafts


# ------------------------------------------------------------------ native's rules, as the released sampler
def _first_resolved(monkeypatch, confidences: list[float]) -> list[int]:
    """The positions native's first call resolves when its proposals have `confidences`."""
    from packedss.decoding import ANYORDER_DECODERS, schedule_named

    native = schedule_named(ANYORDER_DECODERS, "native")
    monkeypatch.setattr(native, "confidences", lambda self, proposed: confidences[: len(proposed.tokens)])
    chosen, resolve = [], native.resolve
    monkeypatch.setattr(native, "resolve", lambda self, items: chosen.append([p for p, _ in items]) or resolve(self, items))
    decode_anyorder(ToySetModel(), TOY_PROMPT, settings("native", 4, n=4))
    return [position - len(TOY_PROMPT) for position in chosen[0]]


def test_native_keeps_the_rightmost_of_equally_confident_proposals(monkeypatch):
    assert _first_resolved(monkeypatch, [0.5, 0.7, 0.7, 0.2]) == [2]


def test_native_compares_the_threshold_in_float32(monkeypatch):
    exactly_float32_09 = torch.tensor(0.9, dtype=torch.float32).item()  # 0.8999999761..., below the float 0.9
    assert _first_resolved(monkeypatch, [exactly_float32_09, 0.95, 0.5, 0.5]) == [0, 1]
    assert _first_resolved(monkeypatch, [0.8999, 0.95, 0.5, 0.5]) == [1]
