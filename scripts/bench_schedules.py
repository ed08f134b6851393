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
equal the eager ones (= eager), the share of calls the harness dispatched to a compiled graph
(Compiled calls), the share of calls after prefill that replayed a CUDA graph and inductor's
cudagraph skips (CUDA-graph calls, Graph skips: counted at the replays, n/a on a CPU), and their
throughput ratio to eager with its paired CI.

    python scripts/bench_schedules.py --model tiny --schedules ar,linear,quadratic,packed --limit 100 --compile default

--cost-shape SHAPE (a name of packedss.models.cost_twin.SHAPES or a checkpoint directory;
--cost-layers N, --cost-dtype D) adds, for every decode, the same decode with a cost twin: the
model still decides every token, and each of its calls is also run on random weights of SHAPE,
whose time is the call's model time (rows `cost:<label>`). The paper's comparison in the
memory-bound regime, beside the same decodes timed on tiny itself:

    python scripts/bench_schedules.py --model tiny --schedules ar,linear,quadratic,packed --width 8,16,31 \
        --cost-shape nemotron3b --cost-layers 6 --cost-dtype bfloat16 --limit 5

Every regime's weight-streaming floor is measured between the questions (Floor ms/call, Floor /
call); the measured Packed/Linear throughput ratio is checked against the one predicted from the
run's NFE and per-call times (within 3%: exit status 1 when a cost twin's is not), and the last
line is `packed/linear tokens/s: X [lo, hi] at W=8 (cost twin <label>); predicted from NFE and
call time: P` (W = the first width).

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

from packedss.analysis.bootstrap import N_RESAMPLES  # noqa: E402
from packedss.benchmark.schedules import BenchSettings, markdown, run  # noqa: E402
from packedss.decoding.trace import TIMINGS  # noqa: E402
from packedss.decoding.verify import VERIFY_RULES  # noqa: E402
from packedss.errors import ArgumentParser, closest, number, numbers, run_cli  # noqa: E402
from packedss.families import FAMILIES  # noqa: E402
from packedss.models.checkpoint import DTYPES  # noqa: E402
from packedss.models.checkpoint import COMPILE_MODES  # noqa: E402
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
    ap.add_argument("--width", type=numbers(1), default=[8], help="W (LTR block B = W + 1); comma separated for several")
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
    ap.add_argument("--threads", type=number(int, 0), default=1, help="intra-op threads (0: the runner's default, 1 on CPU)")
    ap.add_argument("--timing", default="sync", choices=TIMINGS,
                    help="CUDA model time: sync after each call, or CUDA events (one sync per iteration)")
    ap.add_argument("--compile", default="none", choices=COMPILE_MODES,
                    help="also run every decode on the static path compiled in this mode (rows side by side)")
    ap.add_argument("--no-grade", action="store_true", help="skip grading (speed only)")
    ap.add_argument("--n-resamples", type=number(int, 1), default=N_RESAMPLES)
    ap.add_argument("--replay", action="store_true", help="also measure the decoder's own time per iteration "
                    "by replaying recorded logits through a zero-cost model (column Decoder us/iter)")  # fmt: skip
    ap.add_argument("--cost-shape", default=None, help="a cost twin: a named shape or a checkpoint directory")
    ap.add_argument("--cost-layers", type=number(int, 1), default=None, help="the cost twin's first N layers (default: all)")
    ap.add_argument("--cost-dtype", default=None, help="the cost twin's dtype (default: --dtype's)")
    ap.add_argument("--stream-mib", type=number(int, 1), default=None, help="the floor's one-row products cover at least "
                    "this many MiB (default: 4x the last-level cache, at least 1024)")  # fmt: skip
    ap.add_argument("--json", default=None, help="write the per-question rows and the table here")
    args = ap.parse_args(argv)
    if not Path(args.model).is_dir() and args.model not in MODELS:
        ap.error(f"unknown --model {args.model}{closest(args.model, MODELS)}; valid: {', '.join(MODELS)} or a checkpoint directory")

    settings = BenchSettings(
        model=args.model, model_path=args.model_path, shape=args.shape, config=args.config, task=args.task,
        data_dir=args.data_dir, limit=args.limit, schedules=args.schedules.split(","),
        widths=args.width,
        quadratic_width=args.quadratic_width, pad_verify=not args.no_pad_verify, order=args.order,
        temperature=args.temperature, verify=args.verify, seed=args.seed, max_new_tokens=args.max_new_tokens,
        repeats=args.repeats, warmup=args.warmup, device=args.device, dtype=args.dtype, threads=args.threads,
        timing=args.timing,
        compile=args.compile, grade=not args.no_grade, n_resamples=args.n_resamples, replay=args.replay,
        cost_shape=args.cost_shape, cost_layers=args.cost_layers, cost_dtype=args.cost_dtype, stream_mib=args.stream_mib,
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
    print()
    for name, f in report.floors.items():
        print(f"floor of {name}: {f['weight_bytes'] / 2**20:.1f} MiB of weights per call / {f['stream_gbs']:.2f} GB/s "
              f"(one-row products over its weight shapes and dtype, {f['stream_bytes'] / 2**30:.2f} GiB in total) = "
              f"{f['floor_ms']:.3f} ms; raw read (float32 sum): {f['raw_gbs']:.2f} GB/s")  # fmt: skip
    failed = False
    for c in report.checks:
        ok = "within 3%" if c["within"] else "NOT within 3%"
        print(f"{c['regime']} W={c['width']}: packed/linear tokens/s measured {c['measured']:.3f} "
              f"[{c['low']:.3f}, {c['high']:.3f}], predicted from NFE and call time {c['predicted']:.3f} ({ok})")  # fmt: skip
        failed |= c["regime"].startswith("cost:") and not c["within"]
    if args.json:
        Path(args.json).write_text(json.dumps({
            "settings": asdict(settings), "header": report.header, "compile_s": report.compile_s,
            "floors": report.floors, "checks": report.checks,
            "table": report.table.to_dict(orient="records"), "rows": report.rows}, indent=1, default=str) + "\n")  # fmt: skip
    if report.cost_label is not None:
        first = next((c for c in report.checks if c["regime"] == f"cost:{report.cost_label}"), None)
        if first is not None:
            print(f"packed/linear tokens/s: {first['measured']:.3f} [{first['low']:.3f}, {first['high']:.3f}] at "
                  f"W={first['width']} (cost twin {report.cost_label}); predicted from NFE and call time: "
                  f"{first['predicted']:.3f}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    run_cli(main)
