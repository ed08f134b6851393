"""The goodness-of-fit check of the distribution-preservation tests (LTR and any-order)."""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import chisquare

LEVEL = 1e-3  # reject "same distribution" below this p-value
# The negative controls' samples: 1,000, against a test's 4,000 or 5,000. A control that fails on
# them shows the test's power at that size, and a test of more samples has more. Measured
# (2026-12-07), the controls' p-values on 1,000 samples: 6e-14 (PLD's) and 7e-23 or below (the
# others'), far below LEVEL, so the verdict does not hang on the seeds.
CONTROL_RUNS = 1000


def schedules_and_rules(drafting: tuple[str, ...]) -> list[tuple[str, str]]:
    """The (schedule, rule) cases of a distribution test: AR once (it verifies no drafts, so it
    reads no rule: its samples are the same under both), each drafting schedule under both rules."""
    return [("ar", "rejection")] + [(schedule, rule) for schedule in drafting for rule in ("rejection", "match")]


def chi_square_p(samples: list[tuple[int, ...]], probs: dict) -> float:
    """Chi-square goodness of fit of sampled sequences against exact probabilities; cells with
    expected count < 5 are pooled into one."""
    counts = dict.fromkeys(probs, 0)
    for seq in samples:
        counts[seq] += 1
    big = [seq for seq, p in probs.items() if p * len(samples) >= 5]
    small = [seq for seq in probs if seq not in big]
    observed = [counts[s] for s in big] + [sum(counts[s] for s in small)]
    expected = [probs[s] * len(samples) for s in big] + [sum(probs[s] for s in small) * len(samples)]
    observed, expected = np.array(observed, float), np.array(expected, float)
    expected *= observed.sum() / expected.sum()
    return float(chisquare(observed, expected).pvalue)


def accept_every_draft(verifier_logits, drafts, draft_probs, sampling):
    """A deliberately broken verifier (the negative control): accepts every draft, then samples a
    bonus from the last verifier row. Monkeypatched over `verify`, it must fail the chi-square test."""
    bonus = torch.multinomial(torch.softmax(verifier_logits[-1], -1), 1, generator=sampling.generator)
    return drafts.tolist() + bonus.tolist()
