#!/usr/bin/env python
"""Latency of ONE model call against its number of rows and the cached prefix length.

For every block size B (= W + 1) and cached prefix length C, the script times the calls each
LTR schedule makes per iteration, built with the schedules' own call builders (so the masks and
positions are the real ones) on a model of any shape (random weights are fine: the latency of a
call does not depend on the values of the weights):

    linear-draft   B rows        the diffusion block [last, MASK x W]
    linear-verify  B rows        the causal verify rows [last, d_1..d_W]
    packed         2B rows       verify rows + the one-call-ahead draft block
    quadratic      B(B+1) rows   verify rows + B draft blocks

and prints the per-iteration model time of each schedule (Linear-SS = draft + verify call,
Packed-SS and Quadratic-SS = one call), plus the paper's Table 5 pairing (Linear and Packed at
B = 32, Quadratic at B = 8). Each call runs on a cache of exactly C rows and is cropped back
after it (commit(0)), as in decoding. GPU: CUDA events around `adapter.run`; CPU: perf_counter
around run + synchronize. The four calls of one (C, B) are timed round-robin; the median over
--iters timed calls each, after --warmup untimed rounds.

    python scripts/bench_calls.py --shape tiny --device cpu
    python scripts/bench_calls.py --shape nemotron8b --device cuda --dtype bfloat16 --prefix 256,1024
    python scripts/bench_calls.py --config /path/to/Nemotron-Labs-Diffusion-8B --device cuda

Shapes (--shape) are the backbone sizes of the public Ministral-3 text configs the Nemotron-
Labs-Diffusion models are built on (our reading; --config DIR reads a real config.json instead).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from packedss.decoding.calls import causal_segment, draft_block, pack  # noqa: E402
from packedss.decoding.schedules import packed_call, quadratic_call  # noqa: E402
from packedss.models.adapter import BackboneAdapter  # noqa: E402
from packedss.models.checkpoint import default_dtype, read_config, resolve_dtype  # noqa: E402
from packedss.models.nemotron import backbone_config  # noqa: E402

_ROPE = {"rope_type": "default", "rope_theta": 1_000_000.0, "llama_4_scaling_beta": 0.1,
         "original_max_position_embeddings": 16384}  # fmt: skip
SHAPES = {
    # The shipped tiny model (scripts/train_tiny.py defaults).
    "tiny": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=48, vocab_size=1024),
    # Ministral-3 3B / 8B text backbones (Nemotron-Labs-Diffusion-3B / -8B).
    "nemotron3b": dict(hidden_size=3072, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=128, vocab_size=131072),
    "nemotron8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=34, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=128, vocab_size=131072),
    # A toy shape for the script's own test.
    "test": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, vocab_size=64),
}  # fmt: skip
PAPER_TABLE5_MS = {"linear": 54.41, "packed": 28.58, "quadratic": 28.90}  # Nemotron 8B GSM8K


def shape_config(shape: str | None, config: str | None) -> dict:
    """config.json-style dict of the backbone: a named shape, or a checkpoint's config.json."""
    if config:
        path = Path(config)
        return read_config(path.parent if path.is_file() else path, f"config {config}")
    if shape not in SHAPES:
        raise SystemExit(f"unknown shape {shape!r}; valid: {', '.join(SHAPES)} (or --config DIR)")
    return dict(SHAPES[shape], max_position_embeddings=16384, rope_parameters=dict(_ROPE), rms_norm_eps=1e-5,
                tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2, mask_token_id=3)  # fmt: skip


def random_adapter(config: dict, device: torch.device, dtype: torch.dtype, attn: str = "sdpa",
                   vocab_at_least: int = 0, mask_token_id: int | None = None,
                   eos_token_ids: tuple[int, ...] = (), seed: int = 0, name: str = "random") -> BackboneAdapter:  # fmt: skip
    """A BackboneAdapter over a randomly initialised Ministral3 backbone + head of this shape."""
    from transformers import Ministral3Model

    text = dict(config.get("text_config", config))
    text["vocab_size"] = max(int(text.get("vocab_size", 0)), vocab_at_least)
    cfg = backbone_config(text)
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    with torch.device(device), default_dtype(dtype), torch.no_grad():
        backbone = Ministral3Model(cfg)
        head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    mask = mask_token_id if mask_token_id is not None else int(config.get("mask_token_id", text.get("mask_token_id", 3)))
    return BackboneAdapter(backbone, head, mask_token_id=mask, eos_token_ids=eos_token_ids, block_size=None, name=name)


class Timer:
    """Times `adapter.run` calls: CUDA events on a GPU (read after one synchronize), else the host
    clock around run + synchronize. The calls of one (C, B) are timed round-robin (A B C D A B C D
    ...), so that a drift of the machine hits every call shape alike."""

    def __init__(self, adapter: BackboneAdapter):
        self.adapter = adapter
        self.cuda = adapter.device.type == "cuda"

    def _one(self, call):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.adapter.run(call)
            end.record()
            self.adapter.commit(0)  # the cache is cropped back to C rows after every call
            return start, end
        t0 = time.perf_counter()
        self.adapter.run(call)
        self.adapter.synchronize()
        elapsed = time.perf_counter() - t0
        self.adapter.commit(0)
        return elapsed

    def time(self, calls: dict, warmup: int, iters: int) -> dict[str, list[float]]:
        """Seconds per call, `iters` values per call shape."""
        out = {kind: [] for kind in calls}
        for i in range(warmup + iters):
            for kind, call in calls.items():
                measured = self._one(call)
                if i >= warmup:
                    out[kind].append(measured)
        if self.cuda:
            torch.cuda.synchronize(self.adapter.device)
            out = {kind: [s.elapsed_time(e) / 1000.0 for s, e in pairs] for kind, pairs in out.items()}
        return out


def iteration_calls(adapter: BackboneAdapter, block: int, position: int) -> dict:
    """The calls of one iteration of each schedule at block size B, for a cache of `position` rows."""
    device, width, mask = adapter.device, block - 1, adapter.mask_token_id
    gen = torch.Generator().manual_seed(block)
    vocab = min(adapter.head.out_features, 1000)
    last = torch.randint(4, vocab, (1,), generator=gen).to(device)
    drafts = torch.randint(4, vocab, (width,), generator=gen).to(device)
    return {
        "linear-draft": pack([draft_block(last, position, width, mask)]),
        "linear-verify": pack([causal_segment(torch.cat([last, drafts]), position)]),
        "packed": packed_call(last, drafts, position, width, mask, pad_verify=True),
        "quadratic": quadratic_call(last, drafts, position, mask),
    }


def prefill(adapter: BackboneAdapter, rows: int, chunk: int = 1024) -> None:
    """A cache of exactly `rows` rows (random tokens, causal), written in chunks."""
    adapter.reset()
    gen = torch.Generator().manual_seed(rows)
    tokens = torch.randint(4, min(adapter.head.out_features, 1000), (rows,), generator=gen).to(adapter.device)
    with torch.inference_mode():
        for start in range(0, rows, chunk):
            piece = tokens[start : start + chunk]
            adapter.run(pack([causal_segment(piece, start)]))
            adapter.commit(piece.shape[0])


def bench(adapter: BackboneAdapter, blocks: list[int], prefixes: list[int], warmup: int, iters: int) -> list[dict]:
    timer, results = Timer(adapter), []
    for prefix in prefixes:
        prefill(adapter, prefix)
        for block in blocks:
            calls = iteration_calls(adapter, block, prefix)
            for kind, times in timer.time(calls, warmup, iters).items():
                results.append({
                    "prefix": prefix, "block": block, "kind": kind, "rows": calls[kind].rows,
                    "median_ms": 1000 * statistics.median(times), "min_ms": 1000 * min(times),
                    "iters": len(times),
                })  # fmt: skip
                print(f"  C={prefix:5d} B={block:3d} {kind:14s} rows={calls[kind].rows:5d} "
                      f"median {results[-1]['median_ms']:8.3f} ms", file=sys.stderr, flush=True)  # fmt: skip
        adapter.reset()
    return results


def per_iteration(results: list[dict]) -> dict:
    """(prefix, block) -> per-iteration model ms of each schedule, and the 2B/B call ratio."""
    by = {(r["prefix"], r["block"], r["kind"]): r["median_ms"] for r in results}
    out = {}
    for prefix, block in sorted({(r["prefix"], r["block"]) for r in results}):
        get = lambda kind: by[(prefix, block, kind)]  # noqa: E731
        out[(prefix, block)] = {
            "linear": get("linear-draft") + get("linear-verify"),
            "packed": get("packed"),
            "quadratic": get("quadratic"),
            "ratio_2B_B": get("packed") / get("linear-verify"),
        }
    return out


def render(results: list[dict], header: str) -> str:
    lines = [header, "", "Per-call model time (median ms) by rows:", ""]
    lines.append("| C | B | B rows: draft | B rows: verify | 2B rows: packed | B(B+1) rows: quadratic | 2B / B |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|")
    by = {(r["prefix"], r["block"], r["kind"]): r for r in results}
    iters = per_iteration(results)
    for prefix, block in iters:
        cell = lambda kind: f"{by[(prefix, block, kind)]['median_ms']:.3f}"  # noqa: E731
        lines.append(f"| {prefix} | {block} | {cell('linear-draft')} | {cell('linear-verify')} | {cell('packed')} "
                     f"({2 * block}) | {cell('quadratic')} ({block * (block + 1)}) | "
                     f"{iters[(prefix, block)]['ratio_2B_B']:.2f}x |")  # fmt: skip
    lines += ["", "Per-iteration model time (ms): Linear-SS = draft + verify call; Packed-SS, Quadratic-SS = one call", ""]
    lines.append("| C | B | Linear-SS | Packed-SS | Quadratic-SS | Packed / Linear |")
    lines.append("|---:|---:|---:|---:|---:|---:|")
    for (prefix, block), it in iters.items():
        lines.append(f"| {prefix} | {block} | {it['linear']:.3f} | {it['packed']:.3f} | {it['quadratic']:.3f} | "
                     f"{it['packed'] / it['linear']:.2f} |")  # fmt: skip
    blocks = {b for _, b in iters}
    if {8, 32} <= blocks:
        lines += ["", "Table 5 pairing (Linear, Packed at B = 32; Quadratic at B = 8), ms per iteration:", ""]
        lines.append("| C | Linear-SS (32+32 rows) | Packed-SS (64 rows) | Quadratic-SS (72 rows) | paper (8B) |")
        lines.append("|---:|---:|---:|---:|---|")
        paper = " / ".join(f"{v:.2f}" for v in PAPER_TABLE5_MS.values())
        for prefix in sorted({p for p, _ in iters}):
            lines.append(f"| {prefix} | {iters[(prefix, 32)]['linear']:.3f} | {iters[(prefix, 32)]['packed']:.3f} | "
                         f"{iters[(prefix, 8)]['quadratic']:.3f} | {paper} |")  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="tiny", help=f"named backbone shape: {', '.join(SHAPES)}")
    ap.add_argument("--config", default=None, help="a checkpoint directory or config.json (overrides --shape)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | ...")
    ap.add_argument("--attn", default="sdpa", help="attention implementations to time, comma separated "
                    "(sdpa, flex_attention, eager); every one gets the same custom 4D mask")  # fmt: skip
    ap.add_argument("--blocks", default="8,16,32", help="block sizes B = W + 1")
    ap.add_argument("--prefix", default="128,512", help="cached prefix lengths C")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (0: torch's default)")
    ap.add_argument("--json", default=None, help="write every measurement to this file")
    args = ap.parse_args(argv)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))  # fmt: skip
    dtype = resolve_dtype("bfloat16" if args.dtype == "auto" and device.type == "cuda" else
                          ("float32" if args.dtype == "auto" else args.dtype))  # fmt: skip
    config = shape_config(args.shape, args.config)
    blocks = [int(b) for b in args.blocks.split(",")]
    prefixes = [int(c) for c in args.prefix.split(",")]
    what = args.config or args.shape
    report = {"shape": what, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
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
            results = bench(adapter, blocks, prefixes, args.warmup, args.iters)
        except Exception as err:  # an attention implementation that cannot run this mask/device
            print(f"{header}\n\nattn={attn} failed: {type(err).__name__}: {str(err)[:300]}\n", flush=True)
            report["runs"][attn] = {"error": f"{type(err).__name__}: {err}"}
            continue
        finally:
            del adapter
            if device.type == "cuda":
                torch.cuda.empty_cache()
        print(render(results, header) + "\n", flush=True)
        report["runs"][attn] = {
            "params": params, "calls": results,
            "per_iteration": [{"prefix": p, "block": b, **v} for (p, b), v in per_iteration(results).items()],
        }  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if any("calls" in r for r in report["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
