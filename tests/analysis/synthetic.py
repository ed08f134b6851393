"""Synthetic records that satisfy the record schema and its identities (records.validate_record),
with known costs, so that the analysis can be checked against hand-computed values."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from packedss.decoding import GREEDY
from packedss.families import FAMILIES
from packedss.job import IDENTITY_FIELDS, JobSpec
from packedss.records import output_hash, validate_record

PROMPT = 40


def _rows_nemotron(schedule: str, width: int, accepted: list[int]) -> list[int]:
    b = width + 1
    prefill = {"ar": PROMPT, "linear": PROMPT, "quadratic": PROMPT + b * b, "packed": PROMPT + b, "pld": PROMPT}[schedule]
    rows = [prefill]
    draft = width - 1  # packed: the first draft comes with prefill (proposals for L+2..L+W)
    for a in accepted:
        if schedule == "ar":
            rows.append(1)
        elif schedule == "linear":
            rows += [b, b]
        elif schedule == "pld":  # the last token and a lookup draft of W tokens
            rows.append(b)
        elif schedule == "quadratic":
            rows.append(b * (b + 1))
        else:
            rows.append(draft + 1 + b)
            draft = max(width - a, 0)
    return rows


def _drafts_nemotron(schedule: str, width: int, wanted: list[int]) -> tuple[list[int], list[int]]:
    """(drafts verified, drafts accepted) per iteration: the wanted accepted drafts, capped at the
    drafts the schedule verifies (W; AR none; Packed-SS W-1 first, then W - A of the previous
    iteration)."""
    drafted, accepted = [], []
    for h in wanted:
        if schedule == "ar":
            m = 0
        elif schedule == "packed":
            m = width - 1 if not accepted else max(width - accepted[-1] - 1, 0)
        else:
            m = width
        drafted.append(m)
        accepted.append(min(h, m))
    return drafted, accepted


def _rows_setdlm(schedule: str, width: int, iterations: int) -> list[int]:
    rows = [PROMPT + width]
    for t in range(iterations):
        p, u = (0 if t == 0 else 1), width
        if schedule == "linear":
            rows += [p + 2 * u, u]
        elif schedule == "packed":
            rows.append(p + 3 * u)
        elif schedule == "quadratic":
            rows.append(p + 2 * u + u * u)
        else:  # native
            rows.append(u)
    return rows


def make_record(
    *,
    model: str = "tiny",
    task: str = "arith",
    schedule: str = "packed",
    width: int = 8,
    temperature: float = 0.0,
    question: int = 0,
    tokens_per_iteration: int = 3,
    iterations: int = 10,
    call_s: float = 0.01,
    nonmodel_s: float = 0.002,
    correct: bool | None = True,
    family: str = "nemotron",
    order: str | None = None,
    seed: int = 0,
    sample: int = 0,
    repeat: int = 0,
    lora: bool = False,
    accepted_drafts: list[int] | None = None,
    **extra,
) -> dict:
    """A record of `iterations` iterations that each emit `tokens_per_iteration` tokens, or, for the
    Nemotron family, of the given per-iteration accepted drafts (`accepted_drafts`); drafts verified
    per iteration follow the schedule (W, or Packed-SS's W - A of the previous iteration)."""
    decoder = FAMILIES[family].schedule(schedule)
    width = width if decoder.uses_width else 0  # as the job spec normalises it (LTR AR reads no W)
    block = FAMILIES[family].block_of_width(width)
    if accepted_drafts is not None:  # a given acceptance process (Nemotron family)
        iterations = len(accepted_drafts)
    if family == "nemotron":
        wanted = accepted_drafts or [0 if schedule == "ar" else tokens_per_iteration - 1] * iterations
        drafted, accepted_drafts = _drafts_nemotron(schedule, width, wanted)
        accepted = [h + 1 for h in accepted_drafts]
        rows = _rows_nemotron(schedule, width, accepted)
    elif family == "setdlm":
        accepted = [tokens_per_iteration] * iterations
        rows = _rows_setdlm(schedule, width, iterations)
        drafted = [0 if schedule == "native" else width] * iterations
        accepted_drafts = [0 if schedule == "native" else tokens_per_iteration - 1] * iterations
    else:  # a family registered by a test: `calls` calls of one block per iteration
        accepted = [tokens_per_iteration] * iterations
        calls = FAMILIES[family].calls_per_iteration[schedule]
        rows = [PROMPT] + [block] * (calls * iterations)
        drafted = [width] * iterations
        accepted_drafts = [tokens_per_iteration - 1] * iterations
    nfe = len(rows)
    output_tokens = 1 + sum(accepted)
    model_s = call_s * nfe
    wall_s = model_s + nonmodel_s
    spec = JobSpec(**(dict(
        model=model, family=family, checkpoint=f"test/{model}", checkpoint_dir=None, chat=False, end_of_turn=(),
        lora=lora, lora_path=None, device="cpu", dtype="float32", threads=1, compile="none", timing="sync",
        cost_model=None,
        warmup_decode=True, task=task, task_config={"name": task}, data_dir=None, schedule=schedule, width=width,
        block=block, pad_verify=True if decoder.reads_pad_verify else None, native_window=None,
        temperature=temperature, verify="rejection" if temperature > 0 else GREEDY, order=order, seed=seed,
        max_new_tokens=256, lossy=decoder.lossy, concurrency=1,
    ) | {k: v for k, v in extra.items() if k in IDENTITY_FIELDS and (k != "pad_verify" or decoder.reads_pad_verify)}))  # fmt: skip
    extra = {k: v for k, v in extra.items() if k not in IDENTITY_FIELDS}
    record = spec.fields() | {
        "sample": sample,
        "repeat": repeat,
        "config_hash": spec.config_hash,
        "code_version": "test",
        "versions": {"torch": "test", "transformers": "test"},
        "question_id": f"q{question:04d}",
        "prompt_tokens": PROMPT,
        "output_tokens": output_tokens,
        "output_text": "x" * output_tokens,
        "finish_reason": "eos",
        "output_hash": output_hash(list(range(output_tokens))),
        "nfe_total": nfe,
        "nfe_prefill": 1,
        "iterations": iterations,
        "accepted": accepted,
        "rows_evaluated": rows,
        "rows_useful": rows,
        "drafted": drafted,
        "accepted_drafts": accepted_drafts,
        "draft_proposed": sum(drafted),
        "draft_accepted": sum(accepted_drafts),
        "truncated_tokens": 0,
        "wall_s": wall_s,
        "model_s": model_s,
        "nonmodel_s": wall_s - model_s,
        "extracted_answer": "1",
        "correct": correct,
        "grader": {"name": "test"},
    }
    record.update(extra)
    assert validate_record(record) == [], validate_record(record)
    return record


def write_records(root: Path, records: list[dict], name: str | None = None) -> list[Path]:
    """Append records to their record_path files under root (or to root/name)."""
    paths = []
    for record in records:
        spec = JobSpec(**{k: record[k] for k in IDENTITY_FIELDS if k in record} | {"end_of_turn": tuple(record["end_of_turn"])})
        path = root / name if name else spec.record_path(root)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if path not in paths:
            paths.append(path)
    return paths


# Schedules' speed in the synthetic folder: tokens per iteration and seconds per call.
NEMOTRON_PROFILE = {
    "ar": (1, 0.004),
    "linear": (3, 0.006),
    "quadratic": (4, 0.010),
    "packed": (3, 0.007),
}
SETDLM_PROFILE = {"linear": (3, 0.006), "quadratic": (4, 0.012), "packed": (3, 0.007), "native": (2, 0.006)}


SAMPLES = 2  # samples per question at T = 1 (the paper's protocol draws K of them)


def synthetic_results(root: Path, n: int = 12, seed: int = 0) -> Path:
    """A small results folder (records under root/records) that covers every table and figure:
    tiny (Nemotron family) on arith and writingbench at T = 0 and at T = 1 with SAMPLES samples per
    question (ar, linear, quadratic, packed at W = 8, and linear/packed at W = 4 for arith), LoRA
    runs, and tiny-set (SetDLM family) at W = 4 and 8 with LTR and confidence order plus native
    decoding (recorded under order ltr)."""
    rng = np.random.default_rng(seed)
    records = []
    for task in ("arith", "writingbench"):
        for temperature in (0.0, 1.0):
            for schedule, (tpi, call_s) in NEMOTRON_PROFILE.items():
                widths = [8, 4] if task == "arith" and temperature == 0 and schedule in ("linear", "packed") else [8]
                for width in widths:
                    for lora in ([False, True] if task == "arith" and temperature == 0 and width == 8 and schedule != "ar" else [False]):
                        for q, sample in ((q, k) for q in range(n) for k in range(SAMPLES if temperature > 0 else 1)):
                            iterations = int(rng.integers(5, 15))
                            correct = None if task == "writingbench" else bool(rng.random() < 0.7)
                            extra = {}
                            if lora:
                                b = width + 1
                                per_call_sel = {"linear": [b, 0], "quadratic": [b * b], "packed": [b]}[schedule]
                                per_call_eval = {"linear": [b, 0], "quadratic": [b * (b + 1)], "packed": [2 * b]}[schedule]
                                extra = {
                                    "lora_rows_selected": [0] + per_call_sel * iterations,
                                    "lora_rows_evaluated": [0] + per_call_eval * iterations,
                                }
                            records.append(
                                make_record(
                                    task=task, schedule=schedule, width=width, temperature=temperature, question=q,
                                    sample=sample, tokens_per_iteration=tpi, iterations=iterations,
                                    call_s=call_s * (1.15 if lora else 1.0) * float(rng.lognormal(0, 0.05)),
                                    nonmodel_s=0.002 * iterations, correct=correct, lora=lora, **extra,
                                )
                            )  # fmt: skip
    for width in (4, 8):
        for order in ("ltr", "confidence"):
            for schedule, (tpi, call_s) in SETDLM_PROFILE.items():
                if schedule == "native" and order != "ltr":
                    continue
                for q in range(n):
                    iterations = int(rng.integers(5, 15))
                    records.append(
                        make_record(
                            model="tiny-set", task="arith", schedule=schedule, width=width, question=q,
                            tokens_per_iteration=tpi, iterations=iterations,
                            call_s=call_s * float(rng.lognormal(0, 0.05)), nonmodel_s=0.003 * iterations,
                            correct=bool(rng.random() < 0.6), family="setdlm", order=order, lossy=schedule == "native",
                        )
                    )  # fmt: skip
    write_records(root / "records", records)
    return root


COST_MODEL = "nemotron8b:4L:bfloat16:cpu"  # a cost twin's label: <shape>:<L>L:<dtype>:<device>
# Seconds per call of each schedule's share of a batched call, by C: Packed-SS's 2B-row calls grow
# dearer with C faster than Linear-SS's B-row calls (the compute-bound turn).
CALL_SHARE = {
    "ar": {1: 0.004, 2: 0.0024, 4: 0.0015, 8: 0.0011},
    "linear": {1: 0.006, 2: 0.0036, 4: 0.0021, 8: 0.0015},
    "packed": {1: 0.007, 2: 0.0050, 4: 0.0043, 8: 0.0040},
}


def concurrent_record(concurrency: int, latency_s: float, **kwargs) -> dict:
    """A record of a job at concurrency C: its calls carried C requests (of its own rows each),
    its latency from the first call's start to the last call's end, on the cost twin's clock."""
    record = make_record(concurrency=concurrency, cost_model=COST_MODEL, **kwargs)
    record["call_requests"] = [concurrency] * record["nfe_total"]
    record["call_batch_rows"] = [concurrency * rows for rows in record["rows_evaluated"]]
    record["call_model_s"] = [record["model_s"] / record["nfe_total"]] * record["nfe_total"]
    record["latency_s"] = latency_s
    assert validate_record(record) == [], validate_record(record)
    return record


def concurrency_results(root: Path, n: int = 12, concurrencies=(1, 2, 4, 8), shares=None, seed: int = 0) -> Path:
    """A results folder of tiny arith runs of AR, Linear-SS and Packed-SS (W = 8) at every C of
    `concurrencies` on a cost twin, the calls' shares from `shares` (CALL_SHARE by default),
    with per-question noise and latencies that grow with C."""
    rng = np.random.default_rng(seed)
    shares = CALL_SHARE if shares is None else shares
    records = []
    for schedule, by_c in shares.items():
        for c in concurrencies:
            for q in range(n):
                iterations = 5 + q % 7
                records.append(
                    concurrent_record(
                        c, latency_s=0.05 * c * (1 + q) * float(rng.lognormal(0, 0.05)), schedule=schedule, question=q,
                        tokens_per_iteration=1 if schedule == "ar" else 3, iterations=iterations * (3 if schedule == "ar" else 1),
                        call_s=by_c[c] * float(rng.lognormal(0, 0.03)), nonmodel_s=0.0005 * iterations,
                    )
                )  # fmt: skip
    write_records(root / "records", records)
    return root
