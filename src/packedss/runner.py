"""One job = (model, task, schedule, width, temperature, verify, order, seed, repeats): decode the
task's questions with the shared core, grade each output, append one record per response.

Everything that can be wrong with the input is checked before the record file is created."""

from __future__ import annotations

import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from omegaconf import OmegaConf
from tqdm import tqdm

import packedss
from packedss.config import PROJECT_ROOT, validate, validate_width
from packedss.decoding import DecodeSettings, Sampling, decode
from packedss.decoding.anyorder import AnyOrderSettings, decode_anyorder
from packedss.models import load_model, read_block_size, resolve_path
from packedss.records import RecordWriter, config_hash, output_hash, record_path
from packedss.tasks import load_task
from packedss.tasks.stops import make_stop_check, output_text
from packedss.decoding.verify import question_seed


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
        from packedss.errors import PackedSSError

        raise PackedSSError("device=cuda but no CUDA device is available; use device=cpu or device=auto")
    return torch.device(name)


def resolve_dtype_name(name: str, device: torch.device) -> str:
    if name != "auto":
        return name
    return "bfloat16" if device.type == "cuda" else "float32"


def run_job(cfg) -> JobResult:
    validate(cfg)
    device = resolve_device(cfg.device)
    if cfg.threads > 0 or device.type == "cpu":
        # Small CPU models are dominated by per-op overhead; a second intra-op thread buys little
        # alone and costs up to 100x per op when the cores are shared (OpenMP spin-waits).
        torch.set_num_threads(cfg.threads if cfg.threads > 0 else 1)
    dtype = resolve_dtype_name(cfg.dtype, device)
    model_path = resolve_path(cfg.model)
    validate_width(cfg, read_block_size(model_path, cfg.model.family))
    task = load_task(cfg.task, data_dir=cfg.data_dir)
    questions = task.questions(cfg.limit)
    model, tokenizer = load_model(cfg.model, model_path, device, dtype)

    greedy = cfg.temperature == 0
    verify = "greedy" if greedy else cfg.verify
    order = cfg.order if cfg.model.family == "setdlm" else None
    max_new_tokens = cfg.max_new_tokens or task.max_new_tokens
    stops = task.stop_for(cfg.model.chat)
    identity = {
        "model": cfg.model.name,
        "model_path": str(model_path),
        "lora": bool(cfg.model.lora),
        "task": OmegaConf.to_container(cfg.task, resolve=True) if OmegaConf.is_config(cfg.task) else vars(cfg.task),
        "schedule": cfg.schedule.name,
        "pad_verify": bool(cfg.schedule.pad_verify),
        "width": cfg.width,
        "temperature": cfg.temperature,
        "verify": verify,
        "order": order,
        "seed": cfg.seed,
        "max_new_tokens": max_new_tokens,
        "dtype": dtype,
        "device": device.type,
    }
    job_hash = config_hash(identity)
    static = {
        "model": cfg.model.name,
        "task": task.name,
        "schedule": cfg.schedule.name,
        "width": cfg.width,
        "block": cfg.width + 1 if cfg.model.family == "nemotron" else cfg.width,
        "temperature": cfg.temperature,
        "verify": verify,
        "order": order,
        "seed": cfg.seed,
        "config_hash": job_hash,
        "code_version": code_version(),
        "device": device.type if device.type != "cuda" else torch.cuda.get_device_name(device),
        "dtype": dtype,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "family": "ltr" if cfg.model.family == "nemotron" else "anyorder",
        "pad_verify": bool(cfg.schedule.pad_verify),
        "lora": bool(cfg.model.lora),
        "lossy": cfg.schedule.name == "native",
        "timing": cfg.timing,
        "max_new_tokens": max_new_tokens,
    }

    def decode_question(question_id: str, ids: list[int]):
        generator = None
        if not greedy:
            generator = torch.Generator(device=device).manual_seed(question_seed(cfg.seed, question_id))
        sampling = Sampling(temperature=cfg.temperature, rule=cfg.verify, generator=generator)
        common = dict(width=cfg.width, max_new_tokens=max_new_tokens, eos_token_ids=model.eos_token_ids,
                      sampling=sampling, timing=cfg.timing)  # fmt: skip
        if cfg.model.family == "setdlm":
            settings = AnyOrderSettings(schedule=cfg.schedule.name, order=cfg.order, **common)
            out = decode_anyorder(model, ids, settings, stop_check)
        else:
            settings = DecodeSettings(schedule=cfg.schedule.name, pad_verify=cfg.schedule.pad_verify, **common)
            out = decode(model, ids, settings, stop_check)
        return out

    def prompt_ids(question) -> list[int]:
        text = task.build_prompt(question, tokenizer=tokenizer, chat=cfg.model.chat)
        return tokenizer(text, add_special_tokens=not cfg.model.chat)["input_ids"]

    stop_check = make_stop_check(tokenizer, stops)
    variant = ("-nopad" if cfg.schedule.name == "packed" and not cfg.schedule.pad_verify else "") + (
        "-lora" if cfg.model.lora else ""
    )
    path = record_path(cfg.out_dir, cfg.model.name, task.name, cfg.schedule.name + variant, cfg.width,
                       cfg.temperature, verify, order, cfg.seed)  # fmt: skip
    existed = path.exists()
    with RecordWriter(path) as writer:
        done = writer.done_keys(job_hash)
        pending = [(q, r) for q in questions for r in range(cfg.repeats) if (q.question_id, r) not in done]
        if pending and cfg.warmup:
            first = pending[0][0]
            decode_question(first.question_id, prompt_ids(first))
        written = 0
        tokens_total = wall_total = 0.0
        accepted_total = iterations_total = 0
        bar = tqdm(pending, desc=f"{cfg.model.name}/{task.name}/{cfg.schedule.name} W={cfg.width}",
                   unit="q", disable=None if cfg.progress else True, file=sys.stderr)  # fmt: skip
        grades = {}
        for question, repeat in bar:
            ids = prompt_ids(question)
            out = decode_question(question.question_id, ids)
            text = output_text(tokenizer, out.tokens, stops)
            if question.question_id not in grades:
                grades[question.question_id] = task.grade(question, text).record_fields(task.cfg.grader)
            record = {
                **static,
                "repeat": repeat,
                "question_id": question.question_id,
                "prompt_tokens": len(ids),
                "output_tokens": len(out.tokens),
                "output_text": text,
                "finish_reason": out.finish_reason,
                "output_hash": output_hash(out.tokens),
                **out.cost_fields(),
                **grades[question.question_id],
            }
            writer.append(record)
            written += 1
            tokens_total += len(out.tokens)
            wall_total += out.wall_s
            accepted_total += sum(out.accepted)
            iterations_total += out.iterations
            bar.set_postfix(tok_s=f"{tokens_total / max(wall_total, 1e-9):.1f}",
                            accepted=f"{accepted_total / max(iterations_total, 1):.2f}")  # fmt: skip
        bar.close()
    if not existed and written == 0 and path.stat().st_size == 0:
        path.unlink()
    return JobResult(path=path, written=written, skipped=len(questions) * cfg.repeats - len(pending))
