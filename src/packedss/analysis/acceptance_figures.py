"""Figures A1 and A2, drawn from acceptance profiles (the objects of `acceptance_profile.json`),
so that the analysis and the notebook draw them from the same files.

- A1: acceptance by draft depth, one panel per model, task, W, T and LoRA, one curve per run
  (schedule; any-order runs also by verification order): the marginal P(depth i accepted) with its
  95% CI band and, dotted, the share of iterations that verified a depth-i draft (below 1 only
  when drafts are shorter than W: Packed-SS); below it the conditional P(i accepted | 1..i-1
  accepted, a depth-i draft verified).
- A2: the distribution of tokens emitted per iteration, one panel per model, task, W, T and LoRA,
  one step curve per run (share of its iterations), with the mean, median and share of full
  accepts in the legend.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, MaxNLocator

from packedss.analysis.acceptance import run_sort_key
from packedss.analysis.metrics import ORDER_LABELS, model_label, schedule_colour, schedule_label, schedule_marker, task_label

PANEL_KEYS = ("family", "model", "task", "width", "temperature", "verify", "lora")
ORDER_STYLES = {"confidence": "--"}
PANELS_PER_ROW = 4


def panel_title(identity: dict) -> str:
    width = f", W={int(identity['width'])}" if int(identity["width"]) else ""  # AR runs without a W (recorded as 0)
    title = f"{model_label(identity['model'])} {task_label(identity['task'])}{width}, T={float(identity['temperature']):g}"
    if identity["verify"]:
        title += f" ({identity['verify']})"
    return title + (", LoRA" if identity["lora"] else "")


def run_label(identity: dict, seeds: int) -> str:
    label = schedule_label(identity["schedule"])
    if identity["order"] and identity["schedule"] != "native":
        label += f" ({ORDER_LABELS.get(identity['order'], identity['order'])})"
    if identity["pad_verify"] == "false":
        label += " unpadded"
    if identity.get("concurrency", 1) > 1:
        label += f" C={identity['concurrency']}"
    return label + (f" s{identity['seed']}" if seeds > 1 else "")


def _panel_rank(identity: dict) -> tuple:
    """Runs in the tables' order, panels by family, model, task, T, LoRA and then W."""
    rank = run_sort_key(identity)
    return rank[:6] + (identity["width"],) + rank


def panels(profiles: list[dict]) -> list[tuple[str, list[tuple[str, dict]]]]:
    """(panel title, [(run label, profile)]) in the tables' run order."""
    out: dict[tuple, list[dict]] = {}
    for profile in sorted(profiles, key=lambda p: _panel_rank(p["identity"])):
        out.setdefault(tuple(profile["identity"][k] for k in PANEL_KEYS), []).append(profile)
    result = []
    for runs in out.values():
        seeds = len({p["identity"]["seed"] for p in runs})
        result.append((panel_title(runs[0]["identity"]), [(run_label(p["identity"], seeds), p) for p in runs]))
    return result


def _values(values: list) -> np.ndarray:
    return np.array([math.nan if v is None else v for v in values], dtype=float)


def _where_drafted(values: list, share: np.ndarray) -> np.ndarray:
    """Values at the depths some iteration drafted; NaN (no point, the curve ends) at a depth never
    drafted (Packed-SS's last, W), whose 0 accepted would read as "always rejected"."""
    out = _values(values)
    out[share == 0] = math.nan
    return out


def _style(profile: dict) -> dict:
    identity = profile["identity"]
    return {"color": schedule_colour(identity["schedule"]), "linestyle": ORDER_STYLES.get(identity["order"], "-")}


LEGEND_LINE_IN = 0.16  # inches per legend entry at fontsize 7


def _grid(count: int, rows_per_panel: int, height: float, legend_lines: list[int] | None = None):
    """`count` panels, PANELS_PER_ROW to a row, each of `rows_per_panel` axes over `height` inches.
    With `legend_lines` (the legend entries of each panel), each panel gets one more row below its
    axes, with no axes drawn, for its legend, as tall as the longest legend of its row of panels:
    a legend there covers no curve, however many runs a panel has."""
    columns = min(count, PANELS_PER_ROW)
    panel_rows = math.ceil(count / columns)
    per_panel = rows_per_panel + (legend_lines is not None)
    heights = []
    for row in range(panel_rows):
        heights += [height / rows_per_panel] * rows_per_panel
        if legend_lines is not None:
            heights.append(LEGEND_LINE_IN * max(legend_lines[row * columns : (row + 1) * columns]) + 0.2)
    fig, axes = plt.subplots(len(heights), columns, figsize=(4.2 * columns + 1.0, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})  # fmt: skip
    for k in range(panel_rows * columns):
        for r in range(per_panel):
            if k >= count or r >= rows_per_panel:  # no panel there, or a legend's row
                axes[(k // columns) * per_panel + r][k % columns].axis("off")
    return fig, [[axes[(k // columns) * per_panel + r][k % columns] for r in range(per_panel)] for k in range(count)]


def _empty(message: str, title: str) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    fig.suptitle(title)
    return fig


A1_TITLE = "Figure A1: acceptance by draft depth"
A2_TITLE = "Figure A2: tokens emitted per iteration"


def regime_line(profiles: list[dict]) -> str:
    """The regimes the runs were measured in, as Figures 3, 5 and C1 name them (a profile written
    before profiles held it says so)."""
    return " | ".join(sorted({profile.get("regime", "regime not recorded") for profile in profiles}))


def figure_a1(profiles: list[dict]) -> tuple[plt.Figure, pd.DataFrame, list[str]]:
    """Runs that verified no draft (AR, native) have no curve."""
    drafting = [p for p in profiles if p["counts"]["draft_proposed"] > 0]
    rows = []
    if not drafting:
        message = "No runs with verified drafts (and per-iteration draft counts) in these records."
        return _empty(message, A1_TITLE), pd.DataFrame(rows), [message]
    layout = panels(drafting)
    fig, axes = _grid(len(layout), 2, 6.0)
    for (title, runs), (top, bottom) in zip(layout, axes, strict=True):
        for label, profile in runs:
            depth = np.array(profile["depth"])
            share = _values(profile["drafted_share"])
            curves = {f"{name}{part}": _where_drafted(profile[name][key], share) for name in ("marginal", "conditional")
                      for part, key in (("", "estimate"), ("_low", "low"), ("_high", "high"))}  # fmt: skip
            style = _style(profile)
            marker = {"marker": schedule_marker(profile["identity"]["schedule"]), "markersize": 3.5, "markerfacecolor": "none"}
            top.plot(depth, curves["marginal"], label=label, **marker, **style)
            top.fill_between(depth, curves["marginal_low"], curves["marginal_high"], color=style["color"], alpha=0.15, linewidth=0)
            if np.nanmin(share) < 1:
                top.plot(depth, share, color=style["color"], linestyle=":", linewidth=1.2, label=f"{label}: drafted share")
            bottom.plot(depth, curves["conditional"], label=label, **marker, **style)
            bottom.fill_between(depth, curves["conditional_low"], curves["conditional_high"], color=style["color"], alpha=0.15, linewidth=0)
            for i, d in enumerate(profile["depth"]):
                rows.append({"panel": title, "run": label, "depth": d} | {k: float(v[i]) for k, v in curves.items()}
                            | {"drafted_share": profile["drafted_share"][i], "iterations": profile["counts"]["iterations"]})  # fmt: skip
        top.set_title(title, fontsize=10)
        top.set_ylabel("P(depth i accepted)")
        bottom.set_ylabel("P(i accepted | 1..i−1)")
        bottom.set_xlabel("Draft depth i")
        for ax in (top, bottom):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlim(0.5, max(max(p["depth"], default=p["width"]) for _, p in runs) + 0.5)
            ax.grid(alpha=0.3)
        top.legend(fontsize=7, frameon=True, framealpha=0.85, loc="best")
    fig.suptitle(A1_TITLE + " (bands: 95% bootstrap CIs over questions; dotted: share of iterations with a depth-i draft)\n"
                 + regime_line(drafting), fontsize=11)  # fmt: skip
    fig.tight_layout()
    return fig, pd.DataFrame(rows), [f"{len(layout)} panels, {len(drafting)} runs"]


def figure_a2(profiles: list[dict]) -> tuple[plt.Figure, pd.DataFrame, list[str]]:
    rows = []
    if not profiles:
        message = "No runs with per-iteration draft counts in these records."
        return _empty(message, A2_TITLE), pd.DataFrame(rows), [message]
    layout = panels(profiles)
    fig, axes = _grid(len(layout), 1, 3.6, legend_lines=[len(runs) for _, runs in layout])
    for (title, runs), (ax, legend_row) in zip(layout, axes, strict=True):
        longest, smallest = 1, 1.0
        for label, profile in runs:
            counts = np.array(profile["emitted_histogram"], dtype=float)
            total = profile["counts"]["iterations"]
            if not total:
                continue
            share = counts / total
            emitted = profile["emitted"]
            text = f"{label}: mean {emitted['mean']:.2f}, median {emitted['median']:g}, full {100 * emitted['full_accept_share']:.0f}%"
            ax.stairs(share, np.arange(len(share) + 1) - 0.5, label=text, linewidth=1.5, **_style(profile))
            longest = max(longest, int(np.flatnonzero(counts).max()))
            smallest = min(smallest, float(share[share > 0].min()))
            rows += [{"panel": title, "run": label, "tokens": k, "iterations": int(c), "share": c / total} for k, c in enumerate(counts)]
        # A margin beyond the outer bins' edges (k ± 0.5), which would fall on the frame.
        ax.set_xlim(0.2, max(longest, max(p["width"] for _, p in runs) + 1) + 0.8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # AR's one bin: the tick 1 alone
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("Tokens emitted in the iteration")
        ax.set_ylabel("Share of iterations (log)")
        ax.set_yscale("log")  # the long tail of long accepts is what differs between schedules
        # At least the decades 0.1 and 1: on an axis shorter than a decade matplotlib labels
        # minor ticks too, and their labels collide with the decade's.
        ax.set_ylim(min(smallest / 2, 0.05), 1.3)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # shares: 1, 0.1, 0.01
        ax.grid(alpha=0.3)
        legend_row.legend(*ax.get_legend_handles_labels(), fontsize=7, frameon=False, loc="upper center")
    fig.suptitle(A2_TITLE + " (full: every verified draft accepted)\n" + regime_line(profiles), fontsize=11)
    fig.tight_layout()
    return fig, pd.DataFrame(rows), [f"{len(layout)} panels, {len(profiles)} runs"]
