#!/usr/bin/env python
"""Concurrency on one device, for scripts/gpu_check.sh: where Packed-SS stops paying.

Runs the tiny model (it decides every token) with a cost twin of a named shape (its calls are
timed) under --schedules (AR, Linear-SS and Packed-SS at --width, Quadratic-SS at
--quadratic-width) at every --concurrency C, through run.py (one sweep per width, each job its
own record file), then the analysis's concurrency and crossover tables (docs/concurrency.md,
docs/analysis.md §10). While the sweeps run, --json is rewritten every 2 s with the responses
each record file holds, so a run cut short keeps what it decoded; at the end it holds the
tables' rows and the divergence audit's counts (every lossless response against AR's at the same
C). Prints both tables under their regime line, which names what their figures were measured in
as the records' label does (eager, dtype, threads, device, cost model; the JSON's `measured_in`):
the cost twin's calls run eagerly, so on a GPU each 8B call is bound by the host's dispatch
(about 40 ms of Python against a memory floor of about 4 ms), and the crossover is that of
"eager, host-bound" calls (the call counts' ratio), not of memory-bound against compute-bound
ones; the JSON's `regime` says so too.

    python scripts/gpu_concurrency.py --shape nemotron8b --device cuda --concurrency 1,4,16,64 --json results/gpu_check/concurrency-8b.json
"""

from __future__ import annotations

import contextlib
import csv
import subprocess
import sys
import threading
from pathlib import Path

from packedss.benchmark import write_report
from packedss.errors import ArgumentParser, PackedSSError, closest, names, number, numbers, run_cli
from packedss.models.cost_twin import SHAPES
from packedss.paths import PROJECT_ROOT

SCHEDULES = ("ar", "linear", "packed", "quadratic")
REGIME = "eager, host-bound"


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


class Watch:
    """Calls `update` every `every` seconds while the block runs, and once when it ends."""

    def __init__(self, update, every: float = 2.0):
        self.update, self.every, self.stop = update, every, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(self.every):
            self.update()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.update()


def responses(records: Path) -> dict[str, int]:
    """Record file name -> the responses it holds (whole lines: one being written is not counted)."""
    counts = {}
    for path in sorted(records.rglob("*.jsonl")):
        with path.open() as handle:
            counts[path.name] = sum(1 for line in handle if line.endswith("\n"))
    return counts


def measured_in(rows: list[dict]) -> str:
    """The regime of a table's rows as the analysis labels its runs (eager or compiled, dtype,
    threads, device, cost model: the records' own `measured_in` column)."""
    return " | ".join(sorted({row["measured_in"] for row in rows}))


def regime_line(shape: str, regime: str) -> str:
    """The line over the printed tables: what their figures were measured in, and why host-bound."""
    return (f"regime: {REGIME}; measured in: {regime} (the {shape} cost twin's calls run eagerly: each is bound by the "
            "host's dispatch, so the crossover below is that of the call counts, not of memory-bound calls)")


def main(argv=None) -> int:
    ap = ArgumentParser(prog="scripts/gpu_concurrency.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="nemotron8b", help=f"the cost twin's shape: {', '.join(SHAPES)}")
    ap.add_argument("--layers", type=number(int, 1), default=None, help="keep the shape's first N layers")
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--concurrency", type=numbers(1), default=[1, 4, 16, 64], help="the C values (default 1,4,16,64)")
    ap.add_argument("--schedules", type=names(SCHEDULES), default=list(SCHEDULES),
                    help=f"the schedules (default {','.join(SCHEDULES)}; AR is the audit's reference)")  # fmt: skip
    ap.add_argument("--width", type=number(int, 1), default=31, help="W of AR, Linear-SS and Packed-SS (default 31: B = 32)")
    ap.add_argument("--quadratic-width", type=number(int, 1), default=7,
                    help="W of Quadratic-SS (default 7: B = 8, the paper's pairing; its B(B+1) rows at B = 32 and "
                    "large C would not fit a dense mask)")  # fmt: skip
    ap.add_argument("--limit", type=number(int, 1), default=64, help="arith questions per job")
    ap.add_argument("--max-new-tokens", type=number(int, 1), default=64)
    ap.add_argument("--threads", type=number(int, 0), default=0)
    ap.add_argument("--out", required=True, help="a folder for the records and the analysis")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    if args.shape not in SHAPES:
        raise PackedSSError(f"unknown --shape {args.shape}{closest(args.shape, SHAPES)}; valid: {', '.join(SHAPES)}")
    if not Path(args.json).expanduser().absolute().parent.is_dir():
        raise PackedSSError(f"--json {args.json}: its directory does not exist; create it or pick another path")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise PackedSSError("--device cuda but no CUDA device is available; use --device cpu")
    if "ar" not in args.schedules:
        raise PackedSSError("--schedules without ar: the audit compares every response with AR's at the same C; add ar")
    out = Path(args.out).absolute()
    records, analysis = out / "records", out / "analysis"
    layers = [] if args.layers is None else [f"model.cost_layers={args.layers}"]
    common = [f"limit={args.limit}", f"max_new_tokens={args.max_new_tokens}", f"model.cost_shape={args.shape}", *layers,
              "model.cost_dtype=bfloat16", f"device={args.device}", f"threads={args.threads}", "progress=false",
              f"out_dir={records}"]  # fmt: skip
    report = {
        "shape": args.shape, "layers": args.layers, "device": args.device, "width": args.width, "limit": args.limit,
        "quadratic_width": args.quadratic_width, "max_new_tokens": args.max_new_tokens, "concurrency": args.concurrency,
        "schedules": args.schedules, "responses": {}, "done": False, "regime": REGIME,
    }  # fmt: skip
    path = Path(args.json)

    def write() -> None:
        write_report(path, report)

    groups = [(names, width) for names, width in (([x for x in args.schedules if x != "quadratic"], args.width),
              (["quadratic"] if "quadratic" in args.schedules else [], args.quadratic_width)) if names]  # fmt: skip
    def progress() -> None:
        report["responses"] = responses(records)
        write()

    write()
    with Watch(progress):
        for schedules, width in groups:
            sweep = [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", f"schedule={','.join(schedules)}",
                     f"width={width}", f"concurrency={','.join(map(str, args.concurrency))}", *common,
                     f"hydra.sweep.dir={out / 'multirun' / schedules[-1]}"]  # fmt: skip
            done = subprocess.run(sweep, cwd=PROJECT_ROOT, stdout=sys.stderr)
            if done.returncode:
                print(f"the sweep failed (status {done.returncode}); its jobs' errors are above", file=sys.stderr)
                return 1
    from packedss.analysis.__main__ import main as analysis_main
    from packedss.analysis.audit import CLASSES

    with contextlib.redirect_stdout(sys.stderr):
        status = analysis_main([str(records), "--tables", "concurrency", "--figures", "C1", "--out", str(analysis)])
    if status:
        return 1
    runs = _rows(analysis / "tables" / "runs.csv")
    report["audit"] = {kind: sum(int(float(row[kind])) for row in runs if row[kind]) for kind in map(str.capitalize, CLASSES)}
    report["table"] = _rows(analysis / "tables" / "concurrency.csv")
    report["crossover"] = _rows(analysis / "tables" / "crossover.csv")
    report["measured_in"] = measured_in(report["table"])
    print(regime_line(args.shape, report["measured_in"]) + "\n")
    for name in ("concurrency", "crossover"):
        print((analysis / "tables" / f"{name}.md").read_text())
    report["done"] = True
    write()
    return 0


if __name__ == "__main__":
    run_cli(main)
