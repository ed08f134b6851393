"""The SDAR family through run.py on the shipped tiny-sdar: every schedule writes valid records,
the lossless ones equal AR per question, S2D2 (which draws at T = 0) is reproducible run to run
because the runner seeds its generator per question, and C = 2 writes what C = 1 writes."""

from __future__ import annotations

import runpy
import sys

import pytest
from hydra.core.global_hydra import GlobalHydra

from packedss.paths import PROJECT_ROOT
from packedss.records import read_records

TINY_SDAR = PROJECT_ROOT / "assets" / "models" / "tiny-sdar"
pytestmark = pytest.mark.skipif(not (TINY_SDAR / "model.safetensors").is_file(), reason="the shipped tiny-sdar is absent")


def _run_py(monkeypatch, tmp_path, *overrides):
    GlobalHydra.instance().clear()
    monkeypatch.setattr(sys, "argv", ["run.py", "-m", *overrides, f"hydra.sweep.dir={tmp_path / 'multirun'}"])
    try:
        runpy.run_path(str(PROJECT_ROOT / "run.py"), run_name="__main__")
    except SystemExit as exit_:
        assert exit_.code in (None, 0)
    finally:
        GlobalHydra.instance().clear()


def _records(out, schedule: str, concurrency: int = 1) -> dict[str, dict]:
    found = {}
    for path in out.rglob(f"{schedule}-*.jsonl"):
        records, bad = read_records(path)  # validated: identities, the family's calls per iteration
        assert bad == []
        found.update({r["question_id"]: r for r in records if r["concurrency"] == concurrency})
    return found


def test_every_sdar_schedule_runs_through_run_py(monkeypatch, tmp_path):
    common = ["model=tiny-sdar", "width=3", "limit=3", "max_new_tokens=48", "threads=1", "progress=false"]
    first, second = tmp_path / "a", tmp_path / "b"
    _run_py(monkeypatch, tmp_path / "m1", *common, "schedule=ar,linear,packed,sdar-native,s2d2", f"out_dir={first}")
    _run_py(monkeypatch, tmp_path / "m2", *common, "schedule=s2d2,packed", "concurrency=1,2", f"out_dir={second}")
    ar = _records(first, "ar")
    assert len(ar) == 3 and {r["family"] for r in ar.values()} == {"sdar"}
    for schedule in ("linear", "packed"):
        records = _records(first, schedule)
        assert {q: r["output_hash"] for q, r in records.items()} == {q: r["output_hash"] for q, r in ar.items()}
        assert all(not r["lossy"] for r in records.values())
    for schedule in ("sdar-native", "s2d2"):
        records = _records(first, schedule)
        assert len(records) == 3 and all(r["lossy"] for r in records.values())
        assert all(r["call_kinds"][0] == "prefill" and "commit" in r["call_kinds"] for r in records.values())
    again = _records(second, "s2d2")
    assert {q: (r["output_hash"], r["nfe_total"]) for q, r in again.items()} == {
        q: (r["output_hash"], r["nfe_total"]) for q, r in _records(first, "s2d2").items()
    }
    for schedule in ("s2d2", "packed"):
        alone, together = _records(second, schedule), _records(second, schedule, concurrency=2)
        assert {q: r["output_hash"] for q, r in together.items()} == {q: r["output_hash"] for q, r in alone.items()}


def test_an_sdar_model_runs_its_release_block_unless_width_is_given(monkeypatch, tmp_path):
    """`model=tiny-sdar schedule=sdar-native` runs the release's block of 4 (the model config's
    width 3, not the global 8), and says so in its records; an explicit width= wins."""
    common = ["model=tiny-sdar", "schedule=sdar-native", "limit=1", "max_new_tokens=16", "threads=1", "progress=false"]
    out = tmp_path / "out"
    _run_py(monkeypatch, tmp_path / "m1", *common, f"out_dir={out}")
    _run_py(monkeypatch, tmp_path / "m2", *common, "width=5", f"out_dir={out}")
    _run_py(monkeypatch, tmp_path / "m3", *common, "width=3", f"out_dir={out}")
    by_width = {}
    for path in out.rglob("sdar-native-*.jsonl"):
        records, bad = read_records(path)
        assert bad == []
        by_width[path.name.split("-")[2]] = [(r["width"], r["block"], r["width_source"]) for r in records]
    # width=3 given is the same job as the model's 3: it resumed the file (nothing new written)
    assert by_width == {"W3": [(3, 4, "model")], "W5": [(5, 6, "explicit")]}
