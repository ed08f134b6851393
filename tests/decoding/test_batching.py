"""Concurrency C: batched decoding (packedss.decoding.engine over packedss.models.batched) equals
unbatched decoding token for token in float32, for every schedule of both families, greedy and at
T = 1; requests never see each other; the batch's time is shared and its clock is the job's."""

from __future__ import annotations

import time

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling
from packedss.decoding.anyorder import ANYORDER_DECODERS, AnyOrderSettings
from packedss.decoding.calls import block_segment, causal_segment, layout_of, pack
from packedss.decoding.driver import Response, run_alone, schedule_named
from packedss.decoding.engine import CallBatch, Entry, Request, decode_batched
from packedss.decoding.schedules import LTR_DECODERS
from packedss.models.batched import BatchedCalls
from tests.toy_ltr import ToyLTRModel

GREEDY = Sampling(0.0, "rejection", None)
# Prompts of different lengths and output caps of different sizes, so that requests finish at
# different times and later ones join batches in progress.
PROMPTS = [[5, 17, 33, 8, 91, 12, 7], [9, 4], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 3 + 8], [61, 62, 63],
           [7, 7, 7, 7, 7], [100, 5, 100, 5, 100, 5, 100, 5]]  # fmt: skip
CAPS = [30, 12, 22, 5, 17, 9]
# C = 16 needs more requests than slots: 20 of them, from the same prompts and caps, rotated.
MANY = [(PROMPTS[k % 6][k % 3 :] + [k + 20], CAPS[(k + k // 6) % 6]) for k in range(20)]


def _sampling(temperature: float, rule: str, key: int) -> Sampling:
    """Each request's own generator, seeded by the request: the same stream alone and batched."""
    if temperature == 0:
        return GREEDY
    return Sampling(temperature, rule, torch.Generator().manual_seed(1000 + key))


def _requests(decoders, settings_for, pairs):
    def start(model, key):
        prompt, cap = pairs[key]
        settings = settings_for(cap, key)
        return Response(model, prompt, settings, None, schedule_named(decoders, settings.schedule))

    return [Request(k, lambda model, k=k: start(model, k)) for k in range(len(pairs))]


def _batched(model, requests, concurrency):
    return {request.key: out for request, out in decode_batched(BatchedCalls(model, concurrency), requests, concurrency)}


def _same_decode(alone, together):
    assert together.tokens == alone.tokens
    assert together.finish_reason == alone.finish_reason
    assert together.rows_evaluated == alone.rows_evaluated
    assert together.rows_useful == alone.rows_useful
    assert together.accepted == alone.accepted
    assert together.nfe_total == alone.nfe_total
    # A batched call's logits equal a lone call's up to float32 rounding: near-ties at the same
    # outputs, their margins within it.
    ties, alone_ties = together.extra.get("near_ties"), alone.extra.get("near_ties")
    assert [i for i, _ in ties or []] == [i for i, _ in alone_ties or []]
    assert [m for _, m in ties or []] == pytest.approx([m for _, m in alone_ties or []], abs=1e-4)


def _check(model, requests, concurrency):
    alone = {request.key: run_alone(request.start(model)) for request in requests}
    together = _batched(model, requests, concurrency)
    assert sorted(together) == sorted(alone)
    for key in alone:
        _same_decode(alone[key], together[key])
        assert together[key].extra.get("resolved") == alone[key].extra.get("resolved")
    return alone, together


def _pairs(concurrency):
    return MANY if concurrency == 16 else list(zip(PROMPTS, CAPS))


@pytest.mark.parametrize("concurrency", [1, 3, 4, 16])
@pytest.mark.parametrize("schedule", [d.name for d in LTR_DECODERS])
def test_batched_ltr_decoding_equals_one_at_a_time(tiny, schedule, concurrency):
    requests = _requests(LTR_DECODERS, lambda cap, key: LTRSettings(schedule, 4, cap, (2,), GREEDY), _pairs(concurrency))
    alone, _ = _check(tiny, requests, concurrency)
    assert len({len(out.tokens) for out in alone.values()}) > 2  # they do finish at different times


@pytest.mark.parametrize("concurrency", [1, 3, 4, 16])
@pytest.mark.parametrize("order", ["ltr", "confidence"])
@pytest.mark.parametrize("schedule", [d.name for d in ANYORDER_DECODERS])
def test_batched_anyorder_decoding_equals_one_at_a_time(tiny_set, schedule, order, concurrency):
    settings = lambda cap, key: AnyOrderSettings(schedule, 4, cap, (2,), GREEDY, order=order)  # noqa: E731
    _check(tiny_set, _requests(ANYORDER_DECODERS, settings, _pairs(concurrency)), concurrency)


@pytest.mark.parametrize("concurrency", [3, 16])
@pytest.mark.parametrize("rule", ["rejection", "match"])
@pytest.mark.parametrize("schedule", [d.name for d in LTR_DECODERS])
def test_sampled_batched_ltr_decoding_draws_each_requests_own_samples(tiny, schedule, rule, concurrency):
    settings = lambda cap, key: LTRSettings(schedule, 4, cap, (2,), _sampling(1.0, rule, key))  # noqa: E731
    alone, _ = _check(tiny, _requests(LTR_DECODERS, settings, _pairs(concurrency)), concurrency)
    greedy = _requests(LTR_DECODERS, lambda cap, key: LTRSettings(schedule, 4, cap, (2,), GREEDY), _pairs(concurrency))
    assert any(run_alone(r.start(tiny)).tokens != alone[r.key].tokens for r in greedy)  # they did sample


@pytest.mark.parametrize("schedule", ["linear", "packed", "native"])
def test_sampled_batched_anyorder_decoding_draws_each_requests_own_samples(tiny_set, schedule):
    settings = lambda cap, key: AnyOrderSettings(schedule, 4, cap, (2,), _sampling(1.0, "rejection", key))  # noqa: E731
    _check(tiny_set, _requests(ANYORDER_DECODERS, settings, _pairs(3)), 3)


class _Recording(BatchedCalls):
    """BatchedCalls that keeps the slots of each batched call."""

    def __init__(self, model, slots):
        super().__init__(model, slots)
        self.batches: list[list[int]] = []

    def run(self, batch):
        self.batches.append([entry.slot for entry in batch.entries])
        return super().run(batch)


def test_requests_of_a_batch_join_and_leave_independently(tiny):
    """Continuous batching: a finished request's slot takes the next one in the next call, so a
    call carries fewer requests than slots only once the queue is empty."""
    requests = _requests(LTR_DECODERS, lambda cap, key: LTRSettings("packed", 4, cap, (2,), GREEDY), list(zip(PROMPTS, CAPS)))
    executor = _Recording(tiny, 2)
    finished = list(decode_batched(executor, requests, 2))
    by_key = {request.key: out for request, out in finished}
    assert [request.key for request, _ in finished][0] == 1  # its cap is smaller than request 0's
    sizes = [len(batch) for batch in executor.batches]
    assert sizes == sorted(sizes, reverse=True)  # never a part-empty call while requests wait
    assert sizes.count(1) < by_key[max(by_key, key=lambda k: by_key[k].nfe_total)].nfe_total
    # Request 2 took request 1's slot while request 0 still decoded: its prefill rode with it.
    assert by_key[2].call_requests[0] == 2
    assert executor.batches[by_key[1].nfe_total] == [0, 1]
    assert sum(out.nfe_total for out in by_key.values()) == sum(sizes)
    # Each call's rows over all its requests are at least the request's own.
    for out in by_key.values():
        assert all(batch >= own for batch, own in zip(out.call_batch_rows, out.rows_evaluated))


def _batch(calls):
    """A CallBatch of (slot, call) pairs."""
    entries, start = [], 0
    for slot, call in calls:
        entries.append(Entry(slot, layout_of(call), call.rows, call.read_from, start))
        start += call.rows
    return CallBatch(entries, torch.cat([c.tokens for _, c in calls]), torch.cat([c.positions for _, c in calls]))


def _two_calls(model, other_tokens):
    """Two requests, each on a cache of its own prompt, then one packed call of both."""
    batch = BatchedCalls(model, 2)
    prompts = [torch.tensor([5, 17, 33, 8, 91]), other_tokens]
    batch.run(_batch([(0, pack([causal_segment(prompts[0], 0)])), (1, pack([causal_segment(prompts[1], 0)]))]))
    batch.commit(0, 5)
    batch.commit(1, len(other_tokens))
    mask = model.mask_token_id
    first = pack([block_segment(torch.tensor([12, mask, mask, mask]), 5)])
    second = pack([causal_segment(torch.flip(other_tokens, [0])[:3], len(other_tokens))])
    return batch.run(_batch([(0, first), (1, second)]))[:4]


@pytest.mark.parametrize("loader", ["tiny", "tiny_set"])
def test_rows_of_different_requests_never_see_each_other(loader, request):
    model = request.getfixturevalue(loader)
    mine = _two_calls(model, torch.tensor([9, 4, 22, 61, 7, 30]))
    with_other_tokens = _two_calls(model, torch.tensor([60, 61, 62, 10, 11, 12]))
    assert torch.equal(mine, with_other_tokens)
    # And they are the logits of the call alone.
    alone = BatchedCalls(model, 1)
    alone.run(_batch([(0, pack([causal_segment(torch.tensor([5, 17, 33, 8, 91]), 0)]))]))
    alone.commit(0, 5)
    mask = model.mask_token_id
    single = alone.run(_batch([(0, pack([block_segment(torch.tensor([12, mask, mask, mask]), 5)]))]))
    torch.testing.assert_close(mine, single, rtol=1e-5, atol=1e-5)


class _ToyBatch:
    """A BatchExecutor over one toy model per slot, charged one second per batched call."""

    def __init__(self, slots: int, fail_at: int | None = None):
        self.models = [ToyLTRModel(vocab=8, seed=1) for _ in range(slots)]
        self.device = torch.device("cpu")
        self.mask_token_id = self.models[0].mask_token_id
        self.charged_s = 1.0
        self.calls: list[list[int]] = []
        self.resets: list[int] = []
        self.fail_at = fail_at

    def run(self, batch):
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise RuntimeError("the device fell over")
        self.calls.append([entry.slot for entry in batch.entries])
        return torch.cat([self.models[e.slot].run(batch.call(k)) for k, e in enumerate(batch.entries)])

    def commit(self, slot, rows):
        self.models[slot].commit(rows)

    def reset(self, slot):
        self.resets.append(slot)
        self.models[slot].reset()

    def call_stats(self, slot):
        return {}

    def synchronize(self):
        pass


def _toy_requests(count: int):
    pairs = [([1, 2, 3][: 1 + k % 3], 6 + 5 * k) for k in range(count)]
    return _requests(LTR_DECODERS, lambda cap, key: LTRSettings("packed", 3, cap, (), GREEDY), pairs)


def test_a_batched_call_is_shared_by_rows_and_latency_runs_on_the_job_clock():
    executor = _ToyBatch(3)
    finished = dict((request.key, out) for request, out in decode_batched(executor, _toy_requests(5), 3))
    # Every batched call is charged 1 s, split among its requests by their rows.
    for out in finished.values():
        assert out.model_s == pytest.approx(sum(out.call_model_s))
        for share, own, total in zip(out.call_model_s, out.rows_evaluated, out.call_batch_rows):
            assert share == pytest.approx(own / total)
    assert sum(out.model_s for out in finished.values()) == pytest.approx(len(executor.calls), rel=1e-6)
    # The job's clock advances by the charged second per call (plus host work), so a request's
    # latency spans its calls' batches; its wall time holds only its shares.
    for out in finished.values():
        assert out.nfe_total <= out.latency_s + 1e-9
        assert out.latency_s < len(executor.calls) + 0.5
        assert out.wall_s == pytest.approx(out.model_s + out.nonmodel_s)
        assert 0 < out.nonmodel_s < 0.5
    longest = max(finished.values(), key=lambda out: out.nfe_total)
    assert longest.latency_s > longest.model_s + 1  # it waited on other requests' shares too


def test_the_requests_wall_times_add_up_to_the_batchs_time():
    """Each batched call's charged second is shared by rows and the host time between calls among
    the requests that worked in it: the wall times add up to the calls' charge plus host time."""
    executor = _ToyBatch(3)
    started = time.perf_counter()
    finished = [out for _, out in decode_batched(executor, _toy_requests(5), 3)]
    elapsed = time.perf_counter() - started
    host = sum(out.nonmodel_s for out in finished)
    assert sum(out.wall_s for out in finished) == pytest.approx(len(executor.calls) + host)
    assert 0 < host < elapsed


@pytest.mark.parametrize("lockstep", [False, True])
def test_an_error_in_one_request_ends_the_batch_and_drops_every_slots_cache(lockstep):
    executor = _ToyBatch(3, fail_at=4)
    with pytest.raises(RuntimeError, match="fell over"):
        list(decode_batched(executor, _toy_requests(5), 3, lockstep))
    assert sorted(executor.resets[-3:]) == [0, 1, 2]  # the three unfinished requests' coroutines closed


@pytest.mark.parametrize("lockstep", [False, True])
def test_closing_the_batch_early_drops_the_unfinished_requests_caches(lockstep):
    executor = _ToyBatch(3)
    batches = decode_batched(executor, _toy_requests(5), 3, lockstep)
    request, _ = next(batches)  # the first to finish (its slot is refilled once the caller is back)
    before = len(executor.resets)
    batches.close()
    assert sorted(executor.resets[before:]) == sorted({0, 1, 2} - {request.key})  # the two still decoding


def test_a_decoder_error_is_raised_in_the_callers_thread():
    bad = Request("empty", lambda model: Response(model, [], LTRSettings("packed", 3, 5, (), GREEDY), None,
                                                  schedule_named(LTR_DECODERS, "packed")))  # fmt: skip
    with pytest.raises(ValueError, match="at least one token"):
        list(decode_batched(_ToyBatch(2), [*_toy_requests(1), bad], 2))


def test_a_batched_call_runs_the_head_once_over_every_requests_read_rows(tiny):
    """The head (vocabulary x hidden, the largest weight) is read once per batched call, not once
    per request."""
    batch = BatchedCalls(tiny, 3)
    heads = []
    hook = tiny.head.register_forward_hook(lambda module, inputs, output: heads.append(inputs[0].shape[0]))
    try:
        logits = batch.run(_batch([(slot, pack([causal_segment(torch.tensor([5, 17, 33][: slot + 1]), 0)]))
                                   for slot in range(3)]))  # fmt: skip
    finally:
        hook.remove()
    assert heads == [1 + 2 + 3]
    assert logits.shape[0] == 1 + 2 + 3


@pytest.mark.parametrize("schedule", ["ar", "linear", "packed", "quadratic"])
def test_batched_near_ties_are_the_ones_of_one_at_a_time(tiny, schedule, monkeypatch):
    from packedss.decoding import verify as verify_module

    monkeypatch.setattr(verify_module, "NEAR_TIE_ULPS", 1e30)  # every deciding row is a near-tie
    requests = _requests(LTR_DECODERS, lambda cap, key: LTRSettings(schedule, 4, cap, (2,), GREEDY), _pairs(3))
    alone, together = _check(tiny, requests, 3)
    for key, out in alone.items():
        assert len(out.extra["near_ties"]) == len(out.tokens)  # one per output token, its margin each


def test_a_round_mixing_listed_and_planned_calls_gives_each_request_its_own_rows():
    """Calls built from host ids (the any-order family's Listed) and from tensor parts (the LTR
    family's Planned) in one batch: each request decodes as alone."""
    from packedss.decoding.anyorder import ANYORDER_DECODERS, AnyOrderSettings

    pairs = [([1, 2, 3][: 1 + k % 3], 6 + 5 * k) for k in range(6)]
    ltr = _requests(LTR_DECODERS, lambda cap, key: LTRSettings("packed", 3, cap, (), GREEDY), pairs[:3])
    anyorder = _requests(ANYORDER_DECODERS, lambda cap, key: AnyOrderSettings("packed", 3, cap, (), GREEDY), pairs[3:])
    requests = [Request(("ltr", r.key), r.start) for r in ltr] + [Request(("set", r.key), r.start) for r in anyorder]
    alone = {request.key: run_alone(request.start(ToyLTRModel(vocab=8, seed=1))) for request in requests}
    together = dict((request.key, out) for request, out in decode_batched(_ToyBatch(6), requests, 6))
    for key, out in alone.items():
        assert together[key].tokens == out.tokens and together[key].rows_evaluated == out.rows_evaluated
