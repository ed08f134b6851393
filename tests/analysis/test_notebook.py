from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbclient import NotebookClient

from packedss.analysis import analyse, results_dir_from_start
from packedss.errors import PackedSSError
from packedss.paths import PROJECT_ROOT
from tests.analysis.synthetic import make_record, write_records

NOTEBOOK = PROJECT_ROOT / "notebooks" / "figures.ipynb"


def greedy_results(folder: Path) -> Path:
    """A results folder as `make demo` leaves one: tiny arith at T = 0 only, so Figure 4 has no runs."""
    records = [make_record(schedule=schedule, width=8, question=q, tokens_per_iteration=1 if schedule == "ar" else 3)
               for schedule in ("ar", "linear", "quadratic", "packed") for q in range(6)]  # fmt: skip
    write_records(folder / "records", records)
    return folder


def test_figures_notebook_runs_as_the_readme_runs_it(tmp_path, monkeypatch):
    """`PACKEDSS_RESULTS_DIR=<relative> jupyter execute notebooks/figures.ipynb`: the kernel runs in
    notebooks/, and the relative path is found from where the command was started ($PWD). The
    notebook writes what the analysis writes (figure3.csv with its measured_in column, the same
    numbers) and draws no figure of runs the folder lacks (Figure 4, at T > 0)."""
    started_in = tmp_path / "start"
    results = greedy_results(started_in / "user-results" / "demo")
    earlier = results / "figures" / "figure4.png"  # an earlier folder's Figure 4, which these records do not make
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"stale")
    monkeypatch.setenv("PWD", str(started_in))
    monkeypatch.setenv("PACKEDSS_RESULTS_DIR", "user-results/demo")
    monkeypatch.setenv("PACKEDSS_N_RESAMPLES", "200")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert f"results folder: {results}" in text and "skipped figure4" in text
    figures = results / "figures"
    reference = analyse(results, tables=[], figures=None, n_resamples=200, out_dir=tmp_path / "analysis")
    assert sorted(p.name for p in figures.iterdir()) == sorted(p.name for p in (tmp_path / "analysis" / "figures").iterdir())
    assert not earlier.exists() and "figure4" in reference.skipped
    for name in ("figure3.csv", "figure5.csv", "figureA1.csv", "figureA2.csv"):
        drawn = pd.read_csv(figures / name)
        assert "measured_in" in drawn.columns and drawn["measured_in"].str.startswith("eager, float32, 1 thread, cpu").all(), name
        pd.testing.assert_frame_equal(drawn, pd.read_csv(tmp_path / "analysis" / "figures" / name))
    pngs = sorted(figures.glob("*.png"))
    assert [p.stem for p in pngs] == ["figure3", "figure5", "figureA1", "figureA2"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == len(pngs)
    assert len(list((results / "acceptance").rglob("acceptance_profile.json"))) == 4
    assert not list(NOTEBOOK.parent.glob("user-results"))  # nothing written beside the notebook


def test_a_relative_results_folder_is_found_from_where_the_command_started(tmp_path):
    started_in, kernel_dir = tmp_path / "start", tmp_path / "kernel"
    (started_in / "runs" / "demo").mkdir(parents=True)
    (kernel_dir / "beside").mkdir(parents=True)
    (started_in / "results").mkdir()
    environ = {"PWD": str(started_in)}
    assert results_dir_from_start("runs/demo", environ, kernel_dir) == started_in / "runs" / "demo"
    # $PWD first: a folder there wins over the repository root's folder of the same name
    assert results_dir_from_start("results", environ, kernel_dir) == started_in / "results"
    assert results_dir_from_start("results", {}, kernel_dir) == PROJECT_ROOT / "results"  # no $PWD: the root
    assert results_dir_from_start("results", {"PWD": str(kernel_dir)}, kernel_dir) == PROJECT_ROOT / "results"
    assert results_dir_from_start("beside", environ, kernel_dir) == kernel_dir / "beside"  # last, the kernel's own folder
    assert results_dir_from_start(started_in / "runs", {}, kernel_dir) == started_in / "runs"
    with pytest.raises(PackedSSError, match=r"no results folder nowhere \(looked for .*start/nowhere, .*/nowhere, .*kernel/nowhere\)"):
        results_dir_from_start("nowhere", environ, kernel_dir)
    with pytest.raises(PackedSSError, match="no results folder /"):
        results_dir_from_start(tmp_path / "absent", environ, kernel_dir)
