#!/usr/bin/env python
"""Measure the shipped tiny model (and its proposal LoRA) on the held-out arith test split.

Greedy decoding of the first --n arith test questions (plain template, the task's stop
strings, --max-new-tokens) with every LTR schedule at width W; reports per schedule the AR
accuracy, tokens/NFE, total NFE, mean accepted draft tokens per iteration, whether each output
equals the AR output token for token, and the Packed <= Linear NFE theorem-check fraction.
With --lora it repeats AR and the speculative schedules with the proposal-only LoRA attached
(draft rows only) and reports its effect on acceptance plus the LoRA rows selected/evaluated
per call. --card FILE rewrites the block between the eval markers of a model card with the
table, and --json FILE writes every figure.

    python scripts/eval_tiny.py --lora assets/models/tiny-lora --card assets/models/tiny/README.md
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see scripts/train_tiny.py

import torch  # noqa: E402

from packedss.paths import PROJECT_ROOT  # noqa: E402
from packedss.decoding import LTRSettings, Sampling, decode_ltr  # noqa: E402
from packedss.errors import ArgumentParser, number, run_cli  # noqa: E402
from packedss.families import family_named  # noqa: E402
from packedss.models.checkpoint import DTYPES  # noqa: E402
from packedss.models.nemotron import load_nemotron  # noqa: E402
from packedss.tasks.stops import make_stop_check, output_text  # noqa: E402

BEGIN, END = "<!-- eval_tiny:begin -->", "<!-- eval_tiny:end -->"


def run_schedule(adapter, tokenizer, task, questions, schedule, width, max_new_tokens):
    settings = LTRSettings(
        schedule=schedule,
        width=width,
        max_new_tokens=max_new_tokens,
        eos_token_ids=adapter.eos_token_ids,
        sampling=Sampling(temperature=0.0, rule="rejection", generator=None),
    )
    check = make_stop_check(tokenizer, task.stop)
    results = []
    lora = adapter.proposal_lora
    for q in questions:
        prompt_ids = tokenizer.encode(task.build_prompt(q), add_special_tokens=False)
        out = decode_ltr(adapter, prompt_ids, settings, check)
        text = output_text(tokenizer, out.tokens, task.stop)
        grade = task.grade(q, text)
        item = {
            "question_id": q.question_id,
            "tokens": out.tokens,
            "text": text,
            "correct": bool(grade.correct),
            "nfe_total": out.nfe_total,
            "iterations": out.iterations,
            "draft_accepted": out.draft_accepted,
            "draft_proposed": out.draft_proposed,
            "finish_reason": out.finish_reason,
            "wall_s": out.wall_s,
            "rows_evaluated": out.rows_evaluated,
        }
        if lora is not None:
            item["lora_rows_selected"] = out.extra["lora_rows_selected"]
            item["lora_rows_evaluated"] = out.extra["lora_rows_evaluated"]
        results.append(item)
    return results


def summarize(results, reference=None) -> dict:
    tokens = sum(len(r["tokens"]) for r in results)
    nfe = sum(r["nfe_total"] for r in results)
    iterations = sum(r["iterations"] for r in results)
    summary = {
        "questions": len(results),
        "accuracy": 100.0 * sum(r["correct"] for r in results) / len(results),
        "tokens": tokens,
        "nfe_total": nfe,
        "tokens_per_nfe": tokens / nfe,
        "mean_nfe": nfe / len(results),
        "accepted_drafts_per_iter": sum(r["draft_accepted"] for r in results) / max(1, iterations),
        "tokens_per_iter": (tokens - len(results)) / max(1, iterations),
        "wall_s": sum(r["wall_s"] for r in results),
        "finish_eos": sum(r["finish_reason"] == "eos" for r in results),
    }
    if reference is not None:
        same = sum(r["tokens"] == a["tokens"] for r, a in zip(results, reference))
        summary["identical_to_ar"] = same
    if results and "lora_rows_selected" in results[0]:
        calls = [(s, e) for r in results for s, e in zip(r["lora_rows_selected"], r["lora_rows_evaluated"])]
        after_prefill = [c for r in results for c in list(zip(r["lora_rows_selected"], r["lora_rows_evaluated"]))[1:]]
        summary["lora_rows_selected_per_call"] = statistics.mean(s for s, _ in after_prefill) if after_prefill else 0.0
        summary["lora_rows_evaluated_per_call"] = statistics.mean(e for _, e in after_prefill) if after_prefill else 0.0
        summary["lora_calls"] = len(calls)
    return summary


def table(summaries: dict, width: int) -> str:
    lines = [
        "| run | schedule | accuracy (%) | tokens/NFE | total NFE | mean NFE | accepted drafts/iter | "
        "identical to AR | LoRA rows selected/evaluated per call | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (run, schedule), s in summaries.items():
        lora = (
            f"{s['lora_rows_selected_per_call']:.1f} / {s['lora_rows_evaluated_per_call']:.1f}"
            if "lora_rows_selected_per_call" in s
            else "-"
        )
        accepted = "-" if schedule == "ar" else f"{s['accepted_drafts_per_iter']:.3f}"
        same = f"{s.get('identical_to_ar', s['questions'])}/{s['questions']}"
        lines.append(
            f"| {run} | {schedule} (W={width}) | {s['accuracy']:.1f} | {s['tokens_per_nfe']:.3f} | {s['nfe_total']} | "
            f"{s['mean_nfe']:.2f} | {accepted} | {same} | {lora} | {s['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def checks(summaries: dict, theorem: float) -> list[tuple[str, bool]]:
    base = {k[1]: v for k, v in summaries.items() if k[0] == "base"}
    lora = {k[1]: v for k, v in summaries.items() if k[0] == "lora"}
    out = [
        ("AR accuracy >= 50%", base["ar"]["accuracy"] >= 50.0),
        ("Linear-SS tokens/NFE >= 1.5", base["linear"]["tokens_per_nfe"] >= 1.5),
        ("Packed-SS total NFE < Linear-SS total NFE", base["packed"]["nfe_total"] < base["linear"]["nfe_total"]),
        (
            "all lossless schedules identical to AR",
            all(v.get("identical_to_ar", v["questions"]) == v["questions"] for v in base.values()),
        ),
    ]
    if lora:
        out.append(
            (
                "LoRA raises Linear-SS accepted drafts/iter",
                lora["linear"]["accepted_drafts_per_iter"] > base["linear"]["accepted_drafts_per_iter"],
            )
        )
        out.append(("LoRA leaves AR outputs unchanged", lora["ar"].get("identical_to_ar") == lora["ar"]["questions"]))
        out.append(
            (
                "LoRA: lossless schedules identical to AR",
                all(v.get("identical_to_ar", v["questions"]) == v["questions"] for v in lora.values()),
            )
        )
    out.append((f"theorem check: packed NFE <= linear NFE on {theorem:.0%} of questions (reported, not asserted)", True))
    return out


def write_card(path: Path, block: str) -> None:
    text = path.read_text() if path.exists() else ""
    body = f"{BEGIN}\n{block}\n{END}"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + body + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + body + "\n"
    path.write_text(text)


def main(argv=None) -> int:
    ap = ArgumentParser(prog="scripts/eval_tiny.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(PROJECT_ROOT / "assets/models/tiny"))
    ap.add_argument("--lora", default=None, help="PEFT proposal LoRA directory (e.g. assets/models/tiny-lora)")
    ap.add_argument("--n", type=number(int, 1), default=100, help="arith test questions")
    ap.add_argument("--seed", type=number(int, 0), default=0, help="arith generator seed")
    ap.add_argument("--width", type=number(int, 1), default=8)
    ap.add_argument("--max-new-tokens", type=number(int, 1), default=256)
    ap.add_argument("--schedules", nargs="+", default=["ar", "linear", "quadratic", "packed"],
                    choices=family_named("nemotron").schedules)  # fmt: skip
    ap.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    ap.add_argument("--threads", type=number(int, 1), default=2)
    ap.add_argument("--card", default=None, help="model card to update (between the eval markers)")
    ap.add_argument("--json", default=None, help="write all figures and outputs here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    from packedss.models.lora import attach_proposal_lora, detach_proposal_lora, read_peft_config
    from packedss.tasks import load_task, load_task_config

    # What would fail only after the base model's decodes, checked before them.
    if args.lora:
        read_peft_config(args.lora)
    if args.json and not Path(args.json).absolute().parent.is_dir():
        ap.error(f"--json {args.json}: its directory does not exist; create it or write the JSON elsewhere")
    if args.card and not Path(args.card).is_file():
        ap.error(f"--card {args.card}: no such model card; name an existing README.md (its eval markers are rewritten)")
    started = time.time()
    adapter = load_nemotron(args.model, dtype=args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    task = load_task(load_task_config("arith", split="test", n=args.n, seed=args.seed))
    questions = task.questions()
    schedules = ["ar"] + [s for s in args.schedules if s != "ar"]
    results, summaries = {}, {}
    runs = [("base", None)] + ([("lora", args.lora)] if args.lora else [])
    ar_reference = None
    for run, lora_path in runs:
        if lora_path:
            attach_proposal_lora(adapter, lora_path)
        for schedule in schedules:
            t0 = time.time()
            res = run_schedule(adapter, tokenizer, task, questions, schedule, args.width, args.max_new_tokens)
            if run == "base" and schedule == "ar":
                ar_reference = res
            results[(run, schedule)] = res
            summaries[(run, schedule)] = summarize(res, ar_reference if (run, schedule) != ("base", "ar") else None)
            s = summaries[(run, schedule)]
            print(
                f"[{run}] {schedule:9s} acc {s['accuracy']:.1f}% tok/NFE {s['tokens_per_nfe']:.3f} NFE {s['nfe_total']} "
                f"acc.drafts/iter {s['accepted_drafts_per_iter']:.3f} identical {s.get('identical_to_ar', '-')} "
                f"({time.time() - t0:.0f}s)",
                flush=True,
            )
        if lora_path:
            detach_proposal_lora(adapter)
    theorem = 0.0
    if ("base", "packed") in results and ("base", "linear") in results:
        pairs = list(zip(results[("base", "packed")], results[("base", "linear")]))
        theorem = sum(p["nfe_total"] <= lin["nfe_total"] for p, lin in pairs) / len(pairs)
    command = "python scripts/eval_tiny.py " + " ".join(sys.argv[1:] if argv is None else argv)
    verdicts = checks(summaries, theorem) if {"linear", "packed"} <= set(schedules) else []
    block = "\n".join(
        [
            f"Measured by `{command}` ({args.dtype}, greedy, arith test n={len(questions)}, seed {args.seed}, "
            f"max_new_tokens={args.max_new_tokens}, W={args.width}, {args.threads} CPU threads, "
            f"torch {torch.__version__}); one run, {time.time() - started:.0f} s in all.",
            "",
            table(summaries, args.width),
            "",
            *[f"- [{'x' if ok else ' '}] {name}" for name, ok in verdicts],
        ]
    )
    print(block)
    if args.card:
        write_card(Path(args.card), block)
    if args.json:
        payload = {
            "args": vars(args),
            "summaries": {f"{r}/{s}": v for (r, s), v in summaries.items()},
            "theorem_fraction": theorem,
            "checks": {name: ok for name, ok in verdicts},
            "outputs": {f"{r}/{s}": [{k: v for k, v in x.items() if k != "rows_evaluated"} for x in res] for (r, s), res in results.items()},
        }
        Path(args.json).write_text(json.dumps(payload, indent=1) + "\n")
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    run_cli(main)
