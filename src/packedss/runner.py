"""One job (its identity: packedss.job.JobSpec) as a pipeline:

    config -> job_spec -> job_resources -> pending responses -> decoded responses -> records

`job_spec` checks and resolves the config once; `job_resources` builds what the job decodes with
from that alone (the side-by-side benchmark, packedss.benchmark.schedules, builds each of its
jobs with it too); the task's questions are decoded with the shared core (samples x repeats
responses each), each output graded, one record appended per response. What differs between
model families comes from the family table.

Everything that can be wrong with the input is checked before the record file is created."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch
import transformers

import packedss
from packedss.decoding import DecodeSettings, Decoded, Sampling
from packedss.decoding.driver import Response, run_alone
from packedss.decoding.engine import Request, decode_batched
from packedss.decoding.verify import question_seed
from packedss.errors import PackedSSError
from packedss.job import JobSpec, ResolvedJob, job_spec, task_config_for  # noqa: F401 (task_config_for: re-exported)
from packedss.models import load_adapter, load_tokenizer
from packedss.models.checkpoint import resolve_dtype
from packedss.models.cost_twin import CostTwin, available_bytes, build_cost_model, row_scaling_fields
from packedss.models.executors import batched_executor
from packedss.models.static import end_warmup, static_capacity, static_twin
from packedss.numerics import exact_reductions
from packedss.paths import PROJECT_ROOT
from packedss.preemption import SignalGuard
from packedss.progress import response_progress
from packedss.records import RecordWriter, output_hash, read_records
from packedss.tasks import Question, Task, load_task
from packedss.tasks.prompts import encode_prompt
from packedss.tasks.stops import make_stop_check, output_text
from packedss.tasks.turns import ready_turns


@dataclass
class JobResult:
    path: Path
    written: int
    skipped: int


@dataclass
class Weights:
    """The loaded models a job decodes with. A job loads its own (`load_weights`); the benchmark's
    jobs share one set, each job's static and cost twins made over it."""

    adapter: Any
    tokenizer: Any
    cost_models: dict[str, Any] = field(default_factory=dict)  # cost twin label -> its random-weight model


class Prompt(NamedTuple):
    ids: list[int]
    truncated: int  # tokens cut from its left to fit the context


@dataclass
class JobResources:
    """What a job decodes with, built from its ResolvedJob alone (`job_resources`)."""

    job: ResolvedJob
    tokenizer: Any
    task: Task
    questions: list[Question]
    prompts: dict[str, Prompt]  # question id -> its prompt, fitted to the context
    eos_token_ids: tuple[int, ...]  # the model's EOS and end-of-turn ids
    stops: list[str]
    stop_check: Any
    model: Any  # the CallModel of the job's call path: eager, static (compiled), or a cost twin over either
    executor: Any  # C > 1: the batched calls' executor (packedss.models.executors); None: one at a time
    slots: int  # responses decoded together: C, or fewer when the job has fewer
    weights: Any = None  # the loaded Weights (a later pass reuses them)
    waiting: list[Question] = field(default_factory=list)  # later turns whose earlier turns are not recorded yet

    def settings(self, question_id: str, sample: int) -> DecodeSettings:
        """One response's decode settings: the job's, with its own seeded generator at T > 0 (and for
        a schedule that draws at T = 0)."""
        job, spec = self.job, self.job.identity
        generator = None
        if spec.temperature > 0 or job.family.schedule(spec.schedule).draws_at_greedy:
            generator = torch.Generator(device=job.device).manual_seed(question_seed(spec.seed, question_id, sample))
        fields = {
            "schedule": spec.schedule,
            "width": job.width,
            "max_new_tokens": spec.max_new_tokens,
            "eos_token_ids": self.eos_token_ids,
            "sampling": Sampling(temperature=spec.temperature, rule=job.sampling_rule, generator=generator),
            "timing": spec.timing,
        }
        return job.family.settings_type(**(fields | job.settings_fields))

    def response(self, model, question_id: str, sample: int) -> Response:
        """One response as a coroutine on `model` (this job's, or a batch slot's)."""
        settings = self.settings(question_id, sample)
        return self.job.family.response(model, self.prompts[question_id].ids, settings, self.stop_check)

    def end_warmup(self) -> dict[str, float]:
        """Close compilation after the untimed warm-up; the compile seconds per call shape."""
        if self.executor is not None:
            return self.executor.end_warmup()
        return self.model.end_warmup() if isinstance(self.model, CostTwin) else end_warmup(self.model)


class PendingResponse(NamedTuple):
    """One response the job makes: sample `sample` of a question, timed for the `repeat`-th time."""

    question: Question
    sample: int
    repeat: int


@dataclass
class Tally:
    """What the records written so far add up to (the progress bar and the throughput summary)."""

    written: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    accepted: int = 0
    iterations: int = 0

    def add(self, out: Decoded) -> None:
        self.written += 1
        self.tokens += len(out.tokens)
        self.wall_s += out.wall_s
        self.accepted += sum(out.accepted)
        self.iterations += out.iterations


def run_job(cfg) -> JobResult:
    job = job_spec(cfg)
    resources = job_resources(job)
    written = 0
    with SignalGuard() as guard, RecordWriter(job.record_path) as writer:
        while True:  # one pass, and one more per later turn of a multi-turn task (packedss.tasks.turns)
            turn_written, skipped = run_responses(job, resources, writer, guard)
            written += turn_written
            if not resources.waiting or not turn_written:
                break
            resources = job_resources(job, resources.weights)  # the later turns, their earlier ones now recorded
    # A pass's questions hold every earlier pass's: the last one skipped those written before it too.
    return JobResult(path=job.record_path, written=written, skipped=skipped - (written - turn_written))


def run_responses(job: ResolvedJob, resources: JobResources, writer: RecordWriter, guard: SignalGuard) -> tuple[int, int]:
    """Decode and record the responses of the resources' questions not yet recorded: (written, skipped)."""
    responses = [PendingResponse(q, k, r) for q in resources.questions for k in range(job.samples)
                 for r in range(job.repeats)]  # fmt: skip
    resume = writer.resume(job.identity.config_hash)
    for warning in resume.warnings():  # bad lines: kept, named, and not counted as done
        print(warning, file=sys.stderr)
    resume.check_prompts(job.record_path, {q: len(p.ids) for q, p in resources.prompts.items()})
    pending = pending_responses(responses, resume.done)
    fields = job_fields(job.identity) | {"width_source": job.width_source} | warm_up(job, resources, pending)
    fields |= row_scaling_fields(resources.model, job.width + 1) if pending else {}  # a cost twin's regime
    started = time.perf_counter()
    tally = write_records(resources, fields, decoded_responses(resources, pending), len(pending), writer, guard)
    if tally.written:
        write_throughput(job.record_path, job.identity, tally, time.perf_counter() - started)
    return tally.written, len(responses) - len(pending)


def recorded_answers(job: ResolvedJob) -> dict[str, str]:
    """Question id -> the output text of its recorded first response (an earlier turn's answer)."""
    if not job.record_path.is_file():
        return {}
    records, _ = read_records(job.record_path)
    return {r["question_id"]: r["output_text"] for r in records
            if r["config_hash"] == job.identity.config_hash and r["sample"] == 0 and r["repeat"] == 0}  # fmt: skip


def job_resources(job: ResolvedJob, weights: Weights | None = None) -> JobResources:
    """What the job decodes with, from its spec alone: its questions and their prompts, the model
    of its call path (or the batch executor at C > 1), its EOS ids and stops. Loads the job's
    weights unless `weights` are given (the benchmark's jobs share one set). Every check runs
    before what it guards is loaded or built."""
    spec = job.identity
    prepare_process(job)
    task = load_task(job.task_config, data_dir=job.data_dir)
    # A later turn waits until the turns before it are recorded.
    questions, waiting = ready_turns(task.questions(job.limit), partial(recorded_answers, job), job.samples)
    tokenizer = load_tokenizer(job.model_config, job.model_path) if weights is None else weights.tokenizer
    ids = {q.question_id: question_prompt_ids(task, tokenizer, q, spec.chat) for q in questions}
    largest_call = job.family.schedule(spec.schedule).largest_call_rows(spec.call_width)
    if weights is None:
        weights = load_weights(job, tokenizer, max(map(len, ids.values())), largest_call)
    eos_token_ids = weights.adapter.eos_token_ids + end_of_turn_ids(job.model_config, tokenizer)
    stops = task.stop_for(spec.chat)
    prompts = fitted_prompts(spec, weights.adapter, ids, job.prompt_reserve, tokenizer.bos_token_id)
    capacity = static_capacity(max(len(p.ids) for p in prompts.values()), spec.max_new_tokens, largest_call)
    model = call_model(job, weights, capacity)
    # Slots beyond the job's responses would never be used (the memory check is for C).
    slots = min(spec.concurrency, len(questions) * job.samples * job.repeats)
    executor = None
    if spec.concurrency > 1:
        executor = batched_executor(model, slots, spec.compile, capacity if spec.compile != "none" else 0)
    return JobResources(job, tokenizer, task, questions, prompts, eos_token_ids, stops,
                        make_stop_check(tokenizer, stops), model, executor, slots, weights, waiting)  # fmt: skip


def prepare_process(job: ResolvedJob) -> None:
    """The process settings a job runs with: its intra-op threads, and exact reductions (the
    arithmetic the audit's match rates assume)."""
    torch.set_num_threads(job.identity.threads)
    exact_reductions()


def load_weights(job: ResolvedJob, tokenizer, longest_prompt: int, largest_call: int) -> Weights:
    """The job's model from its checkpoint; at C > 1 only after checking that C caches fit."""
    spec = job.identity
    if spec.concurrency > 1:
        check_concurrency_memory(spec, job.family.backbone_config(job.model_path), job.cost, largest_call,
                                 longest_prompt, job.device)  # fmt: skip
    return Weights(load_adapter(job.model_config, job.family, job.model_path, job.device, spec.dtype), tokenizer)


def fitted_prompts(spec: JobSpec, adapter, ids: dict[str, list[int]], reserve: int,
                   bos_token_id) -> dict[str, Prompt]:  # fmt: skip
    """Each prompt cut from its left to what the model's context leaves beside the output cap and
    the model's reserve for a call (`ResolvedJob.prompt_reserve`: the same for every schedule and
    width of the model, so the runs a table pairs decode the same prompts)."""
    budget = adapter.prompt_budget(spec.max_new_tokens, reserve)
    if budget is not None and budget < 1:
        raise PackedSSError(
            f"max_new_tokens={spec.max_new_tokens} leaves no room for a prompt in model {spec.model}'s context "
            f"(a prompt budget of {budget} tokens); lower max_new_tokens"
        )
    fitted = {question_id: fit_prompt(prompt, budget, bos_token_id) for question_id, prompt in ids.items()}
    return {question_id: Prompt(f, len(ids[question_id]) - len(f)) for question_id, f in fitted.items()}


def call_model(job: ResolvedJob, weights: Weights, capacity: int):
    """The CallModel the job's calls run on: the weights' adapter; compiled at C = 1, a static twin
    over it with caches of `capacity` rows (at C > 1 the batch executor holds the static caches);
    with a cost model's time when the job has a cost twin."""
    spec = job.identity
    static = spec.compile != "none" and spec.concurrency == 1
    model = static_twin(weights.adapter, spec.compile, capacity) if static else weights.adapter
    if job.cost is None:
        return model
    job.cost.check_context(capacity)  # before the cost model is built
    label = job.cost.label
    if label not in weights.cost_models:
        weights.cost_models[label] = build_cost_model(job.cost, weights.adapter)
        print(f"cost twin: model time is that of {label} ({job.cost.size} parameters, random "
              "weights)", file=sys.stderr)  # fmt: skip
    cost_model = weights.cost_models[label]
    return CostTwin(model, static_twin(cost_model, spec.compile, capacity) if static else cost_model, label)


def pending_responses(responses: list[PendingResponse], done: set[tuple[str, int, int]]) -> list[PendingResponse]:
    """The job's responses not yet recorded under its config hash (`done`: their keys): a rerun resumes."""
    return [r for r in responses if (r.question.question_id, r.sample, r.repeat) not in done]


def decoded_responses(resources: JobResources, pending: list[PendingResponse]) -> Iterator[tuple[PendingResponse, Decoded]]:  # fmt: skip
    """Each response with its Decoded, as each finishes: one at a time, or C at a time in batched
    calls (packedss.decoding.engine)."""
    if resources.executor is None:
        for response in pending:
            question_id = response.question.question_id
            yield response, run_alone(resources.response(resources.model, question_id, response.sample))
        return
    requests = [Request(response, partial(resources.response, question_id=response.question.question_id,
                                          sample=response.sample))
                for response in pending]  # fmt: skip
    for request, out in decode_batched(resources.executor, requests, resources.slots):
        yield request.key, out


def warm_up(job: ResolvedJob, resources: JobResources, pending: list[PendingResponse]) -> dict:
    """Untimed, unrecorded decodes before the timed ones (warmup=true): the first response, or the
    first C at concurrency C (the batched shapes); compiled shapes are fixed from then on, and
    none compiles while timed. Returns the records' `compile_s` field when any shape compiled."""
    if not pending or not job.identity.warmup_decode:
        return {}
    firsts = list({r.question.question_id: PendingResponse(r.question, 0, 0) for r in pending}.values())
    for _ in decoded_responses(resources, firsts[: resources.slots]):
        pass
    compile_s = resources.end_warmup()
    if not compile_s:
        return {}
    shapes = ", ".join(f"{shape}: {seconds:.1f} s" for shape, seconds in compile_s.items())
    print(f"compiled {len(compile_s)} call shapes in the warm-up ({shapes})", file=sys.stderr)
    return {"compile_s": compile_s}


def job_fields(spec: JobSpec) -> dict:
    """The fields every record of the job holds: its identity, config hash and code versions."""
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "python": platform.python_version()}  # fmt: skip
    return spec.fields() | {"config_hash": spec.config_hash, "code_version": code_version(), "versions": versions}


def write_records(resources: JobResources, fields: dict, decoded: Iterator[tuple[PendingResponse, Decoded]],
                  total: int, writer: RecordWriter, guard: SignalGuard) -> Tally:  # fmt: skip
    """Grade each decoded response and append its record (a signal waits until the record is
    whole); a progress bar shows tokens/s and acceptance (plain lines when stderr is not a terminal)."""
    spec, tally, grades = resources.job.identity, Tally(), {}
    bar = response_progress(total, f"{spec.model}/{spec.task}/{spec.schedule} W={spec.width}", resources.job.progress)
    for response, out in decoded:
        text = output_text(resources.tokenizer, out.tokens, resources.stops)
        key = (response.question.question_id, response.sample)
        if key not in grades:  # repeats time the same response again: grade it once
            grades[key] = resources.task.grade(response.question, text).record_fields(resources.task.cfg.grader)
        prompt = resources.prompts[response.question.question_id]
        record = {
            **fields,
            "sample": response.sample,
            "repeat": response.repeat,
            "question_id": response.question.question_id,
            "prompt_tokens": len(prompt.ids),
            "prompt_truncated_tokens": prompt.truncated,
            "output_tokens": len(out.tokens),
            "output_text": text,
            "finish_reason": out.finish_reason,
            "output_hash": output_hash(out.tokens),
            "output_ids": out.tokens,
            **out.cost_fields(),
            **grades[key],
            **response.question.metadata.get("record_fields", {}),  # e.g. Spec-Bench's category and turn
        }
        with guard.critical():
            writer.append(record)
        tally.add(out)
        bar.update(1)
        bar.set_postfix(tok_s=f"{tally.tokens / max(tally.wall_s, 1e-9):.1f}",
                        accepted=f"{tally.accepted / max(tally.iterations, 1):.2f}")  # fmt: skip
    bar.close()
    return tally


def write_throughput(path: Path, spec: JobSpec, tally: Tally, elapsed_s: float) -> None:
    """Append this invocation's system throughput to the job's `<record stem>.throughput.json`:
    output tokens over the responses' summed wall time (at concurrency C their shares of each
    batched call add up to the job's time; a cost twin's deciding model is left out), and the
    host's own elapsed seconds."""
    summary = path.with_name(path.stem + ".throughput.json")
    runs = json.loads(summary.read_text()) if summary.exists() else []
    runs.append({
        "config_hash": spec.config_hash,
        "concurrency": spec.concurrency,
        "responses": tally.written,
        "output_tokens": tally.tokens,
        "wall_s": tally.wall_s,
        "tokens_per_s": tally.tokens / tally.wall_s if tally.wall_s > 0 else None,
        "elapsed_s": elapsed_s,
    })  # fmt: skip
    partial_file = summary.with_name(summary.name + ".tmp")
    partial_file.write_text(json.dumps(runs, indent=1) + "\n")
    os.replace(partial_file, summary)


def code_version() -> str:
    """packedss version plus the git commit (and '-dirty') when run from a checkout; without .git
    (a copy of the tree, as scripts/gpu_check.sh runs on a GPU machine) the commit the copy was
    made from, PACKEDSS_COMMIT, else 'unknown'."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        sha = os.environ.get("PACKEDSS_COMMIT", "").strip() or "unknown"
    return f"{packedss.__version__}+{sha}"


def kv_bytes_per_row(config, dtype) -> int:
    """Bytes of one cached row (every layer's key and value) of a backbone config."""
    get = config.get if isinstance(config, dict) else lambda name, default=None: getattr(config, name, default)
    heads = int(get("num_attention_heads"))
    kv_heads = int(get("num_key_value_heads") or heads)
    head_dim = int(get("head_dim") or int(get("hidden_size")) // heads)
    element = torch.empty((), dtype=resolve_dtype(dtype) if isinstance(dtype, str) else dtype).element_size()
    return int(get("num_hidden_layers")) * 2 * kv_heads * head_dim * element


def check_concurrency_memory(spec, backbone, cost, largest_call: int, longest_prompt: int, device) -> None:
    """C caches must fit each model's device: a cache holds at most the longest prompt (as
    tokenized, before any cut to the context), the output cap and the largest call, and never
    more rows than the model has positions. Checked before any weights load."""
    capacity = static_capacity(longest_prompt, spec.max_new_tokens, largest_call)
    positions = getattr(backbone, "max_position_embeddings", None)
    models = [(spec.model, backbone, device, spec.dtype, min(capacity, positions or capacity))]
    if cost is not None:
        models.append(("the cost model", cost.config, torch.device(cost.device), cost.dtype, capacity))
    for name, config, where, dtype, rows in models:
        needed = spec.concurrency * rows * kv_bytes_per_row(config, dtype)
        free = available_bytes(where)
        if needed > free:
            raise PackedSSError(
                f"concurrency={spec.concurrency}: {spec.concurrency} caches of {rows} rows for {name} need "
                f"{needed / 2**30:.1f} GiB, but {where.type} has {max(free, 0) / 2**30:.1f} GiB free; "
                "lower concurrency or max_new_tokens"
            )


def question_prompt_ids(task: Task, tokenizer, question, chat: bool) -> list[int]:
    return encode_prompt(tokenizer, task.build_prompt(question, tokenizer=tokenizer, chat=chat), chat)


def end_of_turn_ids(model_cfg, tokenizer) -> tuple[int, ...]:
    """Token ids of the model's end-of-turn tokens (e.g. <|im_end|>); each must be one known token."""
    ids = []
    for token in model_cfg.end_of_turn:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise PackedSSError(
                f"model {model_cfg.name}: end-of-turn token {token!r} is not in the tokenizer's vocabulary; "
                "fix model.end_of_turn"
            )
        ids.append(int(token_id))
    return tuple(ids)


def fit_prompt(ids: list[int], budget: int | None, bos_token_id: int | None) -> list[int]:
    """The prompt cut from the left to `budget` tokens (a leading BOS is kept), as evaluation
    harnesses truncate over-long contexts; unchanged when it fits."""
    if budget is None or len(ids) <= budget:
        return ids
    if bos_token_id is not None and ids and ids[0] == bos_token_id:
        return [ids[0], *ids[len(ids) - budget + 1 :]]
    return ids[len(ids) - budget :]
