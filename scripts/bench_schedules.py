#!/usr/bin/env python
"""Side-by-side benchmark of the LTR schedules on one model and task, in one process.

After a warm-up (every schedule decodes the first --warmup questions, untimed), the schedules
run interleaved over the same questions (q1: A B C, q2: A B C, ...; --repeats times each), so
that drifts of the machine hit every schedule alike. One table per run:

    Tokens/s, Tokens/NFE, Time/NFE (ms), NFE (mean per response), Model ms/iter (model time
    per iteration after prefill), Non-model share of wall (%), Match (% of questions whose
    output equals the reference schedule's token for token: AR when it runs, else the first),
    Accuracy, the throughput ratio to Linear-SS with its 95% paired bootstrap CI
    (packedss.analysis.bootstrap.compare: questions paired, BCa), and with --replay the
    decoder's own time per iteration (every call's logits recorded, then the same decodes
    replayed against a zero-cost model: the schedule, call building, verification and stop
    checks without any model time; best of 5).

Definitions are the paper's (SPEC §6): aggregate totals; non-model share = Σ(wall - model) /
Σwall, where wall is the decoder's inclusive time (prompt included) and model the summed
per-call model time (synchronized host time on CPU, CUDA events on a GPU).

    python scripts/bench_schedules.py --model tiny --task arith --limit 30 --width 8
    python scripts/bench_schedules.py --model tiny --shape nemotron8b --device cuda --limit 10 --max-new-tokens 256

--shape / --config replace the weights by a random model of that shape (see bench_calls.py);
the tokenizer, mask and EOS ids still come from --model. Random weights do not produce useful
drafts, so such a run measures time per call and decoder overhead, not acceptance.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import pandas as pd
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "scripts"))

from packedss.analysis.bootstrap import N_RESAMPLES, compare  # noqa: E402
from packedss.analysis.metrics import SCHEDULE_LABELS  # noqa: E402
from packedss.decoding import DecodeSettings, Sampling, decode  # noqa: E402
from packedss.decoding.schedules import LTR_SCHEDULES  # noqa: E402
from packedss.decoding.trace import TIMINGS  # noqa: E402
from packedss.models.checkpoint import read_config, resolve_dtype  # noqa: E402
from packedss.records import output_hash  # noqa: E402
from packedss.decoding.verify import question_seed  # noqa: E402
from packedss.tasks.stops import make_stop_check, output_text  # noqa: E402
from packedss.tasks import load_task, load_task_config  # noqa: E402



def load(args, device: torch.device, dtype: str):
    """(adapter, tokenizer, chat, label) for --model (a conf/model name or a directory)."""
    from omegaconf import OmegaConf

    from packedss.models import load_model, resolve_path

    conf = REPO / "conf" / "model" / f"{args.model}.yaml"
    if conf.is_file():
        cfg = OmegaConf.load(conf)
        if args.model_path:
            cfg.path = args.model_path
    else:
        cfg = OmegaConf.create({"name": Path(args.model).name, "family": "nemotron", "hub_id": None,
                                "path": args.model, "download": False, "chat": False, "lora": False,
                                "lora_path": None})  # fmt: skip
    if cfg.family != "nemotron":
        raise SystemExit(f"{args.model}: only the LTR (nemotron-format) family is benchmarked here")
    path = resolve_path(cfg)
    if not (args.shape or args.config):
        adapter, tokenizer = load_model(cfg, path, device, dtype)
        return adapter, tokenizer, bool(cfg.chat), cfg.name
    from transformers import AutoTokenizer

    from bench_calls import random_adapter, shape_config

    checkpoint = read_config(path, f"model {cfg.name}")
    eos = checkpoint.get("eos_token_id")
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    adapter = random_adapter(
        shape_config(args.shape, args.config), device, resolve_dtype(dtype), vocab_at_least=len(tokenizer),
        mask_token_id=int(checkpoint["mask_token_id"]),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ()),
        name=f"random-{args.shape or Path(args.config).name}",
    )  # fmt: skip
    return adapter, tokenizer, bool(cfg.chat), f"{cfg.name} tokenizer + random {args.shape or args.config} weights"


class _Recorder:
    """Passes calls to the model and keeps every call's logits (for `replay_overhead`)."""

    def __init__(self, model):
        self.model, self.device, self.mask_token_id, self.log = model, model.device, model.mask_token_id, []

    def run(self, call):
        logits = self.model.run(call)
        self.log.append(logits)
        return logits

    def commit(self, rows):
        self.model.commit(rows)

    def reset(self):
        self.model.reset()

    def synchronize(self):
        self.model.synchronize()


class _Replay:
    """A zero-cost model: returns the recorded logits of each call in turn."""

    def __init__(self, log, device, mask_token_id):
        self.log, self.device, self.mask_token_id, self.index = log, device, mask_token_id, 0

    def run(self, call):
        self.index += 1
        return self.log[self.index - 1]

    def commit(self, rows):
        pass

    def reset(self):
        pass

    def synchronize(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def replay_overhead(adapter, jobs, rounds: int = 5) -> float:
    """The decoder's own time per iteration, in microseconds: every call's logits are recorded
    with the real model, then the same decodes run again against a model that returns them at no
    cost (identical control flow), best of `rounds`. `jobs` = [(prompt, settings, stop_check)]."""
    logs, iterations = [], 0
    for prompt, settings, stop_check in jobs:
        recorder = _Recorder(adapter)
        iterations += decode(recorder, prompt, settings, stop_check).iterations
        logs.append(recorder.log)
    best = math.inf
    for _ in range(rounds):
        started = time.perf_counter()
        for (prompt, settings, stop_check), log in zip(jobs, logs, strict=True):
            decode(_Replay(log, adapter.device, adapter.mask_token_id), prompt, settings, stop_check)
        best = min(best, time.perf_counter() - started)
    return 1e6 * best / max(iterations, 1)


def summarize(frame: pd.DataFrame, reference: str, base: str, n_resamples: int) -> pd.DataFrame:
    rows = []
    ref = frame[frame["schedule"] == reference].set_index("question_id")["output_hash"]
    for schedule, run in frame.groupby("schedule", sort=False):
        tokens, wall, nfe = run["output_tokens"].sum(), run["wall_s"].sum(), run["nfe_total"].sum()
        model, iterations = run["model_s"].sum(), run["iterations"].sum()
        same = (run.set_index("question_id")["output_hash"] == ref.reindex(run["question_id"]).values).mean()
        row = {
            "Schedule": SCHEDULE_LABELS.get(schedule, schedule),
            "W": int(run["width"].iloc[0]),
            "Tokens/s": tokens / wall,
            "Tokens/NFE": tokens / nfe,
            "Time/NFE (ms)": 1000 * wall / nfe,
            "NFE": run["nfe_total"].mean(),
            "Model ms/iter": 1000 * (model - run["prefill_s"].sum()) / max(iterations, 1),
            "Non-model (%)": 100 * (wall - model) / wall,
            "Match (%)": 100 * same,
            "Accuracy (%)": 100 * run["correct_f"].mean() if run["correct_f"].notna().any() else math.nan,
        }
        if schedule == base:
            row["Tok/s vs Linear-SS"] = "1"
        elif (frame["schedule"] == base).any():
            ci = compare(run, frame[frame["schedule"] == base], n_resamples).throughput_ratio
            row["Tok/s vs Linear-SS"] = ci.format(3)
            row["_ratio"], row["_low"], row["_high"] = ci.estimate, ci.low, ci.high
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    shown = [c for c in table.columns if not c.startswith("_")]
    fmt = {"Tokens/s": "{:.1f}", "Tokens/NFE": "{:.3f}", "Time/NFE (ms)": "{:.3f}", "NFE": "{:.2f}",
           "Model ms/iter": "{:.3f}", "Non-model (%)": "{:.1f}", "Decoder us/iter": "{:.1f}", "Match (%)": "{:.0f}", "Accuracy (%)": "{:.1f}"}  # fmt: skip
    lines = ["| " + " | ".join(shown) + " |", "|" + "|".join("---" if c == "Schedule" else "---:" for c in shown) + "|"]
    for _, row in table.iterrows():
        cells = []
        for c in shown:
            v = row[c]
            if isinstance(v, float) and math.isnan(v):
                cells.append("-")
            else:
                cells.append(fmt[c].format(v) if c in fmt else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="a conf/model name (tiny, nemotron8b, ...) or a checkpoint directory")
    ap.add_argument("--model-path", default=None, help="local directory for a named model (model.path)")
    ap.add_argument("--shape", default=None, help="random weights of a named shape (bench_calls.SHAPES)")
    ap.add_argument("--config", default=None, help="random weights of the shape in this config.json / directory")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--limit", type=int, default=30, help="first N questions")
    ap.add_argument("--schedules", default="linear,quadratic,packed", help=f"comma separated, of {LTR_SCHEDULES}")
    ap.add_argument("--width", type=int, default=8, help="W (B = W + 1)")
    ap.add_argument("--quadratic-width", type=int, default=None, help="W for quadratic (default --width)")
    ap.add_argument("--no-pad-verify", action="store_true", help="packed: evaluate real rows only")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--verify", default="rejection", help="rejection | match (T > 0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the task's cap")
    ap.add_argument("--repeats", type=int, default=1, help="timed decodes per (question, schedule), averaged")
    ap.add_argument("--warmup", type=int, default=1, help="untimed questions decoded by every schedule first")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto", help="auto: float32 on CPU, bfloat16 on CUDA")
    ap.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (0: torch's default)")
    ap.add_argument("--timing", default="sync", choices=TIMINGS,
                    help="CUDA model time: sync after each call, or CUDA events (one sync per iteration)")
    ap.add_argument("--no-grade", action="store_true", help="skip grading (speed only)")
    ap.add_argument("--n-resamples", type=int, default=N_RESAMPLES)
    ap.add_argument("--replay", action="store_true", help="also measure the decoder's own time per iteration "
                    "by replaying recorded logits through a zero-cost model (column Decoder us/iter)")  # fmt: skip
    ap.add_argument("--json", default=None, help="write the per-question rows and the table here")
    args = ap.parse_args(argv)

    schedules = args.schedules.split(",")
    unknown = [s for s in schedules if s not in LTR_SCHEDULES]
    if unknown:
        raise SystemExit(f"unknown schedules {unknown}; valid: {', '.join(LTR_SCHEDULES)}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))  # fmt: skip
    dtype = ("bfloat16" if device.type == "cuda" else "float32") if args.dtype == "auto" else args.dtype
    adapter, tokenizer, chat, label = load(args, device, dtype)
    task = load_task(load_task_config(args.task), data_dir=args.data_dir)
    questions = task.questions(args.warmup + args.limit)
    warm, timed = questions[: args.warmup], questions[args.warmup :] if args.warmup < len(questions) else []
    if not timed:  # fewer questions than warm-up + limit: warm up on the first, time all of them
        warm, timed = questions[:1], questions
    timed = timed[: args.limit]
    stops = task.stop_for(chat)
    stop_check = make_stop_check(tokenizer, stops)
    max_new = args.max_new_tokens or task.max_new_tokens
    prompts = {q.question_id: tokenizer(task.build_prompt(q, tokenizer=tokenizer, chat=chat),
                                        add_special_tokens=not chat)["input_ids"] for q in questions}  # fmt: skip
    width_of = {s: (args.quadratic_width or args.width) if s == "quadratic" else args.width for s in schedules}

    def settings_for(schedule: str, question) -> DecodeSettings:
        generator = None
        if args.temperature > 0:
            generator = torch.Generator(device=device).manual_seed(question_seed(args.seed, question.question_id))
        sampling = Sampling(args.temperature, args.verify, generator)
        return DecodeSettings(schedule, width_of[schedule], max_new, adapter.eos_token_ids, sampling,
                              pad_verify=not args.no_pad_verify, timing=args.timing)  # fmt: skip

    def run(schedule: str, question) -> object:
        return decode(adapter, prompts[question.question_id], settings_for(schedule, question), stop_check)

    started = time.perf_counter()
    for question in warm:
        for schedule in schedules:
            run(schedule, question)
    grade = not args.no_grade
    rows = []
    for question in timed:
        outs = {s: [] for s in schedules}
        for _ in range(args.repeats):
            for schedule in schedules:
                outs[schedule].append(run(schedule, question))
        for schedule, decoded in outs.items():
            first = decoded[0]
            text = output_text(tokenizer, first.tokens, stops)
            correct = task.grade(question, text).correct if grade else None
            rows.append({
                "schedule": schedule, "width": width_of[schedule], "question_id": question.question_id, "seed": args.seed,
                "output_tokens": len(first.tokens), "output_hash": output_hash(first.tokens),
                "nfe_total": first.nfe_total, "iterations": first.iterations,
                "wall_s": float(np.mean([d.wall_s for d in decoded])),
                "model_s": float(np.mean([d.model_s for d in decoded])),
                "prefill_s": float(np.mean([d.call_model_s[0] for d in decoded])),
                "correct_f": math.nan if correct is None else float(correct),
            })  # fmt: skip
    frame = pd.DataFrame(rows)
    reference = "ar" if "ar" in schedules else schedules[0]
    table = summarize(frame, reference, "linear", args.n_resamples)
    if args.replay:
        table["Decoder us/iter"] = [
            replay_overhead(adapter, [(prompts[q.question_id], settings_for(s, q), stop_check) for q in timed])
            for s in frame["schedule"].drop_duplicates()
        ]
    elapsed = time.perf_counter() - started
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"bench_schedules: model={label} task={args.task} questions={len(timed)} (+{len(warm)} warm-up) "
          f"repeats={args.repeats} T={args.temperature} max_new_tokens={max_new} device={device_name} dtype={dtype} "
          f"threads={torch.get_num_threads()} pad_verify={not args.no_pad_verify} interleaved={','.join(schedules)} "
          f"match reference={reference} elapsed={elapsed:.0f}s torch={torch.__version__}")  # fmt: skip
    print()
    print(markdown(table))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": vars(args), "device": device_name, "dtype": dtype, "label": label,
            "table": table.to_dict(orient="records"), "rows": rows}, indent=1, default=str) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
