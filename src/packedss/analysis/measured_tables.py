"""The tables of measurements per run: the per-run summary (`runs`, every family), Table 2
(execution cost per iteration, every family), Tables 3-7 (Nemotron) and Tables 8-9 (SetDLM).

Every function takes the per-question frame (`metrics.per_question`), a `Comparisons` cache and
`compare_paper`, and returns a `Table` in the paper's layout and column names. The paper's group
headers ("Nemotron 3B", the caption's model and task) are explicit "Model" / "Task" columns so
that one table can hold several models. A subset with no records gives the rows that can be
computed and a note, never an error."""

from __future__ import annotations

import math

import pandas as pd

from packedss.analysis import audit, paper_numbers
from packedss.analysis.compare import Comparisons
from packedss.analysis.load import RUN_KEYS
from packedss.analysis.metrics import (
    ORDER_LABELS,
    aggregate,
    block_label,
    family_rank,
    max_call_rows,
    max_iteration,
    model_label,
    model_ms_per_iteration,
    order_rank,
    rates,
    schedule_label,
    schedule_rank,
    task_label,
    task_rank,
    width_label,
)
from packedss.analysis.select import (
    LABEL_OF,
    key_labels,
    NEMOTRON,
    SETDLM,
    family_schedules,
    groups,
    labels,
    optional_keys,
    speed_only_note,
    subset,
    varies,
)
from packedss.analysis.table import ABS_COLS, ABS_NOTE, Col, Table, build
from packedss.families import FAMILIES

RATE_COLS = [
    Col("Tokens/NFE (per request)", digits=3),
    Col("Tokens/s (per request)", digits=2),
    Col("Acceptance (%)", digits=2),
    Col("Acceptance (%) (per request)", digits=2),
]


def runs_table(pq: pd.DataFrame, comparisons: Comparisons) -> Table:
    """One row per run of any family: what ran (model, family, task, schedule, W, B, T, ...), how
    many questions, samples and repeats, the absolute measurements, and the rates averaged per
    request beside the pooled ones."""
    responses = dict(list(comparisons.responses.groupby(list(RUN_KEYS), sort=False, dropna=False)))
    rows = []
    runs = [(dict(zip(RUN_KEYS, values, strict=True)), g) for values, g in pq.groupby(list(RUN_KEYS), sort=False, dropna=False)]
    runs.sort(
        key=lambda item: (
            family_rank(item[0]["family"]), item[0]["model"], task_rank(item[0]["task"]), item[0]["temperature"],
            item[0]["verify"], item[0]["lora"], order_rank(item[0]["order"]), schedule_rank(item[0]["schedule"]),
            item[0]["width"], item[0]["pad_verify"], item[0]["seed"], item[0]["concurrency"],
        )
    )  # fmt: skip
    audited = audit.counts_by_run(audit.audit(pq))
    for run, g in runs:
        agg = aggregate(g)
        run_rates = rates(responses[tuple(run.values())])
        verdicts = audited.get(tuple(run[k] for k in RUN_KEYS))
        rows.append(
            {
                "Model": model_label(run["model"]),
                "Family": run["family"],
                "Task": task_label(run["task"]),
                "Method": schedule_label(run["schedule"]),
                "W": width_label(run["width"]),
                "B": block_label(run["family"], run["width"]),
                "T": f"{run['temperature']:g}",
                "Verify": run["verify"],
                "Order": ORDER_LABELS.get(run["order"], run["order"]),
                "LoRA": "yes" if run["lora"] else "no",
                "Padded": {"true": "yes", "false": "no"}.get(run["pad_verify"], ""),
                "Seed": int(run["seed"]),
                "C": str(int(run["concurrency"])),
                "Config": run["config"],
                "Questions": len(g),
                "Samples": int(g["samples"].max()),
                "Repeats": int(g["repeats"].max()),
            }
            | {name.capitalize(): "" if verdicts is None else verdicts[name] for name in audit.CLASSES}
            | {c.name: agg[c.name] for c in ABS_COLS}
            | {f"{name} (per request)": pair[1] for name, pair in run_rates.items()}
            | {"Acceptance (%)": run_rates["Acceptance (%)"][0]}
        )
    keys = ["Model", "Family", "Task", "Method", "W", "B", "T", "Verify", "Order", "LoRA", "Padded", "Seed", "Config",
            "Questions", "Samples", "Repeats"] + [name.capitalize() for name in audit.CLASSES]  # fmt: skip
    notes = [
        "One row per run (every family in the records). " + ABS_NOTE,
        "Equal, Numerical, Context, Unexplained: the divergence audit of a lossless run at T = 0 against AR "
        "(docs/analysis.md; Context: past the model's context, after a call that dropped cache rows).",
        "Samples: independent samples per question (T > 0), averaged per question; Repeats: timings of each response, averaged.",
        "Pooled rates (Tokens/s, Tokens/NFE, Acceptance) are aggregate totals, the paper's; '(per request)' columns are "
        "the means of each response's own rate. Acceptance = drafts accepted / drafts verified.",
    ]
    notes += comparisons.sign_flips()
    notes += speed_only_note(pq)
    return build("runs", "Runs: one row per run in the records.", rows, keys, ABS_COLS + RATE_COLS, False, None, notes)


def row_formula(family: str, schedule: str, width: int) -> tuple[float, float, str]:
    """(NFE per iteration, rows per iteration, formula) of the paper's Table 2, from the schedule's
    own description; NaN and "-" for a family or schedule the paper gives no formula for."""
    decoder = next((d for d in FAMILIES[family].decoders if d.name == schedule), None) if family in FAMILIES else None
    if decoder is None or not decoder.rows_formula:
        return (math.nan, math.nan, "-")
    return (decoder.calls_per_iteration, decoder.rows_per_iteration(width), decoder.rows_formula)


def _paper_setdlm_maximum(family: str, schedule: str, width: int) -> float:
    column = f"SetDLM W={width}"
    for row in paper_numbers.TABLE2 if family == SETDLM else []:
        if row["Method"] == schedule_label(schedule) and column in row:
            return float(row[column])
    return math.nan


def table2(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Execution cost per iteration, every family: measured NFE per iteration and the most rows
    evaluated in one iteration after prefill (an iteration = the family's calls per iteration,
    e.g. Linear-SS's two calls), over every response, beside the paper's formulas (B from W by
    the family's block rule)."""
    rows = []
    responses = comparisons.responses
    by = ["family", "model", "schedule", "width"]
    padded = varies(responses, by, "pad_verify")
    ordered = sorted(groups(responses, by + (["pad_verify"] if padded else [])), key=lambda item: family_rank(item[0]["family"]))
    for values, g in ordered:
        width, schedule, family = int(values["width"]), values["schedule"], values["family"]
        calls = float((g["nfe_total"] - g["nfe_prefill"]).sum())
        iterations = float(g["iterations"].sum())
        biggest = max_iteration(g)
        formula_nfe, formula_rows, formula = row_formula(family, schedule, width)
        row = {
            "Model": model_label(values["model"]),
            "Method": schedule_label(schedule),
            "W": width_label(width),
            "B": block_label(family, width),
            **({"Padded": labels(values)["Padded"]} if padded else {}),
            **({"C": labels(values)["C"]} if "concurrency" in values else {}),
            **({"Config": values["config"]} if values.get("config") else {}),
            "NFE/iteration": calls / iterations if iterations else math.nan,
            "NFE/iteration (paper formula)": formula_nfe,
            "Max rows/iteration": float(sum(biggest)) if biggest else math.nan,
            "Rows/iteration (paper formula)": formula_rows,
            "Formula": formula,
        }
        if compare_paper:
            row["Max rows/iteration (paper)"] = _paper_setdlm_maximum(family, schedule, width)
        rows.append(row)
    notes = [
        "Measured over every response, pooled (aggregate totals): NFE/iteration = calls after prefill / iterations; Max rows/iteration = the "
        "most rows evaluated (padding and duplicates included) in one iteration after prefill, the calls of an "
        "iteration (Linear-SS: two) summed.",
        "Paper formulas: Nemotron 2B, B(B+1), 2B with B = W+1; SetDLM maxima p+3u_t, p+2u_t+u_t^2, p+3u_t at "
        "u_t = W, p = 1 (25/81/25 at W=8, 49/289/49 at W=16). Packed-SS reaches 2B only with a full previous "
        "draft (or pad_verify=true); the SetDLM maxima need an iteration with p = 1 and a full window.",
    ]
    cols = [
        Col("NFE/iteration", digits=3),
        Col("NFE/iteration (paper formula)", digits=0),
        Col("Max rows/iteration", digits=0),
        Col("Rows/iteration (paper formula)", digits=0),
        Col("Formula", kind="text"),
    ]
    if compare_paper:
        cols.insert(3, Col("Max rows/iteration (paper)", digits=0))
        notes.append("Max rows/iteration (paper): the SetDLM maxima the paper publishes (W = 8 and 16); its Nemotron values are the formulas.")
    keys = ["Model", "Method", "W", "B"] + (["Padded"] if padded else [])
    return build(2, TITLES[2], rows, keys, cols, False, None, notes)


def table3(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Block-size probe: every Nemotron schedule and B at T = 0 (paper: Nemotron 8B GSM8K)."""
    sub = subset(pq, family=NEMOTRON, temperature="zero", lora=False, schedules=family_schedules(NEMOTRON))
    padded = ["pad_verify"] if varies(sub, ["model", "task", "schedule", "width"], "pad_verify") else []
    keys = ["Model", "Task", "Method", "B"] + (["Padded"] if padded else [])
    rows = []
    for values, g in groups(sub, ["model", "task", "schedule", "width"] + padded):
        agg = aggregate(g)
        names = labels(values, NEMOTRON)
        rows.append(
            key_labels(names, keys)
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
    notes = ["Rows/call: the most input rows of any call after prefill. Wall, Total NFE, Tokens: means per response; Tokens/s: aggregate totals (pooled, the paper's averaging)."]
    notes += speed_only_note(sub)
    return build(3, TITLES[3], rows, keys, cols, compare_paper, None, notes)


def table4(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Nemotron proposal-only LoRA runs (lora = true), T = 0: means and throughput."""
    sub = subset(pq, family=NEMOTRON, temperature="zero", lora=True)
    extra = optional_keys(sub, ["model", "task", "schedule"], positive=False)
    keys = ["Model", "Task", "Method"] + [LABEL_OF[e] for e in extra]
    rows = []
    for values, g in groups(sub, ["model", "task", "schedule"] + extra):
        agg = aggregate(g)
        names = labels(values, NEMOTRON)
        rows.append(key_labels(names, keys) | {k: agg[k] for k in ("Tokens", "Total NFE", "Model (s)", "Non-model (s)", "Wall (s)", "Tokens/s", "Accuracy (%)")})
    cols = [
        Col("Tokens", digits=1),
        Col("Total NFE", digits=2),
        Col("Model (s)", digits=3),
        Col("Non-model (s)", digits=3),
        Col("Wall (s)", digits=3),
        Col("Tokens/s", digits=2),
        Col("Accuracy (%)", digits=2),
    ]
    notes = ["Means per response; Tokens/s: aggregate totals (pooled, the paper's averaging); model and non-model time sum to the inclusive decoder wall time."]
    if sub.empty:
        notes.append("Needs records with lora=true (the proposal-only LoRA runs).")
    notes += speed_only_note(sub)
    return build(4, TITLES[4], rows, keys, cols, compare_paper, None, notes)


def table5(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Nemotron model execution time per iteration with and without the proposal-only LoRA, T = 0."""
    sub = subset(pq, family=NEMOTRON, temperature="zero")
    extra = optional_keys(sub, ["model", "task", "schedule"], positive=False)
    keys = ["Model", "Task", "Method"] + [LABEL_OF[e] for e in extra]
    rows = []
    for values, g in groups(sub, ["model", "task", "schedule", "width"] + [e for e in extra if e in ("pad_verify", "config")]):
        base, lora = g[~g["lora"]], g[g["lora"]]
        biggest = max_iteration(g)
        selected = max_iteration(lora, "lora_rows_selected") if not lora.empty else None
        evaluated = max_iteration(lora, "lora_rows_evaluated") if not lora.empty else None
        base_ms = model_ms_per_iteration(base) if not base.empty else math.nan
        lora_ms = model_ms_per_iteration(lora) if not lora.empty else math.nan
        names = labels(values, NEMOTRON)
        rows.append(
            key_labels(names, keys)
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
        "Base/LoRA ms: model time per iteration, pooled: Σ model_s / Σ iterations over lora=false / lora=true records "
        "(prefill call included unless records carry per-call times, call_model_s).",
    ]
    if sub.empty or not sub["lora"].any():
        notes.append("No lora=true records: Selected, Evaluated, LoRA ms and Increase need the LoRA runs.")
    if sub.empty or sub["lora"].all():
        notes.append("No lora=false records: Base ms needs the runs without the adapter.")
    return build(5, TITLES[5], rows, keys, cols, compare_paper, None, notes)


def _nemotron_absolute(number: int, pq: pd.DataFrame, positive: bool, compare_paper: bool) -> Table:
    sub = subset(pq, family=NEMOTRON, temperature="positive" if positive else "zero", lora=False, schedules=family_schedules(NEMOTRON))
    extra = optional_keys(sub, ["model", "task", "schedule"], positive)
    keys = ["Model", "Task", "Method"] + [LABEL_OF[e] for e in extra]
    rows = []
    for values, g in groups(sub, ["model", "task", "schedule"] + extra):
        agg = aggregate(g)
        names = labels(values, NEMOTRON)
        rows.append(key_labels(names, keys) | {c.name: agg[c.name] for c in ABS_COLS})
    bold_within = ["Model", "Task"] + [k for k in keys if k in ("T", "Verify")]
    notes = [ABS_NOTE + " Bold: highest tokens/s within each model and task."]
    if positive:
        notes.append("Each question's samples (the paper's T = 1 protocol) are averaged before aggregation.")
    notes.append(audit.note(audit.audit(sub), sampled=positive))
    notes += speed_only_note(sub)
    return build(number, titled(number, sub), rows, keys, ABS_COLS, compare_paper, bold_within, notes)


def table6(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Nemotron absolute measurements at temperature 0."""
    return _nemotron_absolute(6, pq, False, compare_paper)


def table7(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Nemotron absolute measurements at temperature > 0 (paper: T = 1)."""
    return _nemotron_absolute(7, pq, True, compare_paper)


def _setdlm_table(number: int, pq: pd.DataFrame, compare_paper: bool, orders: tuple[str, ...]) -> Table:
    sub = subset(pq, family=SETDLM, temperature="zero", lora=False)
    sub = sub[sub["order_group"].isin(orders)]
    sections = len(orders) > 1
    by = ["model", "task"] + (["order_group"] if sections else []) + ["width", "schedule"]
    keys = ["Model", "Task"] + (["Order"] if sections else []) + ["Window", "Method"]
    rows = []
    for values, g in groups(sub, by):
        agg = aggregate(g)
        names = labels(values, SETDLM)
        rows.append(key_labels(names, keys) | {c.name: agg[c.name] for c in ABS_COLS})
    notes = [
        ABS_NOTE + " Native decoding is listed with LTR verification. Bold: highest tokens/s within each window"
        + (" and order." if sections else ".")
    ]
    notes.append(audit.note(audit.audit(sub)))
    notes += speed_only_note(sub)
    bold_within = ["Model", "Task"] + (["Order"] if sections else []) + ["Window"]
    return build(number, titled(number, sub), rows, keys, ABS_COLS, compare_paper, bold_within, notes)


def table8(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """SetDLM absolute measurements, LTR verification (the family's first order) and native decoding, T = 0."""
    return _setdlm_table(8, pq, compare_paper, FAMILIES[SETDLM].orders[:1])


def table9(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """SetDLM measurements, one section per verification order (LTR with native first), T = 0."""
    return _setdlm_table(9, pq, compare_paper, FAMILIES[SETDLM].orders)


def titled(number: int, sub: pd.DataFrame) -> str:
    """TITLES[number] naming the models the table holds (the paper's "Nemotron", "SetDLM" stand
    for the family only when no record names a model)."""
    title = TITLES[number]
    family = "Nemotron" if "Nemotron" in title else "SetDLM"
    if sub.empty or family not in title:
        return title
    models = ", ".join(model_label(m) for m in sorted(sub["model"].unique()))
    return title.replace(f"{family} ", f"{models} ({family.lower()} family): ", 1)


TITLES = {
    2: "Table 2: Execution cost per iteration with cached prompt context.",
    3: "Table 3: Block-size probe (paper: Nemotron 8B GSM8K).",
    4: "Table 4: Runs with proposal-only LoRA (paper: Nemotron 8B GSM8K).",
    5: "Table 5: Model execution time per iteration (paper: Nemotron 8B GSM8K).",
    6: "Table 6: Nemotron absolute measurements at temperature 0.",
    7: "Table 7: Nemotron absolute measurements at temperature 1.",
    8: "Table 8: SetDLM absolute measurements, LTR verification and native decoding.",
    9: "Table 9: SetDLM measurements: LTR verification and native decoding; confidence-ordered verification.",
}
