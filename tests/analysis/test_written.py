"""By default the analysis writes only the tables and figures its records fill, and names the
others once, in one line; a records folder named twice is read and reported once."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from packedss.analysis.__main__ import main
from tests.analysis.synthetic import make_record, write_records

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SCHEDULES = ("ar", "linear", "quadratic", "packed")


def _greedy_tiny(root):
    write_records(root / "records", [make_record(schedule=s, question=q, tokens_per_iteration={"ar": 1}.get(s, 3))
                                     for s in SCHEDULES for q in range(4)])  # fmt: skip
    return root


def test_by_default_only_what_has_records_is_written_and_the_rest_named_once(tmp_path, capsys):
    root = _greedy_tiny(tmp_path)
    assert main([str(root), "--n-resamples", "50"]) == 0
    out = capsys.readouterr().out
    tables = {p.name for p in (root / "tables").glob("*.md")}
    assert {"runs.md", "table2.md", "table6.md", "table12.md"} <= tables
    assert not {"table4.md", "table7.md", "table13.md"} & tables  # no LoRA, no T > 0 runs
    assert not any("No records" in (root / "tables" / name).read_text() for name in tables)
    figures = {p.name for p in (root / "figures").glob("*.png")}
    assert "figure3.png" in figures and "figure4.png" not in figures  # Figure 4 is T > 0
    skipped = [line for line in out.splitlines() if line.startswith("skipped")]
    assert len(skipped) == 1, out
    assert "table4" in skipped[0] and "table7" in skipped[0] and "figure4" in skipped[0], skipped
    assert "table6" not in skipped[0].split(":")[0], skipped


def test_a_table_named_without_records_is_written_with_its_note(tmp_path, capsys):
    root = _greedy_tiny(tmp_path)
    assert main([str(root), "--tables", "4", "--n-resamples", "50"]) == 0
    assert "No records" in (root / "tables" / "table4.md").read_text()
    assert "skipped" not in capsys.readouterr().out


def test_a_default_run_removes_the_earlier_files_of_what_it_skips_and_says_so(tmp_path, capsys):
    root = _greedy_tiny(tmp_path)
    assert main([str(root), "--tables", "7", "--figures", "4", "--n-resamples", "50"]) == 0  # written, with notes
    earlier = [root / "tables" / f"table7{s}" for s in (".csv", ".md", ".tex")] + [root / "figures" / f"figure4{s}" for s in (".png", ".pdf", ".csv")]
    assert all(path.is_file() for path in earlier)
    (root / "tables" / "concurrency.md").write_text("an earlier sweep over C\n")  # these records hold one C
    (root / "figures" / "figureC1.png").write_bytes(b"png")
    (root / "tables" / "notes.txt").write_text("the user's own\n")
    capsys.readouterr()
    assert main([str(root), "--n-resamples", "50"]) == 0
    assert not [path for path in earlier if path.exists()]
    assert not (root / "tables" / "concurrency.md").exists() and not (root / "figures" / "figureC1.png").exists()
    assert (root / "tables" / "notes.txt").is_file() and (root / "tables" / "table6.md").is_file()
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("skipped")]
    removed = line.split("; removed the earlier files of ")[1]
    assert removed.endswith(", which these records do not make"), line
    assert sorted(removed.split(", which")[0].split(", ")) == ["concurrency", "figure4", "figureC1", "table7"], line


def test_a_run_that_names_its_tables_leaves_the_others_files_alone(tmp_path, capsys):
    root = _greedy_tiny(tmp_path)
    assert main([str(root), "--tables", "7", "--n-resamples", "50"]) == 0
    assert main([str(root), "--tables", "6", "--n-resamples", "50"]) == 0
    assert (root / "tables" / "table7.md").is_file() and "removed" not in capsys.readouterr().out


def test_the_records_folder_named_again_is_reported_once(tmp_path, capsys):
    root = _greedy_tiny(tmp_path)  # as make reproduce-table6 names it: RESULTS/table6 --records RESULTS/table6/records
    assert main([str(root), "--tables", "6", "--records", str(root / "records"), "--n-resamples", "50"]) == 0
    under = [line for line in capsys.readouterr().out.splitlines() if " under " in line]
    assert len(under) == 1 and under[0].count(str(root / "records")) == 1, under


@pytest.mark.parametrize("target", ["table6", "table11", "figure3"])
def test_make_reproduce_names_each_records_folder_once(target):
    result = subprocess.run(["make", "-n", "-s", f"reproduce-{target}", "STAMP=", "MODEL=tiny", "LIMIT=1"], cwd=PROJECT_ROOT,
                            capture_output=True, text=True, check=True)  # fmt: skip
    [line] = [line for line in result.stdout.splitlines() if "-m packedss.analysis" in line]
    arguments = shlex.split(line)
    results_dir = arguments[arguments.index("packedss.analysis") + 1]
    read = [f"{results_dir}/records"] + (arguments[arguments.index("--records") + 1 :] if "--records" in arguments else [])
    assert len(read) == len(set(read)), line
    assert all(folder.endswith("/records") for folder in read), line
