import math
import warnings

import numpy as np
import pandas as pd
import pytest

from packedss.analysis.bootstrap import (
    compare,
    mean_difference,
    paired_bootstrap,
    points_difference,
    ratio_of_sums,
    sum_ratio,
)


def _paired(n, ratio, seed=0):
    rng = np.random.default_rng(seed)
    tok_b = rng.integers(50, 400, n).astype(float)
    wall_b = tok_b / 100.0 * rng.lognormal(0, 0.2, n)
    tok_m = tok_b.copy()
    wall_m = wall_b / ratio * rng.lognormal(-0.05**2 / 2, 0.05, n)  # noise of mean 1
    return tok_m, wall_m, tok_b, wall_b


def test_ratio_ci_covers_known_ratio():
    # Method walls are the baseline's / 1.25 times mean-one noise: the ratio of sums estimates 1.25.
    tok_m, wall_m, tok_b, wall_b = _paired(2000, 1.25)
    ci = paired_bootstrap(ratio_of_sums, (tok_m, wall_m, tok_b, wall_b), n_resamples=2000)
    assert ci.method == "BCa"
    assert ci.low < 1.25 < ci.high
    assert ci.low < ci.estimate < ci.high
    assert ci.high - ci.low < 0.05


def test_ratio_ci_excludes_wrong_ratio():
    tok_m, wall_m, tok_b, wall_b = _paired(2000, 1.25)
    ci = paired_bootstrap(ratio_of_sums, (tok_m, wall_m, tok_b, wall_b), n_resamples=2000)
    assert not ci.low < 1.0 < ci.high
    assert not ci.low < 1.4 < ci.high


def test_mean_difference_ci_covers_known_shift():
    rng = np.random.default_rng(3)
    base = rng.lognormal(0, 0.5, 1500)
    method = base - 0.15 + rng.normal(0, 0.05, 1500)
    ci = paired_bootstrap(mean_difference, (method, base, np.ones(1500)), n_resamples=2000)
    assert ci.low < -0.15 < ci.high


def test_identical_inputs_give_zero_width_interval_without_nan_or_warnings():
    rng = np.random.default_rng(1)
    wall = rng.lognormal(0, 0.3, 300)
    tok = rng.integers(10, 100, 300).astype(float)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        diff = paired_bootstrap(mean_difference, (wall, wall, np.ones(300)), n_resamples=500)
        ratio = paired_bootstrap(ratio_of_sums, (tok, wall, tok, wall), n_resamples=500)
        nfe = paired_bootstrap(sum_ratio, (tok, tok), n_resamples=500)
    assert caught == []
    assert (diff.estimate, diff.low, diff.high) == (0.0, 0.0, 0.0)
    assert (ratio.estimate, ratio.low, ratio.high) == (1.0, 1.0, 1.0)
    assert (nfe.low, nfe.high) == (1.0, 1.0)


def test_constant_difference_falls_back_without_nan():
    a = np.linspace(1, 2, 50)
    ci = paired_bootstrap(mean_difference, (a + 0.5, a, np.ones(50)), n_resamples=500)
    assert not math.isnan(ci.low) and not math.isnan(ci.high)
    assert ci.low == pytest.approx(0.5) and ci.high == pytest.approx(0.5)


def test_accuracy_difference_in_points():
    m = np.array([1, 1, 1, 0, 1, 1, 0, 1, 1, 1] * 20, float)
    b = np.array([1, 0, 1, 0, 1, 0, 0, 1, 1, 1] * 20, float)
    ci = paired_bootstrap(points_difference, (m, b, np.ones(200)), n_resamples=999)
    assert ci.estimate == pytest.approx(20.0)
    assert ci.low < 20.0 < ci.high
    assert ci.low > 0


def test_fixed_rng_makes_intervals_reproducible():
    tok_m, wall_m, tok_b, wall_b = _paired(200, 1.1)
    a = paired_bootstrap(ratio_of_sums, (tok_m, wall_m, tok_b, wall_b), n_resamples=500)
    b = paired_bootstrap(ratio_of_sums, (tok_m, wall_m, tok_b, wall_b), n_resamples=500)
    assert a == b


def test_fewer_than_two_pairs_give_no_interval():
    ci = paired_bootstrap(mean_difference, (np.array([1.0]), np.array([0.5]), np.array([1.0])))
    assert ci.estimate == 0.5 and math.isnan(ci.low) and ci.method == "none"
    assert ci.format(3) == "0.500"


def _pq(ids, tokens, wall, nfe, correct, seed=0, samples=None):
    return pd.DataFrame(
        {"question_id": ids, "sample": samples if samples is not None else 0, "seed": seed, "output_tokens": tokens,
         "wall_s": wall, "model_s": wall, "nfe_total": nfe, "correct_f": correct}
    )  # fmt: skip


def test_compare_pairs_only_common_questions_and_uses_ratio_of_sums():
    method = _pq(["a", "b", "c", "d"], [10, 20, 30, 99], [1.0, 1.0, 2.0, 9.0], [5, 10, 10, 50], [1.0, 0.0, 1.0, 1.0])
    base = _pq(["b", "c", "a", "e"], [20, 30, 10, 5], [2.0, 2.0, 2.0, 1.0], [10, 10, 10, 3], [1.0, 1.0, 1.0, 0.0])
    c = compare(method, base, n_resamples=200)
    assert c.pairs == 3 and c.questions == 3
    assert c.delta_wall.estimate == pytest.approx(((1 - 2) + (1 - 2) + (2 - 2)) / 3)
    assert c.throughput_ratio.estimate == pytest.approx((60 / 4.0) / (60 / 6.0))
    assert c.nfe_ratio.estimate == pytest.approx(25 / 30)
    assert c.accuracy_diff.estimate == pytest.approx(100 * (2 / 3 - 1))
    assert c.accuracy_diff.n == 3


def test_compare_skips_unscored_pairs_for_accuracy():
    method = _pq(["a", "b"], [10, 20], [1.0, 2.0], [5, 10], [np.nan, np.nan])
    c = compare(method, method.copy(), n_resamples=200)
    assert c.pairs == 2 and c.scored_pairs == 0 and c.accuracy_diff.n == 0 and math.isnan(c.accuracy_diff.estimate)
    assert c.accuracy_diff.format(2, signed=True) == "-"


def test_samples_pair_by_question_and_sample():
    ids = ["a", "a", "b", "b"]
    method = _pq(ids, [10, 20, 30, 40], [1.0, 2.0, 3.0, 4.0], [5, 5, 5, 5], [1.0, 0.0, 1.0, 1.0], samples=[0, 1, 0, 1])
    base = _pq(ids[:3], [10, 10, 10], [2.0, 2.0, 2.0], [5, 5, 5], [0.0, 0.0, 1.0], samples=[1, 0, 0])
    c = compare(method, base, n_resamples=200)
    # a/0 - a/0, a/1 - a/1, b/0 - b/0 (b/1 has no base)
    assert (c.pairs, c.questions, c.scored_pairs) == (3, 2, 3)
    assert c.delta_wall.estimate == pytest.approx(((1 - 2) + (2 - 2) + (3 - 2)) / 3)
    assert c.accuracy_diff.estimate == pytest.approx(100 * ((1 - 0) + (0 - 0) + (1 - 1)) / 3)
    assert c.throughput_ratio.estimate == pytest.approx((60 / 6.0) / (30 / 6.0))


def test_the_interval_resamples_questions_not_samples():
    """Samples of one question are strongly correlated (each question has its own speed-up):
    resampling the 400 samples as if independent would give a much narrower interval than
    resampling the 20 questions, which is the interval `compare` must give."""
    rng = np.random.default_rng(5)
    questions, samples = 20, 20
    effect = rng.normal(0.0, 1.0, questions)  # Δwall of each question, shared by its samples
    ids = [f"q{q:02d}" for q in range(questions) for _ in range(samples)]
    sample = [k for _ in range(questions) for k in range(samples)]
    base_wall = np.full(questions * samples, 5.0)
    method_wall = base_wall + np.repeat(effect, samples) + rng.normal(0.0, 0.01, questions * samples)
    ones = np.ones(questions * samples)
    method = _pq(ids, ones, method_wall, ones, ones, samples=sample)
    base = _pq(ids, ones, base_wall, ones, ones, samples=sample)
    c = compare(method, base, n_resamples=999)
    assert (c.pairs, c.questions) == (questions * samples, questions)
    per_question = (method_wall - base_wall).reshape(questions, samples).sum(axis=1)
    by_question = paired_bootstrap(mean_difference, (per_question, np.zeros(questions), np.full(questions, samples)), 999)
    by_sample = paired_bootstrap(mean_difference, (method_wall, base_wall, ones), 999)
    assert (c.delta_wall.low, c.delta_wall.high) == pytest.approx((by_question.low, by_question.high))
    assert c.delta_wall.estimate == pytest.approx(by_sample.estimate)
    assert (by_question.high - by_question.low) > 3 * (by_sample.high - by_sample.low)
    assert c.delta_wall.n == questions
