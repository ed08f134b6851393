"""The static path at concurrency C > 1 (packedss.models.batched_static): compiled (C, R) graphs
over per-slot static caches give every request its C = 1 output, through compiled, padded and
eager rounds, with prefills joining rounds in progress."""

from __future__ import annotations

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling
from packedss.decoding.anyorder import AnyOrderSettings
from packedss.decoding.anyorder import ANYORDER_DECODERS
from packedss.decoding.calls import causal_segment, pack
from packedss.decoding.driver import Response, run_alone, schedule_named
from packedss.decoding.engine import Request, decode_batched
from packedss.decoding.schedules import LTR_DECODERS
from packedss.models.batched_static import StaticBatch
from packedss.models.nemotron import load_nemotron
from packedss.models.setdlm import load_setdlm
from packedss.models.static import static_capacity
from packedss.paths import PROJECT_ROOT

GREEDY = Sampling(0.0, "rejection", None)
PROMPTS = [[5, 17, 33, 8, 91, 12, 7], [9, 4], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [61, 62, 63], [7, 7, 7]]
CAPS = [24, 10, 18, 5, 14]


def _requests(decoders, settings_for):
    def start(model, k):
        settings = settings_for(CAPS[k])
        return Response(model, PROMPTS[k], settings, None, schedule_named(decoders, settings.schedule))

    return [Request(k, lambda model, k=k: start(model, k)) for k in range(len(PROMPTS))]


def _check(model, requests, batch):
    alone = {request.key: run_alone(request.start(model)) for request in requests}
    for _ in decode_batched(batch, requests[:3], 3):  # the warm-up: shapes seen twice compile
        pass
    batch.end_warmup()
    warm = dict(batch.calls)
    together = {request.key: out for request, out in decode_batched(batch, requests, 3)}
    for key, out in alone.items():
        assert together[key].tokens == out.tokens
        assert together[key].rows_evaluated == out.rows_evaluated
    return together, {kind: count - warm[kind] for kind, count in batch.calls.items()}


@pytest.mark.parametrize("schedule", ["ar", "packed"])
def test_compiled_batched_ltr_calls_give_the_outputs_of_one_at_a_time(schedule):
    model = load_nemotron(PROJECT_ROOT / "assets" / "models" / "tiny", dtype="float32")
    settings = lambda cap: LTRSettings(schedule, 4, cap, (2,), GREEDY)  # noqa: E731
    capacity = static_capacity(max(map(len, PROMPTS)), max(CAPS), 2 * 5)
    batch = StaticBatch(model, 3, "default", capacity)
    together, timed = _check(model, _requests(LTR_DECODERS, settings), batch)
    rows = 1 if schedule == "ar" else 10
    assert list(batch.compile_s) == [f"3x{rows} rows"]
    assert timed["compiled"] > 0 and timed["eager"] == timed["padded"] == 0
    # A decode round is one (3, R) pass, padding included; a round with a prefill adds its rows.
    for out in together.values():
        assert all(rows_of_call % (3 * rows) == 0 or rows_of_call > 3 * rows for rows_of_call in out.call_batch_rows[1:])


def test_rounds_of_fewer_rows_run_padded_on_a_larger_graph():
    model = load_nemotron(PROJECT_ROOT / "assets" / "models" / "tiny", dtype="float32")
    capacity = static_capacity(max(map(len, PROMPTS)), max(CAPS), 2 * 5)
    batch = StaticBatch(model, 3, "default", capacity)
    packed = _requests(LTR_DECODERS, lambda cap: LTRSettings("packed", 4, cap, (2,), GREEDY))
    for _ in decode_batched(batch, packed[:3], 3):  # compiles the 3 x 10-row graph
        pass
    batch.end_warmup()
    linear = _requests(LTR_DECODERS, lambda cap: LTRSettings("linear", 4, cap, (2,), GREEDY))
    alone = {request.key: run_alone(request.start(model)) for request in linear}
    before = dict(batch.calls)
    together = {request.key: out for request, out in decode_batched(batch, linear, 3)}
    assert {key: out.tokens for key, out in together.items()} == {key: out.tokens for key, out in alone.items()}
    assert batch.calls["padded"] > before["padded"] and batch.calls["eager"] == before["eager"]
    for out in together.values():  # Linear-SS's 5-row calls ran as 3 x 10 rows
        assert set(out.call_batch_rows[1:]) - {30} <= {30 + rows for rows in map(len, PROMPTS)}


def test_any_order_rounds_of_varying_row_counts_give_the_outputs_of_one_at_a_time():
    model = load_setdlm(PROJECT_ROOT / "assets" / "models" / "tiny-set", dtype="float32")
    settings = lambda cap: AnyOrderSettings("packed", 4, cap, (2,), GREEDY, order="confidence")  # noqa: E731
    capacity = static_capacity(max(map(len, PROMPTS)), max(CAPS), 64)
    batch = StaticBatch(model, 3, "default", capacity, max_graphs=1)
    _, timed = _check(model, _requests(ANYORDER_DECODERS, settings), batch)
    assert len(batch.compile_s) == 1
    # Rounds of the compiled row count ran compiled, larger ones eagerly on the same caches.
    assert timed["compiled"] > 0 and timed["eager"] > 0, (batch.compile_s, timed)


def test_padding_rows_see_only_themselves_and_empty_slots_are_all_padding():
    model = load_nemotron(PROJECT_ROOT / "assets" / "models" / "tiny", dtype="float32")
    batch = StaticBatch(model, 3, "default", 64)
    batch.committed[0] = 7
    call = pack([causal_segment(torch.tensor([4, 5, 6]), 7)])
    tokens, positions, mask = batch._fill([(0, call)], 5, 16)
    visible = mask[:, 0] == 0
    assert visible[0, :3, :7].all() and torch.equal(visible[0, :3, 7:10], torch.ones(3, 3).tril().bool())
    for row in (3, 4):  # the call's padding: its own column only, after the call's rows
        assert visible[0, row].nonzero().flatten().tolist() == [7 + row]
    for slot in (1, 2):  # empty slots: R rows of padding on an empty cache
        assert [visible[slot, row].nonzero().flatten().tolist() for row in range(5)] == [[r] for r in range(5)]
        assert (tokens[slot] == model.mask_token_id).all()
    assert tokens[0].tolist() == [4, 5, 6, model.mask_token_id, model.mask_token_id]
    assert positions[0].tolist() == [7, 8, 9, 9, 9]
