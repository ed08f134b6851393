"""`python -m packedss.plan` over concurrency=1,2,4,8: every C is a job of its own, shown in a C
column, and a C > 1 job's estimate is the paper's C = 1 time scaled by the SGLang call-time curve
(marked *); a plan without C > 1 is printed as before."""

from __future__ import annotations

import pytest

from packedss.analysis.paper_numbers import TABLE6
from packedss.plan import CALL_TIME_MS, call_time_ms, concurrency_factor, main, plan, rows_per_call

QUESTIONS = 378  # MBPP+
SWEEP = ["+experiment=table6", "model=nemotron3b", "task=mbpp"]


def _paper_seconds(method: str) -> float:
    [row] = [r for r in TABLE6 if r["Model"] == "Nemotron 3B" and r["Task"] == "MBPP" and r["Method"] == method]
    return row["Time/NFE (ms)"] / 1000 * row["NFE"]


def test_the_call_time_curve_interpolates_in_log_rows():
    for rows, ms in CALL_TIME_MS.items():
        assert call_time_ms(rows) == pytest.approx(ms)
    assert call_time_ms(2**5.5) == pytest.approx((5.58 + 6.58) / 2)  # halfway between 32 and 64 in log2
    assert call_time_ms(2**10.25) == pytest.approx(20.90 + 0.25 * (35.37 - 20.90))
    assert call_time_ms(1) == call_time_ms(32) == 5.58  # memory-bound: flat below the first point
    assert call_time_ms(8192) == pytest.approx(2 * 66.22)  # compute-bound: proportional past the last


def test_rows_per_call_come_from_the_schedules_formulas():
    assert rows_per_call("nemotron", "linear", 31) == 32  # two calls of B
    assert rows_per_call("nemotron", "packed", 31) == 64  # one call of 2B
    assert rows_per_call("nemotron", "quadratic", 7) == 72  # B(B+1)
    assert rows_per_call("nemotron", "ar", 0) == 1
    assert rows_per_call("setdlm", "linear", 8) == 12.5  # p+3u over two calls
    assert rows_per_call("setdlm", "native", 8) == 16  # no formula: its largest call


def test_a_response_at_c_costs_its_share_of_the_bigger_calls():
    assert concurrency_factor(32, 1) == 1
    assert concurrency_factor(32, 2) == pytest.approx(6.58 / 5.58 / 2)
    assert concurrency_factor(64, 8) == pytest.approx(14.65 / 6.58 / 8)  # 512 rows
    # the Packed/Linear model time per iteration at C = 4: one call of 64C rows against two of 32C
    assert call_time_ms(64 * 4) / (2 * call_time_ms(32 * 4)) == pytest.approx(0.57, abs=0.005)


def test_a_concurrency_sweep_is_planned_and_costed_per_c(capsys):
    sweep = SWEEP + ["concurrency=1,2,4,8"]
    jobs = plan([sweep])
    assert sorted((j.schedule, j.concurrency) for j in jobs) == sorted((s, c) for s in ("linear", "quadratic", "packed") for c in (1, 2, 4, 8))
    paper = {"linear": ("Linear-SS", 32), "quadratic": ("Quadratic-SS", 72), "packed": ("Packed-SS", 64)}
    for job in jobs:
        method, rows = paper[job.schedule]
        at_one = _paper_seconds(method) * QUESTIONS
        scale = call_time_ms(job.concurrency * rows) / call_time_ms(rows) / job.concurrency
        assert job.estimate_s == pytest.approx(at_one * scale)
        assert job.scaled == (job.concurrency > 1)
    assert main(sweep) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[header.index("samples") + 1] == "C"
    for line in lines[1:13]:
        c = line.split()[header.index("C") + 1]  # "mbpp (plus)" is two words
        assert line.endswith(" h*") == (c != "1"), line
    total = sum(j.estimate_s for j in jobs) / 3600
    assert f"  nemotron3b: {total:.2f} h for its 12 jobs (9 of them scaled to C > 1*)" in lines
    assert any(line.startswith("* scaled: the paper measures C = 1 only") for line in lines)


def test_a_plan_at_c1_prints_no_c_column_and_no_scaling(capsys):
    assert main(SWEEP) == 0
    out = capsys.readouterr().out
    assert " C " not in out.splitlines()[0] and "*" not in out and "scaled" not in out
    assert all(not job.scaled and job.concurrency == 1 for job in plan([SWEEP]))
