"""Greedy AR, Linear-SS and Packed-SS of the any-order (set) family as lanes
(packedss.decoding.set_lockstep): every record equals the coroutine engine's field by field (times
aside) in both verification orders at C = 1, 4, 16 and 64, with EOS, a stop that cuts, every
deciding row a near-tie, and every confidence equal; lanes run none of the coroutines' host steps
and read back once a round; lanes and coroutines share rounds; Quadratic-SS, native and T > 0
stay coroutines."""

from __future__ import annotations

import pytest
import torch

from packedss.decoding import Sampling
from packedss.decoding import verify as verify_module
from packedss.decoding.anyorder import ANYORDER_DECODERS, AnyOrderSettings
from packedss.decoding.driver import Response, run_alone, schedule_named
from packedss.decoding.engine import Request, decode_batched
from packedss.decoding.schedules import LTR_DECODERS
from packedss.decoding.set_lockstep import set_steps_in_lockstep
from packedss.models.batched import BatchedCalls
from tests.decoding.test_batching import CAPS, GREEDY, MANY, PROMPTS, _same_decode
from tests.decoding.test_lockstep import WIDE, _cut_at_nine, _fields, _records, refuse_host_steps
from tests.decoding.test_syncs import counting_read_backs


def _requests(order: str, pairs, schedules=("packed",)):
    def start(model, key):
        prompt, cap = pairs[key]
        schedule = schedules[key % len(schedules)]
        settings = AnyOrderSettings(schedule, 4, cap, (2,), GREEDY, order=order)
        return Response(model, prompt, settings, _cut_at_nine if key % 2 else None, schedule_named(ANYORDER_DECODERS, schedule))

    return [Request(k, lambda model, k=k: start(model, k)) for k in range(len(pairs))]


# Every deciding row a near-tie at two concurrencies: their flags and margins are read per lane.
@pytest.mark.parametrize("concurrency, every_row_a_near_tie", [(1, False), (4, False), (16, False), (64, False), (4, True),
                                                                (64, True)])  # fmt: skip
@pytest.mark.parametrize("order", ["ltr", "confidence"])
@pytest.mark.parametrize("schedule", ["ar", "linear", "packed"])
def test_set_lanes_give_the_coroutines_records(tiny_set, schedule, order, concurrency, every_row_a_near_tie,
                                               monkeypatch):  # fmt: skip
    if every_row_a_near_tie:
        monkeypatch.setattr(verify_module, "NEAR_TIE_ULPS", 1e30)
    pairs = WIDE if concurrency == 64 else MANY if concurrency == 16 else list(zip(PROMPTS, CAPS))
    requests = _requests(order, pairs, (schedule,))
    lanes = _records(tiny_set, requests, concurrency, lockstep=True)
    coroutines = _records(tiny_set, requests, concurrency, lockstep=False)
    assert sorted(lanes) == sorted(coroutines) == list(range(len(pairs)))
    for key, out in coroutines.items():
        assert _fields(lanes[key]) == _fields(out), key
    assert {out.finish_reason for out in coroutines.values()} == {"stop", "max_tokens"}
    if schedule != "ar" or order == "confidence":  # left to right, AR emits a token a call: a stop cuts none it produced
        assert any(out.truncated_tokens for out in coroutines.values())
    # drafts were accepted and rejected, and (in confidence order) blocks started after the prefill
    if schedule != "ar":
        assert any(0 < sum(out.accepted_drafts) < sum(out.drafted) for out in coroutines.values())
    assert max(len(out.tokens) for out in coroutines.values()) > 2 * 4  # in confidence order, blocks of W = 4
    if every_row_a_near_tie:
        assert all(len(out.extra["near_ties"]) == len(out.tokens) for out in coroutines.values())
    if concurrency > 1:
        assert max(max(out.call_requests) for out in coroutines.values()) == concurrency


@pytest.mark.parametrize("schedule", ["ar", "linear", "packed"])
def test_blocks_of_equal_confidences_start_where_the_coroutines_do(tiny_set, schedule, monkeypatch):
    """Every confidence read as the same float: each block's first resolved position (the leftmost
    of the equally confident) and its frozen order are the coroutines'."""
    from packedss.decoding import batched_anyorder, lockstep

    def equal(bits, dtype):
        return [0.5] * len(bits)

    monkeypatch.setattr(batched_anyorder, "floats_of", equal)
    monkeypatch.setattr(lockstep, "floats_of", equal)
    requests = _requests("confidence", MANY, (schedule,))
    lanes = _records(tiny_set, requests, 4, lockstep=True)
    coroutines = _records(tiny_set, requests, 4, lockstep=False)
    for key, out in coroutines.items():
        assert _fields(lanes[key]) == _fields(out), key


@pytest.mark.parametrize("order", ["ltr", "confidence"])
@pytest.mark.parametrize("schedule", ["ar", "linear", "packed"])
def test_set_lanes_run_none_of_the_coroutines_host_steps(tiny_set, schedule, order, monkeypatch):
    """A greedy set-family AR, Linear-SS or Packed-SS request is a SetLane: the batched host step
    its coroutine would take never runs; the coroutine engine (lockstep=False) does take it."""
    refuse_host_steps(monkeypatch)
    requests = _requests(order, list(zip(PROMPTS, CAPS)), (schedule,))
    assert len(_records(tiny_set, requests, 3, lockstep=True)) == len(PROMPTS)
    with pytest.raises(AssertionError, match="host step ran"):
        _records(tiny_set, requests, 3, lockstep=False)


@pytest.mark.parametrize("order", ["ltr", "confidence"])
def test_a_round_of_set_lanes_reads_back_once(tiny_set, order, monkeypatch):
    """A round's tokens, near-tie flags and starting blocks' confidences come back in one read;
    beyond that a response reads only its near-ties, when it ends."""
    executor = BatchedCalls(tiny_set, 4)
    schedules = ("ar", "linear", "packed")
    list(decode_batched(executor, _requests(order, MANY[:8], schedules), 4))  # layouts built once
    calls = []
    run = executor.run
    executor.run = lambda batch: calls.append(batch) or run(batch)
    with counting_read_backs(monkeypatch) as counts:
        finished = list(decode_batched(executor, _requests(order, MANY[:8], schedules), 4))
    assert len(counts) <= len(calls) + len(finished), (counts, len(calls))
    assert len(calls) > len(finished)


@pytest.mark.parametrize("order", ["ltr", "confidence"])
def test_lanes_and_coroutines_in_one_round_each_give_its_output_alone(tiny_set, order):
    """Packed-SS, AR and Linear-SS lanes beside Quadratic-SS and native coroutines in the same rounds:
    every request's record equals its C = 1 record (its confidences and near-ties read with the
    coroutines' steps)."""
    requests = _requests(order, MANY, ("packed", "quadratic", "ar", "native", "linear"))
    alone = {request.key: run_alone(request.start(tiny_set)) for request in requests}
    together = _records(tiny_set, requests, 4, lockstep=True)
    for key, out in alone.items():
        _same_decode(out, together[key])
        assert {**together[key].extra, "near_ties": None} == {**out.extra, "near_ties": None}, key


def test_only_greedy_set_ar_linear_and_packed_step_as_set_lanes(tiny_set, tiny):
    """The set family's AR, Linear-SS and Packed-SS, greedy, in either order: not Quadratic-SS or
    native, not T > 0, not the LTR family's decoders."""

    def decoder(schedule, temperature, order="confidence", model=tiny_set, decoders=ANYORDER_DECODERS):
        settings = AnyOrderSettings(schedule, 4, 4, (2,), GREEDY if temperature == 0 else
                                    Sampling(temperature, "rejection", torch.Generator().manual_seed(0)), order=order)  # fmt: skip
        return Response(model, [5, 17, 33], settings, None, schedule_named(decoders, schedule)).decoder

    lanes = ["ar", "linear", "packed"]
    assert [d.name for d in ANYORDER_DECODERS if set_steps_in_lockstep(decoder(d.name, 0.0))] == lanes
    assert [d.name for d in ANYORDER_DECODERS if set_steps_in_lockstep(decoder(d.name, 0.0, "ltr"))] == lanes
    assert not any(set_steps_in_lockstep(decoder(s, 1.0, order)) for s in lanes for order in ("ltr", "confidence"))
    assert not any(set_steps_in_lockstep(decoder(d.name, 0.0, model=tiny, decoders=LTR_DECODERS)) for d in LTR_DECODERS)


def test_a_block_resolves_its_most_confident_position_first_and_the_leftmost_of_equals(tiny_set):
    """anyorder._SetDecoder.begin_block, which the coroutines and the lanes share: the keys are the
    confidences, the most confident proposal resolves, of equals the leftmost."""
    settings = AnyOrderSettings("packed", 4, 8, (2,), GREEDY, order="confidence")
    decoder = Response(tiny_set, [5, 17, 33], settings, None, schedule_named(ANYORDER_DECODERS, "packed")).decoder
    window = [4, 5, 6, 7]
    decoder.ran("prefill", 0, 4)  # resolve counts into the call's record
    decoder.begin_block(window, [40, 50, 60, 70], [0.2, 0.7, 0.1, 0.7], lambda k: None)
    assert decoder.keys == {4: 0.2, 5: 0.7, 6: 0.1, 7: 0.7}
    assert decoder.pending == [(5, 50)] and decoder.tokens == {5: 50}
