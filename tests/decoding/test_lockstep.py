"""Greedy AR, Linear-SS and Packed-SS as lanes (packedss.decoding.lockstep), of the Nemotron family
and of SDAR's: every record equals the coroutine engine's field by field (times aside) at C = 1, 4,
16 and 64, with EOS, a stop that cuts, Packed-SS with and without padding, and every deciding row a
near-tie; lanes run none of the coroutines' host steps, and every other schedule and T > 0 stays a
coroutine."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling, batched_ops
from packedss.decoding import verify as verify_module
from packedss.decoding.blockdiff import SDAR_DECODERS
from packedss.decoding.driver import Response, schedule_named
from packedss.decoding.engine import Request, decode_batched
from packedss.decoding.lockstep import steps_in_lockstep
from packedss.decoding.schedules import LTR_DECODERS
from packedss.models.batched import BatchedCalls
from tests.decoding.test_batching import CAPS, GREEDY, MANY, PROMPTS

DECODERS = {"nemotron": LTR_DECODERS, "sdar": SDAR_DECODERS}


TIMES = ("wall_s", "model_s", "nonmodel_s", "call_model_s", "latency_s")
# 64 requests for C = 64: the shared prompts and caps, rotated and lengthened.
WIDE = [(PROMPTS[k % 6][k % 4 :] + [k % 50 + 3, k % 7 + 9], 4 + (7 * k) % 29) for k in range(64)]


def _cut_at_nine(tokens, new):
    """A stop completed by the ninth output token: keep nine (a stop string's cut)."""
    return 9 if len(tokens) - new < 9 <= len(tokens) else None


def _requests(schedule: str, pad_verify: bool, pairs, temperature: float = 0.0, family: str = "nemotron"):
    decoder = schedule_named(DECODERS[family], schedule)

    def start(model, key):
        prompt, cap = pairs[key]
        sampling = GREEDY if temperature == 0 else Sampling(temperature, "rejection", torch.Generator().manual_seed(key))
        settings = LTRSettings(schedule, 4, cap, (2,), sampling, pad_verify=pad_verify)
        return Response(model, prompt, settings, _cut_at_nine if key % 2 else None, decoder)

    return [Request(k, lambda model, k=k: start(model, k)) for k in range(len(pairs))]


def refuse_host_steps(monkeypatch) -> None:
    """Every batched Host step (batched_ops.BATCHED) raises "a coroutine's host step ran"."""

    def refuse(args, device):
        raise AssertionError("a coroutine's host step ran")

    for function in list(batched_ops.BATCHED):
        monkeypatch.setitem(batched_ops.BATCHED, function, refuse)


def _records(model, requests, concurrency: int, lockstep: bool) -> dict:
    executor = BatchedCalls(model, concurrency)
    return {request.key: out for request, out in decode_batched(executor, requests, concurrency, lockstep=lockstep)}


def _fields(out) -> dict:
    fields = dataclasses.asdict(out)
    for name in TIMES:
        fields.pop(name)
    return fields


@pytest.mark.parametrize("every_row_a_near_tie", [False, True])
@pytest.mark.parametrize("concurrency", [1, 4, 16, 64])
@pytest.mark.parametrize("schedule, pad_verify", [("ar", True), ("linear", True), ("packed", True), ("packed", False)])
@pytest.mark.parametrize("family", list(DECODERS))
def test_lanes_give_the_coroutines_records(request, family, schedule, pad_verify, concurrency, every_row_a_near_tie,
                                           monkeypatch):  # fmt: skip
    if every_row_a_near_tie:
        monkeypatch.setattr(verify_module, "NEAR_TIE_ULPS", 1e30)
    model = request.getfixturevalue("tiny" if family == "nemotron" else "tiny_sdar")
    pairs = WIDE if concurrency == 64 else MANY if concurrency == 16 else list(zip(PROMPTS, CAPS))
    requests = _requests(schedule, pad_verify, pairs, family=family)
    lanes = _records(model, requests, concurrency, lockstep=True)
    coroutines = _records(model, requests, concurrency, lockstep=False)
    assert sorted(lanes) == sorted(coroutines) == list(range(len(pairs)))
    for key, out in coroutines.items():
        assert _fields(lanes[key]) == _fields(out), key
    reasons = {out.finish_reason for out in coroutines.values()}
    assert "stop" in reasons and "max_tokens" in reasons
    if schedule != "ar":  # AR emits one token a call: a stop never cuts any it produced
        assert any(out.truncated_tokens for out in coroutines.values())
    if every_row_a_near_tie:
        assert all(len(out.extra["near_ties"]) == len(out.tokens) for out in coroutines.values())
    if concurrency > 1:
        assert max(max(out.call_requests) for out in coroutines.values()) == concurrency


@pytest.mark.parametrize("schedule", ["ar", "linear", "packed"])
@pytest.mark.parametrize("family", list(DECODERS))
def test_lanes_run_none_of_the_coroutines_host_steps(request, family, schedule, monkeypatch):
    """A greedy AR, Linear-SS or Packed-SS request is a lane: the batched host steps its coroutine
    would take never run; the coroutine engine (lockstep=False) does take them."""
    refuse_host_steps(monkeypatch)
    model = request.getfixturevalue("tiny" if family == "nemotron" else "tiny_sdar")
    requests = _requests(schedule, True, list(zip(PROMPTS, CAPS)), family=family)
    assert len(_records(model, requests, 3, lockstep=True)) == len(PROMPTS)
    with pytest.raises(AssertionError, match="host step ran"):
        _records(model, requests, 3, lockstep=False)


def test_only_greedy_ar_linear_and_packed_decoders_step_in_lockstep(tiny, tiny_sdar):
    """Greedy AR, Linear-SS and Packed-SS of the Nemotron family and of SDAR's only: not
    Quadratic-SS, not T > 0, not SDAR's block-diffusion schedules."""

    def decoder(schedule, temperature, family="nemotron"):
        request = _requests(schedule, True, [([5, 17, 33], 4)], temperature, family)[0]
        return request.start(tiny if family == "nemotron" else tiny_sdar).decoder

    assert [steps_in_lockstep(decoder(s, 0.0)) for s in ("ar", "linear", "packed", "quadratic")] == [True] * 3 + [False]
    assert not any(steps_in_lockstep(decoder(s, 1.0)) for s in ("ar", "linear", "packed"))
    lanes = [d.name for d in SDAR_DECODERS if steps_in_lockstep(decoder(d.name, 0.0, "sdar"))]
    assert lanes == ["ar", "linear", "packed"] and len(SDAR_DECODERS) > 3
    assert not any(steps_in_lockstep(decoder(s, 1.0, "sdar")) for s in ("ar", "linear", "packed"))
