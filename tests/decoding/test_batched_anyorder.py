"""The any-order family's batched host steps (packedss.decoding.batched_anyorder): for every
request of a wave they give what `set_round` gives each alone (tokens, q rows, confidences to the
bit, accepted prefixes, near-tie margins), and batched decoding equals decoding alone at T = 1 for
every schedule in both orders at C = 16 and 64, each request on its own random stream."""

from __future__ import annotations

import pytest
import torch

from packedss.decoding.anyorder import ANYORDER_DECODERS, AnyOrderSettings
from packedss.decoding.batched_anyorder import Propose, Verify, runs_of, set_round
from packedss.decoding.batched_ops import BATCHED
from packedss.decoding.rows import Rows
from packedss.decoding.verify import DecidedMargins, Sampling
from tests.decoding.test_batching import MANY, _check, _requests
from tests.decoding.test_batching_wide import PAIRS

ORDERS = ["ltr", "confidence"]
# The record fields a batched decode must give as alone (besides _check's): the costs and counts.
COUNTED = ("prompt_tokens", "nfe_prefill", "iterations", "drafted", "accepted_drafts", "draft_proposed",
           "draft_accepted", "truncated_tokens")  # fmt: skip


def _check_records(model, requests, concurrency):
    """`_check`, and every counted field and family field of each record (near-ties aside, whose
    margins agree to float32's rounding: `_check`'s) equal to its decode alone."""
    alone, together = _check(model, requests, concurrency)
    for key, out in alone.items():
        assert [getattr(together[key], name) for name in COUNTED] == [getattr(out, name) for name in COUNTED]
        family = {name: value for name, value in out.extra.items() if name != "near_ties"}
        assert {name: value for name, value in together[key].extra.items() if name != "near_ties"} == family
    return alone, together


def _parts(generator: torch.Generator, rows: int, vocabulary: int, sampled: bool) -> tuple:
    """A request's parts on `rows` rows of logits: a verification whose rows are runs (some
    strided, the last sometimes twice) and proposals, one of them confident and deciding."""
    m = int(torch.randint(0, 4, (), generator=generator))
    picks = sorted(torch.randperm(rows - 3, generator=generator)[: m + 1].tolist())
    if m and int(torch.randint(0, 2, (), generator=generator)):
        picks = picks[:m] + picks[m - 1 : m]  # every position drafted: the last query twice
    drafts = torch.randint(0, vocabulary, (m,), generator=generator)
    q = torch.softmax(torch.randn(m, vocabulary, generator=generator, dtype=torch.float64), -1) if sampled else None
    return (Verify(runs_of(picks), drafts, drafts.tolist(), q),
            Propose((range(rows - 3, rows - 1),), confident=True, decides=True), Propose((range(rows - 1, rows),)))  # fmt: skip


def _wave(seed: int, sampling_of, dtype: torch.dtype):
    """Eight requests' parts on one round's logits (few distinct values: ties), as Rows."""
    generator = torch.Generator().manual_seed(seed)
    counts = [int(torch.randint(8, 14, (), generator=generator)) for _ in range(8)]
    logits = (torch.randn(sum(counts), 40, generator=generator) * 2).round().to(dtype)
    # A verification that accepts: a draft equal to its row's argmax.
    starts = [sum(counts[:k]) for k in range(8)]
    args = []
    for k, (start, count) in enumerate(zip(starts, counts)):
        sampling = sampling_of(k)
        parts = _parts(generator, count, 40, not sampling.greedy)
        verify_part = parts[0]
        if k % 2 and verify_part.tokens:
            first = verify_part.runs[0].start
            verify_part.drafts[0] = logits[start + first].argmax()
            parts = (verify_part._replace(tokens=verify_part.drafts.tolist()), *parts[1:])
        args.append((Rows(logits, start, start + count), parts, sampling))
    return args


def _batched(args):
    read, finish = BATCHED[set_round](args, torch.device("cpu"))
    return finish(read.tolist())


def _same_result(together, alone):
    if isinstance(alone, list):  # an Emitted
        assert list(together) == list(alone)
        if alone.deciding is not None:
            assert isinstance(together.deciding, DecidedMargins)
            top2 = alone.deciding[: len(alone)].topk(2, dim=-1).values.float()
            assert together.deciding.margins.tensor().tolist() == (top2[:, 0] - top2[:, 1]).tolist()
        return
    assert together.tokens == alone.tokens
    assert together.confidence == alone.confidence  # to the bit, as floats
    if alone.probs is not None:
        assert torch.equal(together.probs, alone.probs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("temperature, rule", [(0.0, "rejection"), (1.0, "rejection"), (1.0, "match"), (0.7, "match")])
def test_a_batched_wave_gives_each_request_what_it_gets_alone(temperature, rule, dtype):
    for seed in range(6):
        def sampling_of(k, seed=seed):
            return Sampling(temperature, rule, torch.Generator().manual_seed(100 * seed + k))

        together = _batched(_wave(seed, sampling_of, dtype))
        # Alone, on fresh generators seeded the same: the same draws in the same order.
        for (logits, parts, sampling), results in zip(_wave(seed, sampling_of, dtype), together):
            alone = set_round(logits.tensor(), parts, sampling)
            assert len(results) == len(alone)
            for got, want in zip(results, alone):
                _same_result(got, want)


def test_each_requests_draws_come_from_its_own_stream_and_advance_it():
    """A batched wave draws from each request's generator what alone it draws, and leaves every
    generator where alone it would be (the next round draws on)."""
    generators = [torch.Generator().manual_seed(7 + k) for k in range(8)]
    args = _wave(3, lambda k: Sampling(1.0, "rejection", generators[k]), torch.float32)
    _batched(args)
    alone = [torch.Generator().manual_seed(7 + k) for k in range(8)]
    for (logits, parts, _), generator in zip(_wave(3, lambda k: Sampling(1.0, "rejection", alone[k]), torch.float32), alone):
        set_round(logits.tensor(), parts, Sampling(1.0, "rejection", generator))
    assert [g.get_state().tolist() for g in generators] == [g.get_state().tolist() for g in alone]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("schedule", [d.name for d in ANYORDER_DECODERS])
def test_16_sampled_batched_anyorder_requests_equal_one_at_a_time(tiny_set, schedule, order):
    rule = "match" if schedule == "quadratic" else "rejection"

    def settings(cap, key):
        return AnyOrderSettings(schedule, 4, cap, (2,), Sampling(1.0, rule, torch.Generator().manual_seed(300 + key)),
                                order=order)  # fmt: skip

    _check_records(tiny_set, _requests(ANYORDER_DECODERS, settings, MANY), 16)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("schedule", ["ar", "linear", "packed", "quadratic"])
def test_64_batched_anyorder_requests_in_the_other_order_equal_one_at_a_time(tiny_set, schedule, temperature):
    """The order test_batching_wide does not run each schedule in, at C = 64."""
    order = "ltr" if schedule in ("linear", "packed") else "confidence"

    def settings(cap, key):
        return AnyOrderSettings(schedule, 4, cap, (2,), Sampling(temperature, "rejection", torch.Generator().manual_seed(key)),
                                order=order)  # fmt: skip

    _check_records(tiny_set, _requests(ANYORDER_DECODERS, settings, PAIRS), 64)


@pytest.mark.parametrize("schedule, order", [("packed", "confidence"), ("linear", "confidence"), ("quadratic", "ltr")])
def test_a_greedy_anyorder_round_reads_back_once_per_wave(tiny_set, schedule, order, monkeypatch):
    """At T = 0 a wave of every request's set_round reads back once (tokens, near-tie flags and a
    block's confidences together); beyond that a response reads only its near-ties, when it ends.
    As coroutines: greedy Packed-SS steps as a set lane otherwise (test_set_lockstep.py)."""
    from packedss.decoding.engine import decode_batched
    from packedss.models.batched import BatchedCalls
    from tests.decoding.test_syncs import counting_read_backs

    settings = lambda cap, key: AnyOrderSettings(schedule, 4, cap, (2,), Sampling(0.0, "rejection", None), order=order)  # noqa: E731
    executor = BatchedCalls(tiny_set, 4)
    list(decode_batched(executor, _requests(ANYORDER_DECODERS, settings, MANY[:8]), 4, lockstep=False))  # layouts built once
    waves = []
    launch = BATCHED[set_round]
    monkeypatch.setitem(BATCHED, set_round, lambda args, device: waves.append(len(args)) or launch(args, device))
    with counting_read_backs(monkeypatch) as counts:
        finished = list(decode_batched(executor, _requests(ANYORDER_DECODERS, settings, MANY[:8]), 4, lockstep=False))
    assert len(counts) <= len(waves) + len(finished), (counts, waves)
    assert sum(waves) > 2 * len(waves)  # the waves did carry several requests


@pytest.mark.parametrize("schedule, order", [("packed", "confidence"), ("linear", "ltr"), ("quadratic", "confidence")])
def test_a_round_of_anyorder_calls_is_one_copy_to_the_device(tiny_set, schedule, order, monkeypatch):
    """Every request's call of a round (Listed: host ids) is copied to the device in one copy, and
    each request's rows of the batch hold its tokens and positions, as its call alone builds them."""
    from packedss.decoding import engine
    from packedss.decoding.calls import Listed
    from packedss.models.batched import BatchedCalls

    settings = lambda cap, key: AnyOrderSettings(schedule, 4, cap, (2,), Sampling(0.0, "rejection", None), order=order)  # noqa: E731
    copies, rounds = [], []
    copy, make = engine.uploaded, engine._Engine.batch

    def batch(self, slots):
        calls = [slot.op for slot in slots]
        made = make(self, slots)
        rounds.append(len(calls))
        for entry, call in zip(made.entries, calls):
            alone = Listed(call.layout, call.ids, call.read_from).build()
            rows = slice(entry.start, entry.start + entry.rows)
            assert made.tokens[rows].tolist() == alone.tokens.tolist()
            assert made.positions[rows].tolist() == alone.positions.tolist()
            assert call.uploaded.tensor().tolist() == alone.tokens.tolist()  # the drafts' rows
        return made

    monkeypatch.setattr(engine, "uploaded", lambda values, device: copies.append(len(values)) or copy(values, device))
    monkeypatch.setattr(engine._Engine, "batch", batch)
    finished = list(engine.decode_batched(BatchedCalls(tiny_set, 4), _requests(ANYORDER_DECODERS, settings, MANY[:8]), 4))
    assert len(finished) == 8
    assert len(copies) == len(rounds) and max(rounds) > 1, (copies, rounds)
