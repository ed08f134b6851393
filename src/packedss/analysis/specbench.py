"""Spec-Bench's leaderboard layout (`--tables specbench`, docs/analysis.md §5.2) and its figure of
the speedups per category group (`--figures SB`).

One row per run of task=specbench (model, schedule, W, and what else tells runs apart): the
speedup over the AR run of the same setting in each of the leaderboard's six groups and Overall,
and the mean accepted tokens per verification step. The speedup is the throughput ratio of the
project's paired comparisons, (Σtok/Σwall) / (Σtok/Σwall)_AR over the responses both runs made
(for lossless schedules, which emit AR's tokens, it is Σwall_AR / Σwall, Spec-Bench's speedup),
with a 95% paired bootstrap interval over questions (analysis/bootstrap.py)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only, as packedss.analysis.figures
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from packedss.analysis.bootstrap import CI, pair, paired_bootstrap, question_sums, ratio_of_sums  # noqa: E402
from packedss.analysis.compare import Comparisons, Pairing  # noqa: E402
from packedss.analysis.metrics import model_label, regime_labels, schedule_colour, schedule_label  # noqa: E402
from packedss.analysis.select import LABEL_OF, groups, key_labels, labels, optional_keys  # noqa: E402
from packedss.analysis.table import Col, Table, build  # noqa: E402
from packedss.tasks.specbench import MT_BENCH  # noqa: E402

TASK = "specbench"
KEY = "specbench"
FIGURE = "SB"
# The leaderboard's groups of Spec-Bench's 13 categories.
GROUPS = (
    ("Multi-turn Conversation", MT_BENCH),
    ("Translation", ("translation",)),
    ("Summarization", ("summarization",)),
    ("Question Answering", ("qa",)),
    ("Mathematical Reasoning", ("math_reasoning",)),
    ("Retrieval-aug. Generation", ("rag",)),
)
OVERALL = "Overall"
SPEEDUP_COLUMNS = (*(name for name, _ in GROUPS), OVERALL)  # the table's speedup columns, the figure's bars
ACCEPTED = "Mean accepted tokens"
TITLE = "Table specbench: Spec-Bench's leaderboard, speedup over AR of the same model per category group."


def _ar_pairing(comparisons: Comparisons, frame: pd.DataFrame, first: pd.Series) -> Pairing | None:
    """The pairing of a run (its first per-question row) with the AR run of its setting."""
    for p in comparisons.pairings(first["schedule"], "ar", frame):
        if (p.model, p.method_width, p.method_ngram, p.temperature, p.verify, p.config, p.concurrency, p.order) == (
            first["model"], int(first["width"]), int(first["max_ngram"]), float(first["temperature"]), first["verify"],
            first["config"], int(first["concurrency"]), first["order_group"] if p.order else ""):  # fmt: skip
            return p
    return None


def _in_group(rows: pd.DataFrame, categories) -> pd.DataFrame:
    return rows[rows["category"].isin(categories)] if "category" in rows else rows.iloc[:0]


def by_conversation(rows: pd.DataFrame) -> pd.DataFrame:
    """The responses keyed by conversation (`specbench/<id>`) and turn (as the sample), so that
    the bootstrap resamples a question with both its turns: the second depends on the first."""
    conversation = rows["question_id"].str.rsplit("/", n=1).str[0]
    return rows.assign(question_id=conversation, sample=rows["turn"].astype(int))


def throughput_ratio(method: pd.DataFrame, base: pd.DataFrame, n_resamples: int) -> CI | None:
    """`compare`'s throughput ratio alone (the leaderboard reads none of its other bootstraps);
    None when the runs have no paired responses."""
    joined = pair(method, base)
    if joined.empty:
        return None
    sums = question_sums(joined)
    columns = ("output_tokens_m", "wall_s_m", "output_tokens_b", "wall_s_b")
    return paired_bootstrap(ratio_of_sums, tuple(sums[c].to_numpy(float) for c in columns), n_resamples)


def speedups(comparisons: Comparisons, pairing: Pairing) -> dict[str, CI | None]:
    """The speedup over AR per group and Overall (None: the group has no paired responses)."""
    method, base = (by_conversation(comparisons.runs(pairing, side)) for side in ("method", "base"))
    out: dict[str, CI | None] = {}
    for name, categories in [*GROUPS, (OVERALL, None)]:
        m, b = (rows if categories is None else _in_group(rows, categories) for rows in (method, base))
        out[name] = throughput_ratio(m, b, comparisons.n_resamples)
    return out


def mean_accepted(responses: pd.DataFrame) -> float:
    """Tokens emitted per verification step (iteration after the prefill call): AR emits 1."""
    iterations = float(responses["iterations"].sum())
    return float(sum(sum(a) for a in responses["accepted"])) / iterations if iterations else np.nan


def leaderboard_rows(comparisons: Comparisons) -> tuple[list[dict], list[str], set[str]]:
    """(rows, key columns, runs without an AR run of their setting), bootstrapped once for the
    table and the figure."""
    if KEY not in comparisons.derived:
        comparisons.derived[KEY] = _leaderboard_rows(comparisons)
    return comparisons.derived[KEY]


def _leaderboard_rows(comparisons: Comparisons) -> tuple[list[dict], list[str], set[str]]:
    pq = comparisons.pq
    sub = pq[(pq["task"] == TASK) & ~pq["lora"].astype(bool)]
    extra = [e for e in optional_keys(sub, ["model", "schedule"], positive=True) if e != "width"]
    keys = ["Model", "Method", "W"] + [LABEL_OF[e] for e in extra]
    rows, unpaired = [], set()
    for values, g in groups(sub, ["model", "schedule", "width"] + extra):
        first = g.iloc[0]
        names = labels(values)
        row = key_labels(names, [k for k in keys if k not in ("Method", "W")])
        row |= {"Method": schedule_label(values["schedule"]), "W": str(int(values["width"])) if values["width"] else "-"}
        row[ACCEPTED] = mean_accepted(g)  # one sample per question: its per-question rows are its responses
        if values["schedule"] == "ar":
            row |= dict.fromkeys(SPEEDUP_COLUMNS, CI(1.0, np.nan, np.nan, 0, "none"))
        else:
            pairing = _ar_pairing(comparisons, sub, first)
            if pairing is None:
                unpaired.add(model_label(values["model"]))
            else:
                row |= speedups(comparisons, pairing)
        rows.append(row)
    return rows, keys, unpaired


def specbench_table(pq: pd.DataFrame, comparisons: Comparisons, compare_paper: bool = False) -> Table:
    """Spec-Bench's leaderboard: per run, the speedup over AR per group and Overall with 95% CIs,
    and the mean accepted tokens per verification step."""
    rows, keys, unpaired = leaderboard_rows(comparisons)
    cols = [Col(name, kind="ci", digits=2) for name in SPEEDUP_COLUMNS] + [Col(ACCEPTED, digits=2)]
    notes = [
        "Speedup over AR of the same model, temperature and config: (Σtok/Σwall) / (Σtok/Σwall)_AR, a ratio of pooled "
        "totals (the paper's averaging) over the responses both runs made, by question and turn (for a lossless schedule Σwall_AR / Σwall, Spec-Bench's speedup); "
        "brackets: 95% paired bootstrap CIs over questions, a two-turn question resampled with both its turns (BCa, percentile fallback). Groups: Multi-turn "
        "Conversation = MT-bench's 8 categories, both turns (the second asked with the model's own first answer); "
        "the others one category each; Overall = all responses.",
        f"{ACCEPTED}: tokens emitted per verification step (each iteration after the prefill call; Linear-SS's "
        "iteration is its draft and verify calls), Spec-Bench's #Mean Accepted Tokens; AR emits 1.00.",
        "W: the width (PLD: the most draft tokens per call, k); AR reads no W ('-').",
    ]
    if unpaired:
        notes.append(f"No AR run of {', '.join(sorted(unpaired))} on Spec-Bench: its rows have no speedup ('-').")
    return build(KEY, TITLE, rows, keys, cols, compare_paper, None, notes)


def speedup_data(comparisons: Comparisons) -> pd.DataFrame:
    """The figure's numbers: one row per run (not AR) and group."""
    rows, _, _ = leaderboard_rows(comparisons)
    out = []
    for row in rows:
        if row["Method"] == "AR":
            continue
        for name in SPEEDUP_COLUMNS:
            ci = row.get(name)
            if ci is not None:
                out.append({"run": f"{row['Model']} {row['Method']}" + (f" W={row['W']}" if row["W"] != "-" else ""),
                            "method": row["Method"], "group": name, "estimate": ci.estimate, "low": ci.low,
                            "high": ci.high, "questions": ci.n})  # fmt: skip
    return pd.DataFrame(out, columns=["run", "method", "group", "estimate", "low", "high", "questions"])


def speedup_figure(comparisons: Comparisons):
    """Figure SB: grouped bars of each run's speedup over AR per Spec-Bench group, with 95% CIs.
    Returns (figure, data, notes)."""
    data = speedup_data(comparisons)
    fig, ax = plt.subplots(figsize=(12, 4.5))
    if data.empty:
        ax.axis("off")
        ax.text(0.5, 0.5, "No Spec-Bench run with an AR run of its setting in this results folder.", ha="center")
        return fig, data, ["no Spec-Bench runs paired with AR"]
    names = list(SPEEDUP_COLUMNS)
    runs = list(dict.fromkeys(data["run"]))
    x, width = np.arange(len(names)), 0.8 / len(runs)
    schedule_of = {schedule_label(s): s for s in comparisons.pq["schedule"].unique()}
    colour_of = {label: schedule_colour(s) for label, s in schedule_of.items()}
    for k, run in enumerate(runs):
        rows = data[data["run"] == run].set_index("group").reindex(names)
        est = rows["estimate"].to_numpy(float)
        low, high = (rows[bound].astype(float).fillna(rows["estimate"]).to_numpy(float) for bound in ("low", "high"))
        positions = x - 0.4 + width * (k + 0.5)
        shade = colour_of[rows["method"].dropna().iloc[0]]
        ax.bar(positions, est - 1.0, width * 0.9, bottom=1.0, color=shade, label=run)
        ax.errorbar(positions, est, yerr=np.vstack([np.clip(est - low, 0, None), np.clip(high - est, 0, None)]),
                    fmt="none", ecolor="black", elinewidth=1, capsize=3)  # fmt: skip
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xticks(x, [n.replace(" ", "\n") for n in names])
    ax.set_ylabel("Speedup over AR")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    regime = " | ".join(regime_labels(comparisons.responses[comparisons.responses["task"] == TASK]))
    fig.suptitle(f"Figure SB: Spec-Bench speedup over AR per category group\n{regime}", fontsize=10)
    fig.text(0.01, 0.005, "Error bars: 95% paired bootstrap CIs (resampling questions).", fontsize=8, color="#444444")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig, data, [f"{len(runs)} runs against AR"]
