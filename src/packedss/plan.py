"""The plan of one or more sweeps: every job they would run, one line each, without loading any
model or data set, with an estimate of the GPU time from the paper's own measurements.

    python -m packedss.plan +experiment=table6
    python -m packedss.plan +experiment=table6 model=tiny --and +experiment=table9 model=tiny-set

Each `--and` starts another sweep (a make target's presets); a job that two sweeps share (the
same config, the same records) is listed once. The jobs are expanded and checked exactly as a
sweep does it (packedss.sweep): when any job is invalid, one message lists all of them and the
exit status is 2. The plan ends with the line `N jobs, Q question-runs`, a question-run being
one response decoded (questions x samples x repeats).

The estimate of a job is the paper's time per NFE times its NFE per response (Tables 6-9), times
the job's responses, for the jobs that run one of the paper's measured settings (model, task,
schedule, W, temperature, order, the 1,024-token cap); `n/a` for the others.

The paper measures one request at a time (C = 1). A job at concurrency C > 1 is estimated by
scaling that time, and its estimate is marked `*` (scaled). The assumption: while C requests
decode together every model call carries C requests' rows, so the job makes 1/C as many calls,
each of C x r rows instead of r (r: the schedule's rows per call at W, from its rows-per-iteration
formula: Linear-SS B, Packed-SS 2B, Quadratic-SS B(B+1), AR 1, SetDLM p+3u / 2 and so on). A
call's time follows the public SGLang call-time curve of Nemotron-Labs-Diffusion 8B on a B200
(CUDA graphs, B = 32; CALL_TIME_MS), linear in log2(rows) between its points, flat below its
first point (a memory-bound call streams the weights whatever its rows) and proportional to the
rows past its last (compute-bound). So each response's time is

    paper time per NFE x NFE per response x call_time(C x r) / call_time(r) / C

as if the whole per-NFE time (host work included) scaled like the call, and every one of the C
slots stayed full (continuous batching refills a slot when its response ends; the job's tail,
when fewer than C responses are left, is not modelled).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from packedss.errors import InvalidJobs, PackedSSError, run_cli, run_reporting
from packedss.paths import CONF_DIR

# Questions in each benchmark's evaluation split, by (task, split, variant): what `limit: null`
# runs, known without loading the data (tests check them against the data files).
TASK_SIZES = {
    ("gsm8k", "test", ""): 1319,
    ("math500", "test", ""): 500,
    ("mbpp", "test", "plus"): 378,
    ("mbpp", "test", "original"): 500,
    ("humaneval", "test", ""): 164,
    ("writingbench", "test", ""): 1000,
}
PAPER_MAX_NEW_TOKENS = 1024  # the paper's output cap (Figure 5's caption)
# Call time (ms) by rows per call: SGLang, Nemotron-Labs-Diffusion 8B, B200, CUDA graphs, B = 32,
# each call holding C requests' 32-row blocks (issue 24; the requests' histories vary, so the
# trend counts, not the digits).
CALL_TIME_MS = {32: 5.58, 64: 6.58, 128: 9.47, 256: 10.74, 512: 14.65, 1024: 20.90, 2048: 35.37, 4096: 66.22}
SCALED = "*"


@dataclass(frozen=True)
class PlannedJob:
    model: str
    checkpoint: str  # the hub id, and the local directory when one is configured
    task: str
    variant: str
    n: int  # questions
    schedule: str
    width: int
    block: int
    temperature: float
    verify: str
    order: Optional[str]
    samples: int
    repeats: int
    max_new_tokens: int
    chat: bool
    lora: bool
    out_dir: str
    overrides: tuple[str, ...]
    estimate_s: Optional[float]  # estimated GPU seconds; None where the paper has no figure
    concurrency: int = 1  # C: responses decoded together
    width_source: Optional[str] = None  # where W came from (packedss.config.width_source); None: no W read
    scaled: bool = False  # the estimate is the paper's C = 1 time scaled to C (concurrency_factor)

    @property
    def question_runs(self) -> int:
        return self.n * self.samples * self.repeats


def task_size(task) -> Optional[int]:
    """The task's question count, None when the plan does not know it."""
    if task.name == "arith":
        return int(task.n)
    if task.name == "specbench":  # responses: one per turn of the first questions of each category
        from packedss.tasks.specbench import response_count

        return response_count(int(task.per_category))
    return TASK_SIZES.get((task.name, task.split, task.variant or ""))


def question_count(task, limit: Optional[int]) -> int:
    size = task_size(task)
    if size is None:
        if limit is None:
            raise PackedSSError(
                f"the plan knows no question count for task {task.name} (split {task.split}, variant "
                f"{task.variant or 'none'}); set limit=N, or add it to packedss.plan.TASK_SIZES"
            )
        return limit
    if limit is not None and limit > size:  # the job would stop at its start (Task.questions)
        raise PackedSSError(
            f"task {task.name}: limit={limit} asks for more questions than its {size}; "
            f"lower the limit to {size} or less, or set limit=null for all of them"
        )
    return size if limit is None else limit


def _paper_costs() -> dict[tuple, tuple[float, float]]:
    """(model, task, method, temperature, window) -> (ms per NFE, NFE per response), from the
    paper's absolute tables: Nemotron at its B (Tables 6, 7), SetDLM LTR and native (Tables 8, 9)."""
    from packedss.analysis.paper_numbers import TABLE6, TABLE7, TABLE8, TABLE9

    costs = {}
    for rows, temperature in ((TABLE6, 0.0), (TABLE7, 1.0), (TABLE8, 0.0), (TABLE9, 0.0)):
        for row in rows:
            key = (row["Model"], row["Task"], row["Method"], temperature, row.get("Window"))
            costs[key] = (row["Time/NFE (ms)"], row["NFE"])
    return costs


def paper_seconds_per_response(cfg, order: Optional[str], verify: str, max_new_tokens: int) -> Optional[float]:
    """The paper's measured wall time per response for this job's setting; None when the paper
    has no figure for it."""
    from packedss.analysis.metrics import MODEL_LABELS, SCHEDULE_LABELS, TASK_LABELS
    from packedss.families import family_named

    if cfg.model.lora or max_new_tokens != PAPER_MAX_NEW_TOKENS or cfg.temperature not in (0.0, 1.0):
        return None
    if cfg.temperature > 0 and verify != "rejection":
        return None
    if cfg.task.name == "mbpp" and cfg.task.variant != "plus":
        return None
    if family_named(cfg.model.family).orders:
        if order != "ltr":  # the stored paper text shows the LTR part of Table 9 only
            return None
        window = f"W={cfg.width}"
    elif cfg.width != cfg.schedule.paper_width:
        return None
    else:
        window = None
    key = (
        MODEL_LABELS.get(cfg.model.name),
        TASK_LABELS.get(cfg.task.name),
        SCHEDULE_LABELS.get(cfg.schedule.name),
        float(cfg.temperature),
        window,
    )
    cost = _paper_costs().get(key)
    return None if cost is None else cost[0] / 1000.0 * cost[1]


def call_time_ms(rows: float) -> float:
    """A call's time on CALL_TIME_MS: linear in log2(rows) between its points, its first point's
    time below it, proportional to the rows past its last point."""
    import numpy as np

    last = max(CALL_TIME_MS)
    if rows >= last:
        return CALL_TIME_MS[last] * rows / last
    points = sorted(CALL_TIME_MS)
    return float(np.interp(math.log2(rows), [math.log2(r) for r in points], [CALL_TIME_MS[r] for r in points]))


def rows_per_call(family: str, schedule: str, width: int) -> float:
    """The schedule's mean rows per call after prefill at W: its rows-per-iteration formula over its
    calls per iteration, or its largest call where it has no formula (native decoding)."""
    from packedss.families import family_named

    decoder = family_named(family).schedule(schedule)
    rows = decoder.rows_per_iteration(width)
    return rows / decoder.calls_per_iteration if rows is not None else float(decoder.largest_call_rows(width))


def concurrency_factor(rows: float, concurrency: int) -> float:
    """A response's time at concurrency C over its time at C = 1 (the module's assumption):
    call_time(C x rows) / call_time(rows) / C."""
    return call_time_ms(concurrency * rows) / call_time_ms(rows) / concurrency


def describe(cfg, overrides: Sequence[str]) -> PlannedJob:
    """What one job runs, from its composed config and its identity (packedss.job)."""
    from packedss.config import width_source
    from packedss.job import configured_spec
    from packedss.models import select_checkpoint

    spec = configured_spec(cfg)
    checkpoint = select_checkpoint(cfg.model, cfg.checkpoint_dirs)
    if checkpoint.hub_id and checkpoint.path:
        checkpoint_label = f"{checkpoint.hub_id} @ {checkpoint.path}"
    else:
        checkpoint_label = checkpoint.label()
    n = question_count(cfg.task, cfg.limit)
    per_response = paper_seconds_per_response(cfg, spec.order, spec.verify, spec.max_new_tokens)
    job = PlannedJob(
        model=spec.model,
        checkpoint=checkpoint_label,
        task=spec.task,
        variant=cfg.task.variant or "",
        n=n,
        schedule=spec.schedule,
        width=spec.width,
        block=spec.block,
        temperature=spec.temperature,
        verify=spec.verify,
        order=spec.order,
        samples=cfg.samples,
        repeats=cfg.repeats,
        max_new_tokens=spec.max_new_tokens,
        chat=spec.chat,
        lora=spec.lora,
        out_dir=str(cfg.out_dir),
        overrides=tuple(overrides),
        estimate_s=None,
        concurrency=spec.concurrency,
        width_source=width_source(cfg) if spec.width else None,
    )
    if per_response is None:
        return job
    scaled = spec.concurrency > 1
    if scaled:
        per_response *= concurrency_factor(rows_per_call(spec.family, spec.schedule, spec.width), spec.concurrency)
    return PlannedJob(**{**vars(job), "estimate_s": per_response * job.question_runs, "scaled": scaled})


def plan(sweeps: Sequence[Sequence[str]], config_dir: Path = CONF_DIR) -> list[PlannedJob]:
    """Every job of the sweeps (each a list of Hydra overrides, as after `python run.py -m`), in
    order, each listed once; raises PackedSSError listing every invalid job."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from packedss.config import register_configs
    from packedss.sweep import compose_jobs, invalid_jobs_message, job_identity

    register_configs()
    jobs = []
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.3", job_name="run"):
        loader = GlobalHydra.instance().config_loader()
        for overrides in sweeps:
            master = loader.load_configuration("config", list(overrides), run_mode=RunMode.MULTIRUN)
            sweeper = master.hydra.sweeper
            jobs += compose_jobs(loader, master, sweeper.get("params"), sweeper.get("grids"), list(master.hydra.overrides.task))
    for number, job in enumerate(jobs):
        job.number = number
    message = invalid_jobs_message(jobs)
    if message is not None:
        raise InvalidJobs(message)
    planned, seen = [], set()
    for job in jobs:
        identity = job_identity(job.cfg)
        if identity not in seen:
            seen.add(identity)
            planned.append(describe(job.cfg, job.overrides))
    return planned


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


COLUMNS = ("#", "model", "checkpoint", "task", "n", "schedule", "W", "B", "T", "verify", "order", "samples",
           "max_new_tokens", "chat", "est. GPU time")  # fmt: skip


def _estimate(job: PlannedJob) -> str:
    if job.estimate_s is None:
        return "n/a"
    return _hours(job.estimate_s) + (SCALED if job.scaled else "")


def _width(job: PlannedJob) -> str:
    """W, with where it came from when no `width=` set it: `3 (model)`, `8 (default)`."""
    return str(job.width) if job.width_source in (None, "explicit") else f"{job.width} ({job.width_source})"


WIDTH_NOTE = ("W (model): the model config's released width (model.width); W (default): the global default, the "
              "model naming none; width=N sets W")


def _row(number: int, job: PlannedJob, concurrent: bool) -> tuple[str, ...]:
    task = f"{job.task} ({job.variant})" if job.variant else job.task
    if job.lora:
        task += " +lora"
    cells = (
        str(number),
        job.model,
        job.checkpoint,
        task,
        f"{job.n:,}",
        job.schedule,
        _width(job),
        str(job.block),
        f"{job.temperature:g}",
        job.verify,
        job.order or "-",
        str(job.samples) if job.repeats == 1 else f"{job.samples} x{job.repeats} repeats",
        str(job.max_new_tokens),
        "yes" if job.chat else "no",
        _estimate(job),
    )
    return _with_concurrency(cells, str(job.concurrency)) if concurrent else cells


def _with_concurrency(cells: tuple[str, ...], value: str) -> tuple[str, ...]:
    """The row with a C column after `samples` (shown when a job decodes several responses together)."""
    at = COLUMNS.index("samples") + 1
    return cells[:at] + (value,) + cells[at:]


def format_plan(jobs: Sequence[PlannedJob]) -> str:
    concurrent = any(job.concurrency > 1 for job in jobs)
    header = _with_concurrency(COLUMNS, "C") if concurrent else COLUMNS
    rows = [header, *(_row(number, job, concurrent) for number, job in enumerate(jobs, start=1))]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.append("")
    if any(job.width_source in ("model", "default") for job in jobs):
        lines.append(WIDTH_NOTE)
    lines.append("Estimated GPU time (an estimate: the paper's time per NFE x NFE per response, Tables 6-9, x responses):")
    for model in dict.fromkeys(job.model for job in jobs):
        own = [job for job in jobs if job.model == model]
        known = [job.estimate_s for job in own if job.estimate_s is not None]
        scaled = sum(job.scaled for job in own)
        marker = f" ({scaled} of them scaled to C > 1{SCALED})" if scaled else ""
        if not known:
            lines.append(f"  {model}: n/a (the paper has no figure for its {len(own)} jobs)")
        elif len(known) < len(own):
            lines.append(f"  {model}: {_hours(sum(known))} for {len(known)} of its {len(own)} jobs "
                         f"(n/a for {len(own) - len(known)}: the paper has no figure){marker}")
        else:
            lines.append(f"  {model}: {_hours(sum(known))} for its {len(own)} jobs{marker}")
    if any(job.scaled for job in jobs):
        lines.append(f"{SCALED} scaled: the paper measures C = 1 only; at C > 1 its time per response x "
                     "call_time(C x rows per call) / call_time(rows per call) / C, on SGLang's call times of "
                     "Nemotron-Labs-Diffusion 8B on a B200 (python -m packedss.plan --help)")
    lines.append(f"{len(jobs)} jobs, {sum(job.question_runs for job in jobs):,} question-runs")
    return "\n".join(lines)


def split_sweeps(arguments: Sequence[str]) -> list[list[str]]:
    """Command-line arguments -> one override list per sweep (`--and` separates them)."""
    sweeps: list[list[str]] = [[]]
    for argument in arguments:
        if argument == "--and":
            sweeps.append([])
        else:
            sweeps[-1].append(argument)
    return sweeps


def main(argv: Optional[Sequence[str]] = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if any(argument in ("-h", "--help") for argument in arguments):
        print(__doc__)
        return 0
    return run_reporting(lambda: print(format_plan(plan(split_sweeps(arguments)))))


if __name__ == "__main__":
    run_cli(main)
