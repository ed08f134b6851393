"""Figures 3-5 (matplotlib, Agg backend), PNG and PDF, with the data behind each as CSV.

- Figure 3 (T = 0; Nemotron and SetDLM) and Figure 4 (T > 0; Nemotron, K samples per question):
  per setting (model, task; SetDLM also window and order), each schedule's throughput ratio and
  NFE ratio to Linear-SS and its accuracy difference to Linear-SS in percentage points, with 95%
  paired bootstrap CIs (over questions) as error bars; a dashed line marks 1 (ratios) and 0
  (differences). A speed-only task (WritingBench) has its own setting with the ratios and "n/a"
  for accuracy.
- Figure 5: normalized timing decomposition (Nemotron, T = 0): each schedule's mean model and
  non-model time per response divided by that task's Linear-SS mean total, over the questions all
  schedules answered, averaged over the tasks with equal weight (GSM8K and MATH-500 when present,
  else every task) within each model; a dashed line marks Linear-SS's total.
- Figures A1 and A2 (acceptance by draft depth, tokens emitted per iteration): drawn from the
  runs' acceptance profiles by `acceptance_figures`.
- Figure C1 (system tokens/s and p95 latency against the concurrency C): `concurrency_figures`.
One colour per schedule (`metrics.SCHEDULE_COLOURS`) in every figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from packedss.analysis.acceptance import acceptance_profiles  # noqa: E402
from packedss.analysis.acceptance_figures import figure_a1, figure_a2  # noqa: E402
from packedss.analysis.compare import Comparisons, Pairing  # noqa: E402
from packedss.analysis.concurrency import FIGURE as CONCURRENCY_FIGURE  # noqa: E402
from packedss.analysis.concurrency_figures import figure_c1  # noqa: E402
from packedss.analysis.metrics import (  # noqa: E402
    MODEL_SHORT,
    block_of,
    family_orders,
    family_rank,
    model_label,
    order_rank,
    regime_labels,
    schedule_colour,
    schedule_label,
    schedule_rank,
    sort_schedules,
    sort_tasks,
    task_label,
    task_rank,
)
from packedss.analysis.select import NEMOTRON, SETDLM  # noqa: E402
from packedss.analysis.specbench import FIGURE as SPECBENCH_FIGURE, speedup_figure  # noqa: E402

FIGURE5_TASKS = ("gsm8k", "math500")


@dataclass
class Figure:
    number: int | str  # the paper's figure number, or A1 / A2
    figure: matplotlib.figure.Figure | None
    data: pd.DataFrame
    notes: list[str]


def _setting(p: Pairing) -> str:
    label = p.setting_label.replace(" [", "\n[")  # a config (a cost twin, a dtype, ...) on a line of its own
    if family_orders(p.family):  # the any-order family's label ("W=8 LTR") leaves the config to the tables' column
        config = f"\n[{p.config}]" if p.config else ""
        return f"{MODEL_SHORT.get(p.model, p.model)} {task_label(p.task)}\n{label}{config}"
    return label.replace(" ", "\n", 1)


def regime_line(frame: pd.DataFrame) -> str:
    """What the figure's runs were measured in, as Figure C1 names it: 'eager, float32, 1 thread,
    cpu[, cost:<twin>]' (each regime, when they differ) and the widths of its speculative runs."""
    regimes = regime_labels(frame)
    widths = sorted({int(w) for w in frame["width"].unique() if w})
    return f"{' | '.join(regimes)}; W = {', '.join(map(str, widths)) or '-'}"


# The families each ratio figure shows (the paper's Figure 3: Nemotron and SetDLM; Figure 4: Nemotron).
RATIO_FAMILIES = {False: (NEMOTRON, SETDLM), True: (NEMOTRON,)}


def ratio_data(comparisons: Comparisons, positive: bool) -> pd.DataFrame:
    """Long frame: setting, schedule, metric, estimate, low, high, pairs (method vs Linear-SS;
    pairs: question-sample pairs, scored pairs for the accuracy difference)."""
    pq = comparisons.pq
    frame = ratio_frame(pq, positive)
    methods = sort_schedules(s for s in frame["schedule"].unique() if s != "linear")
    rows = []
    pairings = [p for m in methods for p in comparisons.pairings(m, "linear", frame)]
    pairings.sort(key=lambda p: (family_rank(p.family), p.model, task_rank(p.task), p.temperature, p.verify, p.width or 0, order_rank(p.order)))
    for p in pairings:
        c = comparisons.compare(p)
        metrics = {
            "Throughput ratio": (c.throughput_ratio, c.pairs),
            "NFE ratio": (c.nfe_ratio, c.pairs),
            "Accuracy difference (pp)": (c.accuracy_diff, c.scored_pairs),
        }
        for metric, (ci, pairs) in metrics.items():
            rows.append(
                {
                    "setting": _setting(p),
                    "schedule": p.method,
                    "metric": metric,
                    "estimate": ci.estimate,
                    "low": ci.low,
                    "high": ci.high,
                    "pairs": pairs,
                    "ci_method": ci.method,
                }
            )
    return pd.DataFrame(rows, columns=["setting", "schedule", "metric", "estimate", "low", "high", "pairs", "ci_method"])


def ratio_frame(pq: pd.DataFrame, positive: bool) -> pd.DataFrame:
    """The per-question rows a ratio figure compares."""
    frame = pq[(pq["temperature"] > 0) if positive else (pq["temperature"] == 0)]
    return frame[~frame["lora"] & frame["family"].isin(RATIO_FAMILIES[positive])]


TICK_LABEL_GAP_PX = 8  # the least room between two neighbouring x tick labels, at the figure's dpi


def tick_label_crowding(fig: matplotlib.figure.Figure, axes) -> float:
    """How much wider the panels must be for no two neighbouring x tick labels of a panel to touch:
    the largest ratio, over neighbours, of the room their texts need (half of each width and a gap)
    to the distance between their centres; at most 1 when none touch. Measured on the figure as
    drawn, in the labels' own font."""
    renderer = fig.canvas.get_renderer()
    crowding = 1.0
    for ax in axes:
        boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        for left, right in zip(boxes, boxes[1:]):
            distance = (right.x0 + right.x1) / 2 - (left.x0 + left.x1) / 2
            crowding = max(crowding, ((left.width + right.width) / 2 + TICK_LABEL_GAP_PX) / max(distance, 1e-9))
    return crowding


def widen_for_tick_labels(fig: matplotlib.figure.Figure, axes, rect=(0, 0, 1, 1)) -> None:
    """Widen the figure until its panels' x tick labels do not overlap (a figure's margins do not
    grow with it, so a few rounds)."""
    for _ in range(6):
        fig.draw_without_rendering()
        crowding = tick_label_crowding(fig, axes)
        if crowding <= 1.0:
            return
        width, height = fig.get_size_inches()
        fig.set_size_inches(width * min(crowding * 1.05, 3.0), height)
        fig.tight_layout(rect=rect)


def _empty_figure(number: int, message: str) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    fig.suptitle(f"Figure {number}")
    return fig


def ratio_figure(number: int, comparisons: Comparisons, positive: bool) -> Figure:
    data = ratio_data(comparisons, positive)
    title = f"Figure {number}: {'temperature > 0' if positive else 'greedy decoding (T = 0)'} — ratios and differences to Linear-SS"
    if data.empty:
        message = f"No paired runs with Linear-SS at {'T > 0' if positive else 'T = 0'} in this results folder."
        return Figure(number, _empty_figure(number, message), data, [message])
    settings = list(dict.fromkeys(data["setting"]))
    schedules = sort_schedules(data["schedule"].unique())
    metrics = [
        ("Throughput ratio", "Throughput / Linear-SS", 1.0),
        ("NFE ratio", "NFE / Linear-SS", 1.0),
        ("Accuracy difference (pp)", "Accuracy − Linear-SS (pp)", 0.0),
    ]
    width = 0.8 / len(schedules)
    fig, axes = plt.subplots(len(metrics), 1, figsize=(max(6.0, 1.3 * len(settings) + 2.5), 8.5), sharex=True)
    x = np.arange(len(settings))
    for ax, (metric, ylabel, reference) in zip(axes, metrics, strict=True):
        sub = data[data["metric"] == metric]
        for k, schedule in enumerate(schedules):
            rows = sub[sub["schedule"] == schedule].set_index("setting").reindex(settings)
            est = rows["estimate"].to_numpy(float)
            low = np.where(np.isnan(rows["low"].to_numpy(float)), est, rows["low"].to_numpy(float))
            high = np.where(np.isnan(rows["high"].to_numpy(float)), est, rows["high"].to_numpy(float))
            yerr = np.vstack([np.clip(est - low, 0, None), np.clip(high - est, 0, None)])
            positions = x - 0.4 + width * (k + 0.5)
            if reference == 1.0:
                ax.bar(positions, est - 1.0, width * 0.9, bottom=1.0, color=schedule_colour(schedule), label=schedule_label(schedule))
            else:
                ax.bar(positions, est, width * 0.9, color=schedule_colour(schedule), label=schedule_label(schedule))
            ax.errorbar(positions, est, yerr=yerr, fmt="none", ecolor="black", elinewidth=1, capsize=3)
            if metric.startswith("Accuracy"):
                ran = rows["pairs"].notna().to_numpy()
                for pos, value, present in zip(positions, est, ran, strict=True):
                    if present and (np.isnan(value) or value == 0):  # a bar of no height: say what it is
                        ax.text(pos, 0, "n/a" if np.isnan(value) else "0", ha="center", va="bottom", fontsize=7, color="#555555")
        ax.axhline(reference, color="black", linestyle="--", linewidth=1)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
        finite = sub[["estimate", "low", "high"]].to_numpy(float)
        finite = finite[np.isfinite(finite)]
        if finite.size:
            lo, hi = min(finite.min(), reference), max(finite.max(), reference)
            pad = max(0.05 * (hi - lo), 0.02 if reference == 1.0 else 0.5)
            ax.set_ylim(lo - pad, hi + pad)
    axes[-1].set_xticks(x, settings)
    axes[-1].set_xlabel("Setting (model, task)")
    handles = [Patch(color=schedule_colour(s), label=schedule_label(s)) for s in schedules]
    axes[0].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, title="vs Linear-SS")
    fig.suptitle(f"{title}\n{regime_line(ratio_frame(comparisons.pq, positive))}", fontsize=10)
    accuracy = data[data["metric"] == "Accuracy difference (pp)"]
    speed_only = bool((accuracy["pairs"].notna() & accuracy["estimate"].isna()).any())
    footnote = "Error bars: 95% paired bootstrap CIs (resampling questions)." + (" n/a: speed-only task (no accuracy)." if speed_only else "")
    fig.text(0.01, 0.005, footnote, fontsize=8, color="#444444")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    widen_for_tick_labels(fig, axes[-1:], rect=(0, 0.02, 1, 1))
    notes = [f"{len(settings)} settings; pairs per comparison: {', '.join(str(int(n)) for n in data[data['metric'] == 'Throughput ratio']['pairs'])}"]
    return Figure(number, fig, data, notes)


def timing_data(pq: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Figure 5's numbers: model, schedule, label, model_frac, nonmodel_frac, tasks."""
    notes: list[str] = []
    frame = pq[(pq["family"] == NEMOTRON) & (pq["temperature"] == 0) & (~pq["lora"])]
    rows = []
    for model, mf in frame.groupby("model", sort=True):
        several = bool((mf.groupby("schedule")["width"].nunique() > 1).any())
        concurrencies = mf["concurrency"].nunique() > 1
        tasks = [t for t in FIGURE5_TASKS if t in set(mf["task"])] or sort_tasks(mf["task"].unique())
        per_task = []
        for task in tasks:
            tf = mf[mf["task"] == task]
            linear = tf[tf["schedule"] == "linear"]
            if linear.empty:
                notes.append(f"{model_label(model)} {task_label(task)}: no Linear-SS runs, left out.")
                continue
            runs = {(s, w, c): g for (s, w, c), g in tf.groupby(["schedule", "width", "concurrency"])}
            common = set.intersection(*(set(g["question_id"]) for g in runs.values()))
            if not common:
                notes.append(f"{model_label(model)} {task_label(task)}: no question answered by every schedule; all questions used.")
            for (schedule, width, concurrency), g in runs.items():
                own = linear[linear["concurrency"] == concurrency]  # the reference decoded at the same C
                linear_widths = sorted(own["width"].unique())
                ref_width = width if width in linear_widths else (linear_widths[0] if len(linear_widths) == 1 else None)
                if ref_width is None:
                    at = f" C={concurrency}" if concurrencies else ""
                    notes.append(f"{model_label(model)} {task_label(task)} {schedule_label(schedule)} W={width}{at}: no Linear-SS reference width.")
                    continue
                ref = own[own["width"] == ref_width]
                if common:
                    g, ref = g[g["question_id"].isin(common)], ref[ref["question_id"].isin(common)]
                total = float(ref["wall_s"].mean())
                label = schedule_label(schedule) + (f"\nB={block_of(NEMOTRON, width)}" if several else "")
                label += f"\nC={concurrency}" if concurrencies else ""
                per_task.append(
                    {
                        "model": model,
                        "task": task,
                        "schedule": schedule,
                        "width": int(width),
                        "concurrency": int(concurrency),
                        "label": label,
                        "model_frac": float(g["model_s"].mean()) / total,
                        "nonmodel_frac": float(g["nonmodel_s"].mean()) / total,
                        "questions": len(g),
                    }
                )
        if not per_task:
            continue
        tf = pd.DataFrame(per_task)
        averaged = tf.groupby(["model", "schedule", "width", "concurrency", "label"], as_index=False).agg(
            model_frac=("model_frac", "mean"),
            nonmodel_frac=("nonmodel_frac", "mean"),
            tasks=("task", lambda t: ", ".join(task_label(x) for x in sort_tasks(t.unique()))),
            questions=("questions", "sum"),
        )
        rows.append(averaged)
    if not rows:
        return pd.DataFrame(columns=["model", "schedule", "width", "concurrency", "label", "model_frac", "nonmodel_frac", "tasks", "questions"]), notes
    out = pd.concat(rows, ignore_index=True)
    out["_order"] = out["schedule"].map(lambda s: schedule_rank(s)[0])
    out = out.sort_values(["model", "_order", "width", "concurrency"], kind="stable").drop(columns="_order").reset_index(drop=True)
    out["total_frac"] = out["model_frac"] + out["nonmodel_frac"]
    return out, notes


def timing_figure(pq: pd.DataFrame) -> Figure:
    data, notes = timing_data(pq)
    if data.empty:
        message = "No Nemotron runs at T = 0 with Linear-SS in this results folder."
        return Figure(5, _empty_figure(5, message), data, notes + [message])
    models = list(dict.fromkeys(data["model"]))
    bars = int(data.groupby("model").size().max())
    panel = max(3.2, 0.8 * bars + 1.0)
    fig, axes = plt.subplots(1, len(models), figsize=(panel * len(models) + 2.0, 4.8), sharey=True, squeeze=False)
    top = max(1.0, float(data["total_frac"].max())) * 1.15
    for ax, model in zip(axes[0], models, strict=True):
        sub = data[data["model"] == model]
        x = np.arange(len(sub))
        colours = [schedule_colour(s) for s in sub["schedule"]]
        ax.bar(x, sub["model_frac"], 0.6, color=colours, edgecolor="black", linewidth=0.6)
        ax.bar(x, sub["nonmodel_frac"], 0.6, bottom=sub["model_frac"], color=colours, alpha=0.35, hatch="//", edgecolor="black", linewidth=0.6)
        for xi, total in zip(x, sub["total_frac"], strict=True):
            ax.text(xi, total + 0.01 * top, f"{total:.3f}", ha="center", va="bottom", fontsize=8)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_xticks(x, sub["label"])
        ax.set_title(f"{model_label(model)}\n({sub['tasks'].iloc[0]})", fontsize=10)
        ax.set_ylim(0, top)
        ax.grid(axis="y", alpha=0.3)
        ax.set_xlabel("Schedule")
    axes[0][0].set_ylabel("Time / Linear-SS total time")
    legend = [
        Patch(facecolor="#bbbbbb", edgecolor="black", label="model time"),
        Patch(facecolor="#bbbbbb", alpha=0.35, hatch="//", edgecolor="black", label="non-model time"),
        plt.Line2D([0], [0], color="black", linestyle="--", label="Linear-SS total"),
    ]
    axes[0][-1].legend(handles=legend, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    timed = pq[pq["model"].isin(models) & (pq["family"] == NEMOTRON) & (pq["temperature"] == 0) & ~pq["lora"]]
    fig.suptitle(f"Figure 5: normalized timing decomposition (greedy)\n{regime_line(timed)}", fontsize=10)
    fig.tight_layout()
    widen_for_tick_labels(fig, axes[0])
    return Figure(5, fig, data, notes)


ACCEPTANCE_FIGURES = {"A1": figure_a1, "A2": figure_a2}


def make_figure(number: int | str, comparisons: Comparisons, profiles: list[dict] | None = None, records: pd.DataFrame | None = None) -> Figure:
    """Figure 3, 4, 5, A1, A2 or C1; A1 and A2 are drawn from `profiles` (computed from the
    comparisons' responses when not given), C1 from every timed record (`records`; the
    comparisons' per-response rows, repeats averaged, when not given)."""
    if number == CONCURRENCY_FIGURE:
        return Figure(number, *figure_c1(comparisons.responses if records is None else records, comparisons.responses))
    if number in ACCEPTANCE_FIGURES:
        if profiles is None:
            profiles = acceptance_profiles(comparisons.responses, comparisons.n_resamples)
        return Figure(number, *ACCEPTANCE_FIGURES[number](profiles))
    if number == 3:
        return ratio_figure(3, comparisons, positive=False)
    if number == 4:
        return ratio_figure(4, comparisons, positive=True)
    if number == 5:
        return timing_figure(comparisons.pq)
    if number == SPECBENCH_FIGURE:
        return Figure(number, *speedup_figure(comparisons))
    raise ValueError(f"no figure {number}; figures are {', '.join(map(str, FIGURES))}")


FIGURE_SUFFIXES = (".png", ".pdf", ".csv")


def write_figure(figure: Figure, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    stem = directory / f"figure{figure.number}"
    paths = [stem.with_suffix(suffix) for suffix in FIGURE_SUFFIXES]
    figure.figure.savefig(paths[0], dpi=150, bbox_inches="tight")
    figure.figure.savefig(paths[1], bbox_inches="tight")
    figure.data.to_csv(paths[2], index=False)
    plt.close(figure.figure)
    return paths


FIGURES = (3, 4, 5, "A1", "A2", CONCURRENCY_FIGURE, SPECBENCH_FIGURE)
