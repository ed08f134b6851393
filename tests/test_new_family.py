"""A third model family joins through the family table alone: a test double with a schedule of
its own name (its facts on its class: calls per iteration, largest call) is registered here,
runs through run.py eagerly and on the compiled static path, and its records analyse, with no
edit outside this file."""

from __future__ import annotations

import runpy
import sys

import pytest
from hydra.core.global_hydra import GlobalHydra

from packedss.decoding import LTR_DECODERS, LTRSettings
from packedss.families import FAMILIES, Family, register_family
from packedss.paths import PROJECT_ROOT
from packedss.records import read_records


def _load_tiny_layout(path, device, dtype):
    from packedss.models.nemotron import load_nemotron

    return load_nemotron(path, device=device, dtype=dtype)


class DraftThenCheck(LTR_DECODERS[1]):
    """A schedule no built-in family has: Linear-SS's two calls per iteration under a name of its own."""

    name = "draft-then-check"
    rows_formula = ""

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return width + 1


@pytest.fixture
def toy_family():
    family = register_family(
        Family(
            name="toy",
            decoders=(DraftThenCheck,),
            orders=(),
            block_of_width=lambda width: width + 1,
            settings_type=LTRSettings,
            settings_fields=lambda schedule, options, max_block: {},
            load_adapter=_load_tiny_layout,
            max_block=lambda config: None,
            backbone_config=FAMILIES["nemotron"].backbone_config,
        )
    )
    yield family
    del FAMILIES[family.name]


def _run_py(monkeypatch, tmp_path, *overrides):
    GlobalHydra.instance().clear()
    monkeypatch.setattr(sys, "argv", ["run.py", *overrides, f"hydra.run.dir={tmp_path / 'hydra'}"])
    try:
        runpy.run_path(str(PROJECT_ROOT / "run.py"), run_name="__main__")
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize("compile_mode", ["none", pytest.param("default", marks=pytest.mark.slow)])
def test_a_registered_family_runs_through_run_py_and_analyses(toy_family, model_overrides, tmp_path, monkeypatch,
                                                              compile_mode):  # fmt: skip
    out = tmp_path / "results" / "records"
    _run_py(monkeypatch, tmp_path, *model_overrides, "model.family=toy", "model.name=toy",
            "schedule=linear", "schedule.name=draft-then-check", "width=4", "limit=2", "max_new_tokens=16", f"model.compile={compile_mode}",
            f"warmup={compile_mode != 'none'}", f"out_dir={out}")  # fmt: skip
    (path,) = out.rglob("*.jsonl")
    records, bad = read_records(path)  # validated against the toy family's own identities
    assert bad == [] and len(records) == 2
    assert {r["family"] for r in records} == {"toy"} and {r["block"] for r in records} == {5}
    assert {r["compile"] for r in records} == {compile_mode}
    for record in records:  # two calls of B rows per iteration, as the class says
        assert record["nfe_total"] == 1 + 2 * record["iterations"]
        assert set(record["rows_evaluated"][1:]) == {5}

    from packedss.analysis.__main__ import main as analyse

    assert analyse([str(tmp_path / "results"), "--tables", "6", "--n-resamples", "200"]) == 0
    summary = (tmp_path / "results" / "tables" / "runs.csv").read_text()
    assert "toy" in summary


def test_an_unregistered_family_is_refused_with_the_known_ones(model_overrides, tmp_path, monkeypatch):
    from packedss.config import validate
    from packedss.errors import PackedSSError
    from tests.test_fidelity import _compose

    cfg = _compose([*model_overrides, "model.family=toy"])
    with pytest.raises(PackedSSError, match="invalid model.family=.toy.; valid choices: nemotron, setdlm, sdar$"):
        validate(cfg)
