"""The acceptance tables (`--tables acceptance`, docs/analysis.md §8): `acceptance` (one row per run
with draft counts: acceptance, draft lengths, tokens emitted per iteration) from the runs'
acceptance profiles, and `latency` (one row per run: TTFT, iteration time and TPOT percentiles,
rows per NFE and per emitted token) from every timed record."""

from __future__ import annotations

import math

import pandas as pd

from packedss.analysis.acceptance import latency, run_sort_key
from packedss.analysis.bootstrap import CI
from packedss.analysis.load import RUN_KEYS
from packedss.analysis.metrics import (
    ORDER_LABELS,
    model_label,
    schedule_label,
    task_label,
    width_label,
)
from packedss.analysis.table import Col, Table, build

KEYS = ["Model", "Task", "Method", "W", "T", "Verify", "Order", "LoRA", "Padded", "Seed"]


def run_labels(identity: dict) -> dict:
    return {
        "Model": model_label(identity["model"]),
        "Task": task_label(identity["task"]),
        "Method": schedule_label(identity["schedule"]),
        "W": width_label(identity["width"]),
        "T": f"{float(identity['temperature']):g}",
        "Verify": identity["verify"],
        "Order": ORDER_LABELS.get(identity["order"], identity["order"]),
        "LoRA": "yes" if identity["lora"] else "no",
        "Padded": {"true": "yes", "false": "no"}.get(identity["pad_verify"], ""),
        "Seed": int(identity["seed"]),
        "C": str(int(identity.get("concurrency", 1))),
    }


def _depth_ci(curve: dict, depth: int) -> CI | None:
    """The CI of a profile curve at a depth (None past the run's width)."""
    if depth > len(curve["estimate"]):
        return None
    k = depth - 1
    values = [math.nan if curve[key][k] is None else curve[key][k] for key in ("estimate", "low", "high")]
    return CI(*values, n=0, method=curve["method"][k])


ACCEPTANCE_COLS = [
    Col("Iterations", digits=0),
    Col("Drafted/iteration", digits=2),
    Col("Acceptance (%)", digits=1),
    Col("Tokens/iteration", digits=2),
    Col("Median tokens/iteration", digits=1),
    Col("Full accepts (%)", digits=1),
    Col("Marginal d=1", kind="ci", digits=3),
    Col("Marginal d=2", kind="ci", digits=3),
    Col("Conditional d=2", kind="ci", digits=3),
]


def acceptance_table(profiles: list[dict]) -> Table:
    """One row per acceptance profile (a run with per-iteration draft counts)."""
    rows = []
    for profile in sorted(profiles, key=lambda p: run_sort_key(p["identity"])):
        counts, emitted = profile["counts"], profile["emitted"]
        iterations = counts["iterations"]
        verified = counts["draft_proposed"]
        rows.append(
            run_labels(profile["identity"])
            | {
                "Iterations": iterations,
                "Drafted/iteration": verified / iterations if iterations else math.nan,
                "Acceptance (%)": 100.0 * counts["draft_accepted"] / verified if verified else math.nan,
                "Tokens/iteration": math.nan if emitted["mean"] is None else emitted["mean"],
                "Median tokens/iteration": math.nan if emitted["median"] is None else emitted["median"],
                "Full accepts (%)": math.nan if emitted["full_accept_share"] is None else 100.0 * emitted["full_accept_share"],
                "Marginal d=1": _depth_ci(profile["marginal"], 1),
                "Marginal d=2": _depth_ci(profile["marginal"], 2),
                "Conditional d=2": _depth_ci(profile["conditional"], 2),
            }
        )
    notes = [
        "Pooled over the run's iterations (aggregate totals, the paper's averaging); per-request means are in runs.csv.",
        "Drafted/iteration: drafts verified per iteration (Packed-SS's one-call-old draft holds W - A of the previous "
        "iteration). Acceptance: drafts accepted / drafts verified. Tokens/iteration: tokens emitted per iteration "
        "(mean and median). Full accepts: iterations that accepted every draft they verified (at least one).",
        "Marginal d=i: share of iterations whose depth-i draft was accepted; Conditional d=i: the same among "
        "iterations that accepted depths 1..i-1 and verified a depth-i draft. Brackets: 95% bootstrap CIs over "
        "questions (each with all its samples). Every depth: the run's acceptance_profile.json and Figure A1.",
    ]
    if not profiles:
        notes.append("No records with per-iteration draft counts (drafted, accepted_drafts): records written before them have none.")
    return build("acceptance", "Acceptance per run: draft depths, draft lengths and tokens per iteration.", rows, KEYS, ACCEPTANCE_COLS, notes=notes)


LATENCY_COLS = [Col("Records", digits=0)] + [
    Col(f"{name} p{q} (ms)", digits=3) for name in ("TTFT", "Iteration", "TPOT") for q in (50, 95, 99)
] + [Col("Rows/NFE", digits=2), Col("Rows/token", digits=2)]  # fmt: skip


def latency_table(frame: pd.DataFrame) -> Table:
    """One row per run over every timed record (repeats included, not averaged)."""
    runs = [(dict(zip(RUN_KEYS, values, strict=True)), g) for values, g in frame.groupby(list(RUN_KEYS), sort=False, dropna=False)]
    rows = [run_labels(identity) | latency(g) for identity, g in sorted(runs, key=lambda item: run_sort_key(item[0]))]
    notes = [
        "Percentiles over every timed response of the run (each timing repeat counts) or over all their iterations "
        "(pooled: every iteration weighs the same). A call's time is its model time (call_model_s) plus an equal share "
        "of its response's non-model time (nonmodel_s / nfe_total). TTFT: the prefill call; Iteration: the calls of one "
        "iteration (Linear-SS: two); TPOT: an iteration's time / the tokens it emitted.",
        "Rows/NFE and Rows/token: rows evaluated by the calls after prefill (padding included) per call and per "
        "token emitted after prefill, aggregate totals.",
    ]
    if (frame["concurrency"] > 1).any():
        notes.append("At concurrency C > 1 a call's model time is the response's share of a batched call (in proportion "
                     "to its rows), not the time it waited: its latency is in the concurrency table (latency_s).")  # fmt: skip
    return build("latency", "Latency per run: time to first token, per iteration and per output token.", rows, KEYS, LATENCY_COLS, notes=notes)
