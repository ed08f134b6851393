"""`python -m packedss.plan`: a T = 1 job's estimate is the paper's time per NFE x NFE per
response x questions x samples (every sample is one response decoded)."""

from __future__ import annotations

import pytest

from packedss.analysis.paper_numbers import TABLE7
from packedss.plan import main, plan

QUESTIONS = 164  # HumanEval


def _paper_seconds(method: str) -> float:
    [row] = [r for r in TABLE7 if r["Model"] == "Nemotron 3B" and r["Task"] == "HumanEval" and r["Method"] == method]
    return row["Time/NFE (ms)"] / 1000 * row["NFE"]


@pytest.mark.parametrize("samples", [None, 5])
def test_t1_estimate_counts_every_sample(samples, capsys):
    sweep = ["+experiment=table7", "model=nemotron3b", "task=humaneval", "schedule=linear,quadratic"]
    if samples is not None:
        sweep.append(f"samples={samples}")
    jobs = plan([sweep])
    expected_samples = 23 if samples is None else samples  # the paper's 23 samples per question
    expected = {"linear": _paper_seconds("Linear-SS"), "quadratic": _paper_seconds("Quadratic-SS")}
    for job in jobs:
        assert job.temperature == 1.0 and job.samples == expected_samples
        assert job.estimate_s == pytest.approx(expected[job.schedule] * QUESTIONS * expected_samples)
    assert main(sweep) == 0
    lines = capsys.readouterr().out.splitlines()
    for line, schedule in zip(lines[1:3], ("linear", "quadratic")):
        assert line.split()[5] == schedule
        assert line.endswith(f"{expected[schedule] * QUESTIONS * expected_samples / 3600:.2f} h"), line
    total = sum(expected.values()) * QUESTIONS * expected_samples / 3600
    assert f"  nemotron3b: {total:.2f} h for its 2 jobs" in lines
