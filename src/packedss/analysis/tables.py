"""The paper's appendix tables 2-13 as functions of the per-question records frame.

Every function takes the per-question frame (`metrics.per_question`), a `Comparisons` cache
(paired tables) and `compare_paper`, and returns a `Table`: a numeric frame for CSV (CI columns
split into estimate / low / high) and a formatted frame for Markdown and LaTeX, in the paper's
layout and column names. The paper's group headers ("Nemotron 3B", the caption's model and
task) are explicit "Model" / "Task" columns so that one table can hold several models. A subset
with no records gives the rows that can be computed and a note, never an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from packedss.analysis import paper_numbers
from packedss.analysis.bootstrap import CI
from packedss.analysis.compare import Comparisons
from packedss.analysis.metrics import (
    aggregate,
    max_call_rows,
    max_iteration,
    model_label,
    model_ms_per_iteration,
    order_rank,
    schedule_label,
    schedule_rank,
    task_label,
    task_rank,
)

PAPER = "(paper)"


@dataclass(frozen=True)
class Col:
    """A value column: `kind` is "num" (a float), "ci" (a CI or (estimate, low, high)) or "text"."""

    name: str
    kind: str = "num"
    digits: int = 2
    signed: bool = False
    suffix: str = ""

    @property
    def header(self) -> str:
        return f"{self.name} [95% CI]" if self.kind == "ci" else self.name


@dataclass
class Table:
    number: int
    title: str
    data: pd.DataFrame  # CSV
    display: pd.DataFrame  # Markdown / LaTeX (strings)
    notes: list[str] = field(default_factory=list)
    bold: set[tuple[int, str]] = field(default_factory=set)  # (row, display column)


def _fmt(value, col: Col) -> str:
    if col.kind == "text":
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)
    if col.kind == "ci":
        if value is None:
            return "-"
        ci = value if isinstance(value, CI) else CI(*value, n=0, method="paper")
        return ci.format(col.digits, col.signed)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(float(value), f"{'+' if col.signed else ''}.{col.digits}f") + col.suffix


def _ci_parts(value) -> tuple[float, float, float]:
    if value is None:
        return (math.nan, math.nan, math.nan)
    if isinstance(value, CI):
        return (value.estimate, value.low, value.high)
    return tuple(float(v) for v in value)


def build(
    number: int,
    rows: list[dict],
    keys: list[str],
    values: list[Col],
    compare_paper: bool = False,
    bold_within: list[str] | None = None,
    notes: list[str] | None = None,
) -> Table:
    """Assemble a table from row dicts (key columns + value columns), optionally beside the
    paper's rows (matched on the key columns both have; unmatched paper rows are appended)."""
    notes = list(notes or [])
    rows = [dict(r, _measured=True) for r in rows]
    value_names = [c.name for c in values]
    paper_cols: list[str] = []
    if compare_paper:
        paper_rows = paper_numbers.PAPER_TABLES.get(number, [])
        if paper_rows:
            join = [k for k in keys if all(k in p for p in paper_rows)]
            paper_cols = [c for c in value_names if any(c in p for p in paper_rows)]
            matched: set[int] = set()
            for row in rows:
                for index, p in enumerate(paper_rows):
                    if index not in matched and all(str(row.get(k)) == str(p.get(k)) for k in join):
                        matched.add(index)
                        row.update({f"{c} {PAPER}": p.get(c) for c in paper_cols})
                        break
            for index, p in enumerate(paper_rows):
                if index not in matched:
                    rows.append({k: p.get(k, "") for k in keys} | {f"{c} {PAPER}": p.get(c) for c in paper_cols} | {"_measured": False})
            notes.append("Columns marked (paper) hold the paper's published numbers; '-' where it has none.")
    columns: list[Col] = []
    for col in values:
        columns.append(col)
        if col.name in paper_cols:
            columns.append(Col(f"{col.name} {PAPER}", col.kind, col.digits, col.signed, col.suffix))
    data_records, display_records = [], []
    for row in rows:
        data_row = {k: row.get(k, "") for k in keys}
        display_row = {k: "" if row.get(k) is None else str(row.get(k, "")) for k in keys}
        for col in columns:
            value = row.get(col.name)
            if col.kind == "ci":
                estimate, low, high = _ci_parts(value)
                data_row[col.name] = estimate
                data_row[f"{col.name} CI low"] = low
                data_row[f"{col.name} CI high"] = high
            else:
                data_row[col.name] = value
            display_row[col.header] = _fmt(value, col)
        data_records.append(data_row)
        display_records.append(display_row)
    data_columns = list(keys)
    for col in columns:
        data_columns += [col.name, f"{col.name} CI low", f"{col.name} CI high"] if col.kind == "ci" else [col.name]
    data = pd.DataFrame(data_records, columns=data_columns)
    display = pd.DataFrame(display_records, columns=list(keys) + [c.header for c in columns])
    bold: set[tuple[int, str]] = set()
    if bold_within is not None and "Tokens/s" in value_names:
        best: dict[tuple, tuple[float, int]] = {}
        for index, row in enumerate(rows):
            value = row.get("Tokens/s")
            if not row["_measured"] or value is None or not np.isfinite(value):
                continue
            group = tuple(str(row.get(k)) for k in bold_within)
            if group not in best or value > best[group][0]:
                best[group] = (value, index)
        bold = {(index, "Tokens/s") for _, index in best.values()}
    if not any(r["_measured"] for r in rows):
        notes.insert(0, "No records for this table in the results folder.")
    return Table(number, TITLES[number], data, display, notes, bold)


# ---------------------------------------------------------------------------------------------
# subsets and grouping


def subset(pq: pd.DataFrame, family=None, temperature=None, lora=None, schedules=None, order=None) -> pd.DataFrame:
    """temperature: "zero" (T = 0) or "positive" (T > 0)."""
    mask = pd.Series(True, index=pq.index)
    if family is not None:
        mask &= pq["family"] == family
    if temperature == "zero":
        mask &= pq["temperature"] == 0
    elif temperature == "positive":
        mask &= pq["temperature"] > 0
    if lora is not None:
        mask &= pq["lora"] == lora
    if schedules is not None:
        mask &= pq["schedule"].isin(schedules)
    if order is not None:
        mask &= pq["order_group"] == order
    return pq[mask]


def varies(frame: pd.DataFrame, within: list[str], column: str) -> bool:
    if frame.empty:
        return False
    return bool((frame.groupby(within)[column].nunique() > 1).any())


def _sort_key(column: str, value):
    if column == "schedule":
        return schedule_rank(value)
    if column == "task":
        return task_rank(value)
    if column == "order_group":
        return order_rank(value)
    if column == "pad_verify":
        return ({"true": 0, "false": 1}.get(value, 2), value)
    return (0, value)


def groups(frame: pd.DataFrame, by: list[str]):
    """(values dict, rows) for each group, in the paper's order (tasks, schedules, widths)."""
    if frame.empty:
        return []
    out = [(dict(zip(by, values if isinstance(values, tuple) else (values,), strict=True)), g) for values, g in frame.groupby(by, sort=False)]
    out.sort(key=lambda item: tuple(_sort_key(c, item[0][c]) for c in by))
    return out


def _labels(values: dict) -> dict:
    labels = {}
    if "model" in values:
        labels["Model"] = model_label(values["model"])
    if "task" in values:
        labels["Task"] = task_label(values["task"])
    if "schedule" in values:
        labels["Method"] = schedule_label(values["schedule"])
    if "width" in values:
        labels["B"] = int(values["width"]) + 1
        labels["Window"] = f"W={int(values['width'])}"
    if "temperature" in values:
        labels["T"] = f"{values['temperature']:g}"
    if "verify" in values:
        labels["Verify"] = values["verify"]
    if "pad_verify" in values:
        labels["Padded"] = {"true": "yes", "false": "no"}.get(values["pad_verify"], "")
    if "order_group" in values:
        labels["Order"] = ORDER_SECTIONS.get(values["order_group"], values["order_group"])
    return labels


ORDER_SECTIONS = {"ltr": "LTR verification and native decoding", "confidence": "Confidence-ordered verification"}

ABS_COLS = [
    Col("Tokens/s", digits=2),
    Col("Tokens/NFE", digits=3),
    Col("Time/NFE (ms)", digits=3),
    Col("Accuracy (%)", digits=2),
    Col("Tokens", digits=1),
    Col("Wall (s)", digits=3),
    Col("NFE", digits=2),
]


def _optional_keys(frame: pd.DataFrame, within: list[str], positive: bool) -> list[str]:
    """Columns added only when they tell rows apart (several widths per schedule, several
    temperatures or verification rules)."""
    extra = []
    if varies(frame, within, "width"):
        extra.append("width")
    if positive and varies(frame, within, "temperature"):
        extra.append("temperature")
    if positive and varies(frame, within, "verify"):
        extra.append("verify")
    if varies(frame, within, "pad_verify"):
        extra.append("pad_verify")
    return extra


LABEL_OF = {"width": "B", "temperature": "T", "verify": "Verify", "pad_verify": "Padded"}


def _speed_only_note(frame: pd.DataFrame) -> list[str]:
    speed = sorted({task_label(t) for t, g in frame.groupby("task") if g["correct_f"].isna().all()}) if not frame.empty else []
    return [f"{', '.join(speed)}: speed only (no accuracy)."] if speed else []


# ---------------------------------------------------------------------------------------------
# the tables


def table2(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Execution cost per iteration: measured NFE per iteration and the most rows evaluated in
    one iteration after prefill (Linear-SS's iteration = its two calls), beside the paper's
    formulas (Nemotron: B = W+1; SetDLM maxima: u_t = W, p = 1)."""
    rows = []
    padded = varies(pq, ["model", "family", "schedule", "width"], "pad_verify")
    for values, g in groups(pq, ["model", "family", "schedule", "width"] + (["pad_verify"] if padded else [])):
        width, schedule, family = int(values["width"]), values["schedule"], values["family"]
        calls = float((g["nfe_total"] - g["nfe_prefill"]).sum())
        iterations = float(g["iterations"].sum())
        biggest = max_iteration(g)
        formula_nfe, formula_rows, formula = _table2_formula(family, schedule, width)
        rows.append(
            {
                "Model": model_label(values["model"]),
                "Method": schedule_label(schedule),
                "W": width,
                "B": width + 1 if family == "ltr" else "",
                **({"Padded": _labels(values)["Padded"]} if padded else {}),
                "NFE/iteration": calls / iterations if iterations else math.nan,
                "NFE/iteration (paper formula)": formula_nfe,
                "Max rows/iteration": float(sum(biggest)) if biggest else math.nan,
                "Rows/iteration (paper formula)": formula_rows,
                "Formula": formula,
            }
        )
    notes = [
        "Measured: NFE/iteration = calls after prefill / iterations; Max rows/iteration = the most rows "
        "evaluated (padding and duplicates included) in one iteration after prefill, Linear-SS's two calls summed.",
        "Paper formulas: Nemotron (LTR) 2B, B(B+1), 2B with B = W+1; SetDLM (any-order) maxima p+3u_t, "
        "p+2u_t+u_t^2, p+3u_t at u_t = W, p = 1 (25/81/25 at W=8, 49/289/49 at W=16). "
        "Packed-SS reaches 2B only with a full previous draft (or pad_verify=true).",
    ]
    if compare_paper:
        notes.append("Table 2's published values are the formulas shown in the (paper formula) columns.")
    cols = [
        Col("NFE/iteration", digits=3),
        Col("NFE/iteration (paper formula)", digits=0),
        Col("Max rows/iteration", digits=0),
        Col("Rows/iteration (paper formula)", digits=0),
        Col("Formula", kind="text"),
    ]
    return build(2, rows, ["Model", "Method", "W", "B"] + (["Padded"] if padded else []), cols, False, None, notes)


def _table2_formula(family: str, schedule: str, width: int) -> tuple[float, float, str]:
    if family == "anyorder":
        return {
            "linear": (2, 3 * width + 1, "p+3u_t"),
            "packed": (1, 3 * width + 1, "p+3u_t"),
            "quadratic": (1, 1 + 2 * width + width * width, "p+2u_t+u_t^2"),
        }.get(schedule, (math.nan, math.nan, "-"))
    b = width + 1
    return {
        "ar": (1, 1, "1"),
        "linear": (2, 2 * b, "2B"),
        "packed": (1, 2 * b, "2B"),
        "quadratic": (1, b * (b + 1), "B(B+1)"),
    }.get(schedule, (math.nan, math.nan, "-"))


def table3(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Block-size probe: every LTR schedule and B at T = 0 (paper: Nemotron 8B GSM8K)."""
    sub = subset(pq, family="ltr", temperature="zero", lora=False, schedules=["ar", "linear", "quadratic", "packed"])
    padded = ["pad_verify"] if varies(sub, ["model", "task", "schedule", "width"], "pad_verify") else []
    keys = ["Model", "Task", "Method", "B"] + (["Padded"] if padded else [])
    rows = []
    for values, g in groups(sub, ["model", "task", "schedule", "width"] + padded):
        agg = aggregate(g)
        labels = _labels(values)
        rows.append(
            {k: labels[k] for k in keys}
            | {c: agg[c] for c in ("Tokens/s", "Wall (s)", "Total NFE", "Tokens", "Accuracy (%)")}
            | {"Rows/call": max_call_rows(g)}
        )
    cols = [
        Col("Tokens/s", digits=1),
        Col("Rows/call", digits=0),
        Col("Wall (s)", digits=3),
        Col("Total NFE", digits=1),
        Col("Tokens", digits=1),
        Col("Accuracy (%)", digits=1),
    ]
    notes = ["Rows/call: the most input rows of any call after prefill. Wall, Total NFE, Tokens: means per response."]
    notes += _speed_only_note(sub)
    return build(3, rows, keys, cols, compare_paper, None, notes)


def table4(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Proposal-only LoRA runs (lora = true), T = 0: means and throughput."""
    sub = subset(pq, family="ltr", temperature="zero", lora=True)
    extra = _optional_keys(sub, ["model", "task", "schedule"], positive=False)
    keys = ["Model", "Task", "Method"] + [LABEL_OF[e] for e in extra]
    rows = []
    for values, g in groups(sub, ["model", "task", "schedule"] + extra):
        agg = aggregate(g)
        labels = _labels(values)
        rows.append({k: labels[k] for k in keys} | {k: agg[k] for k in ("Tokens", "Total NFE", "Model (s)", "Non-model (s)", "Wall (s)", "Tokens/s", "Accuracy (%)")})
    cols = [
        Col("Tokens", digits=1),
        Col("Total NFE", digits=2),
        Col("Model (s)", digits=3),
        Col("Non-model (s)", digits=3),
        Col("Wall (s)", digits=3),
        Col("Tokens/s", digits=2),
        Col("Accuracy (%)", digits=2),
    ]
    notes = ["Means per response; model and non-model time sum to the inclusive decoder wall time."]
    if sub.empty:
        notes.append("Needs records with lora=true (the proposal-only LoRA runs).")
    notes += _speed_only_note(sub)
    return build(4, rows, keys, cols, compare_paper, None, notes)


def table5(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Model execution time per iteration with and without the proposal-only LoRA, T = 0."""
    sub = subset(pq, family="ltr", temperature="zero")
    extra = _optional_keys(sub, ["model", "task", "schedule"], positive=False)
    keys = ["Model", "Task", "Method"] + [LABEL_OF[e] for e in extra]
    rows = []
    for values, g in groups(sub, ["model", "task", "schedule", "width"] + [e for e in extra if e == "pad_verify"]):
        base, lora = g[~g["lora"]], g[g["lora"]]
        biggest = max_iteration(g)
        selected = max_iteration(lora, "lora_rows_selected") if not lora.empty else None
        evaluated = max_iteration(lora, "lora_rows_evaluated") if not lora.empty else None
        base_ms = model_ms_per_iteration(base) if not base.empty else math.nan
        lora_ms = model_ms_per_iteration(lora) if not lora.empty else math.nan
        labels = _labels(values)
        rows.append(
            {k: labels[k] for k in keys}
            | {
                "Query rows": "+".join(str(r) for r in biggest) if biggest else None,
                "Selected": float(sum(selected)) if selected else math.nan,
                "Evaluated": float(sum(evaluated)) if evaluated else math.nan,
                "Base ms": base_ms,
                "LoRA ms": lora_ms,
                "Increase": 100.0 * (lora_ms / base_ms - 1.0) if base_ms > 0 else math.nan,
            }
        )
    cols = [
        Col("Query rows", kind="text"),
        Col("Selected", digits=0),
        Col("Evaluated", digits=0),
        Col("Base ms", digits=2),
        Col("LoRA ms", digits=2),
        Col("Increase", digits=1, suffix="%"),
    ]
    notes = [
        "Per iteration after prefill (Linear-SS: both calls). Query rows, Selected (rows receiving adapter updates) "
        "and Evaluated (rows for which they are computed): the iteration with the most rows.",
        "Base/LoRA ms: model time per iteration = Σ model_s / Σ iterations over lora=false / lora=true records "
        "(prefill call included unless records carry per-call times, call_model_s).",
    ]
    if sub.empty or not sub["lora"].any():
        notes.append("No lora=true records: Selected, Evaluated, LoRA ms and Increase need the LoRA runs.")
    if sub.empty or sub["lora"].all():
        notes.append("No lora=false records: Base ms needs the runs without the adapter.")
    return build(5, rows, keys, cols, compare_paper, None, notes)


def _absolute_table(number: int, pq: pd.DataFrame, positive: bool, compare_paper: bool) -> Table:
    sub = subset(pq, family="ltr", temperature="positive" if positive else "zero", lora=False, schedules=["ar", "linear", "quadratic", "packed"])
    extra = _optional_keys(sub, ["model", "task", "schedule"], positive)
    keys = ["Model", "Task", "Method"] + [LABEL_OF[e] for e in extra]
    rows = []
    for values, g in groups(sub, ["model", "task", "schedule"] + extra):
        agg = aggregate(g)
        labels = _labels(values)
        rows.append({k: labels[k] for k in keys} | {c.name: agg[c.name] for c in ABS_COLS})
    bold_within = ["Model", "Task"] + [k for k in keys if k in ("T", "Verify")]
    notes = ["Tokens, wall time and NFE are means per response; rates use aggregate totals. Bold: highest tokens/s within each model and task."]
    notes += _speed_only_note(sub)
    return build(number, rows, keys, ABS_COLS, compare_paper, bold_within, notes)


def table6(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """LTR-family (Nemotron) absolute measurements at temperature 0."""
    return _absolute_table(6, pq, False, compare_paper)


def table7(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """LTR-family (Nemotron) absolute measurements at temperature > 0 (paper: T = 1)."""
    return _absolute_table(7, pq, True, compare_paper)


def _setdlm_table(number: int, pq: pd.DataFrame, compare_paper: bool, orders: list[str]) -> Table:
    sub = subset(pq, family="anyorder", temperature="zero", lora=False)
    sub = sub[sub["order_group"].isin(orders)]
    by = ["model", "task"] + (["order_group"] if number == 9 else []) + ["width", "schedule"]
    keys = ["Model", "Task"] + (["Order"] if number == 9 else []) + ["Window", "Method"]
    rows = []
    for values, g in groups(sub, by):
        agg = aggregate(g)
        labels = _labels(values)
        rows.append({k: labels[k] for k in keys} | {c.name: agg[c.name] for c in ABS_COLS})
    notes = [
        "Tokens, wall time and NFE are means per response; rates use aggregate totals. "
        "Native decoding is listed with LTR verification. Bold: highest tokens/s within each window"
        + (" and order." if number == 9 else ".")
    ]
    notes += _speed_only_note(sub)
    bold_within = ["Model", "Task"] + (["Order"] if number == 9 else []) + ["Window"]
    return build(number, rows, keys, ABS_COLS, compare_paper, bold_within, notes)


def table8(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Any-order (SetDLM) absolute measurements, LTR verification and native decoding, T = 0."""
    return _setdlm_table(8, pq, compare_paper, ["ltr"])


def table9(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Any-order (SetDLM) measurements, top: LTR + native; bottom: confidence order, T = 0."""
    return _setdlm_table(9, pq, compare_paper, ["ltr", "confidence"])


PAIRED_COLS = [
    Col("Δ wall (s)", kind="ci", digits=4, signed=True),
    Col("Throughput ratio", kind="ci", digits=3),
    Col("NFE ratio", kind="ci", digits=3),
    Col("Pairs", kind="text"),
]


def _paired_rows(comparisons: Comparisons, frame: pd.DataFrame, with_model_task: bool) -> list[dict]:
    pairings = []
    for base in ("linear", "quadratic"):
        pairings += comparisons.pairings("packed", base, frame)
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


PAIRED_NOTES = [
    "Packed-SS against each baseline, paired by question (only questions both runs answered; Pairs = their number). "
    "Δ wall = mean(wall_Packed - wall_baseline); throughput ratio = (Σtok/Σwall)_Packed / (Σtok/Σwall)_baseline; "
    "NFE ratio = ΣNFE_Packed / ΣNFE_baseline. Brackets: 95% paired bootstrap CIs (BCa, percentile fallback).",
]


def table10(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Paired any-order (SetDLM) efficiency comparisons at T = 0."""
    sub = subset(pq, family="anyorder", temperature="zero", lora=False)
    rows = _paired_rows(comparisons, sub, with_model_task=True)
    return build(10, rows, ["Model", "Task", "Setting", "Baseline"], PAIRED_COLS, compare_paper, None, list(PAIRED_NOTES))


def _nemotron_paired(number: int, pq: pd.DataFrame, comparisons: Comparisons, positive: bool, compare_paper: bool) -> Table:
    sub = subset(pq, family="ltr", temperature="positive" if positive else "zero", lora=False)
    rows = _paired_rows(comparisons, sub, with_model_task=False)
    keys = ["Setting", "Baseline"]
    if positive and len({r["T"] for r in rows}) > 1:
        keys = ["T"] + keys
    return build(number, rows, keys, PAIRED_COLS, compare_paper, None, list(PAIRED_NOTES))


def table12(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Paired LTR-family (Nemotron) efficiency comparisons at T = 0."""
    return _nemotron_paired(12, pq, comparisons, False, compare_paper)


def table13(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Paired LTR-family (Nemotron) efficiency comparisons at T > 0 (paper: T = 1)."""
    return _nemotron_paired(13, pq, comparisons, True, compare_paper)


ACCURACY_PAIRS = (("packed", "linear"), ("packed", "quadratic"), ("linear", "quadratic"))


def _diff_name(method: str, base: str) -> str:
    return f"{schedule_label(method)} − {schedule_label(base)}"


def table11(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Paired LTR-family (Nemotron) accuracy differences in percentage points, by temperature."""
    sub = subset(pq, family="ltr", lora=False)
    cells: dict[tuple, dict] = {}
    speed_only = set()
    for method, base in ACCURACY_PAIRS:
        for p in comparisons.pairings(method, base, sub):
            c = comparisons.compare(p)
            if c.accuracy_diff.n == 0:
                speed_only.add(task_label(p.task))
                continue
            key = (p.model, task_rank(p.task), p.temperature, p.verify, p.setting_label)
            temperature = "Temperature 0" if p.temperature == 0 else f"Temperature {p.temperature:g}"
            cell = cells.setdefault(key, {"Temperature": temperature, "Setting": p.setting_label, "_pairs": []})
            cell[_diff_name(method, base)] = c.accuracy_diff
            cell["_pairs"].append(str(c.accuracy_diff.n))
    rows = []
    for key in sorted(cells, key=lambda k: (k[2], k[0], k[1], k[3], k[4])):
        cell = cells.pop(key)
        pairs = cell.pop("_pairs")
        cell["Pairs"] = pairs[0] if len(set(pairs)) == 1 else "/".join(pairs)
        rows.append(cell)
    cols = [Col(_diff_name(m, b), kind="ci", digits=2, signed=True) for m, b in ACCURACY_PAIRS] + [Col("Pairs", kind="text")]
    notes = [
        "Accuracy differences in percentage points, paired by question (scored pairs only; Pairs = their number, "
        "per column when they differ); 95% paired bootstrap CIs."
    ]
    if speed_only:
        notes.append(f"{', '.join(sorted(speed_only))}: speed only, excluded from accuracy comparisons.")
    return build(11, rows, ["Temperature", "Setting"], cols, compare_paper, None, notes)


TITLES = {
    2: "Table 2: Execution cost per iteration with cached prompt context.",
    3: "Table 3: Block-size probe (paper: Nemotron 8B GSM8K).",
    4: "Table 4: Runs with proposal-only LoRA (paper: Nemotron 8B GSM8K).",
    5: "Table 5: Model execution time per iteration (paper: Nemotron 8B GSM8K).",
    6: "Table 6: Nemotron (LTR) absolute measurements at temperature 0.",
    7: "Table 7: Nemotron (LTR) absolute measurements at temperature 1.",
    8: "Table 8: SetDLM (any-order) absolute measurements, LTR verification and native decoding.",
    9: "Table 9: SetDLM (any-order) measurements: LTR verification and native decoding; confidence-ordered verification.",
    10: "Table 10: Paired SetDLM (any-order) efficiency comparisons.",
    11: "Table 11: Paired Nemotron (LTR) accuracy differences.",
    12: "Table 12: Paired Nemotron (LTR) efficiency comparisons at temperature 0.",
    13: "Table 13: Paired Nemotron (LTR) efficiency comparisons at temperature 1.",
}


@dataclass(frozen=True)
class TableSpec:
    function: Callable[..., Table]
    needs: str  # the record subset the table reads
    experiment: str  # the run.py experiment preset that produces it


TABLES: dict[int, TableSpec] = {
    2: TableSpec(table2, "any records (rows_evaluated per call, iterations), every schedule and W", "table2"),
    3: TableSpec(table3, "LTR family, T=0, lora=false, several widths", "table3"),
    4: TableSpec(table4, "LTR family, T=0, lora=true", "table4"),
    5: TableSpec(table5, "LTR family, T=0, lora=true and lora=false", "table5"),
    6: TableSpec(table6, "LTR family, T=0, lora=false", "table6"),
    7: TableSpec(table7, "LTR family, T>0, lora=false", "table7"),
    8: TableSpec(table8, "any-order family, T=0, LTR order + native", "table8"),
    9: TableSpec(table9, "any-order family, T=0, LTR and confidence orders + native", "table9"),
    10: TableSpec(table10, "any-order family, T=0: packed with linear and quadratic", "table10"),
    11: TableSpec(table11, "LTR family, T=0 and T>0, scored tasks: packed, linear, quadratic", "table11"),
    12: TableSpec(table12, "LTR family, T=0: packed with linear and quadratic", "table12"),
    13: TableSpec(table13, "LTR family, T>0: packed with linear and quadratic", "table13"),
}
