import json
import os
import shutil
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "figures.ipynb"


def test_figures_notebook_runs_headless(results_dir, tmp_path, monkeypatch):
    """Executes notebooks/figures.ipynb on a small results folder (the RESULTS_DIR parameter comes
    from PACKEDSS_RESULTS_DIR) and checks that it wrote every figure, A1 and A2 from the
    acceptance profiles it wrote and read back."""
    for name in ("figure3.png", "figure4.png", "figure5.png", "figureA1.png", "figureA2.png"):
        (results_dir / "figures" / name).unlink(missing_ok=True)
    shutil.rmtree(results_dir / "acceptance", ignore_errors=True)
    monkeypatch.setenv("PACKEDSS_RESULTS_DIR", str(results_dir))
    monkeypatch.setenv("PACKEDSS_N_RESAMPLES", "200")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    for name in ("figure3.png", "figure3.pdf", "figure4.png", "figure5.png", "figure5.pdf", "figureA1.png", "figureA2.pdf"):
        assert (results_dir / "figures" / name).stat().st_size > 0
    profiles = sorted((results_dir / "acceptance").rglob("acceptance_profile.json"))
    assert profiles and all(json.loads(p.read_text())["schema"] == "packedss/acceptance_profile/1" for p in profiles)
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 5
    assert any(f"{len(profiles)} acceptance profiles" in o.get("text", "") for o in outputs)
    assert os.environ["PACKEDSS_RESULTS_DIR"] == str(results_dir)
