"""Acceptance analytics per run (docs/analysis.md §8): acceptance by draft depth, the lengths of the
verified drafts, the tokens emitted per iteration and latency percentiles; and the portable
`acceptance_profile.json` of each run.

Depth i (1..W) is the i-th draft an iteration verifies (in verification order). With h_t the
drafts iteration t accepted (`accepted_drafts`) and m_t the drafts it verified (`drafted`), over
the I iterations of a run:

- marginal(i) = #{t: h_t >= i} / I
- conditional(i) = #{t: h_t >= i} / #{t: h_t >= i-1 and m_t >= i} (the depth-i draft existed and
  every draft before it was accepted)
- drafted_share(i) = #{t: m_t >= i} / I

The CIs resample questions (each with all its samples): every statistic is a ratio of
per-question sums (`bootstrap.sum_ratio`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from packedss.analysis.bootstrap import CONFIDENCE, CI, paired_bootstrap, sum_ratio
from packedss.analysis.load import RUN_KEYS
from packedss.analysis.metrics import block_of, family_rank, iteration_rows, order_rank, regime_label, schedule_rank, task_rank

SCHEMA = "packedss/acceptance_profile/1"
PROFILE_NAME = "acceptance_profile.json"
PERCENTILES = (50, 95, 99)


def run_sort_key(identity: dict) -> tuple:
    """The runs' order in the tables and figures (as the per-run summary's)."""
    return (
        family_rank(identity["family"]), identity["model"], task_rank(identity["task"]), identity["temperature"],
        identity["verify"], identity["lora"], order_rank(identity["order"]), schedule_rank(identity["schedule"]),
        identity["width"], identity["pad_verify"], identity["seed"], identity.get("concurrency", 1),
    )  # fmt: skip


def _present(value) -> bool:
    return isinstance(value, list)


def with_draft_counts(responses: pd.DataFrame) -> pd.DataFrame:
    """The responses whose records carry the per-iteration draft counts (`drafted`)."""
    if "drafted" not in responses:
        return responses.iloc[:0]
    return responses[responses["drafted"].map(_present)]


def _depth_counts(drafted: list[int], accepted_drafts: list[int], width: int) -> np.ndarray:
    """(3, W): per depth, iterations that accepted it, that reached it with a draft there, that
    verified a draft there."""
    m = np.asarray(drafted, dtype=int)[:, None]
    h = np.asarray(accepted_drafts, dtype=int)[:, None]
    depth = np.arange(1, width + 1)[None, :]
    return np.stack([(h >= depth).sum(0), ((h >= depth - 1) & (m >= depth)).sum(0), (m >= depth).sum(0)])


def _ratio_ci(numerator: np.ndarray, denominator: np.ndarray, n_resamples: int) -> CI:
    """Σnumerator / Σdenominator over questions with its bootstrap CI. Only the questions with a
    positive denominator are resampled (the others add 0 to both sums; resampling them would give
    undefined resamples): with one of them the estimate has no interval, with none it is
    undefined."""
    counted = denominator > 0
    if not counted.any():
        return CI(math.nan, math.nan, math.nan, 0, "none")
    return paired_bootstrap(sum_ratio, (numerator[counted], denominator[counted].astype(float)), n_resamples)


def _ci_lists(cis: list[CI]) -> dict:
    return {
        "estimate": [_json_number(c.estimate) for c in cis],
        "low": [_json_number(c.low) for c in cis],
        "high": [_json_number(c.high) for c in cis],
        "method": [c.method for c in cis],
    }


def _json_number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def run_profile(identity: dict, run: pd.DataFrame, n_resamples: int) -> dict:
    """The acceptance profile of one run from its per-response rows (all carrying draft counts),
    as the JSON object of `acceptance_profile.json`. Its depths run to W, or to the longest draft
    an iteration verified when that is longer (S2D2 verifies up to a block, B = W + 1 drafts)."""
    width = int(identity["width"])
    depths = max([width, *(max(drafted) for drafted in run["drafted"] if len(drafted))])
    questions = sorted(run["question_id"].unique())
    per_question = {q: np.zeros((3, depths), dtype=int) for q in questions}
    iterations_q = dict.fromkeys(questions, 0)
    emitted: list[int] = []
    drafted_all: list[int] = []
    full = accepted_total = 0
    for _, row in run.iterrows():
        counts = _depth_counts(row["drafted"], row["accepted_drafts"], depths)
        per_question[row["question_id"]] += counts
        iterations_q[row["question_id"]] += len(row["drafted"])
        emitted += list(row["accepted"])
        drafted_all += list(row["drafted"])
        full += sum(1 for d, a in zip(row["drafted"], row["accepted_drafts"], strict=True) if d >= 1 and a == d)
        accepted_total += sum(row["accepted_drafts"])
    stacked = np.stack([per_question[q] for q in questions])
    iterations = np.array([iterations_q[q] for q in questions], dtype=float)
    marginal = [_ratio_ci(stacked[:, 0, i], iterations, n_resamples) for i in range(depths)]
    conditional = [_ratio_ci(stacked[:, 0, i], stacked[:, 1, i], n_resamples) for i in range(depths)]
    total = int(iterations.sum())
    verified = stacked[:, 2, :].sum(0)
    longest = max([depths + 1, *emitted])
    return {
        "schema": SCHEMA,
        "identity": {k: _plain(identity[k]) for k in RUN_KEYS} | {"config_hash": str(run["config_hash"].iloc[0])},
        "width": width,
        "block": _json_number(block_of(identity["family"], width)),
        "source": Path(str(run["source"].iloc[0])).name,
        "regime": regime_label(run.iloc[0]),  # one per run: its fields are part of the run's config
        "counts": {
            "questions": len(questions),
            "responses": len(run),
            "iterations": total,
            "draft_proposed": int(sum(drafted_all)),
            "draft_accepted": int(accepted_total),
            "tokens_emitted": int(sum(emitted)),
            "full_accepts": int(full),
            "output_tokens": int(run["output_tokens"].sum()),
            "truncated_tokens": int(run["truncated_tokens"].sum()),
        },
        "depth": list(range(1, depths + 1)),
        "marginal": _ci_lists(marginal),
        "conditional": _ci_lists(conditional),
        "drafted_share": [_json_number(v / total) if total else None for v in verified],
        "draft_length_histogram": np.bincount(np.asarray(drafted_all, dtype=int), minlength=depths + 1).tolist(),
        "emitted_histogram": np.bincount(np.asarray(emitted, dtype=int), minlength=longest + 1).tolist(),
        "emitted": {
            "mean": _json_number(sum(emitted) / total) if total else None,
            "median": _json_number(float(np.median(emitted))) if emitted else None,
            "full_accept_share": _json_number(full / total) if total else None,
        },
        "bootstrap": {"unit": "question", "confidence": CONFIDENCE, "n_resamples": n_resamples, "statistic": "ratio of per-question sums"},
    }


def acceptance_profiles(responses: pd.DataFrame, n_resamples: int) -> list[dict]:
    """One profile per run whose responses carry draft counts (responses without them, written
    before the counts existed, are left out), in the order the runs first appear."""
    counted = with_draft_counts(responses)
    if counted.empty:
        return []
    return [
        run_profile(dict(zip(RUN_KEYS, values, strict=True)), run, n_resamples)
        for values, run in counted.groupby(list(RUN_KEYS), sort=False, dropna=False)
    ]


def profile_path(directory: Path, profile: dict) -> Path:
    """<directory>/<model>/<task>/<record file stem>/acceptance_profile.json"""
    identity = profile["identity"]
    return Path(directory) / identity["model"] / identity["task"] / Path(profile["source"]).stem / PROFILE_NAME


def write_profiles(profiles: list[dict], directory: Path) -> list[Path]:
    paths = []
    for profile in profiles:
        path = profile_path(directory, profile)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(profile, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def read_profiles(directory: Path) -> list[dict]:
    """Every `acceptance_profile.json` under a folder (sorted by path)."""
    profiles = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(Path(directory).rglob(PROFILE_NAME))]
    bad = [p["schema"] for p in profiles if p.get("schema") != SCHEMA]
    if bad:
        raise ValueError(f"acceptance profiles of another schema {sorted(set(bad))}; this version reads {SCHEMA}")
    return profiles


# ----------------------------------------------------------------- latency
def response_latency(record: pd.Series) -> tuple[float, list[float], list[int]]:
    """(TTFT, the time of each iteration, the tokens each emitted) of one timed response: each call
    its model time plus an equal share (nonmodel_s / nfe_total) of the response's non-model time;
    TTFT = the prefill call(s), an iteration = the family's calls per iteration."""
    share = float(record["nonmodel_s"]) / int(record["nfe_total"])
    prefill = int(record["nfe_prefill"])
    calls = list(record["call_model_s"])
    ttft = sum(calls[:prefill]) + prefill * share
    times = [sum(group) + len(group) * share for group in iteration_rows(record, "call_model_s")]
    return ttft, times, list(record["accepted"])


def latency(records: pd.DataFrame) -> dict:
    """Latency of one run over every timed record (repeats included): TTFT, iteration time and
    TPOT (an iteration's time / the tokens it emitted) at PERCENTILES, in ms; and rows per NFE and
    per emitted token over the calls after prefill. Times are NaN when a record lacks
    `call_model_s`."""
    rows_after = sum(sum(r[int(p) :]) for r, p in zip(records["rows_evaluated"], records["nfe_prefill"], strict=True))
    calls_after = float((records["nfe_total"] - records["nfe_prefill"]).sum())
    emitted = float(sum(sum(a) for a in records["accepted"]))
    out = {
        "Records": len(records),
        "Rows/NFE": rows_after / calls_after if calls_after else math.nan,
        "Rows/token": rows_after / emitted if emitted else math.nan,
    }
    timed = records["call_model_s"].map(_present).all()
    ttft, iteration, tpot = [], [], []
    if timed:
        for _, record in records.iterrows():
            first, times, tokens = response_latency(record)
            ttft.append(first)
            iteration += times
            tpot += [t / a for t, a in zip(times, tokens, strict=True) if a > 0]
    for name, values in (("TTFT", ttft), ("Iteration", iteration), ("TPOT", tpot)):
        points = np.percentile(values, PERCENTILES) if values else [math.nan] * len(PERCENTILES)
        out |= {f"{name} p{q} (ms)": 1000.0 * float(v) for q, v in zip(PERCENTILES, points, strict=True)}
    return out
