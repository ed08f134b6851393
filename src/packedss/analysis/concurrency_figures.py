"""Figure C1 (`--figures C1`, docs/analysis.md §10): system tokens/s (top) and p95 per-request
latency (bottom) against the concurrency C on a log2 axis, one column of panels per setting (model,
task, temperature, regime, config), one curve per run (schedule, W, padding) measured at two or more
C, in the schedules' colours. The numbers are the concurrency table's (`concurrency.run_point`)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from packedss.analysis.concurrency import FIGURE, ordered_series, run_point, series_runs, swept_runs
from packedss.analysis.metrics import model_label, schedule_colour, schedule_label, schedule_marker, task_label

TITLE = f"Figure {FIGURE}: system throughput and p95 latency against concurrency C"
COLUMNS = ["panel", "run", "schedule", "width", "concurrency", "responses", "tokens_per_s", "latency_p50_s", "latency_p95_s"]


def _panel_title(identity: dict) -> str:
    title = f"{model_label(identity['model'])} {task_label(identity['task'])}, T={float(identity['temperature']):g}"
    if identity["verify"]:
        title += f" ({identity['verify']})"
    return title + (", LoRA" if identity["lora"] else "") + f"\n{identity['regime']}"


def _curve_label(identity: dict, widths: int) -> str:
    label = schedule_label(identity["schedule"])
    if identity["order_group"] and identity["schedule"] != "native":
        label += f" ({identity['order_group']})"
    if widths > 1 and int(identity["width"]):
        label += f" W={int(identity['width'])}"
    return label + (" unpadded" if identity["pad_verify"] == "false" else "")


def concurrency_data(records: pd.DataFrame, responses: pd.DataFrame) -> pd.DataFrame:
    """One row per run and C: the numbers the figure plots."""
    runs = swept_runs(series_runs(records, responses))
    order = ordered_series(runs)
    panels: dict[str, list[str]] = {}
    for series in order:
        panels.setdefault(runs[series][0].identity["setting"], []).append(series)
    rows = []
    for members in panels.values():
        widths = len({int(runs[s][0].identity["width"]) for s in members})
        title = _panel_title(runs[members[0]][0].identity)
        for series in members:
            identity = runs[series][0].identity
            for run in runs[series]:
                point = run_point(run)
                rows.append({
                    "panel": title, "run": _curve_label(identity, widths), "schedule": identity["schedule"],
                    "width": int(identity["width"]), "concurrency": run.concurrency, "responses": point["Responses"],
                    "tokens_per_s": point["Tokens/s (system)"], "latency_p50_s": point["Latency p50 (s)"],
                    "latency_p95_s": point["Latency p95 (s)"],
                })  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def figure_c1(records: pd.DataFrame, responses: pd.DataFrame) -> tuple[plt.Figure, pd.DataFrame, list[str]]:
    data = concurrency_data(records, responses)
    notes = []
    if data.empty:
        message = "No run measured at two or more concurrencies in these records."
        fig, ax = plt.subplots(figsize=(6, 2.5))
        ax.axis("off")
        ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
        fig.suptitle(TITLE)
        return fig, data, [message]
    panels = list(dict.fromkeys(data["panel"]))
    fig, axes = plt.subplots(2, len(panels), figsize=(4.6 * len(panels) + 1.5, 7.0), squeeze=False, sharex="col")
    for k, panel in enumerate(panels):
        top, bottom = axes[0][k], axes[1][k]
        sub = data[data["panel"] == panel]
        for run, curve in sub.groupby("run", sort=False):
            schedule = curve["schedule"].iloc[0]
            style = {"color": schedule_colour(schedule), "marker": schedule_marker(schedule), "label": run}
            top.plot(curve["concurrency"], curve["tokens_per_s"], **style)
            latency = curve["latency_p95_s"].to_numpy(float)
            if np.isnan(latency).all():
                notes.append(f"{panel.splitlines()[0]} {run}: no latency_s in its records, no p95 curve.")
            bottom.plot(curve["concurrency"], latency, **style)
        measured = sorted(sub["concurrency"].unique())
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xticks(measured, [str(c) for c in measured])
            ax.minorticks_off()
            ax.grid(alpha=0.3)
        top.set_title(panel, fontsize=9)
        top.set_ylabel("System tokens/s")
        bottom.set_ylabel("p95 latency per request (s)")
        bottom.set_xlabel("Concurrency C (log2)")
        top.set_ylim(bottom=0)
        if np.isfinite(sub["latency_p95_s"].to_numpy(float)).any():
            bottom.set_ylim(bottom=0)
        top.legend(fontsize=7, frameon=True, framealpha=0.85, loc="best")
    fig.suptitle(TITLE + " (system: Σ tokens / Σ wall over a job's responses)", fontsize=11)
    fig.tight_layout()
    return fig, data, notes + [f"{len(panels)} panels, {data['run'].nunique()} curves"]
