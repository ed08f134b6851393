"""The cost twin's row scaling (packedss.models.cost_twin.row_scaling): before the timed decodes a
job with a cost twin times the cost model's calls of B and 2B rows, warns in one line when 2B
rows cost more than MEMORY_BOUND_RATIO times B rows, and its records and the tables' regime note
say so with the measured ratio. Every timing here is injected, so no verdict depends on the
machine's speed."""

from __future__ import annotations

import pytest
import torch

from packedss.analysis.load import load_records
from packedss.analysis.metrics import regime_note
from packedss.decoding.calls import causal_segment, pack
from packedss.models import cost_twin
from packedss.models.cost_twin import MEMORY_BOUND_RATIO, CostTwin, random_adapter, row_scaling, row_scaling_fields, shape_config
from packedss.paths import PROJECT_ROOT
from packedss.runner import run_job
from tests.test_runner import all_records, composed  # noqa: F401 (a fixture)

TINY = PROJECT_ROOT / "assets" / "models" / "tiny"
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def measured_afresh(monkeypatch):
    """Each test starts with no row scaling measured in the process (and leaves none behind)."""
    monkeypatch.setattr(cost_twin, "MEASURED_ROW_SCALING", {})


@pytest.fixture(scope="module")
def cost():
    return random_adapter(shape_config("test"), CPU, torch.float32, mask_token_id=3)


def scripted(seconds_by_rows: dict[int, list[float]], seen: list[tuple[int, int]]):
    """A timer that runs the call and returns the next scripted time for its row count; `seen`
    gets (rows, cached rows before the call) of each."""
    left = {rows: list(times) for rows, times in seconds_by_rows.items()}

    def timer(model, call) -> float:
        seen.append((call.rows, model.cached_rows))
        model.run(call)
        return left[call.rows].pop(0)

    return timer


def test_the_fastest_call_of_each_size_counts_and_each_runs_on_an_empty_cache(cost):
    cost.reset()
    cost.run(pack([causal_segment(torch.arange(5), 0)]))
    cost.commit(5)  # a response's rows in the cost model's own cache
    seen = []
    scaling = row_scaling(cost, 9, scripted({9: [3.0, 1.0], 18: [1.3, 4.0]}, seen))
    assert seen == [(9, 0), (18, 0), (9, 0), (18, 0)]  # alternated, never on another call's rows
    assert (scaling.rows, scaling.seconds, scaling.double_seconds) == (9, 1.0, 1.3)
    assert scaling.ratio == pytest.approx(1.3)
    assert not scaling.memory_bound and scaling.warning("x") is not None
    assert cost.cached_rows == 5  # the cost model's own cache is untouched
    cost.reset()


@pytest.mark.parametrize("double,bound", [(MEMORY_BOUND_RATIO, True), (MEMORY_BOUND_RATIO + 0.01, False)])
def test_the_memory_bound_regime_is_at_most_the_documented_ratio(cost, double, bound):
    scaling = row_scaling(cost, 4, scripted({4: [1.0, 1.0], 8: [double, double]}, []))
    assert scaling.memory_bound is bound
    assert (scaling.warning("test:2L:float32:cpu") is None) is bound


def test_a_cost_twin_says_in_one_line_when_two_b_rows_cost_more_than_b_rows(cost, capsys):
    twin = CostTwin(cost, cost, "test:2L:float32:cpu")
    fields = row_scaling_fields(twin, 9, scripted({9: [1.0, 1.0], 18: [2.5, 2.4]}, []))
    assert fields["cost_row_scaling"] == {"rows": 9, "ratio": 2.4, "seconds": 1.0, "double_seconds": 2.4,
                                          "memory_bound_at_most": MEMORY_BOUND_RATIO, "memory_bound": False}  # fmt: skip
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "warning: cost twin test:2L:float32:cpu: a call of 18 rows took 2.40x a call of 9 rows on this machine (the "
        f"memory-bound regime: at most {MEMORY_BOUND_RATIO:g}x), so its times are not that regime's and schedules with "
        "larger calls come out slower than there (docs/models.md §10)"
    ]
    assert row_scaling_fields(cost, 9) == {}  # a model that is not a twin: nothing measured, nothing said
    assert capsys.readouterr().err == ""


def _timed_by_rows(double: float):
    """charged_seconds for a whole run: every call runs; B = 9 rows take 1 s, 2B rows `double` s."""

    def timer(model, call) -> float:
        model.run(call)
        model.synchronize()
        return {9: 1.0, 18: double}.get(call.rows, 0.5)

    return timer


@pytest.mark.skipif(not (TINY / "config.json").is_file(), reason="the shipped tiny model is absent")
@pytest.mark.parametrize("double,warned", [(2.0, True), (1.1, False)])
def test_a_run_with_a_cost_twin_records_its_row_scaling_and_the_regime_note_names_it(
    composed, tmp_path, monkeypatch, capsys, double, warned  # noqa: F811
):
    monkeypatch.setattr(cost_twin, "charged_seconds", _timed_by_rows(double))
    out = tmp_path / "out"
    run_job(composed(["model=tiny", "schedule=packed", "width=8", "limit=2", "max_new_tokens=8", "progress=false",
                      "model.cost_shape=test", f"out_dir={out}"]))  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("warning: cost twin test:2L:float32:cpu: a call of 18 rows took 2.00x a call of 9 rows") == warned
    records = all_records(out)
    assert len(records) == 2
    assert {(r["cost_row_scaling"]["ratio"], r["cost_row_scaling"]["memory_bound"]) for r in records} == {(double, not warned)}
    note = regime_note(load_records(out).frame)
    said = ("Not the memory-bound regime: on cost twin test:2L:float32:cpu a call of 18 rows took 2.00x a call of 9 rows "
            f"(memory-bound: at most {MEMORY_BOUND_RATIO:g}x).")  # fmt: skip
    assert note.startswith("Measured in: eager, float32, 1 thread, cpu, cost:test:2L:float32:cpu")
    assert note.endswith(said) is warned and ("memory-bound" in note) is warned


@pytest.mark.skipif(not (TINY / "config.json").is_file(), reason="the shipped tiny model is absent")
def test_the_schedule_benchmarks_header_gives_its_twins_row_scaling_per_width(monkeypatch, capsys):
    from packedss.benchmark.schedules import BenchSettings, run

    monkeypatch.setattr(cost_twin, "charged_seconds", _timed_by_rows(2.0))  # 9 rows: 1 s, 18 rows: 2 s, else 0.5 s
    report = run(BenchSettings(model="tiny", limit=2, warmup=1, schedules=["linear"], widths=[2, 8], max_new_tokens=6,
                               grade=False, n_resamples=50, stream_mib=1, cost_shape="test"))  # fmt: skip
    assert report.header.endswith(f" 2B/B-row calls: W=2 1.00x, W=8 2.00x (memory-bound: at most {MEMORY_BOUND_RATIO:g}x)")
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: cost twin")]
    assert len(warnings) == 1 and "a call of 18 rows took 2.00x a call of 9 rows" in warnings[0]


def test_a_twins_row_scaling_is_measured_once_per_label_rows_and_threads_in_a_process(cost, capsys):
    seen = []
    timer = scripted({rows: [1.0 + (rows == 18)] * 6 for rows in (4, 8, 9, 18)}, seen)  # 18 rows: 2x 9 rows
    first = row_scaling_fields(CostTwin(cost, cost, "test:2L:float32:cpu"), 9, timer)
    assert len(seen) == 4
    later = row_scaling_fields(CostTwin(cost, cost.twin(), "test:2L:float32:cpu"), 9, timer)  # a later job's twin
    assert len(seen) == 4 and later == first  # not timed again: the first job's measurement
    assert capsys.readouterr().err.count("warning: cost twin test:2L:float32:cpu") == 2  # each job says it
    row_scaling_fields(CostTwin(cost, cost, "test:2L:float32:cpu"), 4, timer)  # another width
    assert [rows for rows, _ in seen[4:]] == [4, 8, 4, 8] and len(seen) == 8
    row_scaling_fields(CostTwin(cost, cost, "test:1L:float32:cpu"), 9, timer)  # another cost model
    assert len(seen) == 12
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        row_scaling_fields(CostTwin(cost, cost, "test:2L:float32:cpu"), 9, timer)  # another thread count
    finally:
        torch.set_num_threads(threads)
    assert len(seen) == 16


@pytest.mark.skipif(not (TINY / "config.json").is_file(), reason="the shipped tiny model is absent")
def test_a_sweeps_later_job_of_the_same_twin_and_width_reuses_the_first_ones_row_scaling(
    composed, tmp_path, monkeypatch, capsys  # noqa: F811
):
    measured = []
    monkeypatch.setattr(cost_twin, "row_scaling", lambda *args, **kw: measured.append(args[1]) or row_scaling(*args, **kw))
    out = tmp_path / "out"
    common = ["model=tiny", "width=8", "limit=1", "max_new_tokens=8", "progress=false", "model.cost_shape=test",
              f"out_dir={out}"]  # fmt: skip
    monkeypatch.setattr(cost_twin, "charged_seconds", _timed_by_rows(2.0))
    run_job(composed(["schedule=packed", *common]))
    monkeypatch.setattr(cost_twin, "charged_seconds", _timed_by_rows(1.1))  # a second measurement would say 1.1x
    run_job(composed(["schedule=linear", *common]))
    assert measured == [9]  # the first job's warm-up timed B = 9 and 18 rows; the second job's did not
    records = all_records(out)
    assert sorted(r["schedule"] for r in records) == ["linear", "packed"]
    assert {r["cost_row_scaling"]["ratio"] for r in records} == {2.0}
    assert capsys.readouterr().err.count("warning: cost twin test:2L:float32:cpu: a call of 18 rows took 2.00x") == 2
