import dataclasses
import re
from pathlib import Path

import pandas as pd
import pytest

from packedss.analysis import analyse, load_results
from packedss.analysis import paper_numbers
from packedss.analysis.__main__ import main
from packedss.analysis.figures import make_figure, write_figure
from packedss.analysis.render import latex, markdown
from packedss.analysis.tables import TABLES
from tests.analysis.conftest import N_RESAMPLES
from packedss.families import FAMILIES
from tests.analysis.synthetic import SAMPLES, make_record, write_records

PAPER_TEXT = Path(__file__).resolve().parents[3] / "shared" / "paper" / "packed-ss-paper.txt"

ABS = ["Tokens/s", "Tokens/NFE", "Time/NFE (ms)", "Accuracy (%)", "Tokens", "Wall (s)", "NFE"]
HEADERS = {
    3: ["Method", "B", "Tokens/s", "Rows/call", "Wall (s)", "Total NFE", "Tokens", "Accuracy (%)"],
    4: ["Method", "Tokens", "Total NFE", "Model (s)", "Non-model (s)", "Wall (s)", "Tokens/s", "Accuracy (%)"],
    5: ["Method", "Query rows", "Selected", "Evaluated", "Base ms", "LoRA ms", "Increase"],
    6: ["Task", "Method"] + ABS,
    7: ["Task", "Method"] + ABS,
    8: ["Window", "Method"] + ABS,
    9: ["Window", "Method"] + ABS,
    10: ["Setting", "Baseline", "Δ wall (s) [95% CI]", "Throughput ratio [95% CI]"],
    11: ["Setting", "Packed-SS − Linear-SS [95% CI]", "Packed-SS − Quadratic-SS [95% CI]", "Linear-SS − Quadratic-SS [95% CI]"],
    12: ["Setting", "Baseline", "Δ wall (s) [95% CI]", "Throughput ratio [95% CI]"],
    13: ["Setting", "Baseline", "Δ wall (s) [95% CI]", "Throughput ratio [95% CI]"],
}


@pytest.fixture(scope="module")
def results(results_dir):
    return load_results(results_dir, n_resamples=N_RESAMPLES)


def _table(results, number, compare_paper=False):
    return TABLES[number].function(results.per_question, results.comparisons, compare_paper)


@pytest.mark.parametrize("number", sorted(HEADERS))
def test_every_table_has_the_papers_columns_and_rows(results, number):
    table = _table(results, number)
    columns = list(table.display.columns)
    assert [c for c in columns if c in HEADERS[number]] == HEADERS[number]
    assert len(table.display) > 0
    measured = table.data.drop(columns=[c for c in table.data.columns if not pd.api.types.is_numeric_dtype(table.data[c])])
    assert measured.notna().any().any()


def test_table6_values_and_bold(results):
    table = _table(results, 6)
    pq = results.per_question
    sub = pq[(pq.model == "tiny") & (pq.task == "arith") & (pq.schedule == "packed") & (pq.width == 8) & (pq.temperature == 0) & ~pq.lora]
    row = table.data[(table.data["Task"] == "Arith") & (table.data["Method"] == "Packed-SS") & (table.data["B"] == 9)].iloc[0]
    assert row["Tokens/s"] == pytest.approx(sub.output_tokens.sum() / sub.wall_s.sum())
    assert row["NFE"] == pytest.approx(sub.nfe_total.mean())
    # bold marks the highest tokens/s within each model and task
    for index, column in table.bold:
        task = table.data.loc[index, "Task"]
        assert table.data.loc[index, "Tokens/s"] == table.data[table.data["Task"] == task]["Tokens/s"].max()
    assert len(table.bold) == 2
    assert "**" in markdown(table) and r"\textbf{" in latex(table)
    # speed-only task: accuracy blank, not NaN text
    wb = table.display[table.display["Task"] == "WritingBench"]
    assert set(wb["Accuracy (%)"]) == {"-"}
    assert "nan" not in markdown(table).lower()


def test_table2_measured_rows_match_the_formulas(results):
    data = _table(results, 2).data
    for _, row in data[data["Method"].isin(["Linear-SS", "Quadratic-SS"])].iterrows():
        assert row["Max rows/iteration"] == row["Rows/iteration (paper formula)"]
        assert row["NFE/iteration"] == row["NFE/iteration (paper formula)"]
    setdlm = data[(data["Model"] == "Tiny-Set") & (data["W"] == 8)].set_index("Method")
    assert setdlm.loc["Packed-SS", "Rows/iteration (paper formula)"] == 25
    assert setdlm.loc["Quadratic-SS", "Rows/iteration (paper formula)"] == 81


def test_table5_lora_columns(results):
    data = _table(results, 5).data.set_index(["Task", "Method", "B"])
    linear = data.loc[("Arith", "Linear-SS", 9)]
    assert linear["Query rows"] == "9+9" and linear["Selected"] == 9 and linear["Evaluated"] == 9
    assert linear["Increase"] == pytest.approx(100 * (linear["LoRA ms"] / linear["Base ms"] - 1))
    assert data.loc[("Arith", "Quadratic-SS", 9), "Evaluated"] == 90


def test_paired_tables_count_pairs_and_show_cis(results):
    table = _table(results, 12)
    assert set(table.data["Pairs"]) == {"12"}
    assert set(_table(results, 13).data["Pairs"]) == {str(12 * SAMPLES)}
    assert (table.data["Throughput ratio CI low"] <= table.data["Throughput ratio"]).all()
    assert re.match(r"^[+-]\d\.\d{4} \[[+-]\d\.\d{4}, [+-]\d\.\d{4}\]$", table.display.iloc[0]["Δ wall (s) [95% CI]"])
    t11 = _table(results, 11)
    assert "WritingBench" not in " ".join(t11.data["Setting"]) and any("speed only" in n for n in t11.notes)
    assert set(t11.data["Temperature"]) == {"Temperature 0", "Temperature 1"}


def test_compare_paper_puts_published_numbers_beside_measured(tmp_path):
    records = [
        make_record(model="nemotron3b", task="mbpp", schedule=s, width=w, question=q, correct=True)
        for s, w in (("linear", 31), ("quadratic", 7), ("packed", 31))
        for q in range(4)
    ]
    write_records(tmp_path / "records", records)
    results = load_results(tmp_path, n_resamples=200)
    table = _table(results, 6, compare_paper=True)
    row = table.data[(table.data["Task"] == "MBPP") & (table.data["Method"] == "Linear-SS")].iloc[0]
    assert row["Model"] == "Nemotron 3B"
    assert row["Tokens/s (paper)"] == 173.46 and row["NFE (paper)"] == 17.50
    assert row["Tokens/s"] == pytest.approx(results.per_question.query("schedule == 'linear'").pipe(lambda f: f.output_tokens.sum() / f.wall_s.sum()))
    # paper rows without a measured counterpart are kept, with blank measured cells
    humaneval = table.display[table.display["Task"] == "HumanEval"]
    assert len(humaneval) == 2 and set(humaneval["Tokens/s"]) == {"-"}
    t12 = _table(results, 12, compare_paper=True)
    mbpp = t12.data[(t12.data["Setting"] == "3B MBPP") & (t12.data["Baseline"] == "Linear-SS")].iloc[0]
    assert mbpp["Throughput ratio (paper)"] == 1.044 and mbpp["Throughput ratio (paper) CI high"] == 1.075
    assert mbpp["Pairs"] == "4"


def test_missing_subsets_give_notes_not_errors(tmp_path):
    write_records(tmp_path / "records", [make_record(question=q, schedule="packed") for q in range(3)])
    results = load_results(tmp_path, n_resamples=200)
    for number in TABLES:
        table = _table(results, number, compare_paper=True)
        assert isinstance(markdown(table), str) and isinstance(latex(table), str)
    assert any("No records" in n for n in _table(results, 10).notes)
    assert any("lora=true" in n for n in _table(results, 4).notes)
    for number in (3, 4, 5):
        figure = make_figure(number, results.comparisons)
        paths = write_figure(figure, tmp_path / "figures")
        assert paths[0].stat().st_size > 0


def test_paper_numbers_are_transcribed_from_the_paper():
    if not PAPER_TEXT.exists():
        pytest.skip(f"paper text not present at {PAPER_TEXT}")
    text = PAPER_TEXT.read_text(encoding="utf-8")
    checked = 0
    for number, rows in paper_numbers.PAPER_TABLES.items():
        for row in rows:
            for key, value in row.items():
                values = value if isinstance(value, tuple) else (value,)
                for v in values:
                    if isinstance(v, float) and key not in ("Accuracy (%)",):
                        digits = 4 if key == "Δ wall (s)" else None
                        candidates = {f"{v:.{digits}f}"} if digits else {f"{v:.1f}", f"{v:.2f}", f"{v:.3f}"}
                        candidates |= {c.replace("-", "−") for c in candidates}
                        assert any(re.search(rf"(?<![\d.]){re.escape(c)}(?![\d])", text) for c in candidates), (number, key, v)
                        checked += 1
    assert checked > 300


def test_cli_writes_tables_and_figures_and_reports_bad_lines(results_dir, tmp_path, capsys):
    out = tmp_path / "out"
    bad = results_dir / "records" / "bad.jsonl"
    bad.write_text("{torn\n")
    try:
        code = main([str(results_dir), "--tables", "6,10", "--figures", "3", "--n-resamples", "200", "--out", str(out), "--compare-paper"])
    finally:
        bad.unlink()
    captured = capsys.readouterr()
    assert code == 0
    assert f"{bad}:1:" in captured.err
    for name in ("table6.csv", "table6.md", "table6.tex", "table10.csv", "table10.md", "table10.tex"):
        assert (out / "tables" / name).stat().st_size > 0
    for name in ("figure3.png", "figure3.pdf", "figure3.csv"):
        assert (out / "figures" / name).stat().st_size > 0
    assert not (out / "figures" / "figure5.png").exists()
    assert "(paper)" in (out / "tables" / "table10.md").read_text()


def test_cli_rejects_unknown_tables_and_empty_folders(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--tables", "1"])
    (tmp_path / "records").mkdir()
    assert main([str(tmp_path), "--tables", "6"]) == 2
    assert "no usable records" in capsys.readouterr().err
    assert not (tmp_path / "tables").exists() and not (tmp_path / "figures").exists()


def test_figures_show_every_schedule_against_linear(results, tmp_path):
    fig3 = make_figure(3, results.comparisons)
    assert set(fig3.data["schedule"]) == {"ar", "quadratic", "packed", "native"}
    assert set(fig3.data["metric"]) == {"Throughput ratio", "NFE ratio", "Accuracy difference (pp)"}
    ratios = fig3.data[fig3.data.metric == "Throughput ratio"]
    assert (ratios["low"] <= ratios["estimate"]).all() and (ratios["estimate"] <= ratios["high"]).all()
    fig5 = make_figure(5, results.comparisons)
    linear = fig5.data[fig5.data.schedule == "linear"]
    assert linear["total_frac"].to_numpy() == pytest.approx(1.0)
    for number in (3, 4, 5):
        paths = write_figure(make_figure(number, results.comparisons), tmp_path)
        assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths[1].read_bytes()[:4] == b"%PDF"


def test_analyse_writes_everything(results_dir, tmp_path):
    res = analyse(results_dir, n_resamples=200, out_dir=tmp_path)
    names = {p.name for p in res.written}
    assert {f"table{n}.{ext}" for n in range(2, 14) for ext in ("csv", "md", "tex")} <= names
    assert {"runs.csv", "runs.md", "runs.tex"} <= names
    assert {f"figure{n}.{ext}" for n in (3, 4, 5) for ext in ("png", "pdf")} <= names


def test_packed_with_and_without_padding_are_separate_runs(tmp_path):
    records = [make_record(schedule="linear", question=q, pad_verify=True) for q in range(3)]
    records += [make_record(schedule="packed", question=q, pad_verify=True, call_s=0.01) for q in range(3)]
    records += [make_record(schedule="packed", question=q, pad_verify=False, call_s=0.02) for q in range(3)]
    write_records(tmp_path / "records", records)
    results = load_results(tmp_path, n_resamples=200)
    assert len(results.loaded.frame) == 9 and results.loaded.duplicates_skipped == 0
    t3 = _table(results, 3).data
    assert list(t3["Padded"]) == ["", "yes", "no"]
    t12 = _table(results, 12).data.iloc[0]
    padded = results.per_question.query("schedule == 'packed' and pad_verify == 'true'")
    linear = results.per_question.query("schedule == 'linear'")
    expected = (padded.output_tokens.sum() / padded.wall_s.sum()) / (linear.output_tokens.sum() / linear.wall_s.sum())
    assert t12["Pairs"] == "3" and t12["Throughput ratio"] == pytest.approx(expected)


def test_every_comparison_has_questions_times_samples_pairs(tmp_path):
    """Native recorded under both orders is still compared once per question-sample, and T = 1
    runs with K samples give questions x K pairs."""
    questions, samples = 4, 3
    records = [
        make_record(model="tiny-set", family="setdlm", schedule=s, order=order, question=q, lossy=s == "native")
        for order in ("ltr", "confidence")
        for s in ("linear", "quadratic", "packed", "native")
        for q in range(questions)
    ]
    records += [
        make_record(task=task, schedule=s, temperature=t, question=q, sample=k, correct=None if task == "writingbench" else q % 2 == 0)
        for task in ("arith", "writingbench")
        for t in (0.0, 1.0)
        for s in ("linear", "quadratic", "packed")
        for q in range(questions)
        for k in range(samples if t > 0 else 1)
    ]  # fmt: skip
    write_records(tmp_path / "records", records)
    results = load_results(tmp_path, n_resamples=200)
    assert results.loaded.unverified_orders_skipped == questions
    fig3, fig4 = make_figure(3, results.comparisons).data, make_figure(4, results.comparisons).data
    speed3, speed4 = fig3[fig3.metric != "Accuracy difference (pp)"], fig4[fig4.metric != "Accuracy difference (pp)"]
    assert set(speed3["pairs"]) == {questions} and set(speed4["pairs"]) == {questions * samples}
    native = speed3[speed3.schedule == "native"]
    assert len(native) == 2 and native["setting"].str.contains("LTR").all()  # one setting: LTR verification
    assert set(_table(results, 10).data["Pairs"]) == {str(questions)}
    assert set(_table(results, 12).data["Pairs"]) == {str(questions)}
    assert set(_table(results, 13).data["Pairs"]) == {str(questions * samples)}
    t11 = _table(results, 11).data.set_index("Temperature")
    assert t11.loc["Temperature 0", "Pairs"] == str(questions) and t11.loc["Temperature 1", "Pairs"] == str(questions * samples)


def test_table11_has_a_temperature_0_and_a_temperature_1_half(results, tmp_path):
    data = _table(results, 11).data
    assert list(dict.fromkeys(data["Temperature"])) == ["Temperature 0", "Temperature 1"]
    t1 = data[data["Temperature"] == "Temperature 1"]
    assert set(t1["Pairs"]) == {str(12 * SAMPLES)}
    assert t1["Packed-SS − Linear-SS CI low"].notna().all()
    write_records(tmp_path / "records", [make_record(schedule=s, question=q) for s in ("linear", "packed") for q in range(3)])
    greedy_only = _table(load_results(tmp_path, n_resamples=200), 11)
    assert set(greedy_only.data["Temperature"]) == {"Temperature 0"}
    assert any(n.startswith("Temperature 1 (T > 0): no paired") for n in greedy_only.notes)


@pytest.mark.parametrize("number", [3, 4])
def test_ratio_figures_show_writingbench_for_speed_only(results, number):
    figure = make_figure(number, results.comparisons)
    writing = figure.data[figure.data["setting"].str.contains("WritingBench")]
    assert set(writing["schedule"]) == {"ar", "quadratic", "packed"}
    speed = writing[writing.metric.isin(["Throughput ratio", "NFE ratio"])]
    assert speed["estimate"].notna().all() and (speed["pairs"] == 12 * (SAMPLES if number == 4 else 1)).all()
    accuracy = writing[writing.metric == "Accuracy difference (pp)"]
    assert accuracy["estimate"].isna().all() and (accuracy["pairs"] == 0).all()
    labels = [tick.get_text() for tick in figure.figure.axes[-1].get_xticklabels()]
    assert any("WritingBench" in label for label in labels)
    assert sum(text.get_text() == "n/a" for text in figure.figure.axes[2].texts) == 3


def test_table2_measures_the_setdlm_maxima(tmp_path):
    records = [
        make_record(model="setdlm1.7b", family="setdlm", order="ltr", schedule=s, width=w, question=q, iterations=3)
        for s in ("linear", "quadratic", "packed")
        for w in (8, 16)
        for q in range(2)
    ]
    records += [make_record(model="nemotron8b", schedule=s, width=31, question=0) for s in ("linear", "quadratic", "packed")]
    write_records(tmp_path / "records", records)
    results = load_results(tmp_path, n_resamples=200)
    data = _table(results, 2, compare_paper=True).data
    setdlm = data[data["Model"] == "SetDLM 1.7B"].set_index(["Method", "W"])
    published = {8: {"Linear-SS": 25, "Quadratic-SS": 81, "Packed-SS": 25}, 16: {"Linear-SS": 49, "Quadratic-SS": 289, "Packed-SS": 49}}
    for width, rows in published.items():
        for method, value in rows.items():
            row = setdlm.loc[(method, width)]
            assert row["Max rows/iteration"] == row["Max rows/iteration (paper)"] == row["Rows/iteration (paper formula)"] == value
            assert row["B"] == width
    assert setdlm.loc[("Linear-SS", 8), "NFE/iteration"] == 2
    nemotron = data[data["Model"] == "Nemotron 8B"].set_index("Method")
    assert set(nemotron["B"]) == {32}
    assert nemotron.loc["Quadratic-SS", "Rows/iteration (paper formula)"] == 32 * 33
    assert nemotron.loc["Linear-SS", "Max rows/iteration"] == 64 and nemotron["Max rows/iteration (paper)"].isna().all()


def test_a_family_the_analysis_does_not_know_gets_a_run_summary(tmp_path, monkeypatch, capsys):
    ar, linear = FAMILIES["nemotron"].decoders[:2]
    toy_ar = type("ToyAR", (ar,), {"uses_width": True})
    fast = type("Fast", (linear,), {"name": "fast", "calls_per_iteration": 3, "rows_formula": ""})
    toy = dataclasses.replace(
        FAMILIES["nemotron"], name="toy", decoders=(toy_ar, fast), orders=(), block_of_width=lambda width: 2 * width,
    )  # fmt: skip
    monkeypatch.setitem(FAMILIES, "toy", toy)
    records = [make_record(model="toy-1", family="toy", schedule=s, width=4, question=q, iterations=5) for s in ("ar", "fast") for q in range(3)]
    write_records(tmp_path / "records", records)
    assert main([str(tmp_path), "--n-resamples", "200"]) == 0
    captured = capsys.readouterr()
    assert "bad line" not in captured.err
    runs = pd.read_csv(tmp_path / "tables" / "runs.csv")
    assert list(runs["Family"]) == ["toy", "toy"] and list(runs["Method"]) == ["AR", "fast"]
    assert list(runs["B"]) == [8, 8] and list(runs["Questions"]) == [3, 3] and runs["Tokens/s"].gt(0).all()
    assert "toy-1" in (tmp_path / "tables" / "runs.md").read_text()
    table2 = pd.read_csv(tmp_path / "tables" / "table2.csv").set_index("Method")
    assert table2.loc["fast", "NFE/iteration"] == 3 and table2.loc["fast", "Max rows/iteration"] == 3 * 8
    assert table2.loc["fast", "Formula"] == "-"
    # no Linear-SS to pair with: no Figure 3, and the one skipped line says so
    assert not (tmp_path / "figures" / "figure3.png").exists()
    assert [line for line in captured.out.splitlines() if line.startswith("skipped")][0].count("figure3") == 1
