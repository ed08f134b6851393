"""What a reader sees names what ran: a cost twin's runs say so in Table 6, its CSV and Figure 3,
and the ratio figures name their regime and widths."""

from __future__ import annotations

import csv

import pytest

from packedss.analysis import analyse, load_results
from packedss.analysis.acceptance import acceptance_profiles
from packedss.analysis.acceptance_tables import acceptance_table, latency_table
from packedss.analysis.concurrency import concurrency_tables
from packedss.analysis.figures import make_figure
from packedss.analysis.measured_tables import runs_table, table2, table3
from packedss.analysis.metrics import NO_WIDTH
from tests.analysis.synthetic import concurrency_results, make_record, write_records

TWIN = "nemotron3b:6L:bfloat16:cpu"
SCHEDULES = ("ar", "linear", "quadratic", "packed")


def _folder(root, questions=6, **fields):
    records = [make_record(schedule=schedule, question=q, tokens_per_iteration={"ar": 1}.get(schedule, 3), **fields)
               for schedule in SCHEDULES for q in range(questions)]  # fmt: skip
    write_records(root / "records", records)
    return root


def _texts(figure) -> str:
    return "\n".join(t.get_text() for t in figure.findobj(lambda a: hasattr(a, "get_text")))


@pytest.fixture(scope="module")
def twin_results(tmp_path_factory):
    root = _folder(tmp_path_factory.mktemp("twin"), cost_model=TWIN)
    analyse(root, tables=[6], figures=[3], n_resamples=50)
    return root


def test_table6_and_its_csv_name_the_cost_twin(twin_results):
    rows = [line for line in (twin_results / "tables" / "table6.md").read_text().splitlines() if "Linear-SS" in line]
    assert rows and all(f"cost_model={TWIN}" in row for row in rows), rows
    with open(twin_results / "tables" / "table6.csv", newline="") as handle:
        measured = [row for row in csv.DictReader(handle) if row["Method"]]
    assert measured and all(f"cost_model={TWIN}" in row["Config"] for row in measured), measured


def test_figure3_names_the_cost_twin_in_its_panel_and_its_regime(twin_results):
    results = load_results(twin_results, n_resamples=50)
    figure = make_figure(3, results.comparisons)
    assert all(f"cost_model={TWIN}" in setting for setting in figure.data["setting"])
    texts = _texts(figure.figure)
    assert f"[cost_model={TWIN}]" in texts and f"eager, float32, 1 thread, cpu, cost:{TWIN}; W = 8" in texts
    with open(twin_results / "figures" / "figure3.csv", newline="") as handle:
        assert all(TWIN in row["setting"] for row in csv.DictReader(handle))


def test_without_a_twin_the_labels_stay_plain_and_name_the_regime(tmp_path):
    results = load_results(_folder(tmp_path), n_resamples=50)
    figure = make_figure(3, results.comparisons)
    assert not any("cost_model" in setting for setting in figure.data["setting"])
    texts = _texts(figure.figure)
    assert "eager, float32, 1 thread, cpu; W = 8" in texts
    assert "n/a: speed-only task" not in texts  # no speed-only task here
    assert "eager, float32, 1 thread, cpu; W = 8" in _texts(make_figure(5, results.comparisons).figure)


def test_an_accuracy_difference_of_zero_is_shown_as_0(tmp_path):
    results = load_results(_folder(tmp_path, correct=True), n_resamples=50)  # every schedule always right
    figure = make_figure(3, results.comparisons)
    accuracy = figure.data[figure.data["metric"] == "Accuracy difference (pp)"]
    assert (accuracy["estimate"] == 0).all()
    accuracy_axis = figure.figure.axes[2]
    assert sum(t.get_text() == "0" for t in accuracy_axis.texts) == len(accuracy)


def _ar_rows(table) -> list[dict]:
    rows = table.display[table.display["Method"] == "AR"].to_dict("records")
    assert rows, table.display
    return rows


def test_ar_shows_no_width_in_tables_2_3_runs_acceptance_latency_and_concurrency(tmp_path):
    results = load_results(_folder(tmp_path / "plain"), n_resamples=50)
    for table in (table2(results.per_question, results.comparisons), table3(results.per_question, results.comparisons),
                  runs_table(results.per_question, results.comparisons)):  # fmt: skip
        for row in _ar_rows(table):
            assert {row.get("W", NO_WIDTH), row["B"]} == {NO_WIDTH}, (table.key, row)
        others = table.display[table.display["Method"] != "AR"]
        assert (others["B"] != NO_WIDTH).all(), table.key  # the speculative schedules keep theirs
    profiles = acceptance_profiles(results.per_response, 50)
    for table in (acceptance_table(profiles), latency_table(results.loaded.frame)):
        assert all(row["W"] == NO_WIDTH for row in _ar_rows(table)), table.key
        assert (table.display.loc[table.display["Method"] == "Packed-SS", "W"] == "8").all(), table.key
    concurrent = load_results(concurrency_results(tmp_path / "concurrent", n=4), n_resamples=50)
    for table in concurrency_tables(concurrent.loaded.frame, concurrent.per_response, n_resamples=50):
        if "Method" in table.display:
            assert all(row["W"] == NO_WIDTH for row in _ar_rows(table)), table.key
            assert (table.display.loc[table.display["Method"] == "Packed-SS", "W"] == "8").all()


def _suptitle(figure) -> str:
    return figure._suptitle.get_text()


@pytest.mark.parametrize("cost_model,regime", [(None, "eager, float32, 1 thread, cpu"), (TWIN, f"eager, float32, 1 thread, cpu, cost:{TWIN}")])
def test_figures_a1_and_a2_and_the_profiles_name_the_regime(tmp_path, cost_model, regime):
    fields = {"cost_model": cost_model} if cost_model else {}
    results = load_results(_folder(tmp_path, questions=3, **fields), n_resamples=50)
    profiles = acceptance_profiles(results.per_response, 50)
    assert profiles and {profile["regime"] for profile in profiles} == {regime}
    for number in ("A1", "A2"):
        assert _suptitle(make_figure(number, results.comparisons, profiles).figure).splitlines()[-1] == regime, number


def test_a1_and_a2_say_so_when_a_profile_holds_no_regime(tmp_path):
    results = load_results(_folder(tmp_path, questions=3), n_resamples=50)
    profiles = [{k: v for k, v in profile.items() if k != "regime"} for profile in acceptance_profiles(results.per_response, 50)]
    assert _suptitle(make_figure("A2", results.comparisons, profiles).figure).endswith("\nregime not recorded")


def test_every_written_table_names_the_regime_of_its_runs(tmp_path):
    root = _folder(tmp_path / "one", questions=3)
    written = analyse(root, tables=[2, 6, 12, "acceptance"], figures=[], n_resamples=50).written
    for path in [p for p in written if p.suffix in (".md", ".tex")]:
        assert "Measured in: eager, float32, 1 thread, cpu (every run of these records)." in path.read_text(), path
    mixed = tmp_path / "two"
    write_records(mixed / "records", [make_record(schedule=s, question=q, **fields) for s in SCHEDULES for q in range(3)
                                      for fields in ({}, {"model": "tiny-2", "dtype": "bfloat16"})])  # fmt: skip
    analyse(mixed, tables=[6], figures=[], n_resamples=50)
    assert ("Measured in: eager, bfloat16, 1 thread, cpu | eager, float32, 1 thread, cpu (the runs of these records "
            "differ in how they were measured).") in (mixed / "tables" / "table6.md").read_text()


@pytest.mark.parametrize("family,model,schedules", [("setdlm", "tiny-set", ("ar", "linear", "packed")), ("nemotron", "tiny", SCHEDULES)])
def test_figure3_keeps_apart_runs_of_one_setting_that_differ_in_their_config(tmp_path, family, model, schedules):
    records = [make_record(model=model, family=family, schedule=s, question=q, tokens_per_iteration={"ar": 1}.get(s, 3), **fields)
               for s in schedules for q in range(3) for fields in ({}, {"dtype": "bfloat16"})]  # fmt: skip
    write_records(tmp_path / "records", records)
    figure = make_figure(3, load_results(tmp_path, n_resamples=50).comparisons)
    settings = set(figure.data["setting"])
    assert len(settings) == 2 and all("dtype=" in setting for setting in settings), settings
    assert not figure.data.duplicated(["setting", "schedule", "metric"]).any()


def test_every_csv_the_analysis_writes_names_the_regime(twin_results, tmp_path):
    regime = f"eager, float32, 1 thread, cpu, cost:{TWIN}"
    for path in [twin_results / "tables" / "table6.csv", twin_results / "figures" / "figure3.csv"]:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert rows and {row["measured_in"] for row in rows} == {regime}, path
    # two regimes: both named, in the order of the note
    mixed = _folder(tmp_path / "mixed")
    write_records(mixed / "records" / "twin", [make_record(schedule=s, question=q, cost_model=TWIN) for s in SCHEDULES for q in range(6)])
    analyse(mixed, tables=[6], figures=[], n_resamples=50)
    with open(mixed / "tables" / "table6.csv", newline="") as handle:
        values = {row["measured_in"] for row in csv.DictReader(handle)}
    assert values == {f"eager, float32, 1 thread, cpu | {regime}"}
