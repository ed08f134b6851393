"""Prompt lookup decoding (docs/schedules.md §18): the draft lookup equals transformers'
PromptLookupCandidateGenerator; `pld` equals `ar` token for token in every family (greedy); its
drafts are accepted on a prompt that repeats a span; at T = 1 it preserves the AR distribution."""

from __future__ import annotations

import random

import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from packedss.decoding import AnyOrderSettings, LTRSettings, Sampling
from packedss.decoding import pld as pld_module
from packedss.decoding.pld import lookup_draft, room_for_drafts
from packedss.errors import PackedSSError
from packedss.families import FAMILIES
from packedss.decoding.driver import run_alone
from packedss.models.static import enable_static, end_warmup, static_capacity
from packedss.paths import PROJECT_ROOT
from tests.anyorder_fixtures import ToySetModel
from tests.decoding import test_batching as batching
from tests.chi_square import CONTROL_RUNS, LEVEL, accept_every_draft, chi_square_p
from tests.decoding.test_anyorder import exact_ltr_distribution
from tests.decoding.test_distribution import exact_ar_distribution
from tests.decoding.test_sdar_schedules import ToySDAR
from tests.toy_ltr import ToyLTRModel

GREEDY = Sampling(0.0, "rejection", None)
TOY_PROMPT, LENGTH, RUNS = [1, 4, 6], 3, 4000


def transformers_draft(context: list[int], k: int, n: int, eos: tuple[int, ...]) -> list[int]:
    generator = PromptLookupCandidateGenerator(
        eos_token_id=torch.tensor(eos) if eos else None, num_output_tokens=k, max_matching_ngram_size=n,
        max_length=len(context) + 1000)  # fmt: skip
    candidates, _ = generator.get_candidates(torch.tensor([context]))
    return candidates[0, len(context) :].tolist()


def test_lookup_equals_transformers_prompt_lookup_on_random_contexts():
    rng = random.Random(0)
    for _ in range(600):
        context = [rng.randrange(5) for _ in range(rng.randrange(1, 30))]
        k, n = rng.choice((1, 3, 10)), rng.choice((1, 2, 3))
        eos = rng.choice(((), (4,), (0, 3)))
        assert lookup_draft(context, k, n, eos) == transformers_draft(context, k, n, eos), (context, k, n, eos)


def test_lookup_takes_the_first_occurrence_and_stops_at_the_end():
    # The last 2-gram (5, 6) occurs at 0 and at 3: the first occurrence gives the draft.
    assert lookup_draft([5, 6, 7, 5, 6, 8, 5, 6], 3) == [7, 5, 6]
    assert lookup_draft([5, 6, 7, 5, 6, 8, 5, 6], 10) == [7, 5, 6, 8, 5, 6]
    # Not past the context's end, however large k is.
    assert lookup_draft([1, 2, 3, 1, 2], 10) == [3, 1, 2]
    # No 2-gram match: the 1-gram; no match at all: no draft; EOS cuts the draft before it.
    assert lookup_draft([9, 1, 2, 9], 2) == [1, 2]
    assert lookup_draft([1, 2, 3], 4) == []
    assert lookup_draft([1, 2, 0, 7, 1, 2], 5, eos_token_ids=(0,)) == []
    assert lookup_draft([1, 2, 3, 0, 1, 2], 5, eos_token_ids=(0,)) == [3]


def test_draft_room_leaves_the_verifier_its_token_under_the_cap():
    assert room_for_drafts(10, 64, 0) == 10
    assert room_for_drafts(10, 64, 60) == 3
    assert room_for_drafts(10, 64, 63) == 0


class PeriodicToy(ToyLTRModel):
    """An AR model that repeats the token PERIOD places back (the verifier of a copy task)."""

    PERIOD = 4

    def ar_logits(self, prefix: tuple[int, ...]) -> torch.Tensor:
        logits = torch.zeros(self.vocab, dtype=torch.float64)
        logits[prefix[-self.PERIOD]] = 8.0
        return logits


def test_drafts_of_a_repeated_span_are_accepted():
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]  # the span 1 2 3 4 repeated; the model continues it
    nemotron = FAMILIES["nemotron"]
    out = nemotron.decode(PeriodicToy(), prompt, LTRSettings("pld", 4, 21, (), GREEDY))
    ar = nemotron.decode(PeriodicToy(), prompt, LTRSettings("ar", 4, 21, (), GREEDY))
    assert out.tokens == ar.tokens == [3, 4, 1, 2] * 5 + [3]
    # The first token from the prefill, then every call accepts its 4 drafts and adds the bonus.
    assert out.accepted == [5, 5, 5, 5]
    assert out.accepted_drafts == [4, 4, 4, 4] and out.draft_accepted == 16
    assert out.nfe_total == 5 and ar.nfe_total == 21
    assert out.rows_evaluated == [len(prompt), 5, 5, 5, 5]


def _decode(family: str, model, prompt, schedule: str, width: int, cap: int, sampling: Sampling, max_ngram: int = 2):
    settings = (AnyOrderSettings(schedule, width, cap, (), sampling, max_ngram=max_ngram, order="ltr")
                if family == "setdlm" else LTRSettings(schedule, width, cap, (), sampling, max_ngram=max_ngram))  # fmt: skip
    return FAMILIES[family].decode(model, prompt, settings)


TOYS = {"nemotron": ToyLTRModel, "sdar": ToySDAR, "setdlm": ToySetModel}


@pytest.mark.parametrize("family", list(TOYS))
def test_greedy_pld_equals_ar_on_toy_models(family):
    rng = random.Random(1)
    accepted = []
    for _ in range(12):
        prompt = [rng.randrange(1, 8) for _ in range(rng.randrange(2, 12))]
        for width in (1, 3, 10):
            out = _decode(family, TOYS[family](), prompt, "pld", width, 24, GREEDY)
            assert out.tokens == _decode(family, TOYS[family](), prompt, "ar", width, 24, GREEDY).tokens
            assert out.nfe_total == 1 + out.iterations and sum(out.accepted_drafts) == out.draft_accepted
            assert 1 + sum(out.accepted) - out.truncated_tokens == len(out.tokens)
            assert out.draft_proposed == sum(out.drafted) and max(out.drafted) <= width
            accepted += out.accepted_drafts
    assert max(accepted) >= 1  # some drafts were accepted, so verification was exercised


def _samples(family: str, rule: str, runs: int = RUNS) -> list[tuple[int, ...]]:
    samples = []
    for seed in range(runs):
        sampling = Sampling(1.0, rule, torch.Generator().manual_seed(seed))
        out = _decode(family, TOYS[family](), TOY_PROMPT, "pld", 3, LENGTH, sampling)
        samples.append(tuple(out.tokens))
    return samples


@pytest.fixture(scope="module")
def exact():
    return {"nemotron": exact_ar_distribution(ToyLTRModel()), "sdar": exact_ar_distribution(ToySDAR()),
            "setdlm": exact_ltr_distribution(ToySetModel())}  # fmt: skip


@pytest.mark.parametrize(("family", "rule"), [("nemotron", "rejection"), ("nemotron", "match"),
                                              ("sdar", "rejection"), ("setdlm", "rejection")])  # fmt: skip
def test_sampled_pld_preserves_the_ar_distribution(exact, family, rule):
    assert chi_square_p(_samples(family, rule), exact[family]) > LEVEL


def test_pld_drafts_at_t1_are_accepted_sometimes_and_rejected_sometimes():
    accepted, drafted = [], []
    for seed in range(300):
        sampling = Sampling(1.0, "rejection", torch.Generator().manual_seed(seed))
        out = _decode("nemotron", ToyLTRModel(), TOY_PROMPT, "pld", 3, LENGTH, sampling)
        accepted += out.accepted_drafts
        drafted += out.drafted
    assert sum(accepted) > 0 and sum(accepted) < sum(drafted)


def test_a_verifier_that_accepts_every_draft_fails_the_same_test(exact, monkeypatch):
    monkeypatch.setattr(pld_module, "verify", accept_every_draft)
    assert chi_square_p(_samples("nemotron", "rejection", runs=CONTROL_RUNS), exact["nemotron"]) < LEVEL


# ------------------------------------------------------------------ batched, sampled and static paths
NEMOTRON, SETDLM = FAMILIES["nemotron"], FAMILIES["setdlm"]


@pytest.mark.parametrize("concurrency", [3, 16])
def test_batched_pld_equals_one_at_a_time(tiny, tiny_set, concurrency):
    pairs = batching._pairs(concurrency)
    ltr = batching._requests(NEMOTRON.decoders, lambda cap, key: LTRSettings("pld", 4, cap, (2,), GREEDY), pairs)
    alone, _ = batching._check(tiny, ltr, concurrency)
    assert sum(out.draft_accepted for out in alone.values()) > 0  # the repeating prompts' drafts
    settings = lambda cap, key: AnyOrderSettings("pld", 4, cap, (2,), GREEDY, order="ltr")  # noqa: E731
    batching._check(tiny_set, batching._requests(SETDLM.decoders, settings, pairs), concurrency)


@pytest.mark.parametrize("rule", ["rejection", "match"])
def test_sampled_batched_pld_draws_each_requests_own_samples(tiny, rule):
    settings = lambda cap, key: LTRSettings("pld", 4, cap, (2,), batching._sampling(1.0, rule, key))  # noqa: E731
    alone, _ = batching._check(tiny, batching._requests(NEMOTRON.decoders, settings, batching._pairs(3)), 3)
    greedy = batching._requests(NEMOTRON.decoders, lambda cap, key: LTRSettings("pld", 4, cap, (2,), GREEDY),
                                batching._pairs(3))  # fmt: skip
    assert any(run_alone(r.start(tiny)).tokens != alone[r.key].tokens for r in greedy)  # they did sample


def test_the_batched_rejection_of_lookup_drafts_is_each_requests_verify_lookup():
    """verify_lookup's batched form (the point mass of every request's drafts in one scatter, one
    rejection test for all) gives each request what verify_lookup gives it alone, from its own
    generator, also beside requests without a draft."""
    from packedss.decoding.batched_ops import BATCHED
    from packedss.decoding.rows import Rows

    source = torch.Generator().manual_seed(3)
    counts = [4, 0, 2, 4, 1, 3]
    logits = torch.randn(sum(c + 1 for c in counts), 48, generator=source) * 2
    drafts, rows, start = [], [], 0
    for k, count in enumerate(counts):
        verifier = logits[start : start + count + 1]
        # Half the drafts the verifier's own argmax (accepted often), half random tokens.
        draft = verifier[:count].argmax(dim=-1) if k % 2 else torch.randint(0, 48, (count,), generator=source)
        drafts.append(draft)
        rows.append(Rows(logits, start, start + count + 1))
        start += count + 1
    for trial in range(30):
        seeds = [1000 * trial + k for k in range(len(counts))]
        alone = [pld_module.verify_lookup(row.tensor(), draft, batching._sampling(1.0, "rejection", seed))
                 for row, draft, seed in zip(rows, drafts, seeds)]  # fmt: skip
        args = [(row, draft, batching._sampling(1.0, "rejection", seed)) for row, draft, seed in zip(rows, drafts, seeds)]
        read, finish = BATCHED[pld_module.verify_lookup](args, torch.device("cpu"))
        together = finish(read.tolist())
        assert [list(out) for out in together] == [list(out) for out in alone]
        assert [out.last.tensor().tolist() for out in together] == [out.last.tolist() for out in alone]


def test_sampled_batched_pld_by_rejection_verifies_every_request_at_once(tiny, monkeypatch):
    """At T = 1 by rejection, 16 requests' lookup drafts are verified in one batched step per
    round, and each request's output still equals its output alone."""
    from packedss.decoding import batched_ops

    sizes = []
    batched = batched_ops.BATCHED[pld_module.verify_lookup]
    spy = lambda args, device: sizes.append(len(args)) or batched(args, device)  # noqa: E731
    monkeypatch.setitem(batched_ops.BATCHED, pld_module.verify_lookup, spy)
    settings = lambda cap, key: LTRSettings("pld", 4, cap, (2,), batching._sampling(1.0, "rejection", key))  # noqa: E731
    alone, _ = batching._check(tiny, batching._requests(NEMOTRON.decoders, settings, batching._pairs(16)), 16)
    assert max(sizes) > 8
    assert sum(out.draft_accepted for out in alone.values()) > 0


@pytest.mark.parametrize("family", ["nemotron", "setdlm"])
def test_pld_on_the_static_path_equals_eager(family):
    name = {"nemotron": "tiny", "setdlm": "tiny-set"}[family]
    path = PROJECT_ROOT / "assets" / "models" / name
    eager = FAMILIES[family].load_adapter(path, torch.device("cpu"), "float64")
    prompts, cap, width = [[5, 9, 11, 30, 7], [7, 7, 7, 7, 7], [100, 5, 100, 5, 100, 5]], 24, 4
    largest = FAMILIES[family].schedule("pld").largest_call_rows(width)
    static = enable_static(FAMILIES[family].load_adapter(path, torch.device("cpu"), "float64"), "default",
                           static_capacity(max(map(len, prompts)), cap, largest))  # fmt: skip
    end_warmup(static)
    for prompt in prompts:
        a = _decode(family, eager, prompt, "pld", width, cap, GREEDY)
        b = _decode(family, static, prompt, "pld", width, cap, GREEDY)
        assert (b.tokens, b.rows_evaluated) == (a.tokens, a.rows_evaluated)
        assert max(b.rows_evaluated[1:]) <= largest



def test_pld_on_a_set_model_needs_the_left_to_right_order():
    with pytest.raises(PackedSSError, match="order=ltr"):
        SETDLM.settings_fields("pld", {"order": "confidence"}, 16)
    assert SETDLM.settings_fields("pld", {"order": None}, 16) == {"order": "ltr", "max_ngram": 2}


# ------------------------------------------------------------------ max_ngram, the longest n-gram looked up
class LaterPeriodToy(PeriodicToy):
    PERIOD = 6

    def ar_logits(self, prefix: tuple[int, ...]) -> torch.Tensor:  # the prompt's early rows decide nothing
        return super().ar_logits(prefix) if len(prefix) >= self.PERIOD else torch.zeros(self.vocab, dtype=torch.float64)


def test_max_ngram_picks_which_match_drafts_on_the_decode_path():
    # Context [1 6 2 1 5 2] + the prefill's 1: its last 2-gram (2, 1) first occurs at 2, which drafts
    # 5 2 1 (up to the context's end); its last 1-gram (1) at 0, which drafts 6 2 1 5 2. The model
    # repeats the token 6 places back: 6 2 1 5 2 1 ..., so only n = 1's draft is accepted.
    prompt, nemotron = [1, 6, 2, 1, 5, 2], FAMILIES["nemotron"]
    runs = {n: nemotron.decode(LaterPeriodToy(), prompt, LTRSettings("pld", 5, 12, (), GREEDY, max_ngram=n))
            for n in (1, 2, 3)}  # fmt: skip
    ar = nemotron.decode(LaterPeriodToy(), prompt, LTRSettings("ar", 5, 12, (), GREEDY))
    assert ar.tokens == [1, 6, 2, 1, 5, 2] * 2
    assert all(out.tokens == ar.tokens for out in runs.values())
    assert (runs[1].drafted[0], runs[1].accepted_drafts[0]) == (5, 5)
    assert (runs[2].drafted[0], runs[2].accepted_drafts[0]) == (3, 0)
    assert runs[3].drafted == runs[2].drafted  # no 3-gram matches: n = 3 falls back to n = 2's match


@pytest.mark.parametrize("family", list(TOYS))
def test_every_family_reads_max_ngram_from_its_settings(family):
    rng, differs = random.Random(3), 0
    for _ in range(16):
        prompt = [rng.randrange(1, 6) for _ in range(rng.randrange(6, 14))]
        ar = _decode(family, TOYS[family](), prompt, "ar", 4, 16, GREEDY).tokens
        runs = [_decode(family, TOYS[family](), prompt, "pld", 4, 16, GREEDY, max_ngram=n) for n in (1, 2)]
        assert all(out.tokens == ar for out in runs)
        differs += runs[0].drafted != runs[1].drafted or runs[0].accepted_drafts != runs[1].accepted_drafts
    assert differs > 0  # n = 1 and n = 2 drafted differently on some prompt


def test_max_ngram_below_one_is_refused_before_the_first_call():
    with pytest.raises(ValueError, match="max_ngram must be >= 1"):
        _decode("nemotron", ToyLTRModel(), [1, 2, 3], "pld", 4, 8, GREEDY, max_ngram=0)


def test_only_pld_settings_carry_max_ngram():
    sdar = FAMILIES["sdar"]
    assert NEMOTRON.settings_fields("pld", {"max_ngram": 3}, None) == {"pad_verify": True, "max_ngram": 3}
    assert sdar.settings_fields("pld", {"max_ngram": None}, None) == {"pad_verify": True, "max_ngram": 2}
    assert NEMOTRON.settings_fields("packed", {"max_ngram": 3}, None) == {"pad_verify": True}
    assert SETDLM.settings_fields("linear", {"max_ngram": 3}, 16) == {"order": "ltr"}


# ------------------------------------------------------------------ the shipped tiny models (float32)
TINY_MODELS = {"tiny": "nemotron", "tiny-set": "setdlm", "tiny-sdar": "sdar"}


def _prompts(tokenizer, cap_answers) -> list[list[int]]:
    """The first arith questions and, when Spec-Bench's file is at hand, one question of each of
    its categories, second turns holding an answer as the runner gives them."""
    from packedss.tasks import load_task, load_task_config
    from packedss.tasks.prompts import encode_prompt
    from packedss.tasks.specbench import SHARED_DATA
    from packedss.tasks.turns import ready_turns

    arith = load_task(load_task_config("arith"))
    prompts = [encode_prompt(tokenizer, arith.build_prompt(q), chat=False) for q in arith.questions(12)]
    if (SHARED_DATA / "spec_bench_question.jsonl").is_file():
        spec = load_task(load_task_config("specbench", per_category=1))
        questions = spec.questions(None)
        ready, _ = ready_turns(questions, lambda: dict.fromkeys((q.question_id for q in questions), cap_answers), 1)
        prompts += [encode_prompt(tokenizer, spec.build_prompt(q), chat=False)[-200:] for q in ready]
    return prompts


@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_pld_equals_ar_on_the_tiny_models_in_float32(name):
    from transformers import AutoTokenizer

    family, path = TINY_MODELS[name], PROJECT_ROOT / "assets" / "models" / name
    model = FAMILIES[family].load_adapter(path, torch.device("cpu"), "float32")
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    drafted = 0
    for prompt in _prompts(tokenizer, " 12 apples and 3 boxes. 12 apples"):
        eos = tuple(model.eos_token_ids)
        settings = {s: (AnyOrderSettings(s, 8, 16, eos, GREEDY, order="ltr") if family == "setdlm"
                        else LTRSettings(s, 8, 16, eos, GREEDY)) for s in ("ar", "pld")}  # fmt: skip
        ar, pld = (FAMILIES[family].decode(model, prompt, settings[s]) for s in ("ar", "pld"))
        assert pld.tokens == ar.tokens and pld.finish_reason == ar.finish_reason
        drafted += pld.draft_proposed
    assert drafted > 0


def test_the_audit_pairs_a_pld_run_with_the_ar_run_that_reads_no_max_ngram():
    import pandas as pd

    from packedss.analysis import audit

    pld = {"model": "m", "task": "t", "schedule": "pld", "width": 4, "temperature": 0.0, "verify": "", "order": "",
           "seed": 0, "family": "nemotron", "lora": False, "pad_verify": "", "native_window": 0, "concurrency": 1,
           "config": "", "lossy": False, "question_id": "q", "sample": 0, "dtype": "float32", "max_ngram": 2,
           "output_ids": [1], "near_ties": []}  # fmt: skip
    ar = pld | {"schedule": "ar", "width": 0, "max_ngram": 0, "output_ids": [2]}  # absent from its record: 0, as load reads it
    assert list(audit.audit(pd.DataFrame([pld, ar]))["audit"]) == ["unexplained"]
