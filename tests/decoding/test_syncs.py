"""Host syncs on the decode path, counted by construction: every Tensor method that reads a value
back to the host (a CUDA synchronization when the tensor is on the device) is counted while one
response decodes. Greedy LTR decoding reads back once per iteration (plus the prefill's first
token and the near-ties' one read-back at the end); at T > 0 at most twice per iteration."""

from __future__ import annotations

import ast
import contextlib
import sys

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling, decode_ltr
from packedss.decoding.anyorder import AnyOrderSettings, decode_anyorder
from packedss.models.lora import attach_proposal_lora
from packedss.models.nemotron import load_nemotron
from packedss.models.setdlm import load_setdlm
from packedss.paths import PROJECT_ROOT

# Not `numpy`: it refuses a tensor on a GPU, and on a CPU it is a view (batched_ops._Greedy's). The same list as
# scripts/check_decode.py's CPU stand-in.
READ_BACKS = ("item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__")
PROMPT = [5, 17, 33, 8, 91, 12, 7]


@contextlib.contextmanager
def counting_read_backs(monkeypatch):
    counts: list[str] = []
    for name in READ_BACKS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            counts.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    yield counts
    monkeypatch.undo()


def _decode(model, schedule, width, sampling):
    settings = LTRSettings(schedule, width, 40, (), sampling, timing="events")
    return decode_ltr(model, PROMPT, settings)


def test_the_gpu_checks_cpu_stand_in_counts_the_same_read_backs():
    script = ast.parse((PROJECT_ROOT / "scripts" / "check_decode.py").read_text())
    (listed,) = [node.value for node in script.body if isinstance(node, ast.Assign)
                 and any(getattr(target, "id", None) == "READ_BACKS" for target in node.targets)]  # fmt: skip
    assert ast.literal_eval(listed) == READ_BACKS


@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
def test_greedy_ltr_reads_back_once_per_iteration(tiny, schedule, monkeypatch):
    _decode(tiny, schedule, 4, Sampling(0.0, "rejection", None))  # layouts and biases built once
    with counting_read_backs(monkeypatch) as counts:
        out = _decode(tiny, schedule, 4, Sampling(0.0, "rejection", None))
    # The prefill's first token, one per iteration, the near-ties at the end.
    assert len(counts) == out.iterations + 2, counts


@pytest.mark.parametrize("rule", ["rejection", "match"])
@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
def test_sampled_ltr_reads_back_at_most_twice_per_iteration(tiny, schedule, rule, monkeypatch):
    sampling = Sampling(1.0, rule, torch.Generator().manual_seed(3))
    _decode(tiny, schedule, 4, sampling)
    with counting_read_backs(monkeypatch) as counts:
        out = _decode(tiny, schedule, 4, Sampling(1.0, rule, torch.Generator().manual_seed(3)))
    assert len(counts) <= 2 * out.iterations + 1, counts


def test_the_proposal_lora_and_the_prefill_count_their_rows_on_the_host(monkeypatch):
    model = load_nemotron(PROJECT_ROOT / "assets" / "models" / "tiny", dtype="float32")
    attach_proposal_lora(model, PROJECT_ROOT / "assets" / "models" / "tiny-lora")
    greedy = Sampling(0.0, "rejection", None)
    _decode(model, "linear", 4, greedy)
    with counting_read_backs(monkeypatch) as counts:
        out = _decode(model, "linear", 4, greedy)
    assert len(counts) == out.iterations + 2, counts
    assert out.extra["lora_rows_selected"] == [0] + [5, 0] * out.iterations  # each draft call's block of B rows


def _counted(original, built):
    def counted(*args, **kwargs):
        if "packedss/decoding" in sys._getframe(1).f_code.co_filename:  # not the backbone's cache
            built.append(args)
        return original(*args, **kwargs)

    return counted


def test_any_order_ids_go_to_the_device_once_per_call(monkeypatch):
    model = load_setdlm(PROJECT_ROOT / "assets" / "models" / "tiny-set", dtype="float32")
    greedy = Sampling(0.0, "rejection", None)
    for schedule in ("ar", "linear", "packed", "quadratic"):
        settings = AnyOrderSettings(schedule, 4, 24, (), greedy, order="ltr")
        decode_anyorder(model, PROMPT, settings)  # the shapes' layouts are built once
        built = []
        for name in ("tensor", "frombuffer"):  # a list's tensor, or an array's (rows.uploaded)
            monkeypatch.setattr(torch, name, _counted(getattr(torch, name), built))
        out = decode_anyorder(model, PROMPT, settings)
        monkeypatch.undo()
        assert len(built) == out.nfe_total, (schedule, built)
