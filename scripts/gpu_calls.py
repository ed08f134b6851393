#!/usr/bin/env python
"""One shape's calls eager and compiled (CUDA graphs by default), for scripts/gpu_check.sh.

On random weights of a cost-twin shape (packedss.models.cost_twin.SHAPES), times round-robin, at
every --blocks B in the order given, the calls whose row count is among --rows (default: the 2B
rows of every block, so one compilation per block: 16, 32 and 64 rows for B = 8, 16, 32 time
Packed-SS's call at every B and the B-row calls at B = 16 and 32), eager and on the static path
compiled with --compile, beside the products floor (the call's matrix products alone), the
weight-streaming floor and the HBM floor (the call's weight bytes at the device-to-device copy
bandwidth measured in the same round robin), with each call's achieved bandwidth, its CUDA-graph
replays and cudagraph skips, and the 2B/B ratio eager and compiled where both calls were timed
(packedss.benchmark.calls.bench_compiled). A row count is compiled when the first block that
needs it comes. Before a block is timed, each of its compiled calls runs once on a new input
beside the eager call of that input (same device, same weights, same cache): their logits are
kept as `graph_vs_eager` ({rows, max_abs_logit_diff, argmax_agreement, ...} per call), and a
call whose graph differs beyond the bfloat16 tolerance (packedss.benchmark.graph_check) is not
timed and fails the step (exit status 1, "graph replay differs from eager"). It runs under the
runner's exact reductions (packedss.numerics.exact_reductions), as every decode job does. --json
is rewritten after every block, so a run cut short keeps every block it measured; the table is
printed at the end, in bench_calls.py's layout (runs.<attention implementation>: packedss, the
harness's own).

    python scripts/gpu_calls.py --shape nemotron8b --device cuda --blocks 32,16,8 --json results/gpu_check/graphs-8b.json
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from packedss.benchmark import write_report  # noqa: E402
from packedss.benchmark.calls import (  # noqa: E402
    COMPILE_KINDS,
    FLOOR_KINDS,
    SHAPES,
    bench_compiled,
    call_rows,
    median_ratio,
    random_adapter,
    ratios_2b_b,
    render_compiled,
    shape_config,
)
from packedss.benchmark.floors import stream_min_bytes  # noqa: E402
from packedss.benchmark.graph_check import graph_difference  # noqa: E402
from packedss.errors import ArgumentParser, closest, number, numbers, run_cli  # noqa: E402
from packedss.models.checkpoint import DTYPES, resolve_dtype  # noqa: E402
from packedss.models.checkpoint import COMPILE_MODES  # noqa: E402
from packedss.numerics import exact_reductions  # noqa: E402


def main(argv=None) -> int:
    ap = ArgumentParser(prog="scripts/gpu_calls.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="nemotron8b", help=f"named backbone shape: {', '.join(SHAPES)}")
    ap.add_argument("--layers", type=number(int, 1), default=None, help="keep the shape's first N layers (default: all)")
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    ap.add_argument("--compile", default="reduce-overhead", choices=COMPILE_MODES[1:])
    ap.add_argument("--blocks", type=numbers(1), default=[8, 16, 32], help="block sizes B = W + 1 (default 8,16,32)")
    ap.add_argument("--rows", type=numbers(1), default=None,
                    help="the row counts compiled and timed (default: 2B of every block; each is one compilation)")  # fmt: skip
    ap.add_argument("--prefix", type=numbers(1), default=[1024], help="cached prefix lengths C (default 1024)")
    ap.add_argument("--warmup", type=number(int, 0), default=5)
    ap.add_argument("--iters", type=number(int, 1), default=20)
    ap.add_argument("--threads", type=number(int, 0), default=0, help="CPU intra-op threads (0: torch's default)")
    ap.add_argument("--stream-mib", type=number(int, 1), default=None, help="the floors' buffers cover at least this "
                    "many MiB (default: 4x the last-level cache, at least 1024)")  # fmt: skip
    ap.add_argument("--json", required=True, help="write every measurement to this file")
    args = ap.parse_args(argv)
    if args.shape not in SHAPES:
        ap.error(f"unknown --shape {args.shape}{closest(args.shape, SHAPES)}; valid: {', '.join(SHAPES)}")
    rows = sorted({2 * block for block in args.blocks} if args.rows is None else set(args.rows))
    made = {block: {call_rows(kind, block) for kind in COMPILE_KINDS} for block in args.blocks}
    unmade = [r for r in rows if not any(r in counts for counts in made.values())]
    if unmade:
        ap.error(f"--rows {','.join(map(str, unmade))}: no call of the block sizes {','.join(map(str, args.blocks))} "
                 "has that many rows; use 1, B, 2B or B(B+1) of a block")  # fmt: skip
    idle = [block for block, counts in made.items() if not counts & set(rows)]
    if idle:
        ap.error(f"--blocks {','.join(map(str, idle))}: no call of that block has a row count among --rows "
                 f"{','.join(map(str, rows))}; add one of its row counts or drop the block")  # fmt: skip
    if not Path(args.json).expanduser().absolute().parent.is_dir():
        ap.error(f"--json {args.json}: its directory does not exist; create it or pick another path")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but no CUDA device is available; use --device cpu")
    exact_reductions()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), resolve_dtype(args.dtype)
    stream_bytes = stream_min_bytes() if args.stream_mib is None else args.stream_mib * 2**20
    adapter = random_adapter(shape_config(args.shape, None, args.layers), device, dtype)
    params = sum(p.numel() for p in adapter.backbone.parameters()) + adapter.head.weight.numel()
    what = args.shape + (f" ({args.layers} layers)" if args.layers else "")
    report = {"shape": what, "device": str(device), "dtype": args.dtype, "compile": args.compile,
              "torch": torch.__version__, "threads": torch.get_num_threads(), "runs": {}}  # fmt: skip
    if device.type == "cuda":
        report["device_name"] = torch.cuda.get_device_name(device)
    header = (f"gpu_calls: shape={what} device={report.get('device_name', device)} dtype={args.dtype} "
              f"threads={report['threads']} warmup={args.warmup} iters={args.iters} (median), {params / 1e6:.1f}M params, "
              f"random weights, compile={args.compile}")  # fmt: skip
    run = report["runs"].setdefault(adapter.backbone.config._attn_implementation, {"params": params})
    path = Path(args.json)

    compared: list[dict] = []  # graph_vs_eager, filled by bench_compiled before each block is timed

    def write(results: list[dict], compile_s: dict[str, float]) -> None:
        run.update({"calls": results, "compile_s": compile_s, "graph_vs_eager": compared, "ratios_2B_B": ratios_2b_b(results),
                    "median_ratio": median_ratio(results),
                    "compiled_floor_median": median_ratio(results, "compiled_floor", FLOOR_KINDS)})  # fmt: skip
        write_report(path, report)

    report["rows"] = rows
    results, compile_s = bench_compiled(adapter, args.compile, args.blocks, args.prefix, args.warmup, args.iters,
                                        stream_bytes, rows, on_result=write, comparisons=compared)  # fmt: skip
    write(results, compile_s)
    print(render_compiled(results, compile_s, header) + "\n", flush=True)
    if not all(c["pass"] for c in compared):
        print(f"error: {graph_difference(compared, 'these calls were not timed')}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_cli(main)
