"""near_ties names the right output positions and the margins of the rows that decided them: with
a threshold that takes every row, each schedule notes every output index once, and its margins
are AR's at the same index (the same logits, up to the rounding of another call shape)."""

from __future__ import annotations

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling, decode_ltr
from packedss.decoding import verify as verify_module
from packedss.decoding.anyorder import AnyOrderSettings, decode_anyorder
from packedss.models.nemotron import load_nemotron
from packedss.models.setdlm import load_setdlm
from packedss.paths import PROJECT_ROOT

PROMPT = [5, 17, 33, 8, 91, 12, 7]
GREEDY = Sampling(0.0, "rejection", None)


@pytest.fixture(autouse=True)
def every_row_is_a_near_tie(monkeypatch):
    monkeypatch.setattr(verify_module, "NEAR_TIE_ULPS", 1e30)


def _margins(out) -> dict[int, float]:
    indexes = [index for index, _ in out.extra["near_ties"]]
    assert len(indexes) == len(set(indexes))  # each output token was decided once
    assert set(indexes) == set(range(len(out.tokens)))
    return dict(out.extra["near_ties"])


@pytest.mark.parametrize("schedule", ["linear", "quadratic", "packed"])
def test_ltr_schedules_note_the_deciding_rows(schedule):
    model = load_nemotron(PROJECT_ROOT / "assets" / "models" / "tiny", dtype="float32")
    ar = _margins(decode_ltr(model, PROMPT, LTRSettings("ar", 1, 30, (), GREEDY)))
    out = _margins(decode_ltr(model, PROMPT, LTRSettings(schedule, 4, 30, (), GREEDY)))
    assert out == pytest.approx(ar, abs=1e-3)


@pytest.mark.parametrize("schedule", ["linear", "quadratic", "packed"])
def test_any_order_schedules_note_the_deciding_rows(schedule):
    model = load_setdlm(PROJECT_ROOT / "assets" / "models" / "tiny-set", dtype="float32")
    settings = lambda name: AnyOrderSettings(name, 4, 20, (), GREEDY, order="ltr")  # noqa: E731
    ar = _margins(decode_anyorder(model, PROMPT, settings("ar")))
    out = _margins(decode_anyorder(model, PROMPT, settings(schedule)))
    assert out == pytest.approx(ar, abs=1e-3)


def test_native_decoding_records_no_near_ties():
    model = load_setdlm(PROJECT_ROOT / "assets" / "models" / "tiny-set", dtype="float32")
    out = decode_anyorder(model, PROMPT, AnyOrderSettings("native", 4, 12, (), GREEDY))
    assert "near_ties" not in out.extra


def test_sampled_decoding_records_no_near_ties():
    model = load_nemotron(PROJECT_ROOT / "assets" / "models" / "tiny", dtype="float32")
    sampling = Sampling(1.0, "rejection", torch.Generator().manual_seed(0))
    assert "near_ties" not in decode_ltr(model, PROMPT, LTRSettings("linear", 4, 12, (), sampling)).extra
