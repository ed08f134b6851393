"""Which runs are compared with which (the paired tables 10-13 and figures 3-4).

A *setting* is everything that must match between two compared runs: family, model, task,
temperature, verification rule, LoRA, and for a family with verification orders (SetDLM) also
the window W and the order group. A lossy schedule (native decoding) has no order: `load` keeps
one run of it per setting, and it is compared within the family's first order group (LTR, as
the paper's Tables 8-9 list it), never in two groups, so each of its comparisons has exactly
questions x samples pairs. Runs of different configs (the `config` column of `load`: dtype,
compile mode, output cap, ...) or of different concurrencies (C) are never paired. A schedule that reads no W (the LTR AR target,
recorded at W = 0) is compared with the other schedule at each of its widths. In a family without orders (Nemotron) the schedules of a setting may
use different widths (the paper compares Packed-SS at B = 32 with Quadratic-SS at B = 8): when
each of the two schedules has exactly one width they are compared as they are; when either has
several widths, only equal widths are compared and the setting is labelled with its W. When
Packed-SS ran both with and without `pad_verify`, the padded run (the paper's counting) is
compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from packedss.analysis.bootstrap import N_RESAMPLES, Comparison, compare
from packedss.families import FAMILIES
from packedss.analysis.metrics import (
    MODEL_SHORT,
    ORDER_LABELS,
    family_orders,
    per_question,
    rates,
    schedule_label,
    sort_schedules,
    task_label,
)

SETTING = ("model", "task", "temperature", "verify", "lora", "config", "concurrency")
ORDERED_SETTING = SETTING + ("width", "order_group")


@dataclass(frozen=True)
class Pairing:
    """One comparison of `method` against `base` within a setting."""

    family: str
    model: str
    task: str
    temperature: float
    verify: str
    lora: bool
    config: str
    width: int | None  # set when the comparison is at one width (families with orders, or split widths)
    order: str  # verification order group ("" for families without orders)
    method: str
    base: str
    method_width: int
    base_width: int
    concurrency: int = 1  # C: both runs decoded C responses together
    method_ngram: int = 0  # pld's longest n-gram looked up (max_ngram) of each run; 0 for other schedules
    base_ngram: int = 0

    @property
    def setting_label(self) -> str:
        """The paper's "Setting": "3B MBPP" (Nemotron) or "W=8 LTR" (SetDLM); " C=4" at a
        concurrency above 1."""
        concurrency = f" C={self.concurrency}" if self.concurrency > 1 else ""
        if family_orders(self.family):
            return f"W={self.width} {ORDER_LABELS.get(self.order, self.order)}{concurrency}"
        label = f"{MODEL_SHORT.get(self.model, self.model)} {task_label(self.task)}"
        if self.width is not None:
            label += f" W={self.width}"
        label += concurrency
        label += "".join(f" n={n}" for n in (self.method_ngram, self.base_ngram) if n)
        if self.temperature > 0 and self.verify and self.verify != "rejection":
            label += f" ({self.verify})"
        if self.config:
            label += f" [{self.config}]"
        return label


def _with_ngrams(group: pd.DataFrame, method: str, base: str, combos: list[tuple]) -> list[tuple]:
    """Each (width, method W, base W) once per pair of the runs' max_ngram values: pld runs of
    two n are two comparisons, each against the same AR run (every other schedule's n is 0)."""
    def ngrams(schedule: str, width: int) -> list[int]:
        rows = group[(group["schedule"] == schedule) & (group["width"] == width)]
        return sorted(int(n) for n in rows["max_ngram"].unique())

    return [(width, wm, wb, nm, nb) for width, wm, wb in combos for nm in ngrams(method, wm) for nb in ngrams(base, wb)]


class Comparisons:
    """Per-response rows of every run (for pairing), their per-question rows (for tables), and a
    cache of paired comparisons."""

    def __init__(self, responses: pd.DataFrame, n_resamples: int = N_RESAMPLES):
        self.responses = responses
        self.pq = per_question(responses)
        self.n_resamples = n_resamples
        self._cache: dict[Pairing, Comparison] = {}
        self.derived: dict[str, object] = {}  # what a table and its figure both read, computed once (by name)

    def runs(self, pairing: Pairing, which: str) -> pd.DataFrame:
        schedule = pairing.method if which == "method" else pairing.base
        width = pairing.method_width if which == "method" else pairing.base_width
        ngram = pairing.method_ngram if which == "method" else pairing.base_ngram
        rows = self.responses
        mask = (
            (rows["family"] == pairing.family)
            & (rows["model"] == pairing.model)
            & (rows["task"] == pairing.task)
            & (rows["temperature"] == pairing.temperature)
            & (rows["verify"] == pairing.verify)
            & (rows["lora"] == pairing.lora)
            & (rows["config"] == pairing.config)
            & (rows["schedule"] == schedule)
            & (rows["width"] == width)
            & (rows["max_ngram"] == ngram)
            & (rows["order_group"] == pairing.order)
            & (rows["concurrency"] == pairing.concurrency)
        )
        run = rows[mask]
        if run["pad_verify"].nunique() > 1:  # both Packed-SS paddings ran: compare the paper's (padded)
            keep = "true" if (run["pad_verify"] == "true").any() else sorted(run["pad_verify"].unique())[0]
            run = run[run["pad_verify"] == keep]
        return run

    def pairings(self, method: str, base: str, frame: pd.DataFrame | None = None) -> list[Pairing]:
        """Every comparison of schedule `method` against `base` that the records allow."""
        frame = self.pq if frame is None else frame
        out: list[Pairing] = []
        for family, rows in frame.groupby("family", sort=False):
            ordered = bool(family_orders(family))
            keys = list(ORDERED_SETTING if ordered else SETTING)
            width_free = {d.name for d in FAMILIES[family].decoders if not d.uses_width} if family in FAMILIES else set()
            for values, group in rows.groupby(keys, sort=True):
                setting = dict(zip(keys, values, strict=True))
                widths_m = sorted(group.loc[group["schedule"] == method, "width"].unique())
                widths_b = sorted(group.loc[group["schedule"] == base, "width"].unique())
                if not widths_m or not widths_b:
                    continue
                if ordered:
                    combos = [(int(setting["width"]), int(setting["width"]), int(setting["width"]))]
                elif len(widths_m) == 1 and len(widths_b) == 1:
                    combos = [(None, int(widths_m[0]), int(widths_b[0]))]
                elif base in width_free:
                    combos = [(int(w), int(w), int(widths_b[0])) for w in widths_m]
                elif method in width_free:
                    combos = [(int(w), int(widths_m[0]), int(w)) for w in widths_b]
                else:
                    combos = [(int(w), int(w), int(w)) for w in widths_m if w in widths_b]
                for width, wm, wb, nm, nb in _with_ngrams(group, method, base, combos):
                    out.append(
                        Pairing(
                            family=family,
                            model=setting["model"],
                            task=setting["task"],
                            temperature=float(setting["temperature"]),
                            verify=setting["verify"],
                            lora=bool(setting["lora"]),
                            config=setting["config"],
                            width=width,
                            order=setting.get("order_group", ""),
                            method=method,
                            base=base,
                            method_width=wm,
                            base_width=wb,
                            concurrency=int(setting["concurrency"]),
                            method_ngram=nm,
                            base_ngram=nb,
                        )
                    )
        return out

    def compare(self, pairing: Pairing) -> Comparison:
        if pairing not in self._cache:
            self._cache[pairing] = compare(self.runs(pairing, "method"), self.runs(pairing, "base"), self.n_resamples)
        return self._cache[pairing]

    def sign_flips(self) -> list[str]:
        """A note for every comparison of two schedules (each pair of schedules of a setting) in
        which a rate of `metrics.RATES` is higher for one run when pooled (aggregate totals) and
        for the other when averaged per request."""
        notes = []
        schedules = sort_schedules(self.responses["schedule"].unique())
        for k, base in enumerate(schedules):
            for method in schedules[k + 1 :]:
                for p in self.pairings(method, base):
                    m, b = rates(self.runs(p, "method")), rates(self.runs(p, "base"))
                    setting = p.setting_label
                    if family_orders(p.family):
                        setting = f"{MODEL_SHORT.get(p.model, p.model)} {task_label(p.task)} {setting}"
                    for name in m:
                        pooled, per_request = m[name][0] - b[name][0], m[name][1] - b[name][1]
                        if pooled * per_request < 0:
                            notes.append(
                                f"Sign differs, {setting} T={p.temperature:g}: "
                                f"{name} of {schedule_label(method)} (W={p.method_width}) minus {schedule_label(base)} "
                                f"(W={p.base_width}) is {pooled:+.4g} pooled but {per_request:+.4g} per request."
                            )
        return notes
