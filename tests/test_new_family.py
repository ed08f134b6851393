"""A third model family joins through the family table alone: a test double with one schedule is
registered here, runs through run.py, and its records analyse, with no edit outside this file."""

from __future__ import annotations

import runpy
import sys

import pytest
from hydra.core.global_hydra import GlobalHydra

from packedss.decoding import LTRSettings, decode_ltr
from packedss.families import FAMILIES, Family, register_family
from packedss.paths import PROJECT_ROOT
from packedss.records import read_records


def _load_tiny_layout(path, device, dtype):
    from packedss.models.nemotron import load_nemotron

    return load_nemotron(path, device=device, dtype=dtype)


@pytest.fixture
def toy_family():
    family = register_family(
        Family(
            name="toy",
            schedules=("ar",),
            orders=(),
            calls_per_iteration={"ar": 1},
            block_of_width=lambda width: 1,
            settings_type=LTRSettings,
            settings_fields=lambda schedule, options, max_block: {},
            decode=decode_ltr,
            load_adapter=_load_tiny_layout,
            max_block=lambda config: None,
        )
    )
    yield family
    del FAMILIES[family.name]


def test_a_registered_family_runs_through_run_py_and_analyses(toy_family, model_overrides, tmp_path, monkeypatch):
    out = tmp_path / "results" / "records"
    GlobalHydra.instance().clear()
    monkeypatch.setattr(sys, "argv", ["run.py", *model_overrides, "model.family=toy", "model.name=toy", "schedule=ar",
                                      "limit=2", "max_new_tokens=16", "warmup=false", f"out_dir={out}",
                                      f"hydra.run.dir={tmp_path / 'hydra'}"])  # fmt: skip
    runpy.run_path(str(PROJECT_ROOT / "run.py"), run_name="__main__")
    GlobalHydra.instance().clear()
    (path,) = out.rglob("*.jsonl")
    records, bad = read_records(path)  # validated against the toy family's own identities
    assert bad == [] and len(records) == 2
    assert {r["family"] for r in records} == {"toy"} and {r["block"] for r in records} == {1}

    from packedss.analysis.__main__ import main as analyse

    assert analyse([str(tmp_path / "results"), "--tables", "6", "--n-resamples", "200"]) == 0
    summary = (tmp_path / "results" / "tables" / "runs.csv").read_text()
    assert "toy" in summary


def test_an_unregistered_family_is_refused_with_the_known_ones(model_overrides, tmp_path, monkeypatch):
    from packedss.config import validate
    from packedss.errors import PackedSSError
    from tests.test_fidelity import _compose

    cfg = _compose([*model_overrides, "model.family=toy"])
    with pytest.raises(PackedSSError, match="invalid model.family='toy'; valid choices: nemotron, setdlm"):
        validate(cfg)
