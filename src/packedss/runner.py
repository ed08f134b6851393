"""One job (its identity: packedss.job.JobSpec): decode the task's questions with the shared core
(samples x repeats responses each), grade each output, append one record per response. What
differs between model families comes from the family table.

Everything that can be wrong with the input is checked before the record file is created."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

import packedss
from packedss.errors import PackedSSError
from packedss.config import check_out_dir, validate, validate_width
from packedss.decoding import Sampling
from packedss.decoding.driver import run_alone
from packedss.decoding.engine import Request, decode_batched
from packedss.decoding.verify import question_seed
from packedss.families import family_named
from packedss.job import job_spec, task_config_for
from packedss.models import load_adapter, load_tokenizer, resolve_path, select_checkpoint
from packedss.models.checkpoint import read_config
from packedss.models.executors import batched_executor
from packedss.models.checkpoint import resolve_dtype
from packedss.models.cost_twin import CostTwin, available_bytes, build_cost_model, cost_spec
from packedss.models.static import end_warmup, enable_static, static_capacity
from packedss.numerics import exact_reductions
from packedss.paths import PROJECT_ROOT
from packedss.preemption import SignalGuard
from packedss.records import RecordWriter, output_hash
from packedss.tasks import Task, load_task
from packedss.tasks.prompts import encode_prompt
from packedss.tasks.stops import make_stop_check, output_text


@dataclass
class JobResult:
    path: Path
    written: int
    skipped: int


def code_version() -> str:
    """packedss version plus the git commit (and '-dirty') when run from a checkout."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        sha = "unknown"
    return f"{packedss.__version__}+{sha}"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise PackedSSError("device=cuda but no CUDA device is available; use device=cpu or device=auto")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    """"cpu", or the CUDA device's name: runs on different GPUs are different jobs."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def resolve_dtype_name(name: str, device: torch.device) -> str:
    if name != "auto":
        return name
    return "bfloat16" if device.type == "cuda" else "float32"


def run_job(cfg) -> JobResult:
    validate(cfg)
    check_out_dir(cfg.out_dir)
    exact_reductions()
    family = family_named(cfg.model.family)
    device = resolve_device(cfg.device)
    if cfg.threads > 0 or device.type == "cpu":
        # Small CPU models are dominated by per-op overhead; a second intra-op thread buys little
        # alone and costs up to 100x per op when the cores are shared (OpenMP spin-waits).
        torch.set_num_threads(cfg.threads if cfg.threads > 0 else 1)
    dtype = resolve_dtype_name(cfg.dtype, device)
    cost = None  # the cost twin (model.cost_*): checked here, before anything loads
    if cfg.model.cost_shape is not None:
        cost_device = device if cfg.model.cost_device is None else resolve_device(cfg.model.cost_device)
        cost = cost_spec(cfg.model.cost_shape, cfg.model.cost_layers, cfg.model.cost_dtype or dtype, cost_device)
    checkpoint = select_checkpoint(cfg.model, cfg.checkpoint_dirs)
    model_path = resolve_path(cfg.model, checkpoint)
    max_block = family.max_block(read_config(model_path, f"model {cfg.model.name}"))
    validate_width(cfg, max_block)
    task = load_task(task_config_for(cfg), data_dir=cfg.data_dir)
    spec = job_spec(cfg, task.cfg, device=device_name(device), dtype=dtype, threads=torch.get_num_threads(),
                    max_block=max_block, cost_model=None if cost is None else cost.label)  # fmt: skip
    questions = task.questions(cfg.limit)
    tokenizer = load_tokenizer(cfg.model, model_path)
    decoder = family.schedule(spec.schedule)
    largest_call = decoder.largest_call_rows(spec.call_width)
    if spec.concurrency > 1:  # before any weights load
        check_concurrency_memory(spec, family.backbone_config(model_path), cost, largest_call,
                                 max(len(question_prompt_ids(task, tokenizer, q, cfg.model.chat)) for q in questions),
                                 device)  # fmt: skip
    model = load_adapter(cfg.model, family, model_path, device, spec.dtype)
    eos_token_ids = model.eos_token_ids + end_of_turn_ids(cfg.model, tokenizer)
    greedy = spec.temperature == 0
    stops = task.stop_for(spec.chat)
    job_fields = spec.fields() | {
        "config_hash": spec.config_hash,
        "code_version": code_version(),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
    }
    settings_fields = family.settings_fields(spec.schedule, {"pad_verify": cfg.schedule.pad_verify, "order": spec.order,
                                                             "native_window": spec.native_window}, max_block)  # fmt: skip

    def question_response(model, question_id: str, sample: int, ids: list[int]):
        generator = None
        if not greedy:
            generator = torch.Generator(device=device).manual_seed(question_seed(spec.seed, question_id, sample))
        fields = {
            "schedule": spec.schedule,
            "width": cfg.width,  # what the schedule reads of it is in the spec (LTR AR reads none)
            "max_new_tokens": spec.max_new_tokens,
            "eos_token_ids": eos_token_ids,
            "sampling": Sampling(temperature=spec.temperature, rule=cfg.verify, generator=generator),
            "timing": spec.timing,
        }
        return family.response(model, ids, family.settings_type(**(fields | settings_fields)), stop_check)

    budget = model.prompt_budget(spec.max_new_tokens, largest_call)
    if budget is not None and budget < 1:
        raise PackedSSError(
            f"max_new_tokens={spec.max_new_tokens} and the {spec.schedule} calls at width {spec.call_width} leave "
            f"no room for a prompt in model {spec.model}'s context; lower max_new_tokens or the width"
        )

    def prompt_ids(question) -> tuple[list[int], int]:
        """The prompt's ids, and how many tokens were cut from its left to fit the context."""
        ids = question_prompt_ids(task, tokenizer, question, cfg.model.chat)
        fitted = fit_prompt(ids, budget, tokenizer.bos_token_id)
        return fitted, len(ids) - len(fitted)

    if spec.compile != "none" or cost is not None or spec.concurrency > 1:
        longest_prompt = max(len(prompt_ids(q)[0]) for q in questions)
        capacity = static_capacity(longest_prompt, spec.max_new_tokens, largest_call)
    if cost is not None:
        cost.check_context(capacity)  # before the cost model is built
        model = CostTwin(model, build_cost_model(cost, model), cost.label)
        print(f"cost twin: model time is that of {cost.label} ({cost.params / 1e9:.2f}B parameters, random "
              "weights)", file=sys.stderr)  # fmt: skip
    executor = None  # concurrency > 1: the batched calls' executor, on the eager or the static path
    # Slots beyond the job's responses would never be used (the memory check above is for C).
    slots = min(spec.concurrency, len(questions) * cfg.samples * cfg.repeats)
    if spec.concurrency > 1:
        executor = batched_executor(model, slots, spec.compile, capacity if spec.compile != "none" else 0)
    elif spec.compile != "none":
        if cost is not None:
            model.enable_static(spec.compile, capacity)
        else:
            enable_static(model, spec.compile, capacity)
    stop_check = make_stop_check(tokenizer, stops)
    path = spec.record_path(cfg.out_dir)

    def decoded(pending):
        """(response, its prompt ids and truncation) with its Decoded, as each finishes: one at a
        time, or `concurrency` at a time in batched calls (packedss.decoding.engine)."""
        responses = []
        for question, sample, repeat in pending:
            ids, truncated = prompt_ids(question)
            responses.append((question, sample, repeat, ids, truncated))
        if executor is None:
            for response in responses:
                yield response, run_alone(question_response(model, response[0].question_id, response[1], response[3]))
            return
        requests = [Request(response, partial(question_response, question_id=response[0].question_id,
                                              sample=response[1], ids=response[3]))
                    for response in responses]  # fmt: skip
        for request, out in decode_batched(executor, requests, slots):
            yield request.key, out

    def warm_up(pending) -> dict[str, float]:
        """Untimed, unrecorded decodes before the timed ones: the first response, or the first C
        at concurrency C (the batched shapes); compiled shapes are fixed from then on, and none
        compiles while timed. Returns the compile seconds per shape."""
        firsts = list({question.question_id: (question, 0, 0) for question, _, _ in pending}.values())
        for _ in decoded(firsts[:slots]):
            pass
        if executor is not None:
            return executor.end_warmup()
        return model.end_warmup() if cost is not None else end_warmup(model)

    responses = [(q, k, r) for q in questions for k in range(cfg.samples) for r in range(cfg.repeats)]
    with SignalGuard() as guard, RecordWriter(path) as writer:
        done = writer.done_keys(spec.config_hash)
        pending = [(q, k, r) for q, k, r in responses if (q.question_id, k, r) not in done]
        if pending and cfg.warmup:
            compile_s = warm_up(pending)
            if compile_s:
                job_fields["compile_s"] = compile_s
                shapes = ", ".join(f"{shape}: {seconds:.1f} s" for shape, seconds in compile_s.items())
                print(f"compiled {len(compile_s)} call shapes in the warm-up ({shapes})", file=sys.stderr)
        written = 0
        tokens_total = wall_total = 0.0
        accepted_total = iterations_total = 0
        bar = tqdm(total=len(pending), desc=f"{spec.model}/{spec.task}/{spec.schedule} W={spec.width}",
                   unit="response", disable=None if cfg.progress else True, file=sys.stderr)  # fmt: skip
        grades = {}
        started = time.perf_counter()
        for (question, sample, repeat, ids, truncated), out in decoded(pending):
            text = output_text(tokenizer, out.tokens, stops)
            key = (question.question_id, sample)
            if key not in grades:  # repeats time the same response again: grade it once
                grades[key] = task.grade(question, text).record_fields(task.cfg.grader)
            record = {
                **job_fields,
                "sample": sample,
                "repeat": repeat,
                "question_id": question.question_id,
                "prompt_tokens": len(ids),
                "prompt_truncated_tokens": truncated,
                "output_tokens": len(out.tokens),
                "output_text": text,
                "finish_reason": out.finish_reason,
                "output_hash": output_hash(out.tokens),
                "output_ids": out.tokens,
                **out.cost_fields(),
                **grades[key],
            }
            with guard.critical():
                writer.append(record)
            written += 1
            tokens_total += len(out.tokens)
            wall_total += out.wall_s
            accepted_total += sum(out.accepted)
            iterations_total += out.iterations
            bar.update(1)
            bar.set_postfix(tok_s=f"{tokens_total / max(wall_total, 1e-9):.1f}",
                            accepted=f"{accepted_total / max(iterations_total, 1):.2f}")  # fmt: skip
        bar.close()
        if written:
            write_throughput(path, spec, written, int(tokens_total), wall_total, time.perf_counter() - started)
    return JobResult(path=path, written=written, skipped=len(responses) - len(pending))


def write_throughput(path: Path, spec, responses: int, output_tokens: int, wall_s: float, elapsed_s: float) -> None:
    """Append this invocation's system throughput to the job's `<record stem>.throughput.json`:
    output tokens over the responses' summed wall time (at concurrency C their shares of each
    batched call add up to the job's time; a cost twin's deciding model is left out), and the
    host's own elapsed seconds."""
    summary = path.with_name(path.stem + ".throughput.json")
    runs = json.loads(summary.read_text()) if summary.exists() else []
    runs.append({
        "config_hash": spec.config_hash,
        "concurrency": spec.concurrency,
        "responses": responses,
        "output_tokens": output_tokens,
        "wall_s": wall_s,
        "tokens_per_s": output_tokens / wall_s if wall_s > 0 else None,
        "elapsed_s": elapsed_s,
    })  # fmt: skip
    partial_file = summary.with_name(summary.name + ".tmp")
    partial_file.write_text(json.dumps(runs, indent=1) + "\n")
    os.replace(partial_file, summary)


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

