"""The analysis on real records of the tiny model (run.py, offline, CPU). Skipped until the tiny
model is in assets/models/tiny; kept small (2 questions, 32 tokens) so it stays fast."""

import sys
from pathlib import Path

import pytest

from packedss.analysis import load_results
from packedss.analysis.__main__ import main
from packedss.analysis.tables import TABLES
from tests import bad_inputs

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "assets" / "models" / "tiny"


@pytest.mark.skipif(not (TINY / "config.json").exists(), reason="tiny model not trained yet (assets/models/tiny)")
def test_analysis_of_tiny_model_records(tmp_path):
    records = tmp_path / "records"
    done = bad_inputs.run(
        [sys.executable, str(ROOT / "run.py"), "-m", "model=tiny", "task=arith", "schedule=linear,packed", "width=4",
         "limit=2", "max_new_tokens=32", "device=cpu", f"out_dir={records}", f"hydra.sweep.dir={tmp_path / 'hydra'}"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = load_results(tmp_path, n_resamples=200)
    assert results.loaded.bad_lines == [] and len(results.loaded.frame) == 4
    table6 = TABLES[6].function(results.per_question, results.comparisons, False)
    assert list(table6.data["Method"]) == ["Linear-SS", "Packed-SS"]
    assert (table6.data["Tokens/NFE"] > 0).all()
    table2 = TABLES[2].function(results.per_question, results.comparisons, False).data.set_index("Method")
    assert table2.loc["Linear-SS", "Max rows/iteration"] == 10  # two calls of B = 5 rows
    assert table2.loc["Linear-SS", "NFE/iteration"] == 2 and table2.loc["Packed-SS", "NFE/iteration"] == 1
    assert main([str(tmp_path), "--tables", "12", "--figures", "3,5", "--n-resamples", "200"]) == 0
    assert (tmp_path / "tables" / "table12.md").read_text().count("Linear-SS") == 1
    assert (tmp_path / "figures" / "figure5.png").stat().st_size > 0
