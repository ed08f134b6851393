#!/usr/bin/env python
"""The verdicts of scripts/gpu_check.sh: reads the JSON each step of the plan wrote to RESULTS,
prints one line per check, PASS, FAIL, SKIP (with its reason) or INFO (numbers, no criterion),
each with its criterion, and writes every number (the checks', each step's JSON, and each step's
budget, exit status and seconds from RESULTS/steps.tsv) to RESULTS/gpu_check.json and the lines
with the steps' table to RESULTS/summary.md. A step cut short by its budget left the JSON of what
it measured: its checks judge that and fail where a figure is missing. Exit status 1 when a check
failed.

    python scripts/gpu_summary.py --results results/gpu_check --cuda

The checks: the preflight (the backbones take the adapters' cache keyword), float32 exactness
and the bfloat16 divergence audit of tiny, the 8B shape's calls under CUDA graphs (each compiled
call against the eager call of the same input, graph replays, the 2B/B ratio at B = 32, every
call against the HBM floor of what it moves), host syncs per response (under
torch.cuda.set_sync_debug_mode), the T > 0 draw's peak memory (the blocked inverse CDF against the
whole-vocabulary one), and one C = 1 against C = 8 concurrency point on eager,
host-bound calls (every response written, the audit at each C, Packed/Linear by C). A step left
out of the run's plan (gpu_check.sh's ONLY or SKIP; RESULTS/plan.tsv) has its checks SKIP; a step
cut short (exit status 124 or 137) is named so in the steps' table.
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
HBM_FLOOR_MAX = 2.0  # a compiled call of B or 2B rows at most 2x the HBM floor (8B shape)
RATIO_BLOCK = 32
FLOOR_KINDS = ("ar", "linear-verify", "packed")  # R = 1, B and 2B rows (those the step timed)
# The blocked draw adds at most 1/8 of the whole-vocabulary draw's memory (tests/test_bench_scripts.py
# holds the same bound on the CPU) and draws the same tokens but where a target rounds across a boundary.
SAMPLER_PEAK_FRACTION = 8
SAMPLER_AGREE_MIN = 0.999
STEPS = ("wheels", "preflight", "audit-fp32", "audit-bf16", "graphs-8b", "syncs", "sampler", "concurrency-8b")
STEP_CHECKS = {"preflight": ("preflight",), "audit-fp32": ("fp32-exact",), "audit-bf16": ("audit-bf16",),
               "graphs-8b": ("graph-vs-eager-8b", "graph-replays-8b", "memory-bound-8b", "hbm-floor-8b"),
               "syncs": ("syncs",), "sampler": ("sampler-peak",),
               "concurrency-8b": ("concurrency-runs", "concurrency-audit")}  # fmt: skip
CUT_SHORT = (124, 137)  # timeout's status, and SIGKILL's (timeout -k) when a step ignored the TERM
NO_CUDA = "no CUDA device (DRY=1 runs on the CPU)"
GRAPH_DIFFERS = "graph replay differs from eager"
CONCURRENCY_REGIME = "eager, host-bound"  # the cost twin's calls run eagerly: the host's dispatch, not HBM


class Checks:
    """The checks, printed as they are decided (and kept for summary.md)."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self.lines: list[str] = []

    def add(self, name: str, status: str, criterion: str, detail: str = "", **numbers) -> None:
        self.items.append({"name": name, "status": status, "criterion": criterion, "detail": detail, **numbers})
        self.say(f"{status}: {name}: {criterion}" + (f" -- {detail}" if detail else ""))

    def say(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)

    def verdict(self, name: str, ok: bool, criterion: str, detail: str = "", **numbers) -> None:
        self.add(name, "PASS" if ok else "FAIL", criterion, detail, **numbers)

    def missing(self, name: str, criterion: str, step: str) -> None:
        self.add(name, "FAIL", criterion, f"no result from step {step} (it failed or ran out of time: see {step}.stderr)")

    @property
    def failed(self) -> list[str]:
        return [c["name"] for c in self.items if c["status"] == "FAIL"]


def load(results: Path, step: str) -> dict | None:
    try:
        return json.loads((results / f"{step}.json").read_text())
    except (OSError, ValueError):
        return None


def planned(results: Path) -> list[str]:
    """The steps of the run's plan (RESULTS/plan.tsv; every step when there is none)."""
    try:
        return [line.split("\t")[0] for line in (results / "plan.tsv").read_text().splitlines() if line]
    except OSError:
        return [*STEPS, "summary", "pack"]


def plan_rows(results: Path) -> list[dict]:
    """The steps gpu_check.sh ran: name, budget, exit status and seconds (RESULTS/steps.tsv)."""
    try:
        text = (results / "steps.tsv").read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        name, budget, rc, seconds = line.split("\t")
        rows.append({"step": name, "budget_s": int(budget), "rc": int(rc), "seconds": int(seconds)})
    return rows


def fmt(value) -> str:
    if isinstance(value, str):
        return value
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"


def cut_short(report: dict) -> str:
    return "" if report.get("done", True) else "; the step was cut short: these are the rows it finished"


def preflight(checks: Checks, steps: dict, cut: set[str]) -> None:
    criterion = "transformers' Ministral3Model and Qwen3Model take the adapters' cache keyword; hydra-core, omegaconf present"
    report = steps.get("preflight")
    late = ("cut short by its budget: not fatal, the steps ran (each adapter checks its backbone's cache keyword "
            "itself)") if "preflight" in cut else ""  # fmt: skip
    if report is None:
        return checks.add("preflight", "FAIL", criterion, late) if late else checks.missing("preflight", criterion, "preflight")
    checks.add("versions", "INFO", "the environment of the run", report["line"], **report["versions"])
    checks.verdict("preflight", report["refused"] is None and len(report["backbones"]) == 2, criterion,
                   late or report["refused"] or ", ".join(f"{k} {v}" for k, v in report["backbones"].items()))  # fmt: skip


def audit_counts(report: dict) -> str:
    return ", ".join(f"{a['schedule']} W={a['width']}: {a['equal']}/{a['numerical']}/{a['unexplained']}"
                     for a in report["audit"])  # fmt: skip


def exactness(checks: Checks, steps: dict) -> None:
    criterion = "tiny, float32, greedy: every lossless schedule's output equals AR's on every question, token for token"
    report = steps.get("audit-fp32")
    if report is None:
        return checks.missing("fp32-exact", criterion, "audit-fp32")
    rows = report["audit"]
    ok = report["done"] and bool(rows) and all(a["equal"] == a["equal"] + a["numerical"] + a["unexplained"] for a in rows)
    checks.verdict("fp32-exact", ok, f"{criterion} ({report['device']})",
                   f"equal/numerical/unexplained: {audit_counts(report)}{cut_short(report)}", audit=rows)  # fmt: skip


def audit_bf16(checks: Checks, steps: dict) -> None:
    criterion = "divergence audit, tiny, bfloat16: no unexplained divergence from AR"
    report = steps.get("audit-bf16")
    if report is None:
        return checks.missing("audit-bf16", criterion, "audit-bf16")
    on_cuda = report["device"].startswith("cuda")
    rows = report["audit"]
    ok = report["done"] and bool(rows) and all(a["unexplained"] == 0 for a in rows)
    if not on_cuda:
        checks.add("audit-bf16", "SKIP", criterion + " on CUDA", f"{NO_CUDA}; the same audit on the CPU follows")
    checks.verdict("audit-bf16" if on_cuda else "audit-bf16-cpu", ok, f"{criterion} on {report['device']}",
                   f"equal/numerical/unexplained: {audit_counts(report)}{cut_short(report)}", audit=rows)  # fmt: skip


def syncs(checks: Checks, steps: dict) -> None:
    criterion = ("host syncs per response, timing=events: greedy <= iterations + 2, T = 1 <= 2 x iterations + 2, "
                 "every LTR schedule at W = 8")  # fmt: skip
    report = steps.get("syncs")
    if report is None:
        return checks.missing("syncs", criterion, "syncs")
    rows = report["syncs"]
    per = ", ".join(f"{r['schedule']} T={r['temperature']:g} {r['syncs']} in {r['iterations']} it" for r in rows)
    ok = report["done"] and bool(rows) and all(r["pass"] for r in rows)
    if report["device"].startswith("cuda"):
        return checks.verdict("syncs", ok, criterion + ", counted by torch.cuda.set_sync_debug_mode",
                              per + cut_short(report), syncs=rows)  # fmt: skip
    checks.add("syncs", "SKIP", criterion + ", counted by torch.cuda.set_sync_debug_mode",
               f"{NO_CUDA}: the sync debug mode counts CUDA syncs only")  # fmt: skip
    checks.verdict("syncs-readbacks-cpu", ok, criterion + ", counted as Tensor read-backs on the CPU",
                   per + cut_short(report), syncs=rows)  # fmt: skip


def sampler(checks: Checks, steps: dict) -> None:
    criterion = (f"one T > 0 draw at the most rows measured: the blocked inverse CDF adds at most 1/"
                 f"{SAMPLER_PEAK_FRACTION} of the whole-vocabulary draw's peak memory, and draws the same token in at "
                 f"least {SAMPLER_AGREE_MIN:.1%} of rows")  # fmt: skip
    report = steps.get("sampler")
    if report is None or not report["results"]:
        return checks.missing("sampler-peak", criterion, "sampler")
    largest = max(report["results"], key=lambda r: (r["vocab"] * r["rows"], r["rows"]))
    peak, ms = largest["peak_mib"], largest["ms"]
    ok = peak["blocked"] * SAMPLER_PEAK_FRACTION <= peak["whole"] and largest["agree"] >= SAMPLER_AGREE_MIN
    checks.verdict("sampler-peak", ok, criterion,
                   f"{report['device']}: V={largest['vocab']} R={largest['rows']}: peak whole {peak['whole']:.1f} MiB, "
                   f"blocked {peak['blocked']:.1f} MiB; agree {largest['agree']:.4f}; whole {ms['whole']:.3f} ms, "
                   f"blocked {ms['blocked']:.3f} ms ({report['regime']}){cut_short(report)}", regime=report["regime"],
                   sampler=report["results"])  # fmt: skip


def calls_regime(report: dict) -> str:
    """What the calls step's figures were measured in: device, dtype, compile mode and threads."""
    threads = int(report["threads"])
    return (f"{report.get('device_name', report['device'])}, {report['dtype']}, compile={report['compile']}, "
            f"{threads} thread{'s' if threads != 1 else ''}")  # fmt: skip


def graph_calls(checks: Checks, steps: dict, cuda: bool) -> None:
    """The 8B shape's calls under CUDA graphs: the per-call table, then the checks."""
    report = steps.get("graphs-8b")
    replay_criterion = "8b shape: every timed compiled call replayed a CUDA graph, no cudagraph skips"
    ratio_criterion = (f"8b shape, CUDA graphs: a 2B-row call <= {RATIO_2B_B_MAX:.2f}x a B-row call at "
                       f"B = {RATIO_BLOCK} (memory-bound calls)")  # fmt: skip
    floor_criterion = (f"8b shape, CUDA graphs: every timed call of R = 1, B or 2B rows <= {HBM_FLOOR_MAX:g}x the HBM "
                       "floor (it achieves >= half the device-to-device copy bandwidth)")  # fmt: skip
    run = None if report is None or not report["runs"] else next(iter(report["runs"].values()))
    graph_vs_eager(checks, run, report)
    if run is None or not run.get("calls"):
        for name, criterion in (("graph-replays-8b", replay_criterion), ("memory-bound-8b", ratio_criterion),
                                ("hbm-floor-8b", floor_criterion)):  # fmt: skip
            checks.missing(name, criterion, "graphs-8b")
        return
    calls, ratios = run["calls"], run["ratios_2B_B"]
    first = calls[0]
    where = f" ({calls_regime(report)})"
    replay_criterion, ratio_criterion, floor_criterion = (c + where for c in (replay_criterion, ratio_criterion,
                                                                              floor_criterion))  # fmt: skip
    checks.say(f"8b shape ({run['params'] / 1e9:.2f}B parameters, {calls_regime(report)}): weight bytes "
               f"{first['weight_bytes'] / 1e9:.2f} GB; device-to-device copy "
               f"{first['copy_gbs']:.1f} GB/s; compile s per shape: "
               + ", ".join(f"{k} {v:.0f}" for k, v in run.get("compile_s", {}).items()))  # fmt: skip
    checks.say("HBM floor of a call = (weights + its K/V read + the K/V its masked SDPA repeats to the query heads, "
               "written and read) / the copy bandwidth")  # fmt: skip
    checks.say("| C | B | call | R | compiled ms | eager ms | products ms | weights GB | KV read GB | KV repeat GB | "
               "HBM floor ms | compiled / HBM | achieved GB/s |")  # fmt: skip
    checks.say("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in calls:
        if c["kind"] == "linear-draft":
            continue  # the same B rows as linear-verify
        moved = c.get("traffic") or {"weights": c["weight_bytes"], "kv_read": math.nan, "kv_repeat": math.nan}
        checks.say(f"| {c['prefix']} | {c['block']} | {c['kind']} | {c['rows']} | {c['compiled_ms']:.3f} | "
                   f"{c['eager_ms']:.3f} | {c['products_ms']:.3f} | {moved['weights'] / 1e9:.2f} | "
                   f"{moved['kv_read'] / 1e9:.3f} | {moved['kv_repeat'] / 1e9:.3f} | {c['compiled_hbm_floor_ms']:.3f} | "
                   f"{c['compiled_hbm']:.2f} | {c['compiled_gbs']:.1f} |")  # fmt: skip
    ratio_text = ", ".join(f"B={r['block']}: eager {r['eager']:.2f}x, compiled {r['compiled']:.2f}x" for r in ratios)
    checks.add("ratio-2B-B-8b", "INFO", f"8b shape: 2B-row call / B-row call, eager and compiled{where}",
               ratio_text or "no block timed both calls", ratios=ratios)  # fmt: skip
    numbers = {"copy_gbs": first["copy_gbs"], "compiled_hbm_floor_ms": first["compiled_hbm_floor_ms"],
               "weight_bytes": first["weight_bytes"], "traffic": first.get("traffic")}  # fmt: skip
    replayed = [c["graph_replays_min"] for c in calls]
    if not cuda or report["compile"] != "reduce-overhead" or any(r is None for r in replayed):
        reason = NO_CUDA if not cuda else f"compile={report['compile']} records no CUDA graphs"
        checks.add("graph-replays-8b", "SKIP", replay_criterion, f"{reason}: no graph can replay")
        checks.add("memory-bound-8b", "SKIP", ratio_criterion, f"{reason}: ratios reported above only")
        checks.add("hbm-floor-8b", "SKIP", floor_criterion, f"{reason}: the toy shape's calls are not memory-bound")
        return
    skips = max(c["cudagraph_skips"] for c in calls)
    checks.verdict("graph-replays-8b", min(replayed) >= 1 and skips == 0, replay_criterion,
                   f"fewest replays in a call {min(replayed)}, most skips {skips}")  # fmt: skip
    at = [r["compiled"] for r in ratios if r["block"] == RATIO_BLOCK]
    if at:
        checks.verdict("memory-bound-8b", max(at) <= RATIO_2B_B_MAX, ratio_criterion, f"{fmt(max(at))}x", ratio=max(at))
    else:
        checks.add("memory-bound-8b", "FAIL", ratio_criterion, f"no 2B/B ratio at B = {RATIO_BLOCK} (not timed, or "
                   "the step was cut short before it)")  # fmt: skip
    shown = [c for c in calls if c["kind"] in FLOOR_KINDS]
    if not shown:
        return checks.add("hbm-floor-8b", "FAIL", floor_criterion, "no call of R = 1, B or 2B rows was timed")
    highest = max(c["compiled_hbm"] for c in shown)
    checks.verdict("hbm-floor-8b", highest <= HBM_FLOOR_MAX, floor_criterion,
                   f"largest compiled / HBM floor {highest:.2f}x, lowest achieved "
                   f"{min(c['compiled_gbs'] for c in shown):.1f} GB/s of {first['copy_gbs']:.1f}", **numbers)  # fmt: skip


def graph_vs_eager(checks: Checks, run: dict | None, report: dict | None) -> None:
    """Every timed compiled call was checked against the eager call of the same input, and none differs."""
    criterion = ("8b shape: every timed compiled call's logits equal the eager call's on the same input within the "
                 "bfloat16 tolerance, argmax agreement >= 0.99 (or every differing row a near tie)")  # fmt: skip
    if run is None or "graph_vs_eager" not in run:
        return checks.missing("graph-vs-eager-8b", criterion, "graphs-8b")
    compared = run["graph_vs_eager"]
    bad = [c for c in compared if not c["pass"]]
    unchecked = sorted({(c["block"], c["kind"]) for c in run.get("calls", [])}
                       - {(c["block"], c["kind"]) for c in compared if c["pass"]})  # fmt: skip
    where = f" ({calls_regime(report)})"
    if bad:
        detail = GRAPH_DIFFERS + ": " + "; ".join(
            f"B={c['block']} {c['kind']} ({c['rows']} rows): max |diff| {fmt(c['max_abs_logit_diff'])} > "
            f"{fmt(c['tolerance'])} or argmax agreement {fmt(c['argmax_agreement'])}" for c in bad)  # fmt: skip
        return checks.add("graph-vs-eager-8b", "FAIL", criterion + where, detail, graph_vs_eager=compared)
    if unchecked or not compared:
        return checks.add("graph-vs-eager-8b", "FAIL", criterion + where, "timed without a comparison: "
                          + (", ".join(f"B={b} {k}" for b, k in unchecked) or "no call compared"))  # fmt: skip
    worst = max(compared, key=lambda c: c["max_abs_logit_diff"] / c["tolerance"])
    checks.verdict("graph-vs-eager-8b", True, criterion + where,
                   f"{len(compared)} calls compared; largest |diff| {fmt(worst['max_abs_logit_diff'])} of tolerance "
                   f"{fmt(worst['tolerance'])} (B={worst['block']} {worst['kind']}); lowest argmax agreement "
                   f"{fmt(min(c['argmax_agreement'] for c in compared))}", graph_vs_eager=compared)  # fmt: skip


def concurrency(checks: Checks, steps: dict) -> None:
    runs_criterion = "every (schedule, C) job wrote all its responses"
    audit_criterion = "no lossless output diverges from AR's at the same C without a recorded near-tie"
    report = steps.get("concurrency-8b")
    if report is None:
        checks.missing("concurrency-runs", runs_criterion, "concurrency-8b")
        return checks.missing("concurrency-audit", audit_criterion, "concurrency-8b")
    if not report["done"]:
        written = ", ".join(f"{name}: {n}" for name, n in report["responses"].items()) or "none"
        detail = f"the step was cut short; responses written: {written}"
        checks.add("concurrency-runs", "FAIL", runs_criterion, detail, responses=report["responses"])
        return checks.add("concurrency-audit", "FAIL", audit_criterion, "no analysis (the step was cut short)")
    expected = report["limit"]
    short = [f"{row['Method']} C={row['C']}: {row['Responses']}" for row in report["table"]
             if int(row["Responses"]) != expected]  # fmt: skip
    jobs = {(row["Method"], row["C"]) for row in report["table"]}
    checks.verdict("concurrency-runs", not short and len(jobs) == len(report["schedules"]) * len(report["concurrency"]),
                   f"every (schedule, C) job wrote all {expected} responses", "; ".join(short))  # fmt: skip
    audit = report["audit"]
    checks.verdict("concurrency-audit", audit["Unexplained"] == 0, audit_criterion,
                   ", ".join(f"{k.lower()} {v}" for k, v in audit.items()), **audit)  # fmt: skip
    for row in report["crossover"]:
        if row["Method"] == "Packed-SS":
            ratios = [f"C={r['C']}: {fmt(float(r['Time / Linear-SS']))}" for r in report["table"]
                      if r["Method"] == "Packed-SS" and r["Time / Linear-SS"]]  # fmt: skip
            regime = report.get("regime", CONCURRENCY_REGIME)
            measured = report["measured_in"]
            checks.add("crossover-8b", "INFO", f"Packed/Linear time by C, and the smallest C at which it reaches 1 "
                       f"({regime}: the host's dispatch, not the GPU's memory; measured in: {measured})",
                       f"{', '.join(ratios)}; crossover {row['Crossover C']} (CI above 1: {row['CI above 1']})",
                       regime=regime, measured_in=measured)  # fmt: skip


def steps_table(plan: list[dict]) -> list[str]:
    lines = ["| step | budget s | seconds | exit status |", "|---|---:|---:|---:|"]
    for row in plan:
        note = " (cut short by its budget)" if row["rc"] in CUT_SHORT else ""
        lines.append(f"| {row['step']} | {row['budget_s']} | {row['seconds']} | {row['rc']}{note} |")
    return lines


def not_planned(checks: Checks, step: str) -> None:
    for name in STEP_CHECKS[step]:
        checks.add(name, "SKIP", f"the checks of step {step}", f"step {step} was not in this run's plan (ONLY/SKIP)")


def summarize(results: Path, cuda: bool) -> Checks:
    steps = {step: report for step in STEPS if (report := load(results, step)) is not None}
    plan, run = plan_rows(results), planned(results)
    cut = {row["step"] for row in plan if row["rc"] in CUT_SHORT}
    checks = Checks()
    judges = {"preflight": lambda: preflight(checks, steps, cut), "audit-fp32": lambda: exactness(checks, steps),
              "audit-bf16": lambda: audit_bf16(checks, steps), "graphs-8b": lambda: graph_calls(checks, steps, cuda),
              "syncs": lambda: syncs(checks, steps), "sampler": lambda: sampler(checks, steps),
              "concurrency-8b": lambda: concurrency(checks, steps)}  # fmt: skip
    for step, judge in judges.items():
        judge() if step in run else not_planned(checks, step)
    left_out = [step for step in (*STEPS, "summary", "pack") if step not in run]
    ran = f"steps run: {', '.join(run)}" + (f"; not run (ONLY/SKIP): {', '.join(left_out)}" if left_out else "")
    date = time.strftime("%Y-%m-%d %H:%M:%S")
    summary = {"date": date, "cuda": cuda, "commit": os.environ.get("PACKEDSS_COMMIT") or None, "steps_planned": run,
               "steps_not_run": left_out, "partial": bool(left_out), "plan": plan, "checks": checks.items,
               "failed": checks.failed, "steps": steps}  # fmt: skip
    (results / "gpu_check.json").write_text(json.dumps(summary, indent=1) + "\n")
    code = f"code: packedss {summary['commit'] or 'at an unknown commit (no .git, no PACKEDSS_COMMIT)'}"
    text = [f"# gpu_check {date}" + (" (a partial run)" if left_out else ""), "", ran, code, "", *steps_table(plan), "",
            *checks.lines]  # fmt: skip
    (results / "summary.md").write_text("\n".join(text) + "\n")
    return checks


def main(argv=None) -> int:
    ap = ArgumentParser(prog="scripts/gpu_summary.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", required=True, help="the folder the steps wrote their JSON to (gpu_check.sh's RESULTS)")
    ap.add_argument("--cuda", action="store_true", help="the steps ran on CUDA (else CUDA-only checks are skipped)")
    args = ap.parse_args(argv)
    results = Path(args.results)
    if not results.is_dir():
        raise PackedSSError(f"--results {results} is not a folder; give the RESULTS folder that gpu_check.sh's steps wrote to")
    checks = summarize(results, args.cuda)
    counts = {s: sum(c["status"] == s for c in checks.items) for s in ("PASS", "FAIL", "SKIP", "INFO")}
    print(", ".join(f"{v} {k}" for k, v in counts.items()) + f"; every number in {results / 'gpu_check.json'}")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run_cli(lambda: main(sys.argv[1:]))
