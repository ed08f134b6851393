#!/usr/bin/env python
"""Latency of ONE model call against its number of rows and the cached prefix length.

For every block size B (= W + 1) and cached prefix length C, times the calls each LTR schedule
makes per iteration (linear-draft and linear-verify: B rows, packed: 2B, quadratic: B(B+1)),
built with the schedules' own call builders, on a model of any shape (random weights: the
latency of a call does not depend on their values), and prints the per-iteration model time of
each schedule plus the paper's Table 5 pairing (Linear and Packed at B = 32, Quadratic at B = 8).
See packedss.benchmark.calls for the method.

    python scripts/bench_calls.py --shape tiny --device cpu
    python scripts/bench_calls.py --shape nemotron8b --device cuda --dtype bfloat16 --prefix 256,1024
    python scripts/bench_calls.py --config /path/to/Nemotron-Labs-Diffusion-8B --device cuda

--compile MODE times eager calls against the same calls on the compiled static path
(packedss.models.static) round-robin in this process, for R = 1, B, 2B and B(B+1) (defaults:
W = 8 and 31, prefix 64 and 512), next to the matrix products of R rows alone (every linear
layer and the head: the arithmetic no call path removes), and ends with the line
`compiled/eager median per-call ratio: X`:

    python scripts/bench_calls.py --shape tiny --device cpu --compile default

Every round robin also times the weight-streaming floor: one-row products over weight matrices of
the model's own shapes and dtype, more than the cache holds in total (the model's own weights,
plus copies up to --stream-mib), and a raw read (a float32 sum over as many bytes). Each call is
printed beside its floor (the bytes of weights a call streams / that bandwidth) and the fraction
of it achieved; with --compile the last line is `compiled/floor median per-call ratio: X` (over
R = 1, B and 2B). The memory-bound regime (1.5B parameters, bfloat16, one thread):

    python scripts/bench_calls.py --shape nemotron3b --layers 6 --dtype bfloat16 --threads 1 \
        --blocks 9 --prefix 256 --compile default
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from packedss.benchmark.calls import (  # noqa: E402
    FLOOR_KINDS,
    SHAPES,
    bench,
    bench_compiled,
    bench_prefill,
    median_ratio,
    per_iteration,
    random_adapter,
    render,
    render_compiled,
    render_prefill,
    shape_config,
)
from packedss.benchmark.floors import stream_min_bytes  # noqa: E402
from packedss.errors import ArgumentParser, PackedSSError, closest, number, numbers, run_cli  # noqa: E402
from packedss.models.checkpoint import DTYPES, resolve_dtype  # noqa: E402
from packedss.models.checkpoint import COMPILE_MODES  # noqa: E402


def main(argv=None) -> int:
    ap = ArgumentParser(prog="scripts/bench_calls.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="tiny", help=f"named backbone shape: {', '.join(SHAPES)}")
    ap.add_argument("--config", default=None, help="a checkpoint directory or config.json (overrides --shape)")
    ap.add_argument("--layers", type=number(int, 1), default=None, help="keep the shape's first N layers (default: all)")
    ap.add_argument("--stream-mib", type=number(int, 1), default=None, help="the floor's one-row products cover at least "
                    "this many MiB (default: 4x the last-level cache, at least 1024)")  # fmt: skip
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--dtype", default="auto", choices=("auto", *DTYPES), help="auto: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--attn", default="packedss", help="attention implementations to time, comma separated: "
                    "packedss (the harness's own, fitted to each call: docs/models.md §2), or transformers' sdpa, "
                    "flex_attention, eager (each given the same custom 4D mask)")  # fmt: skip
    ap.add_argument("--blocks", type=numbers(1), default=None, help="block sizes B = W + 1 (default 8,16,32; with --compile 9,32)")
    ap.add_argument("--prefix", type=numbers(1), default=None, help="cached prefix lengths C (default 128,512; with --compile 64,512)")
    ap.add_argument("--compile", default="none", choices=COMPILE_MODES,
                    help="compare eager calls with the static path compiled in this mode")  # fmt: skip
    ap.add_argument("--warmup", type=number(int, 0), default=3)
    ap.add_argument("--iters", type=number(int, 1), default=10)
    ap.add_argument("--threads", type=number(int, 0), default=1, help="CPU intra-op threads (0: torch's default)")
    ap.add_argument("--prefill", type=number(int, 1), default=None, help="time only a prefill of N tokens, with logits of its "
                    "last row against logits of every row (as before logits were cut to the rows read)")  # fmt: skip
    ap.add_argument("--json", default=None, help="write every measurement to this file")
    args = ap.parse_args(argv)
    if args.config is None and args.shape not in SHAPES:
        ap.error(f"unknown --shape {args.shape}{closest(args.shape, SHAPES)}; valid: {', '.join(SHAPES)} (or --config DIR)")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but no CUDA device is available; use --device cpu or auto")

    compiling = args.compile != "none"
    stream_bytes = stream_min_bytes() if args.stream_mib is None else args.stream_mib * 2**20
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))  # fmt: skip
    dtype = resolve_dtype("bfloat16" if args.dtype == "auto" and device.type == "cuda" else
                          ("float32" if args.dtype == "auto" else args.dtype))  # fmt: skip
    config = shape_config(args.shape, args.config, args.layers)
    blocks = args.blocks or ([9, 32] if compiling else [8, 16, 32])
    prefixes = args.prefix or ([64, 512] if compiling else [128, 512])
    what = (args.config or args.shape) + (f" ({args.layers} layers)" if args.layers else "")
    report = {"shape": what, "device": str(device), "dtype": str(dtype).replace("torch.", ""), "compile": args.compile,
              "torch": torch.__version__, "threads": torch.get_num_threads(), "runs": {}}  # fmt: skip
    if device.type == "cuda":
        report["device_name"] = torch.cuda.get_device_name(device)
    for attn in args.attn.split(","):
        header = (f"bench_calls: shape={what} attn={attn} device={report.get('device_name', device)} "
                  f"dtype={report['dtype']} threads={report['threads']} warmup={args.warmup} iters={args.iters} (median)")  # fmt: skip
        adapter = None
        try:
            adapter = random_adapter(config, device, dtype, attn=attn)
            params = sum(p.numel() for p in adapter.backbone.parameters()) + adapter.head.weight.numel()
            header += f", {params / 1e6:.1f}M params, random weights"
            if args.prefill:
                result = bench_prefill(adapter, args.prefill, args.warmup, args.iters)
                print(f"{header}\n\n{render_prefill(result)}\n", flush=True)
                report["runs"][attn] = {"params": params, "prefill": result}
                continue
            if compiling:
                header += f", compile={args.compile}"
                results, compile_s = bench_compiled(adapter, args.compile, blocks, prefixes, args.warmup, args.iters,
                                                    stream_bytes)  # fmt: skip
            else:
                results = bench(adapter, blocks, prefixes, args.warmup, args.iters, stream_bytes)
        except Exception as err:  # an attention implementation that cannot run this mask/device
            print(f"{header}\n\nattn={attn} failed: {type(err).__name__}: {str(err)[:300]}\n", flush=True)
            report["runs"][attn] = {"error": f"{type(err).__name__}: {err}"}
            continue
        finally:
            del adapter
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if compiling:
            print(render_compiled(results, compile_s, header) + "\n", flush=True)
            report["runs"][attn] = {"params": params, "calls": results, "compile_s": compile_s,
                                    "median_ratio": median_ratio(results),
                                    "compiled_floor_median": median_ratio(results, "compiled_floor", FLOOR_KINDS)}  # fmt: skip
        else:
            print(render(results, header) + "\n", flush=True)
            report["runs"][attn] = {
                "params": params, "calls": results,
                "per_iteration": [{"prefix": p, "block": b, **v} for (p, b), v in per_iteration(results).items()],
            }  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if any("calls" in r or "prefill" in r for r in report["runs"].values()) else 1


if __name__ == "__main__":
    run_cli(main)
