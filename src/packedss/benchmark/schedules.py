"""Side-by-side benchmark of the schedules on one model and task, in one process.

Each (schedule, W, regime) is a job of the runner: `packedss.job.job_spec` resolves it from the
run config `python run.py` would compose, and `packedss.runner.job_resources` builds its prompts,
decode settings, stops and call path over the one set of weights the benchmark loads, so that it
decodes exactly what the runner would.

After a warm-up (every schedule decodes the first `warmup` questions, untimed, in every regime),
the schedules run interleaved over the same questions (q1: A B C, q2: A B C, ...; `repeats`
times each), so that drifts of the machine hit every schedule alike. With `compile` set, every
decode also runs on the compiled static call path (packedss.models.static) right after its
eager twin, on the same weights: the two regimes sit in one table. Compilation happens in the
warm-up only; its seconds per shape are reported apart.

Columns: Tokens/s, Tokens/NFE, Time/NFE (ms), NFE (mean per response), Model ms/call (model
time per call after prefill), Model ms/iter, Non-model share of wall (%), Match (% of
questions whose output equals the reference schedule's in the same regime: AR when it runs,
else the first), = eager (% of questions whose compiled output equals the same schedule's eager
output), Compiled calls (% of the compiled regime's calls after prefill that the static path sent
to a compiled graph, padded ones included: the harness's own dispatch, which says nothing of what
the graph then ran), CUDA-graph calls (% of the compiled regime's calls after prefill that
replayed at least one CUDA graph, counted at `torch.cuda.CUDAGraph.replay` by
packedss.models.graphs, beside inductor's `cudagraph_skips` counter, Graph skips: only under
`reduce-overhead` on CUDA; `n/a` in every other compiled regime, where no graph can replay),
Accuracy, the throughput ratio to Linear-SS in the same regime and, for compiled rows, to the
same schedule's eager run, each with its 95% paired bootstrap CI
(packedss.analysis.bootstrap.compare: questions paired, BCa), and with `replay` the decoder's
own time per iteration (every call's logits recorded, then the same decodes replayed against a
zero-cost model; best of 5).

With `cost_shape` set (a cost twin, packedss.models.cost_twin), every decode also runs with a
cost model of that shape, whose time per call is the model time: the rows `cost:<label>` hold the
very same decodes (outputs, NFE, acceptance) timed as a decoder driving the cost model would be;
after the warm-up the header gets the twin's 2B/B-row call ratio at each width
(cost_twin.row_scaling_summary), with a warning line where it is above the memory-bound regime's.
Every regime's timing model also gets its weight-streaming floor (one-row products over weight
matrices of its shapes and dtype, past the cache; packedss.benchmark.calls.Stream), timed once per
question between the decodes: Floor ms/call, and Floor / call (%) the fraction achieved. For each
regime and width the measured Packed/Linear throughput ratio is checked against the one predicted
from the same run's NFE and per-call times (`predict`).

Every run switches reduced-precision reductions off and sets its threads as the runner does
(packedss.runner.prepare_process), so that its match rates compare with the audit's.

Definitions are the paper's (docs/analysis.md §3): aggregate totals; non-model share = Σ(wall - model) /
Σwall, where wall is the decoder's inclusive time (prompt included) and model the summed
per-call model time (synchronized host time on CPU, CUDA events on a GPU).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from packedss.analysis.bootstrap import compare
from packedss.analysis.metrics import SCHEDULE_LABELS
from packedss.benchmark.floors import RawRead, Stream, stream_min_bytes
from packedss.benchmark.loading import compose_run_config, load, model_overrides
from packedss.benchmark.replay import replay_overhead
from packedss.benchmark.settings import BenchSettings
from packedss.decoding.driver import run_alone
from packedss.families import family_named
from packedss.job import ResolvedJob, job_spec
from packedss.models.cost_twin import row_scaling_summary
from packedss.records import output_hash
from packedss.runner import JobResources, Weights, job_resources, prepare_process
from packedss.tasks.stops import output_text

EAGER = "eager"


@dataclass
class Report:
    header: str
    table: pd.DataFrame
    rows: list[dict]
    compile_s: dict[str, float]
    floors: dict[str, dict]  # timing model label -> floor ms, GB/s of the floor and of the raw read
    checks: list[dict]  # per (regime, W): measured and predicted Packed/Linear tokens/s
    cost_label: str | None


def _ratio_cell(run: pd.DataFrame, base: pd.DataFrame, n_resamples: int) -> tuple[str, float, float, float]:
    ci = compare(run, base, n_resamples).throughput_ratio
    return ci.format(3), ci.estimate, ci.low, ci.high


def _eager_of(regime: str) -> str | None:
    """The regime whose outputs and speed a compiled regime is compared with (None: none)."""
    if regime.startswith("compiled:"):
        return EAGER
    if " compiled:" in regime:  # a cost twin on the compiled path: its eager cost twin
        return regime.split(" compiled:")[0]
    return None


def summarize(frame: pd.DataFrame, reference: str, base: str, n_resamples: int, floors: dict | None = None,
              timing_of: dict | None = None) -> pd.DataFrame:  # fmt: skip
    """One row per (schedule, regime, W) of the per-question rows in `frame`; `floors[timing_of[regime]]`
    gives a regime's floor ms per call."""
    rows = []
    for (schedule, regime, width), run in frame.groupby(["schedule", "regime", "width"], sort=False):
        same = frame[(frame["regime"] == regime) & (frame["width"] == width)]
        ref = same[same["schedule"] == reference].set_index("question_id")["output_hash"]
        tokens, wall, nfe = run["output_tokens"].sum(), run["wall_s"].sum(), run["nfe_total"].sum()
        model, iterations = run["model_s"].sum(), run["iterations"].sum()
        decode_model = model - run["prefill_s"].sum()
        hashes = run.set_index("question_id")["output_hash"]
        per_call = 1000 * decode_model / max(nfe - len(run), 1)
        floor = floors[timing_of[regime]]["floor_ms"] if floors and timing_of else math.nan
        row = {
            "Schedule": SCHEDULE_LABELS.get(schedule, schedule),
            "Regime": regime,
            "W": int(width),
            "Tokens/s": tokens / wall,
            "Tokens/NFE": tokens / nfe,
            "Time/NFE (ms)": 1000 * wall / nfe,
            "NFE": run["nfe_total"].mean(),
            "Model ms/call": per_call,
            "Model ms/iter": 1000 * decode_model / max(iterations, 1),
            "Floor ms/call": floor,
            "Floor / call (%)": 100 * floor / per_call,
            "Non-model (%)": 100 * (wall - model) / wall,
            "Match (%)": 100 * (hashes == ref.reindex(hashes.index)).mean(),
            "= eager (%)": math.nan,
            "Compiled calls (%)": math.nan,
            "CUDA-graph calls (%)": math.nan,
            "Graph skips": math.nan,
            "Accuracy (%)": 100 * run["correct_f"].mean() if run["correct_f"].notna().any() else math.nan,
        }
        baseline = same[same["schedule"] == base]
        if schedule == base:
            row["Tok/s vs Linear-SS"] = "1"
        elif not baseline.empty:
            row["Tok/s vs Linear-SS"], row["_ratio"], row["_low"], row["_high"] = _ratio_cell(run, baseline, n_resamples)
        if regime != EAGER:  # outputs against the plain eager decodes of the same schedule and width
            eager = frame[(frame["regime"] == EAGER) & (frame["schedule"] == schedule) & (frame["width"] == width)]
            eager_hashes = eager.set_index("question_id")["output_hash"]
            row["= eager (%)"] = 100 * (hashes == eager_hashes.reindex(hashes.index)).mean()
        against = _eager_of(regime)
        if against is not None:
            row["Compiled calls (%)"] = 100 * run["compiled_calls"].sum() / max(run["compiled_calls"].sum() + run["eager_calls"].sum(), 1)
            row["CUDA-graph calls (%)"], row["Graph skips"] = graph_replay_cells(run)
            eager = frame[(frame["regime"] == against) & (frame["schedule"] == schedule) & (frame["width"] == width)]
            row["Tok/s vs eager"], row["_vs_eager"], row["_vs_eager_low"], row["_vs_eager_high"] = _ratio_cell(
                run, eager, n_resamples
            )
        rows.append(row)
    return pd.DataFrame(rows)


def graph_replays(extra: dict, nfe: int) -> tuple[int | None, int | None, int | None]:
    """(calls after prefill, those that replayed at least one CUDA graph, cudagraph skips) of one
    decode's per-call statistics; (None, None, None) when its calls counted no replays (no CUDA
    graphs: eager, another compile mode, or a CPU)."""
    replays = extra.get("graph_replays")
    if replays is None or len(replays) != nfe:
        return None, None, None
    skips = extra.get("cudagraph_skips") or [0] * nfe
    return nfe - 1, sum(1 for r in replays[1:] if r > 0), int(sum(skips[1:]))


def graph_replay_cells(run: pd.DataFrame) -> tuple[float | str, float | str]:
    """CUDA-graph calls (%) and Graph skips of one compiled regime's rows; 'n/a' when no call
    could replay a CUDA graph."""
    if run["replay_calls"].isna().any():
        return "n/a", "n/a"
    return 100 * run["replay_calls"].sum() / max(run["counted_calls"].sum(), 1), float(run["graph_skips"].sum())


def predict(frame: pd.DataFrame, regime: str, width: int) -> float:
    """Packed/Linear tokens/s predicted from NFE and call time: each schedule's time is its
    measured prefills plus, for each later call, the median time of the calls with as many rows
    made for the same question in this regime and width (over every schedule's decodes of it, which
    ran back to back, so that a drift of the machine between questions stays out of the call
    costs); tokens are each schedule's own."""
    run = frame[(frame["regime"] == regime) & (frame["width"] == width)]
    cost: dict[tuple[str, int], float] = {}
    for question, group in run.groupby("question_id"):
        by_rows: dict[int, list[float]] = {}
        for rows, seconds in zip(group["call_rows"], group["call_s"]):
            for r, t in zip(rows[1:], seconds[1:]):
                by_rows.setdefault(r, []).append(t)
        cost.update({(question, r): float(np.median(ts)) for r, ts in by_rows.items()})

    def throughput(schedule: str) -> float:
        x = run[run["schedule"] == schedule]
        calls = sum(cost[(q, r)] for q, rows in zip(x["question_id"], x["call_rows"]) for r in rows[1:])
        return x["output_tokens"].sum() / (x["prefill_s"].sum() + calls)

    return throughput("packed") / throughput("linear")


PREDICTION_TOLERANCE = 0.03  # measured Packed/Linear within 3% of the prediction


FORMATS = {"Floor ms/call": "{:.3f}", "Floor / call (%)": "{:.0f}", "Tokens/s": "{:.1f}", "Tokens/NFE": "{:.3f}", "Time/NFE (ms)": "{:.3f}", "NFE": "{:.2f}",
           "Model ms/call": "{:.3f}", "Model ms/iter": "{:.3f}", "Non-model (%)": "{:.1f}", "Decoder us/iter": "{:.1f}",
           "Match (%)": "{:.0f}", "= eager (%)": "{:.0f}", "Compiled calls (%)": "{:.0f}", "CUDA-graph calls (%)": "{:.0f}",
           "Graph skips": "{:.0f}", "Accuracy (%)": "{:.1f}"}  # fmt: skip


def markdown(table: pd.DataFrame) -> str:
    """The table in Markdown; columns that hold nothing (e.g. the compiled ones of an eager run) are left out."""
    shown = [c for c in table.columns if not c.startswith("_") and table[c].notna().any()]  # "n/a" cells are shown
    align = {"Schedule": "---", "Regime": "---"}
    lines = ["| " + " | ".join(shown) + " |", "|" + "|".join(align.get(c, "---:") for c in shown) + "|"]
    for _, row in table.iterrows():
        cells = []
        for c in shown:
            v = row[c]
            if v is None or (isinstance(v, float) and math.isnan(v)):
                cells.append("-")
            else:
                cells.append(FORMATS[c].format(v) if c in FORMATS and not isinstance(v, str) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass(frozen=True)
class BenchJob:
    """One (schedule, W, regime) of the benchmark: a job of the runner over the benchmark's weights."""

    schedule: str
    width: int  # the W of --width it is grouped under
    regime: str
    resources: JobResources


def run(s: BenchSettings) -> Report:
    """Decode the questions with every schedule (and regime, and width), interleaved; the summary table."""
    specs = bench_specs(s)
    first = specs[0][2]
    prepare_process(first)  # the runner's threads and exact reductions, before the weights load
    _, adapter, tokenizer, label = load(s, first.device, first.identity.dtype)
    weights = Weights(adapter, tokenizer)
    jobs = [BenchJob(x, w, regime_of(job.identity), job_resources(job, weights)) for x, w, job in specs]
    regimes = list(dict.fromkeys(j.regime for j in jobs))
    questions = jobs[0].resources.questions
    warm, timed = questions[: s.warmup], questions[s.warmup :]
    cost = next((j.resources.job.cost for j in jobs if j.resources.job.cost is not None), None)
    # The model each regime's time comes from (its floor is measured on it).
    timing_of = {j.regime: label if j.resources.job.cost is None else f"cost:{cost.label}" for j in jobs}
    models = {label: adapter} | {f"cost:{name}": model for name, model in weights.cost_models.items()}
    timers = FloorTimers.of(models, stream_min_bytes() if s.stream_mib is None else s.stream_mib * 2**20)
    started = time.perf_counter()
    compile_s = warm_up(jobs, warm)
    rows = [row for question in timed for row in question_rows(s, jobs, question, timers)]
    frame, floors = pd.DataFrame(rows), timers.summary()
    reference = "ar" if "ar" in s.schedules else s.schedules[0]
    table = summarize(frame, reference, "linear", s.n_resamples, floors, timing_of)
    checks = packed_linear_checks(s, frame, table, regimes) if {"linear", "packed"} <= set(s.schedules) else []
    if s.replay:
        by_row = {(j.schedule, j.regime, j.resources.job.width): j for j in jobs}  # the table's rows, in order
        table["Decoder us/iter"] = [replay_of(job, timed) for job in by_row.values()]
    spec = first.identity
    header = (f"bench_schedules: model={label} task={s.task} questions={len(timed)} (+{len(warm)} warm-up) "
              f"repeats={s.repeats} T={spec.temperature} max_new_tokens={spec.max_new_tokens} device={spec.device} "
              f"dtype={spec.dtype} threads={spec.threads} pad_verify={s.pad_verify} widths={','.join(map(str, s.widths))} "
              f"interleaved={','.join(s.schedules)} regimes={','.join(regimes)} match reference={reference} "
              f"elapsed={time.perf_counter() - started:.0f}s torch={torch.__version__} date={time.strftime('%Y-%m-%d')}")  # fmt: skip
    if cost is not None:
        header += f" cost twin={cost.label} ({cost.size} parameters, random weights)"
        header += row_scaling_summary(weights.cost_models[cost.label], cost.label, s.widths)
    return Report(header, table, rows, compile_s, floors, checks, None if cost is None else cost.label)


def bench_specs(s: BenchSettings) -> list[tuple[str, int, ResolvedJob]]:
    """(schedule, W, job) of every schedule and width of the settings in every regime: each the
    runner's job of the run config `python run.py` would compose for it, checked and resolved
    (packedss.job.job_spec) before anything loads. A job holds the warm-up and the timed questions."""
    base = model_overrides(s) + [f"task={s.task}"]
    family = family_named(compose_run_config(base).model.family)
    unknown = [x for x in s.schedules if x not in family.schedules]
    if unknown:
        raise SystemExit(f"unknown schedules {unknown} for the {family.name} family; valid: {', '.join(family.schedules)}")
    common = base + [f"limit={s.warmup + s.limit}", f"schedule.pad_verify={s.pad_verify}", f"temperature={s.temperature}",
                     f"verify={s.verify}", f"seed={s.seed}", f"device={s.device}", f"dtype={s.dtype}",
                     f"timing={s.timing}", f"threads={s.threads}"]  # fmt: skip
    common += [f"data_dir='{s.data_dir}'"] if s.data_dir is not None else []
    common += [f"order={s.order}"] if s.order is not None else []
    common += [f"max_new_tokens={s.max_new_tokens}"] if s.max_new_tokens is not None else []
    regimes = [[]] + ([[f"model.compile={s.compile}"]] if s.compile != "none" else [])
    if s.cost_shape is not None:
        cost = [f"model.cost_shape='{s.cost_shape}'"] + [f"model.{key}={value}" for key, value in
                (("cost_layers", s.cost_layers), ("cost_dtype", s.cost_dtype)) if value is not None]  # fmt: skip
        regimes += [cost + regime for regime in regimes]
    return [(x, w, job_spec(compose_run_config([*common, f"schedule={x}", f"width={width_of(s, x, w)}", *regime])))
            for w in s.widths for x in s.schedules for regime in regimes]  # fmt: skip


def width_of(s: BenchSettings, schedule: str, width: int) -> int:
    return (s.quadratic_width or width) if schedule == "quadratic" else width


def regime_of(spec) -> str:
    """A job's regime: the model's own eager calls or compiled ones, either timed on a cost twin."""
    parts = [f"cost:{spec.cost_model}"] if spec.cost_model else []
    parts += [f"compiled:{spec.compile}"] if spec.compile != "none" else []
    return " ".join(parts) or EAGER


def warm_up(jobs: list[BenchJob], warm: list) -> dict[str, dict[str, float]]:
    """Every job decodes the warm-up questions, untimed; then compilation closes. The compile
    seconds per regime and call shape."""
    for question in warm:
        for job in jobs:
            decode(job, question)
    compile_s = {}
    for job in jobs:
        for shape, seconds in job.resources.end_warmup().items():
            compile_s.setdefault(job.regime, {})[f"{job.schedule} W={job.width} {shape}"] = seconds
    return compile_s


def decode(job: BenchJob, question):
    """The job's decode of `question`, with the static path's call counts of it ({}: eager)."""
    model = job.resources.model
    before = dict(model.static.calls) if model.static is not None else None
    out = run_alone(job.resources.response(model, question.question_id, 0))
    counts = {k: model.static.calls[k] - before[k] for k in before} if before else {}
    return out, counts


def question_rows(s: BenchSettings, jobs: list[BenchJob], question, timers: FloorTimers) -> list[dict]:
    """Every job's row for one timed question: the floors first, then `repeats` rounds of the
    jobs' decodes back to back, averaged."""
    timers.time_once()
    decoded = [[] for _ in jobs]
    for _ in range(s.repeats):
        for job, outs in zip(jobs, decoded):
            outs.append(decode(job, question))
    rows = []
    for job, outs in zip(jobs, decoded):
        first, counts = outs[0]
        resources = job.resources
        counted, replayed, skips = graph_replays(first.extra, first.nfe_total)
        text = output_text(resources.tokenizer, first.tokens, resources.stops)
        correct = resources.task.grade(question, text).correct if s.grade else None
        rows.append({
            "schedule": job.schedule, "regime": job.regime, "width": resources.job.width,
            "question_id": question.question_id, "sample": 0, "seed": resources.job.identity.seed,
            "output_tokens": len(first.tokens), "output_hash": output_hash(first.tokens),
            "nfe_total": first.nfe_total, "iterations": first.iterations,
            "wall_s": float(np.mean([d.wall_s for d, _ in outs])),
            "model_s": float(np.mean([d.model_s for d, _ in outs])),
            "prefill_s": float(np.mean([d.call_model_s[0] for d, _ in outs])),
            "call_rows": list(first.rows_evaluated),
            "call_s": [float(v) for v in np.mean([d.call_model_s for d, _ in outs], axis=0)],
            "compiled_calls": counts.get("compiled", 0) + counts.get("padded", 0), "eager_calls": counts.get("eager", 0),
            "counted_calls": counted, "replay_calls": replayed, "graph_skips": skips,
            "correct_f": math.nan if correct is None else float(correct),
        })  # fmt: skip
    return rows


def packed_linear_checks(s: BenchSettings, frame: pd.DataFrame, table: pd.DataFrame, regimes: list[str]) -> list[dict]:
    """Per regime and width: the measured Packed/Linear tokens/s ratio against the predicted one."""
    checks = []
    for regime in regimes:
        for width in s.widths:
            row = table[(table["Regime"] == regime) & (table["W"] == width) & (table["Schedule"] == "Packed-SS")]
            predicted, measured = predict(frame, regime, width), float(row["_ratio"].iloc[0])
            checks.append({"regime": regime, "width": width, "measured": measured, "low": float(row["_low"].iloc[0]),
                           "high": float(row["_high"].iloc[0]), "predicted": predicted,
                           "within": bool(abs(measured / predicted - 1) <= PREDICTION_TOLERANCE)})  # fmt: skip
    return checks


def replay_of(job: BenchJob, timed: list) -> float:
    """The job's decoder time per iteration on a zero-cost replay of its timed decodes."""
    r = job.resources
    return replay_overhead(r.job.family.decode, r.model,
                           [(r.prompts[q.question_id].ids, r.settings(q.question_id, 0), r.stop_check) for q in timed])  # fmt: skip


@dataclass
class FloorTimers:
    """Each timing model's weight-streaming floor and the raw read (packedss.benchmark.floors),
    timed once per question between the decodes."""

    streams: dict[str, Stream]
    raw: RawRead
    times: dict[str, list] = field(default_factory=dict)
    raw_times: list = field(default_factory=list)

    @classmethod
    def of(cls, models: dict, stream_bytes: int) -> FloorTimers:
        """`models`: timing model label -> its model; the raw read runs on the last (the cost model's device)."""
        return cls({name: Stream(model, stream_bytes) for name, model in models.items()},
                   RawRead(list(models.values())[-1], stream_bytes))  # fmt: skip

    def time_once(self) -> None:
        for name, timer in self.streams.items():
            self.times.setdefault(name, []).append(timer.one(None))
        self.raw_times.append(self.raw.one(None))

    def summary(self) -> dict[str, dict]:
        """Per timing model: floor ms per call, the floor's and the raw read's GB/s, and the bytes."""
        raw_gbs = self.raw.gbs(float(np.median(self.raw.seconds(self.raw_times))))
        floors = {}
        for name, timer in self.streams.items():
            gbs = timer.gbs(float(np.median(timer.seconds(self.times[name]))))
            floors[name] = {"floor_ms": 1000 * timer.weight_bytes / (gbs * 1e9), "stream_gbs": gbs, "raw_gbs": raw_gbs,
                            "weight_bytes": timer.weight_bytes, "stream_bytes": timer.bytes}  # fmt: skip
        return floors
