"""The paired tables: Table 10 (SetDLM efficiency), Table 11 (Nemotron accuracy differences, a
T = 0 half and a T = 1 half), Tables 12-13 (Nemotron efficiency at T = 0 and T > 0) and the SDAR
table (ours: every SDAR schedule's absolute measurements beside its paired comparison with AR).

Every comparison pairs the two runs' responses by question and sample (`bootstrap.compare`); its
CI resamples questions, each with all its samples. "Pairs" is the number of question-sample
pairs: questions x samples when both runs answered every one."""

from __future__ import annotations

import pandas as pd

from packedss.analysis import audit
from packedss.analysis.compare import Comparisons, Pairing
from packedss.analysis.metrics import (
    aggregate,
    block_label,
    model_label,
    order_rank,
    schedule_label,
    schedule_rank,
    task_label,
    task_rank,
    width_label,
)
from packedss.analysis.select import (
    LABEL_OF,
    NEMOTRON,
    SDAR,
    SETDLM,
    family_schedules,
    groups,
    key_labels,
    labels,
    optional_keys,
    speed_only_note,
    subset,
)
from packedss.analysis.table import ABS_COLS, ABS_NOTE, Col, Table, build

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


# The SDAR table: each schedule against the AR target of its model and task (docs/analysis.md §5.1).
AGAINST_AR_COLS = [
    Col("Δ wall vs AR (s)", kind="ci", digits=4, signed=True),
    Col("Throughput vs AR", kind="ci", digits=3),
    Col("NFE vs AR", kind="ci", digits=3),
    Col("Accuracy vs AR (pp)", kind="ci", digits=2, signed=True),
    Col("Pairs", kind="text"),
]
AGAINST_AR_NOTE = (
    "Against AR: each schedule's responses paired with those of the AR run of the same model, task, temperature and "
    "config, by question and sample (only question-samples both runs answered; Pairs = their number). Δ wall vs AR = "
    "mean(wall - wall_AR); throughput vs AR = (Σtok/Σwall) / (Σtok/Σwall)_AR and NFE vs AR = ΣNFE / ΣNFE_AR, ratios "
    "of pooled totals (the paper's averaging); accuracy vs AR = 100 · mean(correct - correct_AR) over the scored "
    "pairs, in points. Brackets: 95% paired bootstrap CIs over questions, each resampled with all its samples (BCa, "
    "percentile fallback). AR's own row is the base ('-')."
)
LOSSY_NOTE = (
    "Lossy = yes: the schedule is not meant to equal AR's output (the family's lossy schedules, records' `lossy`: "
    "SDAR native resolves a block's tokens by confidence, S2D2 by its acceptance rule and routing policy), so its "
    "accuracy against AR is part of its result. Lossy = no: the schedule emits AR's tokens (up to the numerical "
    "divergences the audit counts), and its accuracy against AR is 0 in exact arithmetic."
)


def _against_ar(comparisons: Comparisons, frame: pd.DataFrame, schedule: str, first: pd.Series) -> Pairing | None:
    """The pairing of one run (its per-question rows' first row) with the AR run of its setting."""
    for p in comparisons.pairings(schedule, "ar", frame):
        if (p.model, p.task, p.method_width, p.temperature, p.verify, p.config, p.concurrency) == (
            first["model"], first["task"], int(first["width"]), float(first["temperature"]), first["verify"],
            first["config"], int(first["concurrency"]),
        ):  # fmt: skip
            return p
    return None


def _cost_note(frame: pd.DataFrame) -> str:
    """Which cost model timed the rows: none (the model's own calls) or each cost twin."""
    twins = sorted({str(c) for c in frame["cost_model"] if isinstance(c, str) and c})
    if not twins:
        return "Cost model: none; every call is timed on the model named (its own weights)."
    return f"Cost model: {', '.join(twins)} (docs/models.md §10)."


def sdar_table(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """SDAR's schedules beside one another, one row per model, task, schedule and W: Table 6's
    absolute measurements and each schedule's paired comparison with the AR run of its model and
    task (Δ wall, throughput and NFE ratios, accuracy difference, with 95% CIs), the lossy
    schedules marked."""
    sub = subset(pq, family=SDAR, lora=False, schedules=family_schedules(SDAR))
    extra = [e for e in optional_keys(sub, ["model", "task", "schedule"], positive=True) if e != "width"]
    keys = ["Model", "Task", "Method", "W", "B", "Lossy"] + [LABEL_OF[e] for e in extra]
    rows, unpaired, padding = [], set(), False
    for values, g in groups(sub, ["model", "task", "schedule", "width"] + extra):
        agg = aggregate(g)
        names = labels(values, SDAR)
        row = key_labels(names, [k for k in keys if k not in ("W", "B", "Lossy")])
        row |= {"W": width_label(values["width"]), "B": block_label(SDAR, values["width"]),
                "Lossy": "yes" if g["lossy"].any() else "no"}  # fmt: skip
        row |= {c.name: agg[c.name] for c in ABS_COLS}
        if values["schedule"] != "ar":
            pairing = _against_ar(comparisons, sub, values["schedule"], g.iloc[0])
            compared = pairing is not None and (
                "pad_verify" not in values or set(comparisons.runs(pairing, "method")["pad_verify"]) == {values["pad_verify"]}
            )
            if pairing is None:
                unpaired.add(f"{names['Model']} {names['Task']}")
            elif not compared:
                padding = True
            if compared:
                c = comparisons.compare(pairing)
                row |= {"Δ wall vs AR (s)": c.delta_wall, "Throughput vs AR": c.throughput_ratio, "NFE vs AR": c.nfe_ratio,
                        "Accuracy vs AR (pp)": c.accuracy_diff if c.scored_pairs else None, "Pairs": str(c.pairs)}  # fmt: skip
        rows.append(row)
    notes = [
        ABS_NOTE + " Bold: highest tokens/s within each model and task.",
        AGAINST_AR_NOTE,
        "W: the width; B = W + 1 is every SDAR schedule's block (the draft block of Linear-SS and Packed-SS, the aligned "
        "block of SDAR native and S2D2; W = 3 is the release's block of 4). AR reads no W ('-').",
        LOSSY_NOTE,
    ]
    if unpaired:
        notes.append(f"No AR run of {', '.join(sorted(unpaired))}: its rows have no comparison ('-').")
    if padding:
        notes.append("Packed-SS ran both paddings: only the padded run is compared with AR (as in Tables 10-13).")
    notes.append(audit.note(audit.audit(sub), sampled=bool((sub["temperature"] > 0).all()) and not sub.empty))
    if not sub.empty:
        notes.append(_cost_note(sub))
    notes += speed_only_note(sub)
    bold_within = ["Model", "Task"] + [k for k in keys if k in ("T", "Verify", "C", "Config")]
    title = TITLES[SDAR]
    if not sub.empty:
        title = title.replace("SDAR schedules", f"{', '.join(model_label(m) for m in sorted(sub['model'].unique()))} (sdar family): the schedules", 1)
    cols = ABS_COLS + AGAINST_AR_COLS
    return build(SDAR, title, rows, keys, cols, compare_paper, bold_within, notes)


TITLES = {
    SDAR: "Table SDAR: SDAR schedules against the AR target of the same model and task.",
    10: "Table 10: Paired SetDLM efficiency comparisons.",
    11: "Table 11: Paired Nemotron accuracy differences (temperature 0 and temperature 1).",
    12: "Table 12: Paired Nemotron efficiency comparisons at temperature 0.",
    13: "Table 13: Paired Nemotron efficiency comparisons at temperature 1.",
}
