#!/usr/bin/env python
"""Side-by-side benchmark of the schedules on one model and task, in one process.

After a warm-up, the schedules decode the same questions interleaved (q1: A B C, q2: A B C,
...), and one table reports each schedule's Tokens/s, Tokens/NFE, Time/NFE, NFE, model ms per
call and per iteration, non-model share of wall, output match, accuracy and throughput ratio to
Linear-SS with its 95% paired bootstrap CI. See packedss.benchmark.schedules for the
definitions.

    python scripts/bench_schedules.py --model tiny --task arith --limit 30 --width 8
    python scripts/bench_schedules.py --model tiny-set --schedules linear,packed --width 4 --limit 20
    python scripts/bench_schedules.py --model tiny --shape nemotron8b --device cuda --limit 10 --max-new-tokens 256

--compile MODE adds, for every schedule, a row of the same decodes on the compiled static call
path (packedss.models.static; mode default, reduce-overhead or max-autotune) next to the eager
row: each decode runs in both regimes back to back, compilation happens in the untimed warm-up
(seconds per shape printed below the table), and the compiled rows also report how many outputs
equal the eager ones (= eager), the share of calls that ran a compiled graph and their
throughput ratio to eager with its paired CI.

    python scripts/bench_schedules.py --model tiny --schedules ar,linear,quadratic,packed --limit 100 --compile default

--shape / --config replace the weights by a random model of that shape (see bench_calls.py);
the tokenizer, mask and EOS ids still come from --model. Random weights do not produce useful
drafts, so such a run measures time per call and decoder overhead, not acceptance.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from packedss.analysis.bootstrap import N_RESAMPLES  # noqa: E402
from packedss.benchmark.schedules import BenchSettings, markdown, run  # noqa: E402
from packedss.decoding.trace import TIMINGS  # noqa: E402
from packedss.decoding.verify import VERIFY_RULES  # noqa: E402
from packedss.errors import ArgumentParser, closest, number, run_cli  # noqa: E402
from packedss.families import FAMILIES  # noqa: E402
from packedss.models.checkpoint import DTYPES  # noqa: E402
from packedss.models.static import COMPILE_MODES  # noqa: E402
from packedss.paths import CONF_DIR  # noqa: E402
from packedss.tasks import TASK_NAMES, DataUnavailable  # noqa: E402

MODELS = sorted(path.stem for path in (CONF_DIR / "model").glob("*.yaml"))
ORDERS = sorted({order for family in FAMILIES.values() for order in family.orders})


def main(argv=None) -> int:
    ap = ArgumentParser(prog="scripts/bench_schedules.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="a conf/model name (tiny, tiny-set, nemotron8b, ...) or a "
                    "Nemotron-format checkpoint directory")  # fmt: skip
    ap.add_argument("--model-path", default=None, help="local directory for a named model (model.path)")
    ap.add_argument("--shape", default=None, help="random weights of a named shape (bench_calls.py --shape)")
    ap.add_argument("--config", default=None, help="random weights of the shape in this config.json / directory")
    ap.add_argument("--task", default="arith", choices=TASK_NAMES)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--limit", type=number(int, 1), default=30, help="first N questions")
    ap.add_argument("--schedules", default="linear,quadratic,packed", help="comma separated, of the model family's")
    ap.add_argument("--width", type=number(int, 1), default=8, help="W (LTR block B = W + 1)")
    ap.add_argument("--quadratic-width", type=number(int, 1), default=None, help="W for quadratic (default --width)")
    ap.add_argument("--no-pad-verify", action="store_true", help="packed (LTR): evaluate real rows only")
    ap.add_argument("--order", default=None, choices=ORDERS, help="any-order models (default: ltr)")
    ap.add_argument("--temperature", type=number(float, 0), default=0.0)
    ap.add_argument("--verify", default="rejection", choices=VERIFY_RULES, help="T > 0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=number(int, 1), default=None, help="default: the task's cap")
    ap.add_argument("--repeats", type=number(int, 1), default=1, help="timed decodes per (question, schedule), averaged")
    ap.add_argument("--warmup", type=number(int, 0), default=1, help="untimed questions decoded by every schedule first")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--dtype", default="auto", choices=("auto", *DTYPES), help="auto: float32 on CPU, bfloat16 on CUDA")
    ap.add_argument("--threads", type=number(int, 0), default=1, help="CPU intra-op threads (0: torch's default)")
    ap.add_argument("--timing", default="sync", choices=TIMINGS,
                    help="CUDA model time: sync after each call, or CUDA events (one sync per iteration)")
    ap.add_argument("--compile", default="none", choices=COMPILE_MODES,
                    help="also run every decode on the static path compiled in this mode (rows side by side)")
    ap.add_argument("--no-grade", action="store_true", help="skip grading (speed only)")
    ap.add_argument("--n-resamples", type=number(int, 1), default=N_RESAMPLES)
    ap.add_argument("--replay", action="store_true", help="also measure the decoder's own time per iteration "
                    "by replaying recorded logits through a zero-cost model (column Decoder us/iter)")  # fmt: skip
    ap.add_argument("--json", default=None, help="write the per-question rows and the table here")
    args = ap.parse_args(argv)
    if not Path(args.model).is_dir() and args.model not in MODELS:
        ap.error(f"unknown --model {args.model}{closest(args.model, MODELS)}; valid: {', '.join(MODELS)} or a checkpoint directory")

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    settings = BenchSettings(
        model=args.model, model_path=args.model_path, shape=args.shape, config=args.config, task=args.task,
        data_dir=args.data_dir, limit=args.limit, schedules=args.schedules.split(","), width=args.width,
        quadratic_width=args.quadratic_width, pad_verify=not args.no_pad_verify, order=args.order,
        temperature=args.temperature, verify=args.verify, seed=args.seed, max_new_tokens=args.max_new_tokens,
        repeats=args.repeats, warmup=args.warmup, device=args.device, dtype=args.dtype, timing=args.timing,
        compile=args.compile, grade=not args.no_grade, n_resamples=args.n_resamples, replay=args.replay,
    )  # fmt: skip
    try:
        report = run(settings)
    except DataUnavailable as err:
        raise DataUnavailable(err.message("--data-dir DIR")) from None
    print(report.header)
    print()
    print(markdown(report.table))
    for regime, seconds in report.compile_s.items():
        shapes = ", ".join(f"{label} {value:.1f} s" for label, value in seconds.items()) or "none"
        print(f"\n{regime}: compile time per shape (untimed warm-up): {shapes}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "settings": asdict(settings), "header": report.header, "compile_s": report.compile_s,
            "table": report.table.to_dict(orient="records"), "rows": report.rows}, indent=1, default=str) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    run_cli(main)
