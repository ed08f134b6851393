"""The concurrency tables and Figure C1 (docs/analysis.md §10), checked against sums computed here
from the records written, and the concurrency as a key of every other table and comparison."""

from __future__ import annotations

import numpy as np
import pytest

from packedss.analysis import analyse, load_results
from packedss.analysis.__main__ import main
from packedss.analysis.concurrency import concurrency_tables
from packedss.analysis.figures import make_figure
from packedss.analysis.tables import TABLES
from tests.analysis.synthetic import COST_MODEL, concurrency_results, concurrent_record, make_record, write_records

N = 200  # bootstrap resamples
QUESTIONS = 12
REGIME = f"eager, float32, 1 thread, cpu, cost:{COST_MODEL}"


def _tables(root):
    results = load_results(root, n_resamples=N)
    table, crossing = concurrency_tables(results.loaded.frame, results.per_response, N)
    return results, table, crossing


def _sums(records: list[dict], schedule: str, c: int) -> dict:
    own = [r for r in records if r["schedule"] == schedule and r["concurrency"] == c]
    return {
        "tokens": sum(r["output_tokens"] for r in own),
        "wall": sum(r["wall_s"] for r in own),
        "by_question": {r["question_id"]: r["wall_s"] for r in own},
    }


def _written(root) -> list[dict]:
    import json

    return [json.loads(line) for path in sorted((root / "records").rglob("*.jsonl")) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = concurrency_results(tmp_path_factory.mktemp("concurrency"), n=QUESTIONS)
    return root, _written(root), *_tables(root)


def test_each_row_is_one_run_at_one_c_with_its_own_sums(swept):
    root, records, results, table, _ = swept
    data = table.data
    assert len(data) == 3 * 4 and set(data["Regime"]) == {REGIME}
    for _, row in data.iterrows():
        schedule = {"AR": "ar", "Linear-SS": "linear", "Packed-SS": "packed"}[row["Method"]]
        c = int(row["C"])
        own = _sums(records, schedule, c)
        assert row["Responses"] == QUESTIONS
        assert row["Tokens/s (system)"] == pytest.approx(own["tokens"] / own["wall"])
        if schedule == "linear":
            assert np.isnan(row["Time / Linear-SS"]) and row["Pairs"] == ""
            continue
        base = _sums(records, "linear", c)
        assert row["Time / Linear-SS"] == pytest.approx(own["wall"] / base["wall"])
        assert row["Pairs"] == str(QUESTIONS)
        assert row["Time / Linear-SS CI low"] <= row["Time / Linear-SS"] <= row["Time / Linear-SS CI high"]
    assert list(table.display.columns[:6]) == ["Model", "Task", "Regime", "Method", "W", "C"]


def test_host_ms_per_round_is_the_host_time_over_the_batched_calls(swept):
    root, records, results, table, _ = swept
    for _, row in table.data.iterrows():
        schedule = {"AR": "ar", "Linear-SS": "linear", "Packed-SS": "packed"}[row["Method"]]
        own = [r for r in records if r["schedule"] == schedule and r["concurrency"] == int(row["C"])]
        # Every call of a record at C carried C requests: C records share each batched call.
        rounds = sum(r["nfe_total"] for r in own) / int(row["C"])
        host = sum(r["wall_s"] - r["model_s"] for r in own)
        assert row["Host ms / round"] == pytest.approx(host / rounds * 1000)


def test_latency_percentiles_interpolate_linearly(tmp_path):
    # latencies k, 2k, ..., 12k: p50 = 6.5k, p95 = k * (1 + 0.95 * 11) = 11.45k (numpy's linear rule)
    records = [
        concurrent_record(c, latency_s=0.1 * c * (q + 1), schedule=s, question=q, call_s=0.001 * c)
        for s in ("linear", "packed") for c in (1, 4) for q in range(QUESTIONS)
    ]  # fmt: skip
    write_records(tmp_path / "records", records)
    _, table, _ = _tables(tmp_path)
    for _, row in table.data.iterrows():
        k = 0.1 * int(row["C"])
        assert row["Latency p50 (s)"] == pytest.approx(6.5 * k)
        assert row["Latency p95 (s)"] == pytest.approx(11.45 * k)


def test_the_crossover_is_the_smallest_c_whose_ratio_reaches_one(swept):
    root, records, results, table, crossing = swept
    packed = crossing.data.set_index("Method").loc["Packed-SS"]
    ratios = {c: _sums(records, "packed", c)["wall"] / _sums(records, "linear", c)["wall"] for c in (1, 2, 4, 8)}
    expected = min(c for c, r in ratios.items() if r >= 1)
    assert expected == 4  # CALL_SHARE makes Packed-SS's calls dearer than Linear-SS's pair from C = 4
    assert packed["C paired"] == "1, 2, 4, 8" and packed["Crossover C"] == str(expected)
    assert packed["Time / Linear-SS at crossover"] == pytest.approx(ratios[expected])
    assert packed["CI above 1"] == ("yes" if packed["Time / Linear-SS at crossover CI low"] > 1 else "no")
    assert packed["Time / Linear-SS at largest C"] == pytest.approx(ratios[8])


def test_no_crossover_says_up_to_which_c(tmp_path):
    shares = {"linear": {1: 0.006, 2: 0.004}, "packed": {1: 0.007, 2: 0.0045}}
    records = _written(concurrency_results(tmp_path, n=6, concurrencies=(1, 2), shares=shares))
    _, _, crossing = _tables(tmp_path)
    [row] = crossing.data.to_dict("records")
    assert all(_sums(records, "packed", c)["wall"] < _sums(records, "linear", c)["wall"] for c in (1, 2))
    assert row["Crossover C"] == "none up to C=2" and np.isnan(row["Time / Linear-SS at crossover"])
    assert row["CI above 1"] == "-"


def test_a_ci_that_reaches_below_one_is_not_above_it(tmp_path):
    # Packed-SS at C = 2 is as fast as Linear-SS on average, faster on half the questions
    records = []
    for q in range(QUESTIONS):
        records.append(concurrent_record(2, 1.0, schedule="linear", question=q, call_s=0.005))
        records.append(concurrent_record(1, 1.0, schedule="linear", question=q, call_s=0.01))
        records.append(concurrent_record(1, 1.0, schedule="packed", question=q, call_s=0.01))
        records.append(concurrent_record(2, 1.0, schedule="packed", question=q, call_s=0.0112 if q % 2 else 0.0088))
    write_records(tmp_path / "records", records)
    _, _, crossing = _tables(tmp_path)
    [row] = crossing.data.to_dict("records")
    assert row["Crossover C"] in ("1", "2")
    assert row["Time / Linear-SS at crossover CI low"] < 1 and row["CI above 1"] == "no"


def test_regimes_are_separate_series_and_never_paired(tmp_path):
    records = [
        concurrent_record(c, 0.1, schedule=s, question=q, call_s=0.004 * (1 if compile == "none" else 0.5) / c, compile=compile)
        for compile in ("none", "default") for s in ("linear", "packed") for c in (1, 2) for q in range(4)
    ]  # fmt: skip
    write_records(tmp_path / "records", records)
    _, table, crossing = _tables(tmp_path)
    assert set(table.data["Regime"]) == {REGIME, REGIME.replace("eager", "compiled:default")}
    assert set(table.data[table.data["Method"] == "Packed-SS"]["Pairs"]) == {"4"}
    assert len(crossing.data) == 2


def test_concurrency_separates_rows_and_pairs_in_the_other_tables(swept):
    root, records, results, _, _ = swept
    t6 = TABLES[6].function(results.per_question, results.comparisons)
    assert "C" in t6.display.columns and len(t6.data) == 3 * 4
    packed = t6.data[t6.data["Method"] == "Packed-SS"].set_index("C")
    for c in (1, 2, 4, 8):
        own = _sums(records, "packed", c)
        assert packed.loc[str(c), "Tokens/s"] == pytest.approx(own["tokens"] / own["wall"])
    t12 = TABLES[12].function(results.per_question, results.comparisons)
    linear = t12.data[t12.data["Baseline"] == "Linear-SS"].set_index("Setting")
    twin = f" [cost_model={records[0]['cost_model']}]"  # these runs were timed on a cost twin
    assert list(linear.index) == [f"Tiny Arith{c}{twin}" for c in ("", " C=2", " C=4", " C=8")]
    assert set(linear["Pairs"]) == {str(QUESTIONS)}
    for c, setting in zip((1, 2, 4, 8), linear.index, strict=True):
        m, b = _sums(records, "packed", c), _sums(records, "linear", c)
        assert linear.loc[setting, "Throughput ratio"] == pytest.approx((m["tokens"] / m["wall"]) / (b["tokens"] / b["wall"]))
    t2 = TABLES[2].function(results.per_question, results.comparisons)
    assert sorted(t2.data["C"].unique()) == ["1", "2", "4", "8"]
    fig3 = make_figure(3, results.comparisons).data
    assert set(fig3[fig3.metric == "Throughput ratio"]["pairs"]) == {QUESTIONS} and fig3["setting"].str.contains("C=8").any()
    fig5 = make_figure(5, results.comparisons).data
    assert set(fig5["concurrency"]) == {1, 2, 4, 8}
    assert fig5[fig5.schedule == "linear"]["total_frac"].to_numpy() == pytest.approx(1.0)


def test_tables_at_c1_have_no_c_column(results_dir):
    results = load_results(results_dir, n_resamples=N)
    for number in (2, 3, 6, 8, 12):
        table = TABLES[number].function(results.per_question, results.comparisons)
        assert "C" not in table.display.columns, number
        assert not any("C=" in str(v) for v in table.display.get("Setting", []))


def test_figure_c1_plots_the_tables_numbers_on_a_log2_axis(swept, tmp_path):
    root, records, results, table, _ = swept
    figure = make_figure("C1", results.comparisons, records=results.loaded.frame)
    data = figure.data
    assert set(data["concurrency"]) == {1, 2, 4, 8} and len(data) == 12
    by = table.data.assign(C=table.data["C"].astype(int)).set_index(["Method", "C"])
    for _, row in data.iterrows():
        expected = by.loc[({"ar": "AR", "linear": "Linear-SS", "packed": "Packed-SS"}[row["schedule"]], row["concurrency"])]
        assert row["tokens_per_s"] == pytest.approx(expected["Tokens/s (system)"])
        assert row["latency_p95_s"] == pytest.approx(expected["Latency p95 (s)"])
    top, bottom = figure.figure.axes[:2]
    assert top.get_xscale() == "log" and bottom.get_xscale() == "log"
    assert top.get_ylabel() == "System tokens/s" and bottom.get_ylabel().startswith("p95 latency")
    assert len(top.lines) == 3


def test_cli_writes_the_concurrency_tables_and_figure(swept, tmp_path, capsys):
    root = swept[0]
    assert main([str(root), "--tables", "concurrency", "--figures", "C1", "--n-resamples", str(N), "--out", str(tmp_path)]) == 0
    for name in ("concurrency.csv", "concurrency.md", "concurrency.tex", "crossover.csv", "crossover.md", "crossover.tex"):
        assert (tmp_path / "tables" / name).stat().st_size > 0
    assert (tmp_path / "figures" / "figureC1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Crossover C" in (tmp_path / "tables" / "crossover.md").read_text()


def test_by_default_they_are_written_only_when_c_varies(swept, results_dir, tmp_path):
    names = {p.name for p in analyse(swept[0], n_resamples=N, out_dir=tmp_path / "swept").written}
    assert {"concurrency.csv", "crossover.csv", "figureC1.png"} <= names
    names = {p.name for p in analyse(results_dir, n_resamples=N, out_dir=tmp_path / "c1").written}
    assert not names & {"concurrency.csv", "crossover.csv", "figureC1.png"}
    assert "table6.csv" in names


@pytest.mark.parametrize("option, records, expected", [
    (["--tables", "concurrency"], "c1", "error: --tables concurrency needs a run measured at two or more concurrencies, and no run of these records is (C = 1); run its sweep over C"),
    (["--figures", "C1"], "c1", "error: --figures C1 needs a run measured at two or more concurrencies"),
    (["--tables", "concurrency"], "no linear", "error: --tables concurrency compares every schedule with Linear-SS at the same C, and no setting measured at several concurrencies has a Linear-SS run; add schedule=linear"),
])  # fmt: skip
def test_bad_inputs_get_one_error_line_and_write_nothing(tmp_path, capsys, option, records, expected):
    if records == "c1":
        written = [make_record(schedule=s, question=q) for s in ("linear", "packed") for q in range(3)]
    else:
        written = [concurrent_record(c, 0.1, schedule=s, question=q) for s in ("ar", "packed") for c in (1, 2) for q in range(3)]
    write_records(tmp_path / "records", written)
    assert main([str(tmp_path), *option, "--n-resamples", str(N)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and err[0].startswith(expected), err
    assert not (tmp_path / "tables").exists() and not (tmp_path / "figures").exists()


def test_records_without_latency_get_a_note_not_numbers(tmp_path):
    records = [concurrent_record(c, 0.1, schedule=s, question=q) for s in ("linear", "packed") for c in (1, 2) for q in range(3)]
    for record in records:
        del record["latency_s"]
    write_records(tmp_path / "records", records)
    _, table, _ = _tables(tmp_path)
    assert table.data["Latency p95 (s)"].isna().all() and set(table.display["Latency p95 (s)"]) == {"-"}
    assert any("without latency_s" in note for note in table.notes)
    assert table.data["Time / Linear-SS"].notna().sum() == 2


def test_the_runs_and_acceptance_tables_tell_cs_apart(swept):
    from packedss.analysis.acceptance import acceptance_profiles
    from packedss.analysis.acceptance_tables import acceptance_table, latency_table
    from packedss.analysis.measured_tables import runs_table

    _, _, results, _, _ = swept
    runs = runs_table(results.per_question, results.comparisons).data
    assert list(runs.columns[:13])[-1] == "C" and len(runs) == 12 and not runs.duplicated(["Method", "C"]).any()
    acceptance = acceptance_table(acceptance_profiles(results.per_response, N)).data
    assert len(acceptance) == 12 and not acceptance.duplicated(["Method", "C"]).any()
    latency = latency_table(results.loaded.frame).data
    assert len(latency) == 12 and not latency.duplicated(["Method", "C"]).any()


def test_the_latency_table_says_its_call_times_are_shares_once_c_varies(swept):
    from packedss.analysis.acceptance_tables import latency_table

    _, _, results, _, _ = swept
    frame = results.loaded.frame
    assert any("share of a batched call" in note for note in latency_table(frame).notes)
    alone = frame[frame["concurrency"] == 1]
    assert not any("share of a batched call" in note for note in latency_table(alone).notes)
