"""Paired comparisons by question with 95% paired bootstrap confidence intervals (SPEC §6).

Pairs: the per-question rows (repeats already averaged, see `metrics.per_question`) of two runs
are joined on (question_id, seed); only questions present in both runs are paired, and the
number of pairs is reported with every comparison. When the two runs use different single seeds
(e.g. seed 0 against seed 1) they are paired by question alone.

Statistics, each resampled over the same paired questions:
- Δwall = mean(wall_method - wall_base) (seconds)
- throughput ratio = (Σtok_m / Σwall_m) / (Σtok_b / Σwall_b) (a ratio of sums)
- NFE ratio = ΣNFE_m / ΣNFE_b
- accuracy difference = 100 * mean(correct_m - correct_b) (percentage points; only pairs where
  both runs are scored)

CIs: `scipy.stats.bootstrap(..., paired=True, method="BCa")` with `rng=np.random.default_rng(0)`
and `N_RESAMPLES` resamples. When BCa is undefined (a degenerate bootstrap distribution, e.g.
identical inputs) the percentile interval is used instead; a constant statistic gives [x, x].
No warning leaks out.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

N_RESAMPLES = 10_000
CONFIDENCE = 0.95
SEED = 0
BATCH = 500  # resamples evaluated at once (bounds memory on large question sets)


@dataclass(frozen=True)
class CI:
    """A point estimate and its confidence interval. `method` says how the interval was made:
    "BCa", "percentile" (BCa undefined), "constant" (every resample gives the estimate) or
    "none" (fewer than two pairs: no interval)."""

    estimate: float
    low: float
    high: float
    n: int
    method: str

    def format(self, digits: int, signed: bool = False) -> str:
        if math.isnan(self.estimate):
            return "-"
        spec = f"{'+' if signed else ''}.{digits}f"
        text = format(self.estimate, spec)
        if math.isnan(self.low):
            return text
        return f"{text} [{format(self.low, spec)}, {format(self.high, spec)}]"


def paired_bootstrap(
    statistic: Callable[..., np.ndarray],
    arrays: Sequence[np.ndarray],
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> CI:
    """CI of a vectorised `statistic(*arrays, axis=-1)` over paired resamples of the arrays."""
    data = tuple(np.asarray(a, dtype=float) for a in arrays)
    n = len(data[0])
    if any(len(a) != n for a in data):
        raise ValueError("paired arrays must have the same length")
    if n == 0:
        return CI(math.nan, math.nan, math.nan, 0, "none")
    estimate = float(statistic(*data, axis=-1))
    if n < 2 or not math.isfinite(estimate):
        return CI(estimate, math.nan, math.nan, n, "none")
    low, high, method = math.nan, math.nan, "BCa"
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with np.errstate(all="ignore"):
                result = stats.bootstrap(
                    data,
                    statistic,
                    n_resamples=n_resamples,
                    batch=BATCH,
                    vectorized=True,
                    paired=True,
                    axis=-1,
                    confidence_level=confidence,
                    method=method,
                    rng=np.random.default_rng(seed),
                )
        low = float(result.confidence_interval.low)
        high = float(result.confidence_interval.high)
        distribution = np.asarray(result.bootstrap_distribution)
        if np.all(distribution == distribution.flat[0]) and distribution.flat[0] == estimate:
            return CI(estimate, estimate, estimate, n, "constant")
        if math.isfinite(low) and math.isfinite(high):
            return CI(estimate, low, high, n, method)
    return CI(estimate, estimate, estimate, n, "constant")


# Vectorised statistics (the resample axis is the last one).
def mean_difference(method: np.ndarray, base: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(method - base, axis=axis)


def ratio_of_sums(
    num_m: np.ndarray, den_m: np.ndarray, num_b: np.ndarray, den_b: np.ndarray, axis: int = -1
) -> np.ndarray:
    return (np.sum(num_m, axis=axis) / np.sum(den_m, axis=axis)) / (np.sum(num_b, axis=axis) / np.sum(den_b, axis=axis))


def sum_ratio(method: np.ndarray, base: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.sum(method, axis=axis) / np.sum(base, axis=axis)


def points_difference(method: np.ndarray, base: np.ndarray, axis: int = -1) -> np.ndarray:
    return 100.0 * np.mean(method - base, axis=axis)


@dataclass(frozen=True)
class Comparison:
    """Method vs baseline over the questions both runs answered."""

    pairs: int
    delta_wall: CI
    throughput_ratio: CI
    nfe_ratio: CI
    wall_ratio: CI
    accuracy_diff: CI  # n = scored pairs (0 for speed-only tasks)


def pair(method: pd.DataFrame, base: pd.DataFrame) -> pd.DataFrame:
    """Per-question rows of two runs joined by question (and seed): columns suffixed _m and _b."""
    columns = ["question_id", "seed", "output_tokens", "wall_s", "model_s", "nfe_total", "correct_f"]
    m, b = method[columns], base[columns]
    joined = m.merge(b, on=["question_id", "seed"], suffixes=("_m", "_b"))
    if joined.empty and m["seed"].nunique() == 1 and b["seed"].nunique() == 1:
        joined = m.drop(columns="seed").merge(b.drop(columns="seed"), on="question_id", suffixes=("_m", "_b"))
    return joined.sort_values("question_id", kind="stable").reset_index(drop=True)


def compare(method: pd.DataFrame, base: pd.DataFrame, n_resamples: int = N_RESAMPLES) -> Comparison:
    joined = pair(method, base)
    tok_m, tok_b = joined["output_tokens_m"].to_numpy(float), joined["output_tokens_b"].to_numpy(float)
    wall_m, wall_b = joined["wall_s_m"].to_numpy(float), joined["wall_s_b"].to_numpy(float)
    nfe_m, nfe_b = joined["nfe_total_m"].to_numpy(float), joined["nfe_total_b"].to_numpy(float)
    scored = joined.dropna(subset=["correct_f_m", "correct_f_b"])
    return Comparison(
        pairs=len(joined),
        delta_wall=paired_bootstrap(mean_difference, (wall_m, wall_b), n_resamples),
        throughput_ratio=paired_bootstrap(ratio_of_sums, (tok_m, wall_m, tok_b, wall_b), n_resamples),
        nfe_ratio=paired_bootstrap(sum_ratio, (nfe_m, nfe_b), n_resamples),
        wall_ratio=paired_bootstrap(sum_ratio, (wall_m, wall_b), n_resamples),
        accuracy_diff=paired_bootstrap(
            points_difference, (scored["correct_f_m"].to_numpy(float), scored["correct_f_b"].to_numpy(float)), n_resamples
        ),
    )
