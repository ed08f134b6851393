"""The paper's aggregates (SPEC §6) and the labels used in tables and figures.

Repeats: a run may time each question several times (`repeat`). Before anything else, the
records of one question within one run are collapsed to one row: wall, model and non-model
time, tokens, NFE and correctness are averaged over the repeats (at T = 0 tokens and NFE are
identical across repeats). Rates then use aggregate totals over these per-question rows:

- Tokens/s = total tokens / total wall
- Tokens/NFE = total tokens / total NFE
- Time/NFE (ms) = 1000 * total wall / total NFE
- Tokens, Wall (s), NFE, Model (s), Non-model (s) = means per response
- Accuracy (%) = 100 * mean(correct) over the questions whose `correct` is not null
  (blank for speed-only tasks such as WritingBench)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from packedss.analysis.load import RUN_KEYS

SCHEDULE_ORDER = ("ar", "linear", "quadratic", "packed", "native")
SCHEDULE_LABELS = {
    "ar": "AR",
    "linear": "Linear-SS",
    "quadratic": "Quadratic-SS",
    "packed": "Packed-SS",
    "native": "Native",
}
# One colour per schedule, used by every figure.
SCHEDULE_COLOURS = {
    "ar": "#000000",
    "linear": "#8c8c8c",
    "quadratic": "#ff7f0e",
    "packed": "#1f77b4",
    "native": "#2ca02c",
}
MODEL_LABELS = {
    "nemotron3b": "Nemotron 3B",
    "nemotron8b": "Nemotron 8B",
    "setdlm1.7b": "SetDLM 1.7B",
    "tiny": "Tiny",
    "tiny-set": "Tiny-Set",
}
# The short model name used in the paper's "Setting" column ("3B MBPP").
MODEL_SHORT = {"nemotron3b": "3B", "nemotron8b": "8B", "setdlm1.7b": "SetDLM", "tiny": "Tiny", "tiny-set": "Tiny-Set"}
TASK_LABELS = {
    "gsm8k": "GSM8K",
    "math500": "MATH-500",
    "mbpp": "MBPP",
    "humaneval": "HumanEval",
    "writingbench": "WritingBench",
    "arith": "Arith",
}
TASK_ORDER = ("mbpp", "humaneval", "gsm8k", "math500", "writingbench", "arith")
ORDER_LABELS = {"ltr": "LTR", "confidence": "Confidence"}

ABSOLUTE_COLUMNS = ("Tokens/s", "Tokens/NFE", "Time/NFE (ms)", "Accuracy (%)", "Tokens", "Wall (s)", "NFE")

PER_QUESTION_MEANS = ("output_tokens", "wall_s", "model_s", "nonmodel_s", "nfe_total", "correct_f")


def model_label(model: str) -> str:
    return MODEL_LABELS.get(model, model)


def task_label(task: str) -> str:
    return TASK_LABELS.get(task, task)


def schedule_label(schedule: str) -> str:
    return SCHEDULE_LABELS.get(schedule, schedule)


def order_group(frame: pd.DataFrame) -> pd.Series:
    """The verification order a record belongs to in the any-order tables: native decoding has no
    verification and is shown with LTR verification (paper Tables 8-9); the LTR family has none."""
    group = frame["order"].where(frame["order"] != "", "ltr")
    group = group.where(frame["schedule"] != "native", "ltr")
    return group.where(frame["family"] == "anyorder", "")


def per_question(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, question): repeats averaged. Keeps the list fields of the first repeat
    (rows per call do not depend on timing) and counts the repeats."""
    if frame.empty:
        return frame.assign(repeats=pd.Series(dtype=int), order_group=pd.Series(dtype=str))
    keys = list(RUN_KEYS) + ["question_id"]
    means = frame.groupby(keys, sort=False, dropna=False)[list(PER_QUESTION_MEANS)].mean()
    firsts = frame.groupby(keys, sort=False, dropna=False).first()
    firsts = firsts.drop(columns=[c for c in PER_QUESTION_MEANS if c in firsts.columns])
    counts = frame.groupby(keys, sort=False, dropna=False).size().rename("repeats")
    out = means.join(firsts).join(counts).reset_index()
    out["order_group"] = order_group(out)
    return out


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


def iteration_rows(record: dict | pd.Series, field: str = "rows_evaluated") -> list[list[int]]:
    """A per-call list field grouped into iterations after the prefill call(s): Linear-SS's
    iteration holds two calls, every other schedule's one. Falls back to one call per
    iteration when the counts do not divide evenly."""
    values = record.get(field) if isinstance(record, dict) else record[field]
    if values is None or (isinstance(values, float) and np.isnan(values)):
        return []
    calls = list(values)[int(record["nfe_prefill"]) :]
    iterations = int(record["iterations"])
    per = 1
    if iterations > 0 and len(calls) % iterations == 0 and len(calls) // iterations >= 1:
        per = len(calls) // iterations
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
    included (our reading; see the README)."""
    iterations = float(rows["iterations"].sum())
    if iterations <= 0:
        return np.nan
    if "call_model_s" in rows and rows["call_model_s"].map(lambda v: isinstance(v, list)).all():
        total = sum(sum(calls[int(p) :]) for calls, p in zip(rows["call_model_s"], rows["nfe_prefill"]))
        return 1000.0 * total / iterations
    return 1000.0 * float(rows["model_s"].sum()) / iterations


def schedule_rank(schedule: str) -> tuple[int, str]:
    return (SCHEDULE_ORDER.index(schedule) if schedule in SCHEDULE_ORDER else len(SCHEDULE_ORDER), schedule)


def task_rank(task: str) -> tuple[int, str]:
    return (TASK_ORDER.index(task) if task in TASK_ORDER else len(TASK_ORDER), task)


def order_rank(order: str) -> tuple[int, str]:
    return ({"": 0, "ltr": 0, "confidence": 1}.get(order, 2), order)


def sort_schedules(schedules) -> list[str]:
    return sorted(schedules, key=schedule_rank)


def sort_tasks(tasks) -> list[str]:
    return sorted(tasks, key=task_rank)
