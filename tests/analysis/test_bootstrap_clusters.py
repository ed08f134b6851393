"""The accuracy interval of `compare` resamples questions, keeping a question's samples together:
on samples that share their question's difficulty it is the by-question interval (n = the
questions), much wider than one that treats the samples as independent."""

import numpy as np
import pandas as pd
import pytest

from packedss.analysis.bootstrap import compare, paired_bootstrap, points_difference

QUESTIONS, SAMPLES = 20, 20


def _run(ids, samples, correct):
    ones = np.ones(len(ids))
    return pd.DataFrame({"question_id": ids, "sample": samples, "seed": 0, "output_tokens": ones, "wall_s": ones,
                         "model_s": ones, "nfe_total": ones, "correct_f": correct})  # fmt: skip


def test_the_accuracy_interval_resamples_questions_not_samples():
    rng = np.random.default_rng(3)
    ids = [f"q{q:02d}" for q in range(QUESTIONS) for _ in range(SAMPLES)]
    sample = [k for _ in range(QUESTIONS) for k in range(SAMPLES)]
    # each question is easy or hard for the method (its samples agree), and a coin flip for the base
    easy = np.repeat(rng.random(QUESTIONS) < 0.5, SAMPLES)
    method = (rng.random(QUESTIONS * SAMPLES) < np.where(easy, 0.95, 0.05)).astype(float)
    base = (rng.random(QUESTIONS * SAMPLES) < 0.5).astype(float)
    c = compare(_run(ids, sample, method), _run(ids, sample, base), n_resamples=999)
    assert c.accuracy_diff.n == QUESTIONS
    by_question = paired_bootstrap(points_difference, (method.reshape(QUESTIONS, SAMPLES).sum(axis=1),
                                                       base.reshape(QUESTIONS, SAMPLES).sum(axis=1),
                                                       np.full(QUESTIONS, SAMPLES)), 999)  # fmt: skip
    by_sample = paired_bootstrap(points_difference, (method, base, np.ones(QUESTIONS * SAMPLES)), 999)
    assert c.accuracy_diff.estimate == pytest.approx(100 * (method.mean() - base.mean()))
    assert (c.accuracy_diff.low, c.accuracy_diff.high) == pytest.approx((by_question.low, by_question.high))
    assert (by_question.high - by_question.low) > 2 * (by_sample.high - by_sample.low)
