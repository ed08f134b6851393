"""scripts/gpu_check.sh and its verdicts (scripts/gpu_summary.py): the checks decide PASS and FAIL
by their criteria on the numbers the steps wrote, skip the CUDA-only ones on a CPU with the
reason, refuse bad input with one line, and the dry run goes through end to end on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from packedss.benchmark.calls import ratios_2b_b
from packedss.paths import PROJECT_ROOT

summary = SimpleNamespace(**__import__("runpy").run_path(str(PROJECT_ROOT / "scripts" / "gpu_summary.py")))
gpu_calls = SimpleNamespace(**__import__("runpy").run_path(str(PROJECT_ROOT / "scripts" / "gpu_calls.py")))
SCRIPT = PROJECT_ROOT / "scripts" / "gpu_check.sh"


def graphs_report(compiled_ms: dict, replays: int = 3, skips: int = 0, copy_gbs: float = 4000.0,
                  weight_bytes: int = 16 * 10**9) -> dict:  # fmt: skip
    """A bench_calls --compile report of CUDA graphs: compiled_ms[(block, kind)]; eager calls 10 ms."""
    hbm = 1000 * weight_bytes / (copy_gbs * 1e9)
    calls = []
    for (block, kind), ms in compiled_ms.items():
        rows = {"ar": 1, "linear-draft": block, "linear-verify": block, "packed": 2 * block,
                "quadratic": block * (block + 1)}[kind]  # fmt: skip
        calls.append({"prefix": 1024, "block": block, "kind": kind, "rows": rows, "eager_ms": 10.0, "compiled_ms": ms,
                      "products_ms": ms / 2, "hbm_floor_ms": hbm, "compiled_hbm": ms / hbm, "copy_gbs": copy_gbs,
                      "compiled_gbs": weight_bytes / ms * 1e-6, "weight_bytes": weight_bytes,
                      "graph_replays_min": replays, "cudagraph_skips": skips})  # fmt: skip
    return {"device": "cuda", "device_name": "a GPU", "dtype": "bfloat16", "compile": "reduce-overhead",
            "runs": {"sdpa": {"params": 8e9, "calls": calls, "ratios_2B_B": ratios_2b_b(calls)}}}  # fmt: skip


def calls_at(ratio_32: float, hbm_factor: float = 1.2) -> dict:
    """Compiled ms per (B, kind): R = 1 and B at hbm_factor x the 4 ms floor, 2B at ratio x B (B = 32)."""
    out = {}
    for block in (8, 16, 32):
        base = 4.0 * hbm_factor
        out |= {(block, "ar"): base, (block, "linear-verify"): base, (block, "packed"): base * (ratio_32 if block == 32 else 1.1)}
    out[(8, "quadratic")] = 6.0
    return out


def judge(tmp_path, which: str, reports: dict, cuda: bool = True) -> dict:
    for step, report in reports.items():
        (tmp_path / f"{step}.json").write_text(json.dumps(report))
    summary.main(["--out", str(tmp_path), "--pass", which] + (["--cuda"] if cuda else []))
    checks = json.loads((tmp_path / "gpu_check.json").read_text())["passes"][which]["checks"]
    return {c["name"]: c for c in checks}


def compiled_tiny(graph_calls, skips=0.0, dispatch=100.0) -> dict:
    return {"table": [{"Schedule": "Packed-SS", "Regime": "eager", "Compiled calls (%)": None, "CUDA-graph calls (%)": None,
                       "Graph skips": None, "= eager (%)": None},
                      {"Schedule": "Packed-SS", "Regime": "compiled:reduce-overhead", "Compiled calls (%)": dispatch,
                       "CUDA-graph calls (%)": graph_calls, "Graph skips": skips, "= eager (%)": 100.0}]}  # fmt: skip


def test_the_8b_checks_pass_on_memory_bound_graph_calls_and_fail_on_each_fault(tmp_path, capsys):
    good = judge(tmp_path, "2", {"graphs-8b": graphs_report(calls_at(1.1)), "compiled-tiny": compiled_tiny(100.0)})
    assert {n: c["status"] for n, c in good.items()} == {
        "compiled-dispatch": "PASS", "cuda-graph-calls": "PASS", "ratio-2B-B-8b": "INFO", "graph-replays-8b": "PASS",
        "memory-bound-8b": "PASS", "hbm-floor-8b": "PASS"}  # fmt: skip
    assert good["memory-bound-8b"]["ratio"] == pytest.approx(1.1)
    assert good["hbm-floor-8b"]["hbm_floor_ms"] == pytest.approx(4.0) and good["hbm-floor-8b"]["copy_gbs"] == 4000.0
    printed = capsys.readouterr().out
    assert "PASS: memory-bound-8b: 8b shape, CUDA graphs: a 2B-row call <= 1.30x a B-row call at B = 32" in printed
    assert "device-to-device copy 4000.0 GB/s -> HBM floor 4.000 ms" in printed
    assert "| 1024 | 8 | quadratic | 72 | 6.000 |" in printed  # the B(B+1) row beside R = 1, B and 2B
    assert judge(tmp_path, "2", {"graphs-8b": graphs_report(calls_at(1.5))})["memory-bound-8b"]["status"] == "FAIL"
    assert judge(tmp_path, "2", {"graphs-8b": graphs_report(calls_at(1.1, hbm_factor=2.5))})["hbm-floor-8b"]["status"] == "FAIL"
    assert judge(tmp_path, "2", {"graphs-8b": graphs_report(calls_at(1.1), replays=0)})["graph-replays-8b"]["status"] == "FAIL"
    assert judge(tmp_path, "2", {"graphs-8b": graphs_report(calls_at(1.1), skips=1)})["graph-replays-8b"]["status"] == "FAIL"
    assert judge(tmp_path, "2", {"compiled-tiny": compiled_tiny(95.0)})["cuda-graph-calls"]["status"] == "FAIL"
    assert judge(tmp_path, "2", {"compiled-tiny": compiled_tiny(100.0, skips=2.0)})["cuda-graph-calls"]["status"] == "FAIL"
    assert judge(tmp_path, "2", {"compiled-tiny": compiled_tiny(100.0, dispatch=90.0)})["compiled-dispatch"]["status"] == "FAIL"
    assert summary.main(["--out", str(tmp_path), "--pass", "2", "--cuda"]) == 1


def test_a_missing_step_fails_its_checks_and_a_cpu_run_skips_the_cuda_ones_with_a_reason(tmp_path):
    (tmp_path / "graphs-8b.json").unlink(missing_ok=True)
    missing = judge(tmp_path, "2", {})
    assert {n: c["status"] for n, c in missing.items()} == dict.fromkeys(
        ("compiled-dispatch", "cuda-graph-calls", "graph-replays-8b", "memory-bound-8b", "hbm-floor-8b"), "FAIL")
    assert "no result from step graphs-8b" in missing["memory-bound-8b"]["detail"]
    cpu = graphs_report(calls_at(3.0), replays=None, skips=None) | {"device": "cpu", "compile": "reduce-overhead"}
    skipped = judge(tmp_path, "2", {"graphs-8b": cpu, "compiled-tiny": compiled_tiny("n/a", "n/a")}, cuda=False)
    for name in ("cuda-graph-calls", "graph-replays-8b", "memory-bound-8b", "hbm-floor-8b"):
        assert skipped[name]["status"] == "SKIP" and "no CUDA device" in skipped[name]["detail"], name
    assert skipped["compiled-dispatch"]["status"] == "PASS"


def decode_report(device: str, unexplained: int = 0, syncs_ok: bool = True) -> dict:
    syncs = [{"schedule": s, "temperature": t, "iterations": 5, "syncs": 6, "syncs_per_iteration": 1.2, "bound": 7,
              "pass": syncs_ok or s != "packed"} for s in ("ar", "linear", "quadratic", "packed") for t in (0.0, 1.0)]  # fmt: skip
    audit = [{"schedule": s, "width": w, "equal": 9, "numerical": 1 - unexplained, "unexplained": unexplained}
             for s in ("linear", "quadratic", "packed") for w in (8, 16, 31)]  # fmt: skip
    return {"device": device, "dtype": "bfloat16", "syncs": syncs, "audit": audit, "failed": []}


def test_the_decode_checks_read_syncs_and_audit_counts(tmp_path):
    exact = {"table": [{"Schedule": "AR", "Match (%)": 100.0}, {"Schedule": "Packed-SS", "Match (%)": 100.0}]}
    good = judge(tmp_path, "1", {"decode-bf16": decode_report("cuda"), "exact-fp32": exact})
    assert good["syncs"]["status"] == "PASS" and good["audit-bf16"]["status"] == "PASS"
    assert good["fp32-exact"]["status"] == "PASS"
    assert "linear W=8: 9/1/0" in good["audit-bf16"]["detail"]
    assert judge(tmp_path, "1", {"decode-bf16": decode_report("cuda", unexplained=1)})["audit-bf16"]["status"] == "FAIL"
    assert judge(tmp_path, "1", {"decode-bf16": decode_report("cuda", syncs_ok=False)})["syncs"]["status"] == "FAIL"
    inexact = {"table": [{"Schedule": "AR", "Match (%)": 100.0}, {"Schedule": "Packed-SS", "Match (%)": 96.7}]}
    assert judge(tmp_path, "1", {"exact-fp32": inexact})["fp32-exact"]["status"] == "FAIL"
    cpu = judge(tmp_path, "1", {"decode-bf16": decode_report("cpu")}, cuda=False)
    assert cpu["syncs"]["status"] == "SKIP" and "set_sync_debug_mode" in cpu["syncs"]["criterion"]
    assert cpu["syncs-readbacks-cpu"]["status"] == "PASS" and cpu["audit-bf16"]["status"] == "SKIP"
    assert cpu["audit-bf16-cpu"]["status"] == "PASS"


def test_bad_input_is_one_error_line_and_status_2(tmp_path):
    run = lambda env: subprocess.run(["bash", str(SCRIPT)], env={**os.environ, "PY": sys.executable, **env},  # noqa: E731
                                     capture_output=True, text=True, timeout=120)  # fmt: skip
    for env, message in (({"PASS": "eager"}, "error: PASS=eager is not a pass; use PASS=1, PASS=2, PASS=3 or PASS=all"),
                         ({"DRY": "yes"}, "error: DRY=yes; use DRY=1"),
                         ({"COMPILE": "none"}, "error: COMPILE=none; use reduce-overhead"),
                         ({"PY": str(tmp_path / "no-python")}, "error: no Python found"),
                         ({"OUT": "/proc/gpu_check"}, "error: cannot write to OUT=/proc/gpu_check")):  # fmt: skip
        done = run(env)
        assert done.returncode == 2 and done.stderr.strip().startswith(message), (env, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "; " in done.stderr  # what was wrong; how to fix it
    done = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "gpu_summary.py"), "--out",
                           str(tmp_path / "absent"), "--pass", "1"], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and done.stderr.strip().startswith("error: --out ") and "is not a folder" in done.stderr
    done = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "gpu_summary.py"), "--out", str(tmp_path),
                           "--pass", "4"], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and done.stderr.strip().startswith("error: argument --pass: invalid choice")


def test_compiled_calls_time_quadratic_only_at_the_blocks_asked_for_and_give_2b_over_b(tmp_path, capsys):
    out = tmp_path / "graphs.json"
    argv = ["--shape", "test", "--device", "cpu", "--blocks", "1,2", "--quadratic-blocks", "1", "--prefix", "3",
            "--warmup", "0", "--iters", "1", "--compile", "default", "--stream-mib", "1", "--json", str(out)]  # fmt: skip
    assert gpu_calls.main(argv) == 0
    printed = capsys.readouterr().out
    run = json.loads(out.read_text())["runs"]["packedss"]
    kinds = sorted((c["block"], c["kind"]) for c in run["calls"])
    assert (1, "quadratic") in kinds and (2, "quadratic") not in kinds
    assert sorted(run["compile_s"]) == ["C=3: 1 rows", "C=3: 2 rows", "C=3: 4 rows"]
    by = {(c["block"], c["kind"]): c for c in run["calls"]}
    assert [r["block"] for r in run["ratios_2B_B"]] == [1, 2]
    for r in run["ratios_2B_B"]:
        packed, verify = by[(r["block"], "packed")], by[(r["block"], "linear-verify")]
        assert r["eager"] == pytest.approx(packed["eager_ms"] / verify["eager_ms"])
        assert r["compiled"] == pytest.approx(packed["compiled_ms"] / verify["compiled_ms"])
    for c in run["calls"]:
        assert c["compiled_hbm"] == pytest.approx(c["compiled_ms"] / c["hbm_floor_ms"])
        assert c["compiled_gbs"] == pytest.approx(c["weight_bytes"] / c["compiled_ms"] * 1e-6)
        assert c["graph_replays_min"] is None and c["cudagraph_skips"] is None  # no CUDA graphs on a CPU
    assert "| C | B | eager 2B / B | compiled 2B / B |" in printed and "device-to-device copy" in printed
    capsys.readouterr()
    for bad, message in ((["--shape", "tset"], "error: unknown --shape tset (did you mean test?)"),
                         (["--blocks", "2", "--quadratic-blocks", "3"],
                          "error: --quadratic-blocks 3 not all among the block sizes 2")):  # fmt: skip
        with pytest.raises(SystemExit) as stopped:
            gpu_calls.main(["--device", "cpu", "--json", str(out), "--shape", "test", *bad])
        err = capsys.readouterr().err.strip()
        assert stopped.value.code == 2 and err.startswith(message) and len(err.splitlines()) == 1


@pytest.mark.slow
def test_the_dry_run_goes_through_on_the_cpu(tmp_path):
    started = time.monotonic()
    env = {**os.environ, "DRY": "1", "PY": sys.executable, "OUT": str(tmp_path)}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == f"gpu_check: all checks passed; results in {tmp_path}"
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    checks = {c["name"]: c for which in ("1", "2") for c in report["passes"][which]["checks"]}
    passed = ("fp32-exact", "syncs-readbacks-cpu", "audit-bf16-cpu", "compiled-dispatch")
    skipped = ("syncs", "audit-bf16", "graph-replays-3b", "graph-replays-8b", "memory-bound-8b", "hbm-floor-8b",
               "cuda-graph-calls")  # fmt: skip
    for name in passed:
        assert checks[name]["status"] == "PASS", checks[name]
        assert f"PASS: {name}: {checks[name]['criterion']}" in done.stdout
    for name in skipped:
        assert checks[name]["status"] == "SKIP" and "no CUDA device" in checks[name]["detail"], checks[name]
    assert all(c["criterion"] for c in checks.values())
    graphs = report["passes"]["2"]["steps"]["graphs-8b"]["runs"]["packedss"]
    rows = {c["kind"]: c["rows"] for c in graphs["calls"]}
    assert rows == {"ar": 1, "linear-draft": 1, "linear-verify": 1, "packed": 2, "quadratic": 2}  # DRY: B = 1
    for c in graphs["calls"]:
        assert c["copy_gbs"] > 0 and c["hbm_floor_ms"] > 0 and c["compiled_gbs"] > 0 and c["products_ms"] > 0
    assert [r["block"] for r in graphs["ratios_2B_B"]] == [1]
    audit = report["passes"]["1"]["steps"]["decode-bf16"]["audit"]
    assert audit and all(a["unexplained"] == 0 for a in audit)
    print(f"DRY=1 gpu_check: {time.monotonic() - started:.0f} s")


def concurrency_report(unexplained: int = 0, responses: int = 4, ratios=(0.7, 0.9, 1.05)) -> dict:
    """A gpu_concurrency.py report: four schedules at C = 1, 4, 16 with Packed/Linear `ratios`."""
    table = []
    for method in ("AR", "Linear-SS", "Packed-SS", "Quadratic-SS"):
        for c, ratio in zip((1, 4, 16), ratios):
            table.append({"Method": method, "C": str(c), "Responses": str(responses),
                          "Time / Linear-SS": "" if method == "Linear-SS" else str(ratio)})  # fmt: skip
    crossover = [{"Method": "Packed-SS", "Crossover C": "16", "CI above 1": "no"}]
    return {"limit": 4, "schedules": ["ar", "linear", "packed", "quadratic"], "concurrency": [1, 4, 16],
            "table": table, "crossover": crossover, "audit": {"Equal": 30, "Numerical": 2, "Unexplained": unexplained}}


def test_the_concurrency_checks_pass_on_complete_exact_runs_and_fail_on_each_fault(tmp_path, capsys):
    good = judge(tmp_path, "3", {"concurrency-8b": concurrency_report()})
    assert good["concurrency-runs"]["status"] == good["concurrency-audit"]["status"] == "PASS"
    assert good["crossover-8b"]["status"] == "INFO"
    assert "C=1: 0.7, C=4: 0.9, C=16: 1.05; crossover 16" in good["crossover-8b"]["detail"]
    assert judge(tmp_path, "3", {"concurrency-8b": concurrency_report(unexplained=1)})["concurrency-audit"]["status"] == "FAIL"
    assert judge(tmp_path, "3", {"concurrency-8b": concurrency_report(responses=3)})["concurrency-runs"]["status"] == "FAIL"
    (tmp_path / "concurrency-8b.json").unlink()
    assert judge(tmp_path, "3", {})["concurrency-runs"]["status"] == "FAIL"


@pytest.mark.slow
def test_the_dry_concurrency_pass_goes_through_on_the_cpu(tmp_path):
    env = {**os.environ, "DRY": "1", "PASS": "3", "PY": sys.executable, "OUT": str(tmp_path)}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    checks = {c["name"]: c for c in json.loads((tmp_path / "gpu_check.json").read_text())["passes"]["3"]["checks"]}
    assert checks["concurrency-runs"]["status"] == checks["concurrency-audit"]["status"] == "PASS"
    assert checks["crossover-8b"]["status"] == "INFO" and "crossover" in checks["crossover-8b"]["detail"]
    report = json.loads((tmp_path / "concurrency-8b.json").read_text())
    assert sorted({row["C"] for row in report["table"]}) == ["1", "2"]
    assert len(list((tmp_path / "concurrency-8b" / "records").rglob("*-C2-*.jsonl"))) == 4
