#!/usr/bin/env python
"""The verdicts of scripts/gpu_check.sh: reads the JSON each step of a pass wrote to OUT, prints
one line per check, PASS, FAIL, SKIP (with its reason) or INFO (numbers, no criterion), each with
its criterion, and writes every number (the checks' and each step's JSON) to OUT/gpu_check.json
(one section per pass, so that the two commands of a GPU run fill one file). Exit status 1 when
a check failed.

    python scripts/gpu_summary.py --out results/gpu_check --pass 1

Pass 1: float32 exactness, the bfloat16 match rate, host syncs per iteration (under
torch.cuda.set_sync_debug_mode), the divergence audit of tiny in bfloat16, and the 3B shape's calls
under CUDA graphs. Pass 2: the tiny model's schedules under CUDA graphs, and the 8B shape's calls
under CUDA graphs: per-call time at R = 1, B, 2B and B(B+1) rows against the products floor and
the HBM floor, the achieved bandwidth, the 2B/B ratio eager and compiled. Pass 3: concurrency,
the divergence audit at every C and the crossover of Packed/Linear.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from packedss.errors import ArgumentParser, PackedSSError, run_cli

RATIO_2B_B_MAX = 1.30  # a 2B-row call at most 1.3x a B-row call at B = 32 (8B shape, CUDA graphs)
HBM_FLOOR_MAX = 2.0  # a compiled call of R = 1, B or 2B rows at most 2x the HBM floor (8B shape)
RATIO_BLOCK = 32
FLOOR_KINDS = ("ar", "linear-verify", "packed")  # R = 1, B and 2B rows
SHAPE_STEPS = {"3b": "graphs-3b", "8b": "graphs-8b"}
PASS_STEPS = {
    "1": ("exact-fp32", "exact-bf16", "events-bf16", "info-attn-8b", "schedules-3b", "schedules-8b", "decode-bf16",
          "graphs-3b"),
    "2": ("compiled-tiny", "graphs-8b"),
    "3": ("concurrency-8b",),
}  # fmt: skip
NO_CUDA = "no CUDA device (DRY=1 runs on the CPU)"


class Checks:
    """The checks of one pass, printed as they are decided."""

    def __init__(self) -> None:
        self.items: list[dict] = []

    def add(self, name: str, status: str, criterion: str, detail: str = "", **numbers) -> None:
        self.items.append({"name": name, "status": status, "criterion": criterion, "detail": detail, **numbers})
        print(f"{status}: {name}: {criterion}" + (f" -- {detail}" if detail else ""), flush=True)

    def verdict(self, name: str, ok: bool, criterion: str, detail: str = "", **numbers) -> None:
        self.add(name, "PASS" if ok else "FAIL", criterion, detail, **numbers)

    def missing(self, name: str, criterion: str, step: str) -> None:
        self.add(name, "FAIL", criterion, f"no result from step {step} (it failed or ran out of time: see {step}.stderr)")

    @property
    def failed(self) -> list[str]:
        return [c["name"] for c in self.items if c["status"] == "FAIL"]


def load(out: Path, step: str) -> dict | None:
    try:
        return json.loads((out / f"{step}.json").read_text())
    except (OSError, ValueError):
        return None


def fmt(value) -> str:
    if isinstance(value, str):
        return value
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"


def exactness(checks: Checks, steps: dict) -> None:
    criterion = "float32, greedy: every LTR schedule's output equals AR's on every question (Match 100%)"
    report = steps.get("exact-fp32")
    if report is None:
        return checks.missing("fp32-exact", criterion, "exact-fp32")
    rates = {row["Schedule"]: row["Match (%)"] for row in report["table"]}
    checks.verdict("fp32-exact", all(rate == 100 for rate in rates.values()), criterion,
                   ", ".join(f"{k} {v:.0f}%" for k, v in rates.items()), match=rates)  # fmt: skip
    for step in ("exact-bf16", "events-bf16"):
        report = steps.get(step)
        if report is not None:
            rates = {row["Schedule"]: row["Match (%)"] for row in report["table"]}
            checks.add(f"{step}-match", "INFO", "bfloat16 greedy match rate against AR (not asserted; the audit "
                       "explains differences)", ", ".join(f"{k} {v:.0f}%" for k, v in rates.items()), match=rates)  # fmt: skip


def decode_path(checks: Checks, steps: dict, cuda: bool) -> None:
    report = steps.get("decode-bf16")
    sync_criterion = ("host syncs per response, timing=events: greedy <= iterations + 2, T = 1 <= 2 x iterations + 2, "
                      "every LTR schedule at W = 8")  # fmt: skip
    audit_criterion = "divergence audit, tiny, bfloat16: no unexplained divergence from AR"
    if report is None:
        checks.missing("syncs", sync_criterion, "decode-bf16")
        return checks.missing("audit-bf16", audit_criterion, "decode-bf16")
    on_cuda = report["device"].startswith("cuda")
    per = ", ".join(f"{r['schedule']} T={r['temperature']:g} {r['syncs_per_iteration']:.2f}/it" for r in report["syncs"])
    sync_ok = bool(report["syncs"]) and all(r["pass"] for r in report["syncs"])
    if on_cuda:
        checks.verdict("syncs", sync_ok, sync_criterion + ", counted by torch.cuda.set_sync_debug_mode", per,
                       syncs=report["syncs"])  # fmt: skip
    else:
        checks.add("syncs", "SKIP", sync_criterion + ", counted by torch.cuda.set_sync_debug_mode",
                   f"{NO_CUDA}: the sync debug mode counts CUDA syncs only")  # fmt: skip
        checks.verdict("syncs-readbacks-cpu", sync_ok, sync_criterion + ", counted as Tensor read-backs on the CPU",
                       per, syncs=report["syncs"])  # fmt: skip
    counts = ", ".join(f"{a['schedule']} W={a['width']}: {a['equal']}/{a['numerical']}/{a['unexplained']}"
                       for a in report["audit"])  # fmt: skip
    audit_ok = bool(report["audit"]) and all(a["unexplained"] == 0 for a in report["audit"])
    name = "audit-bf16" if on_cuda else "audit-bf16-cpu"
    if not on_cuda:
        checks.add("audit-bf16", "SKIP", audit_criterion + " on CUDA", f"{NO_CUDA}; the same audit on the CPU follows")
    checks.verdict(name, audit_ok, f"{audit_criterion} on {report['device']}",
                   f"equal/numerical/unexplained: {counts}", audit=report["audit"])  # fmt: skip


def compiled_schedules(checks: Checks, steps: dict, cuda: bool) -> None:
    dispatch = "every compiled timed call after prefill ran on a compiled graph (Compiled calls 100%)"
    replays = ("under CUDA graphs, every timed call after prefill replayed a CUDA graph (CUDA-graph calls 100%) "
               "and inductor skipped none (Graph skips 0)")  # fmt: skip
    report = steps.get("compiled-tiny")
    if report is None:
        checks.missing("compiled-dispatch", dispatch, "compiled-tiny")
        return checks.missing("cuda-graph-calls", replays, "compiled-tiny")
    rows = [row for row in report["table"] if row["Regime"] != "eager"]
    detail = ", ".join(f"{r['Schedule']} {fmt(r['Compiled calls (%)'])}% (= eager {fmt(r['= eager (%)'])}%)" for r in rows)
    checks.verdict("compiled-dispatch", bool(rows) and all(r["Compiled calls (%)"] == 100 for r in rows), dispatch,
                   detail, table=rows)  # fmt: skip
    counted = [r for r in rows if not isinstance(r["CUDA-graph calls (%)"], str)]
    if not cuda or not counted:
        reason = NO_CUDA if not cuda else "no CUDA-graph regime ran (COMPILE is not reduce-overhead)"
        return checks.add("cuda-graph-calls", "SKIP", replays, f"{reason}: CUDA-graph calls n/a")
    ok = len(counted) == len(rows) and all(r["CUDA-graph calls (%)"] == 100 and r["Graph skips"] == 0 for r in rows)
    checks.verdict("cuda-graph-calls", ok, replays,
                   ", ".join(f"{r['Schedule']} {fmt(r['CUDA-graph calls (%)'])}% skips {fmt(r['Graph skips'])}"
                             for r in counted))  # fmt: skip


def graph_calls(checks: Checks, steps: dict, label: str, cuda: bool) -> None:
    """The shape's calls under CUDA graphs: the per-call table, then the checks."""
    step = SHAPE_STEPS[label]
    report = steps.get(step)
    replay_criterion = f"{label} shape: every timed compiled call replayed a CUDA graph, no cudagraph skips"
    ratio_criterion = (f"{label} shape, CUDA graphs: a 2B-row call <= {RATIO_2B_B_MAX:.2f}x a B-row call at "
                       f"B = {RATIO_BLOCK} (memory-bound calls)")  # fmt: skip
    floor_criterion = (f"{label} shape, CUDA graphs: every call of R = 1, B and 2B rows <= {HBM_FLOOR_MAX:g}x the HBM "
                       "floor (it achieves >= half the device-to-device copy bandwidth)")  # fmt: skip
    run = None if report is None or not report["runs"] else next(iter(report["runs"].values()))
    if run is None or "calls" not in run:
        checks.missing(f"graph-replays-{label}", replay_criterion, step)
        if label == "8b":
            checks.missing("memory-bound-8b", ratio_criterion, step)
            checks.missing("hbm-floor-8b", floor_criterion, step)
        return
    calls, ratios = run["calls"], run["ratios_2B_B"]
    first = calls[0]
    where = report.get("device_name", report["device"])
    print(f"{label} shape ({run['params'] / 1e9:.2f}B parameters, {report['dtype']}, compile={report['compile']}, "
          f"{where}): weight bytes {first['weight_bytes'] / 1e9:.2f} GB; device-to-device copy "
          f"{first['copy_gbs']:.1f} GB/s -> HBM floor {first['hbm_floor_ms']:.3f} ms; products floor per R below")  # fmt: skip
    print("| C | B | call | R | compiled ms | eager ms | products ms | HBM floor ms | compiled / HBM | achieved GB/s |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for c in calls:
        if c["kind"] == "linear-draft":
            continue  # the same B rows as linear-verify
        print(f"| {c['prefix']} | {c['block']} | {c['kind']} | {c['rows']} | {c['compiled_ms']:.3f} | "
              f"{c['eager_ms']:.3f} | {c['products_ms']:.3f} | {c['hbm_floor_ms']:.3f} | {c['compiled_hbm']:.2f} | "
              f"{c['compiled_gbs']:.1f} |")  # fmt: skip
    ratio_text = ", ".join(f"B={r['block']}: eager {r['eager']:.2f}x, compiled {r['compiled']:.2f}x" for r in ratios)
    checks.add(f"ratio-2B-B-{label}", "INFO", f"{label} shape: 2B-row call / B-row call, eager and under "
               f"compile={report['compile']}", ratio_text, ratios=ratios)  # fmt: skip
    numbers = {"copy_gbs": first["copy_gbs"], "hbm_floor_ms": first["hbm_floor_ms"], "weight_bytes": first["weight_bytes"]}
    replayed = [c["graph_replays_min"] for c in calls]
    if not cuda or report["compile"] != "reduce-overhead" or any(r is None for r in replayed):
        reason = NO_CUDA if not cuda else f"compile={report['compile']} records no CUDA graphs"
        checks.add(f"graph-replays-{label}", "SKIP", replay_criterion, f"{reason}: no graph can replay")
        if label == "8b":
            checks.add("memory-bound-8b", "SKIP", ratio_criterion, f"{reason}: ratios reported above only")
            checks.add("hbm-floor-8b", "SKIP", floor_criterion, f"{reason}: the toy shape's calls are not memory-bound")
        return
    skips = max(c["cudagraph_skips"] for c in calls)
    checks.verdict(f"graph-replays-{label}", min(replayed) >= 1 and skips == 0, replay_criterion,
                   f"fewest replays in a call {min(replayed)}, most skips {skips}")  # fmt: skip
    if label != "8b":
        return
    at = [r for r in ratios if r["block"] == RATIO_BLOCK]
    worst = max((r["compiled"] for r in at), default=math.inf)
    checks.verdict("memory-bound-8b", worst <= RATIO_2B_B_MAX, ratio_criterion, f"{fmt(worst)}x", ratio=worst)
    shown = [c for c in calls if c["kind"] in FLOOR_KINDS]
    highest = max(c["compiled_hbm"] for c in shown)
    checks.verdict("hbm-floor-8b", highest <= HBM_FLOOR_MAX, floor_criterion,
                   f"largest compiled / HBM floor {highest:.2f}x, lowest achieved "
                   f"{min(c['compiled_gbs'] for c in shown):.1f} GB/s of {first['copy_gbs']:.1f}", **numbers)  # fmt: skip


def concurrency(checks: Checks, steps: dict) -> None:
    report = steps.get("concurrency-8b")
    if report is None:
        checks.missing("concurrency-runs", "every (schedule, C) job wrote all its responses", "concurrency-8b")
        return
    expected = report["limit"]
    short = [f"{row['Method']} C={row['C']}: {row['Responses']}" for row in report["table"]
             if int(row["Responses"]) != expected]  # fmt: skip
    jobs = {(row["Method"], row["C"]) for row in report["table"]}
    checks.verdict("concurrency-runs", not short and len(jobs) == len(report["schedules"]) * len(report["concurrency"]),
                   f"every (schedule, C) job wrote all {expected} responses", "; ".join(short))  # fmt: skip
    audit = report["audit"]
    checks.verdict("concurrency-audit", audit["Unexplained"] == 0, "no lossless output diverges from AR's at the same C "
                   "without a recorded near-tie", ", ".join(f"{k.lower()} {v}" for k, v in audit.items()), **audit)  # fmt: skip
    for row in report["crossover"]:
        if row["Method"] == "Packed-SS":
            ratios = [f"C={r['C']}: {fmt(float(r['Time / Linear-SS']))}" for r in report["table"]
                      if r["Method"] == "Packed-SS" and r["Time / Linear-SS"]]  # fmt: skip
            checks.add("crossover-8b", "INFO", "Packed/Linear time by C, and the smallest C at which it reaches 1",
                       f"{', '.join(ratios)}; crossover {row['Crossover C']} (CI above 1: {row['CI above 1']})")  # fmt: skip


def summarize(out: Path, which: str, cuda: bool) -> Checks:
    steps = {step: report for step in PASS_STEPS[which] if (report := load(out, step)) is not None}
    checks = Checks()
    if which == "1":
        exactness(checks, steps)
        decode_path(checks, steps, cuda)
        graph_calls(checks, steps, "3b", cuda)
    elif which == "2":
        compiled_schedules(checks, steps, cuda)
        graph_calls(checks, steps, "8b", cuda)
    else:
        concurrency(checks, steps)
    path = out / "gpu_check.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        summary = {"passes": {}}
    summary["passes"][which] = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cuda": cuda, "checks": checks.items,
                                "failed": checks.failed, "steps": steps}  # fmt: skip
    path.write_text(json.dumps(summary, indent=1) + "\n")
    return checks


def main(argv=None) -> int:
    ap = ArgumentParser(prog="scripts/gpu_summary.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the folder the steps wrote their JSON to (gpu_check.sh's OUT)")
    ap.add_argument("--pass", dest="which", required=True, choices=tuple(PASS_STEPS), help="the pass to judge")
    ap.add_argument("--cuda", action="store_true", help="the steps ran on CUDA (else CUDA-only checks are skipped)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if not out.is_dir():
        raise PackedSSError(f"--out {out} is not a folder; give the OUT folder that gpu_check.sh's steps wrote to")
    checks = summarize(out, args.which, args.cuda)
    counts = {s: sum(c["status"] == s for c in checks.items) for s in ("PASS", "FAIL", "SKIP", "INFO")}
    print(f"pass {args.which}: " + ", ".join(f"{v} {k}" for k, v in counts.items()) + f"; every number in {out / 'gpu_check.json'}")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run_cli(lambda: main(sys.argv[1:]))
