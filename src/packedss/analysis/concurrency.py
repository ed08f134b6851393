"""The concurrency tables (`--tables concurrency`, docs/analysis.md §10): how each schedule's system
throughput, per-request latency and time against Linear-SS change with C, the responses a job
decodes together, and the crossover: the smallest measured C at which a schedule's time reaches
Linear-SS's.

A *series* is one run measured at several C: every identity field equal but the concurrency. At C
requests per call each response's `wall_s` is its share of the batched calls' model time plus its
own host time, so over a job Σ wall_s is the job's elapsed time:

- Tokens/s (system) = Σ output_tokens / Σ wall_s over every timed record of the run;
- Latency p50, p95 = `numpy.percentile` (linear interpolation) of `latency_s` (the response's first
  call's start to its last call's end) over every timed record;
- Time / Linear-SS = Σ wall_method / Σ wall_Linear-SS over the question-samples both answered, the
  Linear-SS run of the same series at the same C (same W, or Linear-SS's only W), with the paired
  bootstrap CI over questions of `bootstrap` (BCa, percentile fallback);
- crossover = the smallest C at which that ratio's estimate is >= 1 (the schedule stops saving
  time), with whether its CI lies wholly above 1; "none up to C=<largest>" when it never does.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from packedss.analysis.bootstrap import CI, N_RESAMPLES, pair, paired_bootstrap, question_sums, sum_ratio
from packedss.analysis.load import CONFIG_FIELDS, RUN_KEYS
from packedss.analysis.metrics import (
    ORDER_LABELS,
    REGIME_FIELDS,
    family_rank,
    model_label,
    order_group,
    order_rank,
    regime_label,
    schedule_label,
    schedule_rank,
    task_label,
    task_rank,
    width_label,
)
from packedss.analysis.table import Col, Table, build
from packedss.errors import PackedSSError

CONCURRENCY = "concurrency"  # `--tables concurrency`: the tables concurrency and crossover
CROSSOVER = "crossover"  # the second table of `--tables concurrency`
FIGURE = "C1"  # `--figures C1`
BASE = "linear"
# A series' setting: what its Linear-SS reference shares with it.
SERIES_KEYS = tuple(k for k in RUN_KEYS if k not in ("concurrency", "config")) + ("order_group",)
OWN_KEYS = ("schedule", "width", "pad_verify", "native_window", "max_ngram")
SETTING_KEYS = tuple(k for k in SERIES_KEYS if k not in OWN_KEYS)


def _plain(value):
    if isinstance(value, np.generic):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value  # NaN: a field pandas filled in


def _canonical(value) -> str:
    return json.dumps(_plain(value), sort_keys=True, default=str)


def _shown(value) -> str:
    value = _plain(value)
    return value if isinstance(value, str) else _canonical(value)


def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with `order_group`, `regime`, `series` (every identity field but C) and `setting`
    (the series less the schedule's own W, padding and window) columns."""
    frame = frame.copy()
    if "order_group" not in frame:
        frame["order_group"] = order_group(frame)
    frame["regime"] = frame.apply(regime_label, axis=1) if len(frame) else pd.Series(dtype=str)
    text = {name: frame[name].map(_canonical) for name in SERIES_KEYS + CONFIG_FIELDS if name in frame}
    others = [name for name in CONFIG_FIELDS if name in frame]

    def key(names) -> pd.Series:
        joined = pd.Series("", index=frame.index)
        for name in list(names) + others:
            joined = joined + "\x1f" + text[name]
        return joined

    frame["series"], frame["setting"] = key(SERIES_KEYS), key(SETTING_KEYS)
    return frame


@dataclass
class Run:
    """One series at one C: its timed records (every repeat) and its per-response rows."""

    identity: dict
    concurrency: int
    records: pd.DataFrame
    responses: pd.DataFrame


def series_runs(records: pd.DataFrame, responses: pd.DataFrame) -> dict[str, list[Run]]:
    """series key -> its runs, by C."""
    records, responses = _keyed(records), _keyed(responses)
    by_response = {key: g for key, g in responses.groupby(["series", "concurrency"], sort=False)}
    out: dict[str, list[Run]] = {}
    for (series, c), g in records.groupby(["series", "concurrency"], sort=False):
        identity = g.iloc[0].to_dict()
        out.setdefault(series, []).append(Run(identity, int(c), g, by_response.get((series, c), responses.iloc[:0])))
    for runs in out.values():
        runs.sort(key=lambda run: run.concurrency)
    return out


def swept_runs(runs: dict[str, list[Run]]) -> dict[str, list[Run]]:
    return {series: r for series, r in runs.items() if len(r) > 1}


def problem(records: pd.DataFrame, responses: pd.DataFrame, what: str) -> str | None:
    """Why the concurrency tables (`what` = "tables") or figure ("figure") cannot be made from
    these records, None when they can."""
    runs = series_runs(records, responses)
    option = f"--tables {CONCURRENCY}" if what == "tables" else f"--figures {FIGURE}"
    swept = swept_runs(runs)
    if not swept:
        held = ", ".join(str(c) for c in sorted({int(c) for c in records["concurrency"]})) or "none"
        return (
            f"{option} needs a run measured at two or more concurrencies, and no run of these records is "
            f"(C = {held}); run its sweep over C, e.g. python run.py -m ... concurrency=1,2,4,8"
        )
    swept_settings = {r[0].identity["setting"] for r in swept.values()}
    based = any(r[0].identity["schedule"] == BASE and r[0].identity["setting"] in swept_settings for r in runs.values())
    if what == "tables" and not based:
        return (
            f"{option} compares every schedule with Linear-SS at the same C, and no setting measured at several "
            "concurrencies has a Linear-SS run; add schedule=linear to the sweep (e.g. schedule=linear,packed)"
        )
    return None


def check(records: pd.DataFrame, responses: pd.DataFrame, what: str) -> None:
    message = problem(records, responses, what)
    if message is not None:
        raise PackedSSError(message)


def _base_series(series: str, runs: dict[str, list[Run]]) -> str | None:
    """The Linear-SS series a series is compared with: same setting, same W, or Linear-SS's only W."""
    identity = runs[series][0].identity
    candidates = [s for s, r in runs.items() if r[0].identity["schedule"] == BASE and r[0].identity["setting"] == identity["setting"]]
    same = [s for s in candidates if int(runs[s][0].identity["width"]) == int(identity["width"])]
    if same:
        return same[0]
    return candidates[0] if len(candidates) == 1 else None


def time_ratio(method: pd.DataFrame, base: pd.DataFrame, n_resamples: int) -> tuple[CI, int]:
    """(Σwall_method / Σwall_base over the paired question-samples with its CI, the pairs)."""
    joined = pair(method, base)
    sums = question_sums(joined)
    ci = paired_bootstrap(sum_ratio, (sums["wall_s_m"].to_numpy(float), sums["wall_s_b"].to_numpy(float)), n_resamples)
    return ci, len(joined)


def latency_percentiles(records: pd.DataFrame) -> tuple[float, float]:
    """(p50, p95) of `latency_s` in seconds; NaN when a record lacks it."""
    if "latency_s" not in records:
        return math.nan, math.nan
    values = pd.to_numeric(records["latency_s"], errors="coerce").to_numpy(float)
    if not len(values) or np.isnan(values).any():
        return math.nan, math.nan
    p50, p95 = np.percentile(values, [50, 95])
    return float(p50), float(p95)


def host_ms_per_round(records: pd.DataFrame) -> float:
    """(Σ wall - Σ model) / batched calls, in ms: the host time of a round, the job's elapsed time
    less its calls' model time over its batched calls. A record's call carried `call_requests`
    requests, so the batched calls are Σ 1 / call_requests over every record's calls. NaN for
    records without call_requests."""
    if "call_requests" not in records or records["call_requests"].isna().any():
        return math.nan
    rounds = sum(1.0 / requests for calls in records["call_requests"] for requests in calls)
    host = float((records["wall_s"] - records["model_s"]).sum())
    return host / rounds * 1000 if rounds else math.nan


def run_point(run: Run) -> dict:
    """System throughput, latency and host time of one run (the numbers the table and the figure show)."""
    wall = float(run.records["wall_s"].sum())
    p50, p95 = latency_percentiles(run.records)
    return {
        "Responses": len(run.responses),
        "Tokens/s (system)": float(run.records["output_tokens"].sum()) / wall if wall > 0 else math.nan,
        "Latency p50 (s)": p50,
        "Latency p95 (s)": p95,
        "Host ms / round": host_ms_per_round(run.records),
    }


def _labels(identity: dict) -> dict:
    return {
        "Model": model_label(identity["model"]),
        "Task": task_label(identity["task"]),
        "Regime": identity["regime"],
        "Method": schedule_label(identity["schedule"]),
        "W": width_label(identity["width"]),
        "T": f"{float(identity['temperature']):g}",
        "Verify": identity["verify"],
        "Order": ORDER_LABELS.get(identity["order_group"], identity["order_group"]),
        "LoRA": "yes" if identity["lora"] else "",
        "Padded": {"true": "yes", "false": "no"}.get(identity["pad_verify"], ""),
        "Seed": str(int(identity["seed"])),
    }


def _series_rank(identity: dict) -> tuple:
    return (
        family_rank(identity["family"]), identity["model"], task_rank(identity["task"]), identity["temperature"],
        identity["verify"], identity["lora"], order_rank(identity["order_group"]), identity["regime"],
        schedule_rank(identity["schedule"]), identity["width"], identity["pad_verify"], identity["seed"],
    )  # fmt: skip


def ordered_series(runs: dict[str, list[Run]]) -> list[str]:
    return sorted(runs, key=lambda s: _series_rank(runs[s][0].identity))


def _config_labels(runs: dict[str, list[Run]]) -> dict[str, str]:
    """Per series, the identity fields outside the regime in which series of otherwise equal keys
    differ (`field=value`), "" where none does."""
    fields = [f for f in CONFIG_FIELDS if f not in REGIME_FIELDS]
    groups: dict[tuple, list[dict]] = {}
    for r in runs.values():
        identity = r[0].identity
        groups.setdefault(tuple(str(identity[k]) for k in SERIES_KEYS) + (identity["regime"],), []).append(identity)
    differing = [f for f in fields if any(len({_canonical(i.get(f)) for i in g}) > 1 for g in groups.values())]
    return {s: ", ".join(f"{f}={_shown(r[0].identity.get(f))}" for f in differing) for s, r in runs.items()}


KEYS = ["Model", "Task", "Regime", "Method", "W"]
OPTIONAL = ("T", "Verify", "Order", "LoRA", "Padded", "Seed")


def _keys(rows: list[dict]) -> list[str]:
    """KEYS, and each OPTIONAL column that tells rows apart or holds a value."""
    def shown(k: str) -> bool:
        values = {r[k] for r in rows}
        if k == "Padded":  # Packed-SS ran both paddings
            return {"yes", "no"} <= values
        return len(values) > 1 or (k in ("Verify", "Order", "LoRA") and any(values))

    extra = [k for k in OPTIONAL if shown(k)]
    return KEYS + extra


VALUE_COLS = [
    Col("Responses", digits=0),
    Col("Tokens/s (system)", digits=2),
    Col("Latency p50 (s)", digits=3),
    Col("Latency p95 (s)", digits=3),
    Col("Host ms / round", digits=3),
    Col("Time / Linear-SS", kind="ci", digits=3),
    Col("Pairs", kind="text"),
]
CROSSOVER_COLS = [
    Col("C paired", kind="text"),
    Col("Crossover C", kind="text"),
    Col("Time / Linear-SS at crossover", kind="ci", digits=3),
    Col("CI above 1", kind="text"),
    Col("Time / Linear-SS at largest C", kind="ci", digits=3),
]


def concurrency_tables(records: pd.DataFrame, responses: pd.DataFrame, n_resamples: int = N_RESAMPLES) -> list[Table]:
    """The tables `concurrency` (one row per run and C) and `crossover` (one row per schedule
    measured at several C against Linear-SS)."""
    runs = swept_runs(series_runs(records, responses))
    configs = _config_labels(runs)
    rows, crossings, unpaired = [], [], []
    for series in ordered_series(runs):
        base = _base_series(series, runs) if runs[series][0].identity["schedule"] != BASE else None
        base_at = {r.concurrency: r for r in runs[base]} if base else {}
        ratios = []
        for run in runs[series]:
            labels = _labels(run.identity) | {"Config": configs[series], "C": str(run.concurrency)}
            row = labels | run_point(run) | {"Time / Linear-SS": None, "Pairs": ""}
            if run.concurrency in base_at:
                ci, pairs = time_ratio(run.responses, base_at[run.concurrency].responses, n_resamples)
                row |= {"Time / Linear-SS": ci, "Pairs": str(pairs)}
                ratios.append((run.concurrency, ci))
            elif run.identity["schedule"] != BASE:
                unpaired.append(f"{labels['Model']} {labels['Task']} {labels['Method']} W={labels['W']} C={run.concurrency}")
            rows.append(row)
        if len(ratios) > 1:
            crossings.append(_labels(runs[series][0].identity) | {"Config": configs[series]} | crossover(ratios))
    keys = (_keys(rows) if rows else list(KEYS)) + ["C"]
    notes = [
        "One row per run and concurrency C (responses decoded together, each call carrying every active one's rows), "
        "for the runs measured at two or more C. Tokens/s (system) = Σ output tokens / Σ wall over every timed "
        "record: at C > 1 a response's wall is its share of each batched call's model time plus its share of the host time "
        "between batched calls, "
        "so Σ wall is the jobs' elapsed time.",
        "Latency p50/p95: numpy.percentile (linear interpolation) of latency_s, the response's first call's start to "
        "its last call's end, over every timed record. Time / Linear-SS = Σ wall / Σ wall of the Linear-SS run at the "
        "same C (same W, or its only W), paired by question and sample; brackets: 95% paired bootstrap CIs over "
        "questions (BCa, percentile fallback); below 1 the schedule takes less time than Linear-SS.",
        "Regime: eager or compiled calls, dtype, torch threads, device, and cost:<label> where a cost twin's model "
        "time is recorded.",
        "Host ms / round = (Σ wall - Σ model) / batched calls, the batched calls being Σ 1 / call_requests over every "
        "record's calls: the host work of a round between its model calls (at C = 1, per call).",
    ]
    if any(math.isnan(r["Latency p95 (s)"]) for r in rows):
        notes.append("Latency '-': records without latency_s (written before concurrency was recorded).")
    if unpaired:
        notes.append("No Linear-SS run at the same C, so no time ratio: " + "; ".join(unpaired) + ".")
    table = build(CONCURRENCY, "Concurrency: system throughput, latency and time against Linear-SS by C.", rows, keys, VALUE_COLS, notes=notes)
    cross_notes = [
        "C paired: the concurrencies at which both the schedule and Linear-SS ran. Crossover C: the smallest of them at which Σ wall / Σ wall of Linear-SS (the concurrency table's Time / "
        "Linear-SS) reaches 1 or more, where the schedule stops saving time; 'none up to C=<largest>' when it stays below "
        "1. CI above 1: whether that C's 95% CI lies wholly above 1 (no: the crossover is within the noise).",
    ]
    if not crossings:
        cross_notes.append("No schedule has a Linear-SS run at two or more of its concurrencies.")
    keys = _keys(crossings) if crossings else list(KEYS)
    crossing = build(CROSSOVER, "Crossover: the smallest C at which each schedule's time reaches Linear-SS's.", crossings, keys, CROSSOVER_COLS, notes=cross_notes)
    return [table, crossing]


def crossover(ratios: list[tuple[int, CI]]) -> dict:
    """The crossover columns from (C, time ratio) in increasing C."""
    largest = ratios[-1]
    reached = next(((c, ci) for c, ci in ratios if ci.estimate >= 1.0), None)
    out = {"C paired": ", ".join(str(c) for c, _ in ratios), "Time / Linear-SS at largest C": largest[1]}
    if reached is None:
        return out | {"Crossover C": f"none up to C={largest[0]}", "Time / Linear-SS at crossover": None, "CI above 1": "-"}
    c, ci = reached
    above = "-" if math.isnan(ci.low) else ("yes" if ci.low > 1.0 else "no")
    return out | {"Crossover C": str(c), "Time / Linear-SS at crossover": ci, "CI above 1": above}
