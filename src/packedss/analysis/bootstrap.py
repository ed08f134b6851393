"""Paired comparisons by question with 95% paired bootstrap confidence intervals (docs/analysis.md §4).

Pairs: the per-response rows (repeats already averaged, see `metrics.per_response`) of two runs
are joined on (question_id, sample, seed); only question-samples present in both runs are
paired, and the number of pairs is reported with every comparison. When the two runs use
different single seeds (e.g. seed 0 against seed 1) they are paired by (question_id, sample).

Statistics over the pairs:
- Δwall = mean(wall_method - wall_base) (seconds)
- throughput ratio = (Σtok_m / Σwall_m) / (Σtok_b / Σwall_b) (a ratio of sums)
- NFE ratio = ΣNFE_m / ΣNFE_b
- accuracy difference = 100 * mean(correct_m - correct_b) (percentage points; only pairs where
  both runs are scored)

The paper's T = 1 protocol draws K samples per question; the samples of one question are not
independent (they share the question's difficulty), so the bootstrap resamples QUESTIONS and
keeps all K samples of a question together. Each statistic is written over per-question sums
(Σ over the question's pairs, and the pair count), which gives exactly the pair-level value for
any set of questions; with one sample per question this is the ordinary paired bootstrap.

CIs: `scipy.stats.bootstrap(..., paired=True, method="BCa")` over questions, with
`rng=np.random.default_rng(0)` and `N_RESAMPLES` resamples. When BCa is undefined (a degenerate bootstrap distribution, e.g.
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
    "none" (fewer than two resampled units: no interval). `n`: the units resampled (questions,
    for comparisons)."""

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


# Vectorised statistics over per-question sums (the resample axis is the last one).
def mean_difference(method: np.ndarray, base: np.ndarray, pairs: np.ndarray, axis: int = -1) -> np.ndarray:
    """mean(method - base) over the pairs, from per-question sums and pair counts."""
    return (np.sum(method, axis=axis) - np.sum(base, axis=axis)) / np.sum(pairs, axis=axis)


def points_difference(method: np.ndarray, base: np.ndarray, pairs: np.ndarray, axis: int = -1) -> np.ndarray:
    return 100.0 * mean_difference(method, base, pairs, axis)


def ratio_of_sums(
    num_m: np.ndarray, den_m: np.ndarray, num_b: np.ndarray, den_b: np.ndarray, axis: int = -1
) -> np.ndarray:
    return (np.sum(num_m, axis=axis) / np.sum(den_m, axis=axis)) / (np.sum(num_b, axis=axis) / np.sum(den_b, axis=axis))


def sum_ratio(method: np.ndarray, base: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.sum(method, axis=axis) / np.sum(base, axis=axis)


@dataclass(frozen=True)
class Comparison:
    """Method vs baseline over the question-samples both runs answered."""

    pairs: int  # question-sample pairs
    questions: int  # the units the bootstrap resamples
    scored_pairs: int  # pairs where both responses are scored (0 for speed-only tasks)
    delta_wall: CI
    throughput_ratio: CI
    nfe_ratio: CI
    wall_ratio: CI
    accuracy_diff: CI


PAIRED_FIELDS = ("output_tokens", "wall_s", "nfe_total", "correct_f")


def pair(method: pd.DataFrame, base: pd.DataFrame) -> pd.DataFrame:
    """Per-response rows of two runs joined by question and sample (and seed): columns suffixed
    _m and _b."""
    columns = ["question_id", "sample", "seed", *PAIRED_FIELDS]
    m, b = method[columns], base[columns]
    joined = m.merge(b, on=["question_id", "sample", "seed"], suffixes=("_m", "_b"))
    if joined.empty and m["seed"].nunique() == 1 and b["seed"].nunique() == 1:
        joined = m.drop(columns="seed").merge(b.drop(columns="seed"), on=["question_id", "sample"], suffixes=("_m", "_b"))
    return joined.sort_values(["question_id", "sample"], kind="stable").reset_index(drop=True)


def question_sums(joined: pd.DataFrame) -> pd.DataFrame:
    """One row per question: the sums of its pairs' fields and its pair count (`pairs`)."""
    fields = [f"{name}_{side}" for name in PAIRED_FIELDS if name != "correct_f" for side in "mb"]
    grouped = joined.groupby("question_id", sort=True)
    return grouped[fields].sum().join(grouped.size().rename("pairs")).reset_index()


def compare(method: pd.DataFrame, base: pd.DataFrame, n_resamples: int = N_RESAMPLES) -> Comparison:
    joined = pair(method, base)
    sums = question_sums(joined)

    def column(name: str, frame: pd.DataFrame = sums) -> np.ndarray:
        return frame[name].to_numpy(float)

    scored = joined.dropna(subset=["correct_f_m", "correct_f_b"])
    correct = scored.groupby("question_id", sort=True).agg(
        correct_m=("correct_f_m", "sum"), correct_b=("correct_f_b", "sum"), pairs=("correct_f_m", "size")
    )
    return Comparison(
        pairs=len(joined),
        questions=len(sums),
        scored_pairs=len(scored),
        delta_wall=paired_bootstrap(mean_difference, (column("wall_s_m"), column("wall_s_b"), column("pairs")), n_resamples),
        throughput_ratio=paired_bootstrap(
            ratio_of_sums, (column("output_tokens_m"), column("wall_s_m"), column("output_tokens_b"), column("wall_s_b")), n_resamples
        ),
        nfe_ratio=paired_bootstrap(sum_ratio, (column("nfe_total_m"), column("nfe_total_b")), n_resamples),
        wall_ratio=paired_bootstrap(sum_ratio, (column("wall_s_m"), column("wall_s_b")), n_resamples),
        accuracy_diff=paired_bootstrap(
            points_difference, (column("correct_m", correct), column("correct_b", correct), column("pairs", correct)), n_resamples
        ),
    )
