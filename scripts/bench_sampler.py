#!/usr/bin/env python
"""One T > 0 draw of R rows over a vocabulary of V: the blocked inverse CDF the decoders use
(packedss.decoding.verify.inverse_cdf) beside the sampler it replaced, one float64 cumulative sum
over the whole vocabulary, on the same softmax rows and uniforms.

For each V and R the two take turns `--repeats` times, each keeping its least time (ms); the ratio
is whole over blocked. The peak is the memory a draw adds over its inputs: on CUDA the allocator's
peak, on a CPU the growth of the resident set's high-water mark in a fresh process of its own
(the inputs made first). `agree` is the fraction of rows that draw the same token by both (they
round apart only where a target lies within rounding of a token's boundary). `--json` is rewritten
after every (V, R), so a run cut short keeps what it measured (scripts/gpu_check.sh's `sampler`
step).

    python scripts/bench_sampler.py --vocab 1024,151936 --rows 1,8,512 --repeats 10
    python scripts/bench_sampler.py --device cuda --vocab 151936 --rows 64,4096
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from packedss.benchmark import cpu_name, write_report
from packedss.decoding.verify import inverse_cdf
from packedss.errors import ArgumentParser, number, numbers, run_cli

def whole_vocabulary(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The sampler before the blocked one: the first token whose float64 cumulative probability
    over the whole vocabulary exceeds the uniform times the row's total."""
    cdf = probs.double().cumsum(dim=-1)
    target = uniform.double() * cdf[:, -1]
    return torch.searchsorted(cdf, target[:, None], right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)


DRAW = {"whole": whole_vocabulary, "blocked": inverse_cdf}


def inputs(rows: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax rows of logits N(0, 9), and a uniform per row. The softmax is taken in place, so
    that making the inputs leaves no freed (rows, vocab) block a draw could reuse unmeasured."""
    generator = torch.Generator(device=device).manual_seed(rows * 1_000_003 + vocab)
    probs = torch.randn(rows, vocab, generator=generator, device=device).mul_(3).exp_()
    return probs.div_(probs.sum(dim=-1, keepdim=True)), torch.rand(rows, generator=generator, device=device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def least_ms(draws: dict, probs: torch.Tensor, uniform: torch.Tensor, repeats: int) -> dict[str, float]:
    """Each draw's least time of `repeats` turns, the draws taking turns (after one untimed call each)."""
    best = dict.fromkeys(draws, float("inf"))
    for draw in draws.values():
        draw(probs, uniform)
    for _ in range(repeats):
        for name, draw in draws.items():
            sync(probs.device)
            started = time.perf_counter()
            draw(probs, uniform)
            sync(probs.device)
            best[name] = min(best[name], 1000 * (time.perf_counter() - started))
    return best


def peak_mib(sampler: str, rows: int, vocab: int, device: torch.device) -> float:
    """The memory one draw adds over its inputs (module docstring)."""
    if device.type == "cuda":
        probs, uniform = inputs(rows, vocab, device)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        DRAW[sampler](probs, uniform)
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    child = subprocess.run([sys.executable, __file__, "--peak-child", sampler, str(rows), str(vocab)],
                           capture_output=True, text=True, check=True)  # fmt: skip
    return float(child.stdout)


def high_water_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def peak_child(sampler: str, rows: int, vocab: int) -> None:
    """In a fresh process: the growth of the resident set's high-water mark over one CPU draw, in
    MiB, the mark reset after the inputs are made and a one-row draw has paged in the code the
    draw runs (Linux: /proc/self/clear_refs)."""
    torch.set_num_threads(1)
    probs, uniform = inputs(rows, vocab, torch.device("cpu"))
    DRAW[sampler](probs[:1], uniform[:1])
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    before = high_water_kib()
    DRAW[sampler](probs, uniform)
    print((high_water_kib() - before) / 1024)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--peak-child"]:
        peak_child(argv[1], int(argv[2]), int(argv[3]))
        return 0
    ap = ArgumentParser(prog="scripts/bench_sampler.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=numbers(2), default=[1024, 151936], help="comma separated vocabulary sizes")
    ap.add_argument("--rows", type=numbers(1), default=[8, 512], help="comma separated rows a draw samples")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=number(int, 1), default=1, help="CPU intra-op threads")
    ap.add_argument("--repeats", type=number(int, 1), default=10, help="turns of each sampler; each keeps its least")
    ap.add_argument("--json", default=None, help="write every measurement here, after each (V, R)")
    args = ap.parse_args(argv)
    if args.json and not Path(args.json).expanduser().absolute().parent.is_dir():
        ap.error(f"--json {args.json}: its directory does not exist; create it or pick another path")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda, but torch finds no CUDA device here; use --device cpu")
    if args.device == "cpu" and not os.path.exists("/proc/self/clear_refs"):
        ap.error("a CPU draw's peak is read from /proc/self (Linux), which this system lacks; run it on Linux or with --device cuda")
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{cpu_name()}, {os.cpu_count()} cores"
    regime = (f"one draw, softmax rows of float32, {device.type} ({name}), eager, {torch.get_num_threads()} intra-op "
              f"thread(s), torch {torch.__version__}, least of {args.repeats} turns; peak: memory a draw adds over its "
              "inputs")  # fmt: skip
    print(f"regime: {regime}")
    results = []
    report = {"regime": regime, "device": device.type, "results": results, "done": False}
    for vocab in args.vocab:
        for rows in args.rows:
            probs, uniform = inputs(rows, vocab, device)
            ms = least_ms(DRAW, probs, uniform, args.repeats)
            agree = (whole_vocabulary(probs, uniform) == inverse_cdf(probs, uniform)).double().mean().item()
            del probs, uniform
            peaks = {sampler: peak_mib(sampler, rows, vocab, device) for sampler in DRAW}
            results.append({"vocab": vocab, "rows": rows, "ms": ms, "peak_mib": peaks, "agree": agree})
            print(f"V={vocab} R={rows}: whole {ms['whole']:.3f} ms, blocked {ms['blocked']:.3f} ms, "
                  f"whole/blocked {ms['whole'] / ms['blocked']:.2f}; peak whole {peaks['whole']:.1f} MiB, "
                  f"blocked {peaks['blocked']:.1f} MiB; agree {agree:.4f}")  # fmt: skip
            if args.json:
                write_report(Path(args.json), report)
    report["done"] = True
    if args.json:
        write_report(Path(args.json), report)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    run_cli(main)
