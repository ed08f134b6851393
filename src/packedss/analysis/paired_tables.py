"""The paired tables: Table 10 (SetDLM efficiency), Table 11 (Nemotron accuracy differences, a
T = 0 half and a T = 1 half) and Tables 12-13 (Nemotron efficiency at T = 0 and T > 0).

Every comparison pairs the two runs' responses by question and sample (`bootstrap.compare`); its
CI resamples questions, each with all its samples. "Pairs" is the number of question-sample
pairs: questions x samples when both runs answered every one."""

from __future__ import annotations

import pandas as pd

from packedss.analysis.compare import Comparisons
from packedss.analysis.metrics import model_label, order_rank, schedule_label, schedule_rank, task_label, task_rank
from packedss.analysis.select import NEMOTRON, SETDLM, subset
from packedss.analysis.table import Col, Table, build

PAIRED_COLS = [
    Col("Δ wall (s)", kind="ci", digits=4, signed=True),
    Col("Throughput ratio", kind="ci", digits=3),
    Col("NFE ratio", kind="ci", digits=3),
    Col("Pairs", kind="text"),
]

PAIRED_NOTES = [
    "Packed-SS against each baseline, paired by question and sample (only question-samples both runs answered; "
    "Pairs = their number). Δ wall = mean(wall_Packed - wall_baseline); throughput ratio = "
    "(Σtok/Σwall)_Packed / (Σtok/Σwall)_baseline; NFE ratio = ΣNFE_Packed / ΣNFE_baseline: ratios of pooled totals (the paper's averaging). Brackets: 95% paired "
    "bootstrap CIs over questions, each resampled with all its samples (BCa, percentile fallback).",
]

BASELINES = ("linear", "quadratic")


def _paired_rows(comparisons: Comparisons, frame: pd.DataFrame, with_model_task: bool) -> list[dict]:
    pairings = [p for base in BASELINES for p in comparisons.pairings("packed", base, frame)]
    pairings.sort(key=lambda p: (p.model, task_rank(p.task), p.temperature, p.verify, p.width or 0, order_rank(p.order), schedule_rank(p.base)))
    rows = []
    for p in pairings:
        c = comparisons.compare(p)
        row = {"Model": model_label(p.model), "Task": task_label(p.task)} if with_model_task else {}
        rows.append(
            row
            | {
                "T": f"{p.temperature:g}",
                "Setting": p.setting_label,
                "Baseline": schedule_label(p.base),
                "Δ wall (s)": c.delta_wall,
                "Throughput ratio": c.throughput_ratio,
                "NFE ratio": c.nfe_ratio,
                "Pairs": str(c.pairs),
            }
        )
    return rows


def table10(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Paired SetDLM efficiency comparisons at T = 0."""
    sub = subset(pq, family=SETDLM, temperature="zero", lora=False)
    rows = _paired_rows(comparisons, sub, with_model_task=True)
    return build(10, TITLES[10], rows, ["Model", "Task", "Setting", "Baseline"], PAIRED_COLS, compare_paper, None, list(PAIRED_NOTES))


def _nemotron_paired(number: int, pq: pd.DataFrame, comparisons: Comparisons, positive: bool, compare_paper: bool) -> Table:
    sub = subset(pq, family=NEMOTRON, temperature="positive" if positive else "zero", lora=False)
    rows = _paired_rows(comparisons, sub, with_model_task=False)
    keys = ["Setting", "Baseline"]
    if positive and len({r["T"] for r in rows}) > 1:
        keys = ["T"] + keys
    return build(number, TITLES[number], rows, keys, PAIRED_COLS, compare_paper, None, list(PAIRED_NOTES))


def table12(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Paired Nemotron efficiency comparisons at T = 0."""
    return _nemotron_paired(12, pq, comparisons, False, compare_paper)


def table13(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Paired Nemotron efficiency comparisons at T > 0 (paper: T = 1)."""
    return _nemotron_paired(13, pq, comparisons, True, compare_paper)


ACCURACY_PAIRS = (("packed", "linear"), ("packed", "quadratic"), ("linear", "quadratic"))


def difference_name(method: str, base: str) -> str:
    return f"{schedule_label(method)} − {schedule_label(base)}"


def _accuracy_half(comparisons: Comparisons, frame: pd.DataFrame, speed_only: set[str]) -> list[dict]:
    """The rows of one temperature half of Table 11, in the paper's order."""
    cells: dict[tuple, dict] = {}
    for method, base in ACCURACY_PAIRS:
        for p in comparisons.pairings(method, base, frame):
            c = comparisons.compare(p)
            if c.scored_pairs == 0:
                speed_only.add(task_label(p.task))
                continue
            key = (p.temperature, p.model, task_rank(p.task), p.verify, p.setting_label)
            cell = cells.setdefault(key, {"Temperature": f"Temperature {p.temperature:g}", "Setting": p.setting_label, "_pairs": []})
            cell[difference_name(method, base)] = c.accuracy_diff
            cell["_pairs"].append(str(c.scored_pairs))
    rows = []
    for key in sorted(cells):
        cell = cells[key]
        pairs = cell.pop("_pairs")
        cell["Pairs"] = pairs[0] if len(set(pairs)) == 1 else "/".join(pairs)
        rows.append(cell)
    return rows


def table11(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Paired Nemotron accuracy differences in percentage points: the paper's two halves,
    Temperature 0 and then Temperature 1 (every T > 0 present, each question's K samples paired
    sample by sample)."""
    sub = subset(pq, family=NEMOTRON, lora=False)
    speed_only: set[str] = set()
    notes = [
        "Accuracy differences in percentage points (pooled: the mean over all scored pairs), paired by question and sample (scored pairs only; Pairs = their "
        "number, per column when they differ); 95% paired bootstrap CIs over questions, each with all its samples."
    ]
    rows = []
    for half, name in (("zero", "Temperature 0"), ("positive", "Temperature 1 (T > 0)")):
        half_rows = _accuracy_half(comparisons, subset(sub, temperature=half), speed_only)
        if not half_rows:
            notes.append(f"{name}: no paired Nemotron runs of a scored task in the records.")
        rows += half_rows
    if speed_only:
        notes.append(f"{', '.join(sorted(speed_only))}: speed only, excluded from accuracy comparisons.")
    cols = [Col(difference_name(m, b), kind="ci", digits=2, signed=True) for m, b in ACCURACY_PAIRS] + [Col("Pairs", kind="text")]
    return build(11, TITLES[11], rows, ["Temperature", "Setting"], cols, compare_paper, None, notes)


TITLES = {
    10: "Table 10: Paired SetDLM efficiency comparisons.",
    11: "Table 11: Paired Nemotron accuracy differences (temperature 0 and temperature 1).",
    12: "Table 12: Paired Nemotron efficiency comparisons at temperature 0.",
    13: "Table 13: Paired Nemotron efficiency comparisons at temperature 1.",
}
