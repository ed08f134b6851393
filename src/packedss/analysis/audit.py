"""The divergence audit: every greedy response of a lossless schedule against the AR response of
the same identity (docs/analysis.md).

A lossless schedule equals AR token for token in exact arithmetic. In reduced precision a call's
shape changes its rounding, so at a near-tie (a verifier row whose top-2 logit margin is within a
few units in the last place, recorded in `near_ties`) it may pick the other token and continue
from there. Each response is classed:

- `equal`: its output ids are AR's;
- `numerical`: they differ, and the response or AR's recorded a near-tie at an output index at or
  before the first differing one;
- `context`: they differ, with no such near-tie, at or after the first token a call emitted once
  the response outgrew its model's context (SetDLM's `length`: that call dropped the oldest
  cache rows, `cache_rows_dropped`). Each schedule drops rows before its own calls, as the
  released decoder does, so past that point its tokens see another window than AR's;
- `unexplained`: they differ with none of these (a bug until shown otherwise).

The AR response of the same identity: same question and sample, and every identity field equal
but the schedule, W (unless the family's AR reads W: then the same W) and `pad_verify`. Responses
without `output_ids` (older records), at T > 0 (sampled outputs are not compared token for token),
of a lossy schedule or without an AR counterpart are not audited.
"""

from __future__ import annotations

import json

import pandas as pd

from packedss.analysis.load import RUN_KEYS
from packedss.families import FAMILIES
from packedss.job import IDENTITY_FIELDS

CLASSES = ("equal", "numerical", "context", "unexplained")
# What may differ between a schedule's run and its AR run (block follows W, lossy the schedule,
# max_ngram is pld's own).
_FREE = ("schedule", "width", "block", "pad_verify", "lossy", "max_ngram")
_IDENTITY = tuple(name for name in IDENTITY_FIELDS if name not in _FREE)


def _canonical(value) -> str:
    if isinstance(value, float) and value != value:  # a field pandas filled in for a missing value
        value = None
    return json.dumps(value, sort_keys=True, default=str)


def _identity(row: pd.Series) -> tuple:
    return tuple(_canonical(row.get(name)) for name in _IDENTITY) + (str(row["question_id"]), int(row["sample"]))


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first output index where a and b differ (the shorter one's length when one is a prefix
    of the other), None when equal."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def classify(output: list[int], ties: list, ar_output: list[int], ar_ties: list,
             slid_from: int | None = None) -> tuple[str, int | None]:  # fmt: skip
    """(class, first differing output index) of one response against AR's; `slid_from`: the first
    output index either of them emitted after dropping cache rows (None: neither dropped any)."""
    first = first_difference(list(output), list(ar_output))
    if first is None:
        return "equal", None
    if any(index <= first for index, _ in list(ties or []) + list(ar_ties or [])):
        return "numerical", first
    return ("context" if slid_from is not None and first >= slid_from else "unexplained"), first


def slid_from(row: pd.Series) -> int | None:
    """The output index of the first token a call emitted after it dropped cache rows (the model's
    context outgrown), from the record's per-call `cache_rows_dropped`, its prefill calls and its
    accepted tokens per iteration; None when no call dropped any."""
    dropped = row.get("cache_rows_dropped")
    if not isinstance(dropped, list) or not any(dropped):
        return None
    call = next(k for k, rows in enumerate(dropped) if rows)
    prefill_calls, accepted = int(row["nfe_prefill"]), list(row["accepted"])
    prefill_tokens = int(row["output_tokens"]) + int(row.get("truncated_tokens") or 0) - sum(accepted)
    if call < prefill_calls:
        return 0
    iteration = (call - prefill_calls) // FAMILIES[row["family"]].calls_per_iteration[row["schedule"]]
    return prefill_tokens + sum(accepted[:iteration])


def _usable(frame: pd.DataFrame) -> pd.DataFrame:
    if "output_ids" not in frame or "near_ties" not in frame:
        return frame.iloc[0:0]
    ok = frame["output_ids"].map(lambda v: isinstance(v, list)) & frame["near_ties"].map(lambda v: isinstance(v, list))
    return frame[ok & (frame["temperature"] == 0)]


def audit(responses: pd.DataFrame) -> pd.DataFrame:
    """One row per audited response (per-response or per-question rows, one per question-sample):
    the run keys, question_id, sample, `audit` (a CLASSES name) and `first_difference`."""
    columns = list(RUN_KEYS) + ["question_id", "sample", "audit", "first_difference"]
    usable = _usable(responses)
    if usable.empty:
        return pd.DataFrame(columns=columns)
    if "sample" not in usable:
        usable = usable.assign(sample=0)
    ar = usable[usable["schedule"] == "ar"]
    by_identity: dict[tuple, list[pd.Series]] = {}
    for _, row in ar.iterrows():
        by_identity.setdefault(_identity(row), []).append(row)
    rows = []
    for _, row in usable[(usable["schedule"] != "ar") & ~usable["lossy"].astype(bool)].iterrows():
        # The family's AR reads no W (width 0) or the same W as the schedule.
        match = [r for r in by_identity.get(_identity(row), []) if int(r["width"]) in (0, int(row["width"]))]
        if not match:
            continue
        reference = match[0]
        slides = [index for index in (slid_from(row), slid_from(reference)) if index is not None]
        verdict, first = classify(row["output_ids"], row["near_ties"], reference["output_ids"], reference["near_ties"],
                                  min(slides, default=None))  # fmt: skip
        rows.append({k: row[k] for k in RUN_KEYS} | {"question_id": row["question_id"], "sample": int(row["sample"]),
                                                    "audit": verdict, "first_difference": first})  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def counts(audited: pd.DataFrame) -> dict[str, int]:
    """How many audited responses fall in each class."""
    return {name: int((audited["audit"] == name).sum()) for name in CLASSES}


def counts_by_run(audited: pd.DataFrame) -> dict[tuple, dict[str, int]]:
    """CLASSES counts per run, keyed by the RUN_KEYS values."""
    return {tuple(values): counts(g) for values, g in audited.groupby(list(RUN_KEYS), sort=False, dropna=False)}


def note(audited: pd.DataFrame, sampled: bool = False) -> str:
    """The line a table's notes carry (`sampled`: a T > 0 table, whose outputs are not compared)."""
    if sampled:
        return "Divergence audit: T > 0 outputs are sampled, so they are not compared with AR token for token."
    c = counts(audited)
    if not sum(c.values()):
        return "Divergence audit (T = 0, lossless vs AR): no audited responses (needs output_ids and an AR run)."
    context = f"{c['context']} past the context (after a call that dropped cache rows), " if c["context"] else ""
    return (
        f"Divergence audit (T = 0, lossless vs AR of the same identity): {c['equal']} equal, {c['numerical']} "
        f"numerical (at a recorded near-tie), {context}{c['unexplained']} unexplained."
    )


def unexplained_lines(audited: pd.DataFrame) -> list[str]:
    """One loud line per unexplained divergence."""
    lines = []
    for _, row in audited[audited["audit"] == "unexplained"].iterrows():
        lines.append(
            f"UNEXPLAINED DIVERGENCE: {row['model']}/{row['task']} {row['schedule']} W={row['width']} "
            f"{row['question_id']} sample {row['sample']}: differs from AR at output index {row['first_difference']} "
            "with no near-tie at or before it"
        )
    return lines
