"""The paper's aggregates (docs/analysis.md §3), per-family facts read from the family table, and the labels
used in tables and figures.

Samples and repeats: a run at T > 0 may decode K independent samples of each question
(`sample`), and may time each response several times (`repeat`). `per_response` collapses the
repeats of one response (wall, model and non-model time, tokens, NFE and correctness averaged;
tokens and NFE are identical across repeats); `per_question` then averages the samples of one
question, so that every question weighs the same. Rates use aggregate totals over these
per-question rows:

- Tokens/s = total tokens / total wall
- Tokens/NFE = total tokens / total NFE
- Time/NFE (ms) = 1000 * total wall / total NFE
- Tokens, Wall (s), NFE, Model (s), Non-model (s) = means per response
- Accuracy (%) = 100 * mean(correct) over the questions whose `correct` is not null
  (blank for speed-only tasks such as WritingBench)
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from packedss.analysis.load import RUN_KEYS
from packedss.families import FAMILIES, schedule_names

# Display labels by schedule name; a schedule without one is shown by its name.
SCHEDULE_LABELS = {
    "ar": "AR",
    "linear": "Linear-SS",
    "quadratic": "Quadratic-SS",
    "packed": "Packed-SS",
    "native": "Native",
    "sdar-native": "SDAR native",
    "s2d2": "S2D2",
    "s2d2-always": "S2D2 (always verify)",
    "pld": "PLD",
}
# One colour per schedule, used by every figure (OTHER_COLOUR for a schedule without one).
SCHEDULE_COLOURS = {
    "ar": "#000000",
    "linear": "#8c8c8c",
    "quadratic": "#ff7f0e",
    "packed": "#1f77b4",
    "native": "#2ca02c",
    "sdar-native": "#9467bd",
    "s2d2": "#d62728",
    "s2d2-always": "#e377c2",
    "pld": "#17becf",
}
OTHER_COLOUR = "#555555"
MODEL_LABELS = {
    "nemotron3b": "Nemotron 3B",
    "nemotron8b": "Nemotron 8B",
    "setdlm1.7b": "SetDLM 1.7B",
    "tiny": "Tiny",
    "tiny-set": "Tiny-Set",
    "sdar8b": "SDAR 8B",
    "sdar4b": "SDAR 4B",
    "tiny-sdar": "Tiny-SDAR",
}
# The short model name used in the paper's "Setting" column ("3B MBPP").
MODEL_SHORT = {"nemotron3b": "3B", "nemotron8b": "8B", "setdlm1.7b": "SetDLM", "tiny": "Tiny", "tiny-set": "Tiny-Set",
               "sdar8b": "SDAR-8B", "sdar4b": "SDAR-4B", "tiny-sdar": "Tiny-SDAR"}
TASK_LABELS = {
    "gsm8k": "GSM8K",
    "math500": "MATH-500",
    "mbpp": "MBPP",
    "humaneval": "HumanEval",
    "writingbench": "WritingBench",
    "specbench": "Spec-Bench",
    "arith": "Arith",
}
TASK_ORDER = ("mbpp", "humaneval", "gsm8k", "math500", "writingbench", "specbench", "arith")
ORDER_LABELS = {"ltr": "LTR", "confidence": "Confidence"}

ABSOLUTE_COLUMNS = ("Tokens/s", "Tokens/NFE", "Time/NFE (ms)", "Accuracy (%)", "Tokens", "Wall (s)", "NFE")

MEANS = ("output_tokens", "wall_s", "model_s", "nonmodel_s", "nfe_total", "correct_f")


def model_label(model: str) -> str:
    return MODEL_LABELS.get(model, model)


def task_label(task: str) -> str:
    return TASK_LABELS.get(task, task)


def schedule_label(schedule: str) -> str:
    return SCHEDULE_LABELS.get(schedule, schedule)


def schedule_colour(schedule: str) -> str:
    return SCHEDULE_COLOURS.get(schedule, OTHER_COLOUR)


# Markers tell overlapping curves apart (Linear-SS and Packed-SS often accept alike).
SCHEDULE_MARKERS = {"linear": "s", "quadratic": "^", "packed": "o"}


def schedule_marker(schedule: str) -> str:
    return SCHEDULE_MARKERS.get(schedule, "o")


def family_orders(family: str) -> tuple[str, ...]:
    """The verification orders of a family (none for a family the table does not know)."""
    return FAMILIES[family].orders if family in FAMILIES else ()


def block_of(family: str, width: int) -> float:
    """B, the rows of one draft block at width W, by the family's rule (NaN: unknown family)."""
    return FAMILIES[family].block_of_width(int(width)) if family in FAMILIES else math.nan


# What a table shows for W and B of a schedule that runs without a width (AR): the runner records
# such a schedule at W = 0, and "W 0" or its block (B = 1) would read as a setting that ran.
NO_WIDTH = "-"


def width_label(width: int) -> int | str:
    """W as a table shows it: the width, or NO_WIDTH for a schedule recorded without one."""
    return int(width) if int(width) else NO_WIDTH


def block_label(family: str, width: int) -> float | str:
    """B as a table shows it: `block_of`, or NO_WIDTH for a schedule recorded without a width."""
    return block_of(family, width) if int(width) else NO_WIDTH


def calls_per_iteration(family: str, schedule: str) -> int:
    """Model calls per iteration after prefill; a family or schedule the table does not know
    counts each call as one iteration."""
    return FAMILIES[family].calls_per_iteration.get(schedule, 1) if family in FAMILIES else 1


def order_group(frame: pd.DataFrame) -> pd.Series:
    """The verification order a record belongs to in the tables of families with orders: a lossy
    schedule (native decoding) has no verification and is shown with the family's first order
    (paper Tables 8-9: with LTR verification); families without orders have none ("")."""
    first = frame["family"].map(lambda f: (family_orders(f) or ("",))[0])
    group = frame["order"].where(frame["order"] != "", first)
    group = group.where(~frame["lossy"].astype(bool), first)
    return group.where(frame["family"].map(lambda f: bool(family_orders(f))), "")


def _collapse(frame: pd.DataFrame, keys: list[str], count: str) -> pd.DataFrame:
    grouped = frame.groupby(keys, sort=False, dropna=False)
    means = grouped[list(MEANS)].mean()
    firsts = grouped.first()
    firsts = firsts.drop(columns=[c for c in firsts.columns if c in MEANS or c in ("repeats", "samples")])
    counts = grouped.size().rename(count)
    return means.join(firsts).join(counts).reset_index()


def per_response(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, question, sample): timing repeats averaged, counted in `repeats`. The
    per-call list fields are those of the first repeat (rows per call do not depend on timing)."""
    if frame.empty:
        return frame.assign(repeats=pd.Series(dtype=int), order_group=pd.Series(dtype=str))
    out = _collapse(frame, list(RUN_KEYS) + ["question_id", "sample"], "repeats")
    out["order_group"] = order_group(out)
    return out


def per_question(responses: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, question): the samples of `per_response` rows averaged, counted in
    `samples`; `repeats` is the most repeats of any sample. List fields: the first sample's."""
    if responses.empty:
        return responses.assign(samples=pd.Series(dtype=int))
    keys = list(RUN_KEYS) + ["question_id"]
    out = _collapse(responses, keys, "samples")
    most = responses.groupby(keys, sort=False, dropna=False)["repeats"].max().rename("repeats")
    out = out.merge(most.reset_index(), on=keys, how="left")
    return out.drop(columns=["sample"])


def aggregate(rows: pd.DataFrame) -> dict:
    """The paper's absolute measurements over a set of per-question rows."""
    n = len(rows)
    tokens = float(rows["output_tokens"].sum())
    wall = float(rows["wall_s"].sum())
    nfe = float(rows["nfe_total"].sum())
    scored = rows["correct_f"].dropna()
    return {
        "Tokens/s": tokens / wall if wall > 0 else np.nan,
        "Tokens/NFE": tokens / nfe if nfe > 0 else np.nan,
        "Time/NFE (ms)": 1000.0 * wall / nfe if nfe > 0 else np.nan,
        "Accuracy (%)": 100.0 * float(scored.mean()) if len(scored) else np.nan,
        "Tokens": tokens / n if n else np.nan,
        "Wall (s)": wall / n if n else np.nan,
        "NFE": nfe / n if n else np.nan,
        "Total NFE": nfe / n if n else np.nan,
        "Model (s)": float(rows["model_s"].mean()) if n else np.nan,
        "Non-model (s)": float(rows["nonmodel_s"].mean()) if n else np.nan,
        "Questions": n,
    }


def _pooled_and_mean(numerator: pd.Series, denominator: pd.Series) -> tuple[float, float]:
    """(pooled = Σnum / Σden, per request = mean of num/den over the rows with den > 0)."""
    num, den = numerator.to_numpy(float), denominator.to_numpy(float)
    keep = den > 0
    pooled = num.sum() / den.sum() if den.sum() > 0 else np.nan
    return float(pooled), float(np.mean(num[keep] / den[keep])) if keep.any() else np.nan


RATES = ("Tokens/NFE", "Tokens/s", "Acceptance (%)")


def rates(responses: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """RATES of one run's per-response rows, each as (pooled: aggregate totals, the paper's;
    per request: the mean of every response's own rate). Acceptance = draft_accepted /
    draft_proposed, over the responses that proposed drafts."""
    accepted = _pooled_and_mean(responses["draft_accepted"], responses["draft_proposed"])
    return {
        "Tokens/NFE": _pooled_and_mean(responses["output_tokens"], responses["nfe_total"]),
        "Tokens/s": _pooled_and_mean(responses["output_tokens"], responses["wall_s"]),
        "Acceptance (%)": (100.0 * accepted[0], 100.0 * accepted[1]),
    }


def iteration_rows(record: dict | pd.Series, field: str = "rows_evaluated") -> list[list[int]]:
    """A per-call list field grouped into iterations after the prefill call(s), with as many calls
    per iteration as the family table gives the schedule (Linear-SS: two)."""
    values = record.get(field) if isinstance(record, dict) else record[field]
    if values is None or (isinstance(values, float) and np.isnan(values)):
        return []
    calls = list(values)[int(record["nfe_prefill"]) :]
    per = calls_per_iteration(record["family"], record["schedule"])
    return [calls[i : i + per] for i in range(0, len(calls), per)]


def max_iteration(rows: pd.DataFrame, field: str = "rows_evaluated") -> list[int] | None:
    """The per-call values of the iteration with the most rows (summed over its calls)."""
    best: list[int] | None = None
    for _, row in rows.iterrows():
        for iteration in iteration_rows(row, field):
            if best is None or sum(iteration) > sum(best):
                best = iteration
    return best


def max_call_rows(rows: pd.DataFrame) -> int | None:
    """The most rows of any call after the prefill call(s) (paper Table 3, Rows/call)."""
    best = None
    for _, row in rows.iterrows():
        calls = list(row["rows_evaluated"])[int(row["nfe_prefill"]) :]
        if calls:
            best = max(calls) if best is None else max(best, max(calls))
    return best


def model_ms_per_iteration(rows: pd.DataFrame) -> float:
    """Model execution time per iteration (ms). With a per-call time list (`call_model_s`) the
    prefill calls are left out; records without it give Σ model_s / Σ iterations, prefill
    included (our reading; see docs/analysis.md)."""
    iterations = float(rows["iterations"].sum())
    if iterations <= 0:
        return np.nan
    if "call_model_s" in rows and rows["call_model_s"].map(lambda v: isinstance(v, list)).all():
        total = sum(sum(calls[int(p) :]) for calls, p in zip(rows["call_model_s"], rows["nfe_prefill"]))
        return 1000.0 * total / iterations
    return 1000.0 * float(rows["model_s"].sum()) / iterations


def _rank(value: str, order) -> tuple[int, str]:
    order = tuple(order)
    return (order.index(value) if value in order else len(order), value)


def schedule_rank(schedule: str) -> tuple[int, str]:
    return _rank(schedule, schedule_names())


def task_rank(task: str) -> tuple[int, str]:
    return _rank(task, TASK_ORDER)


def family_rank(family: str) -> tuple[int, str]:
    return _rank(family, FAMILIES)


def order_rank(order: str) -> tuple[int, str]:
    """"" (no order) first, then the orders in the order the families list them."""
    orders = [""] + [o for f in FAMILIES.values() for o in f.orders]
    return _rank(order, dict.fromkeys(orders))


def sort_schedules(schedules) -> list[str]:
    return sorted(schedules, key=schedule_rank)


def sort_tasks(tasks) -> list[str]:
    return sorted(tasks, key=task_rank)


# The identity fields of the regime label: how the model time was made.
REGIME_FIELDS = ("compile", "dtype", "threads", "device", "cost_model")


def regime_label(row: pd.Series) -> str:
    """eager or compiled:<mode>, dtype, threads, device, and cost:<label> for a cost twin's time."""
    parts = ["eager" if row["compile"] in ("none", None) else f"compiled:{row['compile']}", str(row["dtype"])]
    parts += [f"{int(row['threads'])} thread{'s' if int(row['threads']) != 1 else ''}", str(row["device"])]
    if isinstance(row.get("cost_model"), str) and row["cost_model"]:
        parts.append(f"cost:{row['cost_model']}")
    return ", ".join(parts)


def regime_labels(frame: pd.DataFrame) -> list[str]:
    """The regime labels of the runs in `frame`, each once, sorted."""
    return sorted({regime_label(row) for _, row in frame[list(REGIME_FIELDS)].drop_duplicates().iterrows()})


def regime_note(frame: pd.DataFrame) -> str:
    """The note under every written table: how the runs of these records were measured."""
    regimes = regime_labels(frame)
    if len(regimes) == 1:
        return f"Measured in: {regimes[0]} (every run of these records).{row_scaling_note(frame)}"
    return (f"Measured in: {' | '.join(regimes)} (the runs of these records differ in how they were "
            f"measured).{row_scaling_note(frame)}")  # fmt: skip


def row_scaling_note(frame: pd.DataFrame) -> str:
    """' Not the memory-bound regime: ...' per cost twin whose warm-up found 2B rows costing more than
    its bound times B rows (the records' `cost_row_scaling`, packedss.models.cost_twin); '' for none."""
    if "cost_row_scaling" not in frame:
        return ""
    ratios: dict[tuple[str, int, float], list[float]] = {}
    for label, scaling in zip(frame["cost_model"], frame["cost_row_scaling"]):
        if isinstance(scaling, dict) and not scaling["memory_bound"]:
            key = (str(label), int(scaling["rows"]), float(scaling["memory_bound_at_most"]))
            ratios.setdefault(key, []).append(float(scaling["ratio"]))
    notes = []
    for (label, rows, bound), measured in sorted(ratios.items()):
        low, high = min(measured), max(measured)
        took = f"{low:.2f}x" if low == high else f"{low:.2f}-{high:.2f}x"
        notes.append(f" Not the memory-bound regime: on cost twin {label} a call of {2 * rows} rows took {took} a call "
                     f"of {rows} rows (memory-bound: at most {bound:g}x).")  # fmt: skip
    return "".join(notes)
