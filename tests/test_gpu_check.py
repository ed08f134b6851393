"""scripts/gpu_check.sh and its verdicts (scripts/gpu_summary.py): the plan fits its window, the
checks decide PASS and FAIL by their criteria on the numbers the steps wrote (also on what a step
cut short left), skip the CUDA-only ones on a CPU with the reason, the sync counter counts torch's
sync warnings and not its notice, the steps write their JSON as they measure, bad input is one
line, and (slow) the dry run goes through on the CPU, also from an empty environment (one dry run
serves both: the fixture gpu_dry_run of tests/conftest.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import warnings
from types import SimpleNamespace

import pytest
import torch

from packedss.benchmark.calls import ratios_2b_b
from packedss.paths import PROJECT_ROOT

summary = SimpleNamespace(**__import__("runpy").run_path(str(PROJECT_ROOT / "scripts" / "gpu_summary.py")))
gpu_calls = __import__("runpy").run_path(str(PROJECT_ROOT / "scripts" / "gpu_calls.py"))
check_decode = __import__("runpy").run_path(str(PROJECT_ROOT / "scripts" / "check_decode.py"))
gpu_concurrency = __import__("runpy").run_path(str(PROJECT_ROOT / "scripts" / "gpu_concurrency.py"))
SCRIPT = PROJECT_ROOT / "scripts" / "gpu_check.sh"
PLAN_STEPS = ["wheels", "preflight", "audit-fp32", "audit-bf16", "graphs-8b", "syncs", "sampler", "concurrency-8b", "summary",
              "pack"]
WINDOW_S = 480
# torch's own texts under torch.cuda.set_sync_debug_mode("warn"): the one-time notice of
# torch/csrc/cuda/Module.cpp, and c10's warn_or_error_on_sync (with the suffix TORCH_WARN adds).
SYNC_NOTICE = ("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing "
               "operations (Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:900.)")  # fmt: skip
SYNC_WARNING = "called a synchronizing CUDA operation (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:171.)"


def graphs_report(compiled_ms: dict, replays: int = 3, skips: int = 0, copy_gbs: float = 4000.0,
                  weight_bytes: int = 16 * 10**9) -> dict:  # fmt: skip
    """A gpu_calls.py report under CUDA graphs: compiled_ms[(block, kind)]; eager calls 10 ms; the
    floor's traffic is the weights alone; every call compared with eager and equal."""
    hbm = 1000 * weight_bytes / (copy_gbs * 1e9)
    calls, compared = [], []
    for (block, kind), ms in compiled_ms.items():
        rows = {"linear-draft": block, "linear-verify": block, "packed": 2 * block}[kind]
        calls.append({"prefix": 1024, "block": block, "kind": kind, "rows": rows, "eager_ms": 10.0, "compiled_ms": ms,
                      "products_ms": ms / 2, "compiled_hbm_floor_ms": hbm, "compiled_hbm": ms / hbm, "copy_gbs": copy_gbs,
                      "compiled_gbs": weight_bytes / ms * 1e-6, "weight_bytes": weight_bytes,
                      "traffic": {"weights": weight_bytes, "kv_read": 0, "kv_repeat": 0, "total": weight_bytes},
                      "graph_replays_min": replays, "cudagraph_skips": skips})  # fmt: skip
        compared.append({"prefix": 1024, "block": block, "kind": kind, "rows": rows, "max_abs_logit_diff": 0.1,
                         "argmax_agreement": 1.0, "tolerance": 0.5, "pass": True})  # fmt: skip
    return {"device": "cuda", "device_name": "a GPU", "dtype": "bfloat16", "compile": "reduce-overhead", "threads": 16,
            "runs": {"sdpa": {"params": 8e9, "calls": calls, "ratios_2B_B": ratios_2b_b(calls),
                              "graph_vs_eager": compared, "compile_s": {"C=1024: 64 rows": 41.0}}}}  # fmt: skip


def calls_at(ratio_32: float, hbm_factor: float = 1.2, blocks=(32, 16, 8)) -> dict:
    """The plan's calls (2B rows at every B, B rows where 2B of another block) at hbm_factor x the
    4 ms floor, 2B at ratio x B at B = 32."""
    out = {}
    for block in blocks:
        base = 4.0 * hbm_factor
        out[(block, "packed")] = base * (ratio_32 if block == 32 else 1.1)
        if block != 8:
            out |= {(block, "linear-draft"): base, (block, "linear-verify"): base}
    return out


def judge(tmp_path, reports: dict, cuda: bool = True) -> dict:
    for step in summary.STEPS:
        (tmp_path / f"{step}.json").unlink(missing_ok=True)
    for step, report in reports.items():
        (tmp_path / f"{step}.json").write_text(json.dumps(report))
    summary.main(["--results", str(tmp_path)] + (["--cuda"] if cuda else []))
    return {c["name"]: c for c in json.loads((tmp_path / "gpu_check.json").read_text())["checks"]}


def test_the_8b_checks_pass_on_memory_bound_graph_calls_and_fail_on_each_fault(tmp_path, capsys):
    good = judge(tmp_path, {"graphs-8b": graphs_report(calls_at(1.1))})
    assert {n: good[n]["status"] for n in ("ratio-2B-B-8b", "graph-replays-8b", "memory-bound-8b", "hbm-floor-8b")} == {
        "ratio-2B-B-8b": "INFO", "graph-replays-8b": "PASS", "memory-bound-8b": "PASS", "hbm-floor-8b": "PASS"}  # fmt: skip
    assert good["memory-bound-8b"]["ratio"] == pytest.approx(1.1)
    assert good["hbm-floor-8b"]["compiled_hbm_floor_ms"] == pytest.approx(4.0) and good["hbm-floor-8b"]["copy_gbs"] == 4000.0
    assert "hbm_floor_ms" not in good["hbm-floor-8b"]  # one name for the compiled call's floor
    printed = capsys.readouterr().out
    assert "PASS: memory-bound-8b: 8b shape, CUDA graphs: a 2B-row call <= 1.30x a B-row call at B = 32" in printed
    regime = "(a GPU, bfloat16, compile=reduce-overhead, 16 threads)"  # device, dtype, compiled, threads
    assert "8b shape (8.00B parameters, a GPU, bfloat16, compile=reduce-overhead, 16 threads): weight bytes" in printed
    for name in ("ratio-2B-B-8b", "graph-replays-8b", "memory-bound-8b", "hbm-floor-8b", "graph-vs-eager-8b"):
        assert good[name]["criterion"].endswith(regime), name
    assert summary.calls_regime(graphs_report({}) | {"threads": 1}).endswith(", 1 thread")
    assert "device-to-device copy 4000.0 GB/s" in printed and "C=1024: 64 rows 41" in printed
    assert "| 1024 | 8 | packed | 16 | 5.280 |" in printed  # B = 8: only Packed-SS's call was timed
    assert "| 16.00 | 0.000 | 0.000 | 4.000 | 1.32 |" in printed  # weights, KV read, KV repeat, floor, call / floor
    assert good["graph-vs-eager-8b"]["status"] == "PASS" and "7 calls compared" in good["graph-vs-eager-8b"]["detail"]
    assert "bfloat16, compile=" in good["graph-vs-eager-8b"]["criterion"]  # the regime it was checked in
    assert [r["block"] for r in good["ratio-2B-B-8b"]["ratios"]] == [16, 32]
    assert judge(tmp_path, {"graphs-8b": graphs_report(calls_at(1.5))})["memory-bound-8b"]["status"] == "FAIL"
    assert judge(tmp_path, {"graphs-8b": graphs_report(calls_at(1.1, hbm_factor=2.5))})["hbm-floor-8b"]["status"] == "FAIL"
    assert judge(tmp_path, {"graphs-8b": graphs_report(calls_at(1.1), replays=0)})["graph-replays-8b"]["status"] == "FAIL"
    assert judge(tmp_path, {"graphs-8b": graphs_report(calls_at(1.1), skips=1)})["graph-replays-8b"]["status"] == "FAIL"
    cut = judge(tmp_path, {"graphs-8b": graphs_report(calls_at(1.1, blocks=(16, 8)))})  # B = 32 never came
    assert cut["memory-bound-8b"]["status"] == "FAIL" and "no 2B/B ratio at B = 32" in cut["memory-bound-8b"]["detail"]
    assert cut["hbm-floor-8b"]["status"] == "PASS"  # judged on the calls that were timed
    assert summary.main(["--results", str(tmp_path), "--cuda"]) == 1


def test_a_graph_that_differs_from_eager_or_was_not_compared_fails_by_name(tmp_path):
    report = graphs_report(calls_at(1.1))
    compared = report["runs"]["sdpa"]["graph_vs_eager"]
    compared[0] |= {"max_abs_logit_diff": 3.2, "argmax_agreement": 0.2, "pass": False}
    bad = judge(tmp_path, {"graphs-8b": report})["graph-vs-eager-8b"]
    assert bad["status"] == "FAIL" and bad["detail"].startswith("graph replay differs from eager: B=32 packed (64 rows)")
    del compared[0]  # a timed call that was never compared
    unchecked = judge(tmp_path, {"graphs-8b": report})["graph-vs-eager-8b"]
    assert unchecked["status"] == "FAIL" and "timed without a comparison: B=32 packed" in unchecked["detail"]
    del report["runs"]["sdpa"]["graph_vs_eager"]
    assert judge(tmp_path, {"graphs-8b": report})["graph-vs-eager-8b"]["status"] == "FAIL"


def test_a_missing_step_fails_its_checks_and_a_cpu_run_skips_the_cuda_ones_with_a_reason(tmp_path):
    missing = judge(tmp_path, {})
    assert {n: c["status"] for n, c in missing.items()} == dict.fromkeys(
        ("preflight", "fp32-exact", "audit-bf16", "graph-vs-eager-8b", "graph-replays-8b", "memory-bound-8b",
         "hbm-floor-8b", "syncs", "sampler-peak", "concurrency-runs", "concurrency-audit"), "FAIL")  # fmt: skip
    assert "no result from step graphs-8b" in missing["memory-bound-8b"]["detail"]
    cpu = graphs_report(calls_at(3.0), replays=None, skips=None) | {"device": "cpu"}
    skipped = judge(tmp_path, {"graphs-8b": cpu, "syncs": decode_report("cpu"), "audit-bf16": decode_report("cpu")},
                    cuda=False)  # fmt: skip
    for name in ("graph-replays-8b", "memory-bound-8b", "hbm-floor-8b", "syncs", "audit-bf16"):
        assert skipped[name]["status"] == "SKIP" and "no CUDA device" in skipped[name]["detail"], name
    assert skipped["syncs-readbacks-cpu"]["status"] == skipped["audit-bf16-cpu"]["status"] == "PASS"


def decode_report(device: str, unexplained: int = 0, numerical: int = 1, syncs_ok: bool = True, done: bool = True) -> dict:
    """check_decode.py's report: syncs of every schedule, the audit at W = 8, 16, 31 of 10 questions."""
    syncs = [{"schedule": s, "temperature": t, "iterations": 5, "syncs": 6, "syncs_per_iteration": 1.2, "bound": 7,
              "pass": syncs_ok or s != "packed"} for s in ("ar", "linear", "quadratic", "packed") for t in (0.0, 1.0)]  # fmt: skip
    audit = [{"schedule": s, "width": w, "equal": 10 - numerical - unexplained, "numerical": numerical,
              "unexplained": unexplained} for s in ("linear", "quadratic", "packed") for w in (8, 16, 31)]  # fmt: skip
    return {"device": device, "dtype": "bfloat16", "syncs": syncs, "audit": audit, "failed": [], "done": done}


def test_the_decode_checks_read_syncs_audit_counts_and_float32_exactness(tmp_path):
    good = judge(tmp_path, {"syncs": decode_report("cuda"), "audit-bf16": decode_report("cuda"),
                            "audit-fp32": decode_report("cuda", numerical=0)})  # fmt: skip
    assert good["syncs"]["status"] == good["audit-bf16"]["status"] == good["fp32-exact"]["status"] == "PASS"
    assert "linear W=8: 9/1/0" in good["audit-bf16"]["detail"]
    assert judge(tmp_path, {"audit-bf16": decode_report("cuda", unexplained=1)})["audit-bf16"]["status"] == "FAIL"
    assert judge(tmp_path, {"syncs": decode_report("cuda", syncs_ok=False)})["syncs"]["status"] == "FAIL"
    # float32 must equal AR token for token: a divergence at a near-tie is no excuse there
    assert judge(tmp_path, {"audit-fp32": decode_report("cuda")})["fp32-exact"]["status"] == "FAIL"
    cut = judge(tmp_path, {"audit-fp32": decode_report("cuda", numerical=0, done=False)})["fp32-exact"]
    assert cut["status"] == "FAIL" and "cut short" in cut["detail"]
    cpu = judge(tmp_path, {"syncs": decode_report("cpu")}, cuda=False)
    assert cpu["syncs"]["status"] == "SKIP" and "set_sync_debug_mode" in cpu["syncs"]["criterion"]


def test_the_preflight_check_passes_on_both_backbones_and_fails_on_a_refusal(tmp_path):
    versions = {"python": "3.12.3", "torch": "2.11.0+cu130", "cuda": "13.0", "transformers": "5.24.0",
                "hydra-core": "1.3.8", "omegaconf": "2.3.1", "gpu": "NVIDIA H200"}  # fmt: skip
    good = {"versions": versions, "line": "versions: ...", "refused": None,
            "backbones": {"Ministral3Model": "takes 'cache'", "Qwen3Model": "takes 'cache'"}}  # fmt: skip
    checks = judge(tmp_path, {"preflight": good})
    assert checks["preflight"]["status"] == "PASS" and checks["versions"]["status"] == "INFO"
    assert checks["versions"]["gpu"] == "NVIDIA H200"
    refused = good | {"backbones": {}, "refused": "transformers 5.17.0: Ministral3Model.forward takes no 'cache' keyword"}
    checks = judge(tmp_path, {"preflight": refused})
    assert checks["preflight"]["status"] == "FAIL" and "takes no 'cache'" in checks["preflight"]["detail"]


def concurrency_report(unexplained: int = 0, responses: int = 16, ratios=(0.7, 1.05)) -> dict:
    """A gpu_concurrency.py report: AR, Linear-SS and Packed-SS at C = 1, 16 with Packed/Linear `ratios`."""
    table = []
    for method in ("AR", "Linear-SS", "Packed-SS"):
        for c, ratio in zip((1, 16), ratios):
            table.append({"Method": method, "C": str(c), "Responses": str(responses),
                          "Time / Linear-SS": "" if method == "Linear-SS" else str(ratio)})  # fmt: skip
    crossover = [{"Method": "Packed-SS", "Crossover C": "16", "CI above 1": "no"}]
    return {"limit": 16, "schedules": ["ar", "linear", "packed"], "concurrency": [1, 16], "responses": {}, "done": True,
            "table": table, "crossover": crossover, "audit": {"Equal": 30, "Numerical": 2, "Unexplained": unexplained},
            "device": "cuda", "measured_in": CONCURRENCY_MEASURED_IN}  # fmt: skip


CONCURRENCY_MEASURED_IN = "eager, bfloat16, 16 threads, NVIDIA H200, cost:nemotron8b:34L:bfloat16:cuda"


def test_the_concurrency_checks_pass_on_complete_exact_runs_and_fail_on_each_fault(tmp_path):
    good = judge(tmp_path, {"concurrency-8b": concurrency_report()})
    assert good["concurrency-runs"]["status"] == good["concurrency-audit"]["status"] == "PASS"
    assert good["crossover-8b"]["status"] == "INFO"
    assert "C=1: 0.7, C=16: 1.05; crossover 16" in good["crossover-8b"]["detail"]
    assert good["crossover-8b"]["regime"] == "eager, host-bound" and "eager, host-bound" in good["crossover-8b"]["criterion"]
    assert good["crossover-8b"]["criterion"].endswith(f"; measured in: {CONCURRENCY_MEASURED_IN})")  # the device too
    assert good["crossover-8b"]["measured_in"] == CONCURRENCY_MEASURED_IN
    assert judge(tmp_path, {"concurrency-8b": concurrency_report(unexplained=1)})["concurrency-audit"]["status"] == "FAIL"
    assert judge(tmp_path, {"concurrency-8b": concurrency_report(responses=3)})["concurrency-runs"]["status"] == "FAIL"
    partial = {"limit": 16, "schedules": ["ar"], "concurrency": [1, 16], "done": False, "responses": {"ar-C1.jsonl": 9}}
    cut = judge(tmp_path, {"concurrency-8b": partial})
    assert cut["concurrency-runs"]["status"] == "FAIL" and "ar-C1.jsonl: 9" in cut["concurrency-runs"]["detail"]


def sampler_report(rows: dict, done: bool = True) -> dict:
    """bench_sampler.py's --json: R -> (whole MiB, blocked MiB, agree) at V = 131,072."""
    results = [{"vocab": 131072, "rows": r, "ms": {"whole": 10.0, "blocked": 1.0},
                "peak_mib": {"whole": whole, "blocked": blocked}, "agree": agree}
               for r, (whole, blocked, agree) in rows.items()]  # fmt: skip
    return {"regime": "one draw, ...", "device": "cuda", "results": results, "done": done}


def test_the_sampler_check_judges_the_draw_of_the_most_rows_and_fails_on_each_fault(tmp_path):
    good = judge(tmp_path, {"sampler": sampler_report({64: (65.0, 30.0, 1.0), 2048: (4096.0, 26.0, 0.9995)})})
    assert good["sampler-peak"]["status"] == "PASS"  # 64 rows' 30 of 65 MiB is not the largest draw
    assert good["sampler-peak"]["detail"].startswith("cuda: V=131072 R=2048: peak whole 4096.0 MiB, blocked 26.0 MiB; agree 0.9995; whole 10.000 ms")
    assert "blocked 1.000 ms (one draw, ...)" in good["sampler-peak"]["detail"]  # the regime of the figures
    heavy = judge(tmp_path, {"sampler": sampler_report({64: (65.0, 1.0, 1.0), 2048: (4096.0, 600.0, 1.0)})})
    assert heavy["sampler-peak"]["status"] == "FAIL"
    apart = judge(tmp_path, {"sampler": sampler_report({2048: (4096.0, 26.0, 0.99)})})
    assert apart["sampler-peak"]["status"] == "FAIL"
    cut = judge(tmp_path, {"sampler": sampler_report({64: (65.0, 1.0, 1.0)}, done=False)})
    assert cut["sampler-peak"]["status"] == "PASS" and cut["sampler-peak"]["detail"].endswith(
        "the step was cut short: these are the rows it finished")  # fmt: skip
    nothing = judge(tmp_path, {"sampler": sampler_report({}, done=False)})
    assert nothing["sampler-peak"]["status"] == "FAIL" and "no result from step sampler" in nothing["sampler-peak"]["detail"]


def test_the_summary_lists_every_step_with_its_budget_and_seconds_and_names_124_and_137_cut_short(tmp_path):
    (tmp_path / "steps.tsv").write_text("wheels\t15\t0\t12\npreflight\t50\t0\t9\ngraphs-8b\t260\t124\t260\n"
                                        "syncs\t20\t137\t23\nconcurrency-8b\t50\t1\t7\n")  # fmt: skip
    judge(tmp_path, {})
    plan = json.loads((tmp_path / "gpu_check.json").read_text())["plan"]
    assert plan[2] == {"step": "graphs-8b", "budget_s": 260, "rc": 124, "seconds": 260}
    text = (tmp_path / "summary.md").read_text()
    assert "| graphs-8b | 260 | 260 | 124 (cut short by its budget) |" in text and "FAIL: memory-bound-8b" in text
    assert "| syncs | 20 | 23 | 137 (cut short by its budget) |" in text  # killed after ignoring the TERM
    assert "| concurrency-8b | 50 | 7 | 1 |" in text


def test_a_partial_run_says_which_steps_ran_and_skips_the_checks_of_the_others(tmp_path):
    (tmp_path / "plan.tsv").write_text("wheels\t15\ngraphs-8b\t260\nsummary\t10\npack\t10\n")
    checks = judge(tmp_path, {"graphs-8b": graphs_report(calls_at(1.1))})
    assert checks["memory-bound-8b"]["status"] == "PASS" and checks["graph-vs-eager-8b"]["status"] == "PASS"
    for name in ("preflight", "fp32-exact", "audit-bf16", "syncs", "sampler-peak", "concurrency-runs", "concurrency-audit"):
        assert checks[name]["status"] == "SKIP" and "was not in this run's plan (ONLY/SKIP)" in checks[name]["detail"]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["partial"] and report["steps_planned"] == ["wheels", "graphs-8b", "summary", "pack"]
    assert report["steps_not_run"] == ["preflight", "audit-fp32", "audit-bf16", "syncs", "sampler", "concurrency-8b"]
    text = (tmp_path / "summary.md").read_text()
    assert "(a partial run)" in text.splitlines()[0]
    assert "steps run: wheels, graphs-8b, summary, pack; not run (ONLY/SKIP): preflight, audit-fp32" in text
    assert ("code: packedss " + os.environ["PACKEDSS_COMMIT"]) in text if os.environ.get("PACKEDSS_COMMIT") else (
        "code: packedss at an unknown commit" in text)  # fmt: skip
    (tmp_path / "plan.tsv").unlink()  # no plan: every step was planned
    assert judge(tmp_path, {})["syncs"]["status"] == "FAIL"
    assert json.loads((tmp_path / "gpu_check.json").read_text())["partial"] is False


def test_a_preflight_cut_short_is_reported_as_not_fatal(tmp_path):
    (tmp_path / "steps.tsv").write_text("preflight\t50\t124\t50\n")
    partial = {"versions": {"python": "3.12.3"}, "line": "versions: python 3.12.3, ...", "refused": None, "backbones": {}}
    checks = judge(tmp_path, {"preflight": partial})
    assert checks["preflight"]["status"] == "FAIL" and "cut short by its budget: not fatal, the steps ran" in checks[
        "preflight"]["detail"]  # fmt: skip
    assert checks["versions"]["status"] == "INFO"


def test_the_code_version_falls_back_to_the_commit_passed_in_without_git(monkeypatch):
    from packedss import runner

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(runner.subprocess, "run", no_git)
    monkeypatch.setenv("PACKEDSS_COMMIT", "c065743abcde")
    assert runner.code_version().endswith("+c065743abcde")
    monkeypatch.delenv("PACKEDSS_COMMIT")
    assert runner.code_version().endswith("+unknown")


def test_the_sync_counter_counts_torchs_sync_warnings_and_not_its_notice(monkeypatch):
    is_sync_warning = check_decode["is_sync_warning"]
    assert not is_sync_warning(SYNC_NOTICE) and is_sync_warning(SYNC_WARNING)
    # the CUDA branch of the counter, with the device calls stood in: what torch warns inside the block
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    with check_decode["counted_syncs"](torch.device("cuda")) as seen:
        warnings.warn(SYNC_NOTICE)
        warnings.warn(SYNC_WARNING)
        warnings.warn(SYNC_WARNING)
    assert seen == [SYNC_WARNING, SYNC_WARNING]


def test_the_decode_checks_write_each_row_as_it_is_measured(tmp_path, monkeypatch):
    real, calls = check_decode["decode_ltr"], []

    def decode_then_stop(*args, **kwargs):  # the step's budget runs out at the third decode
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setitem(check_decode["main"].__globals__, "decode_ltr", decode_then_stop)
    out = tmp_path / "audit.json"
    with pytest.raises(KeyboardInterrupt):
        check_decode["main"](["--device", "cpu", "--dtype", "float32", "--checks", "audit", "--exact", "--limit", "1",
                              "--widths", "1,2", "--max-new-tokens", "4", "--json", str(out)])  # fmt: skip
    report = json.loads(out.read_text())  # AR's reference, then linear at W = 1: one row, kept
    assert report["done"] is False and [(a["schedule"], a["width"]) for a in report["audit"]] == [("linear", 1)]
    assert report["audit"][0]["equal"] == 1 and report["audit"][0]["pass"]


def test_the_calls_step_times_the_rows_asked_for_and_writes_its_json_after_each_block(tmp_path, capsys, monkeypatch):
    out = tmp_path / "graphs.json"
    argv = ["--shape", "test", "--device", "cpu", "--blocks", "2,1", "--prefix", "3", "--warmup", "0", "--iters", "1",
            "--compile", "default", "--stream-mib", "1", "--json", str(out)]  # fmt: skip
    assert gpu_calls["main"](argv) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    run = report["runs"]["packedss"]
    assert report["rows"] == [2, 4]  # 2B of each block: two compilations
    assert sorted((c["block"], c["kind"]) for c in run["calls"]) == [
        (1, "packed"), (1, "quadratic"), (2, "linear-draft"), (2, "linear-verify"), (2, "packed")]  # fmt: skip
    assert sorted(run["compile_s"]) == ["C=3: 2 rows", "C=3: 4 rows"]
    assert [r["block"] for r in run["ratios_2B_B"]] == [2]  # B = 1 timed no B-row call
    for c in run["calls"]:
        assert c["compiled_hbm"] == pytest.approx(c["compiled_ms"] / c["compiled_hbm_floor_ms"])
        assert c["eager_hbm"] == pytest.approx(c["eager_ms"] / c["eager_hbm_floor_ms"])
        assert "hbm_floor_ms" not in c  # each path's floor under its own name, no copy of the compiled one
        assert c["graph_replays_min"] is None and c["cudagraph_skips"] is None  # no CUDA graphs on a CPU
    compared = {(c["block"], c["kind"]): c for c in run["graph_vs_eager"]}
    assert set(compared) == {(c["block"], c["kind"]) for c in run["calls"]}  # every timed call, compared first
    for c in compared.values():
        assert c["pass"] and c["max_abs_logit_diff"] <= c["tolerance"] and c["argmax_agreement"] >= 0.99
        assert c["rows"] == {"packed": 2 * c["block"], "quadratic": c["block"] * (c["block"] + 1)}.get(c["kind"], c["block"])
    assert "| C | B | eager 2B / B | compiled 2B / B |" in printed

    def stopped_after_the_first_block(*args, on_result, **kwargs):
        on_result([{"prefix": 3, "block": 2, "kind": "packed", "compiled_floor": 2.0, "ratio": 0.5}], {"C=3: 4 rows": 1.0})
        raise KeyboardInterrupt  # the step's budget ran out

    out.unlink()
    monkeypatch.setitem(gpu_calls["main"].__globals__, "bench_compiled", stopped_after_the_first_block)
    with pytest.raises(KeyboardInterrupt):
        gpu_calls["main"](argv)
    kept = json.loads(out.read_text())["runs"]["packedss"]
    assert [c["block"] for c in kept["calls"]] == [2] and kept["compile_s"] == {"C=3: 4 rows": 1.0}
    capsys.readouterr()
    for bad, message in ((["--shape", "tset"], "error: unknown --shape tset (did you mean test?)"),
                         (["--blocks", "2", "--rows", "3"], "error: --rows 3: no call of the block sizes 2 has that"),
                         (["--blocks", "2,8", "--rows", "4"], "error: --blocks 8: no call of that block has a row count")):  # fmt: skip
        with pytest.raises(SystemExit) as stopped:
            gpu_calls["main"](["--device", "cpu", "--json", str(out), "--shape", "test", *bad])
        err = capsys.readouterr().err.strip()
        assert stopped.value.code == 2 and err.startswith(message) and len(err.splitlines()) == 1


StaticInputs = __import__("packedss.models.static", fromlist=["_Inputs"])._Inputs
StaticCalls = __import__("packedss.models.static", fromlist=["StaticCalls"]).StaticCalls
FILL, RUN_COMPILED = StaticInputs.fill, StaticCalls._run_compiled


def test_the_calls_step_runs_under_the_runners_exact_reductions(tmp_path, monkeypatch):
    class Built(Exception):
        pass

    def reductions_then_stop(*args, **kwargs):  # the model is built after the settings: read them then
        raise Built(torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)

    monkeypatch.setitem(gpu_calls["main"].__globals__, "random_adapter", reductions_then_stop)
    matmul = torch.backends.cuda.matmul
    before = (torch.get_float32_matmul_precision(), matmul.allow_bf16_reduced_precision_reduction)
    torch.set_float32_matmul_precision("high")
    matmul.allow_bf16_reduced_precision_reduction = True
    try:
        with pytest.raises(Built) as built:
            gpu_calls["main"](["--shape", "test", "--device", "cpu", "--json", str(tmp_path / "g.json")])
        assert built.value.args == ("highest", False)
    finally:
        torch.set_float32_matmul_precision(before[0])
        matmul.allow_bf16_reduced_precision_reduction = before[1]


def stale_input(self, committed, tokens, positions, bias):
    """_Inputs.fill whose token buffer keeps the tokens of its first call (those the graph was
    compiled and warmed with): every later call of the graph reads them, stale."""
    old = self.tokens.clone()
    filled = FILL(self, committed, tokens, positions, bias)
    if getattr(self, "warmed", False):
        self.tokens.copy_(old)
    self.warmed = True
    return filled


def reversed_output(self, key, inputs):
    """A compiled call whose logits come back in the wrong order (an output a later call overwrote)."""
    return RUN_COMPILED(self, key, inputs).flip(-1)


@pytest.mark.parametrize("fault", [("_Inputs", "fill", stale_input), ("StaticCalls", "_run_compiled", reversed_output)],
                         ids=["stale-input-buffer", "corrupted-output"])  # fmt: skip
def test_a_graph_that_replays_stale_inputs_or_corrupts_its_output_fails_the_calls_step(tmp_path, capsys, monkeypatch, fault):
    import packedss.models.static as static

    monkeypatch.setattr(getattr(static, fault[0]), fault[1], fault[2])
    out = tmp_path / "graphs.json"
    argv = ["--shape", "test", "--device", "cpu", "--blocks", "2", "--rows", "4", "--prefix", "3", "--warmup", "0",
            "--iters", "1", "--compile", "default", "--stream-mib", "1", "--json", str(out)]  # fmt: skip
    assert gpu_calls["main"](argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: graph replay differs from eager: B=2 packed (4 rows): max |diff| ")
    run = json.loads(out.read_text())["runs"]["packedss"]
    assert run["calls"] == []  # the call whose graph differs is not timed
    [compared] = run["graph_vs_eager"]
    assert not compared["pass"] and compared["rows"] == 4 and compared["max_abs_logit_diff"] > compared["tolerance"]
    checks = judge(tmp_path, {"graphs-8b": json.loads(out.read_text())}, cuda=False)
    assert checks["graph-vs-eager-8b"]["status"] == "FAIL"
    assert checks["graph-vs-eager-8b"]["detail"].startswith("graph replay differs from eager: B=2 packed (4 rows)")


def test_the_concurrency_step_keeps_the_responses_of_a_sweep_cut_short(tmp_path, monkeypatch):
    records = tmp_path / "run" / "records"

    def sweep_cut_short(command, **kwargs):
        records.mkdir(parents=True, exist_ok=True)
        (records / "ar-C1.jsonl").write_text('{"a": 1}\n{"a": 2}\n{"torn": ')  # the third is being written
        raise KeyboardInterrupt  # the step's budget ran out

    monkeypatch.setitem(gpu_concurrency["main"].__globals__, "subprocess", SimpleNamespace(run=sweep_cut_short))
    out = tmp_path / "concurrency.json"
    with pytest.raises(KeyboardInterrupt):
        gpu_concurrency["main"](["--device", "cpu", "--shape", "test", "--concurrency", "1,16", "--schedules",
                                 "ar,linear,packed", "--out", str(tmp_path / "run"), "--json", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    assert report["done"] is False and report["responses"] == {"ar-C1.jsonl": 2}


def test_the_concurrency_steps_regime_line_names_what_its_tables_were_measured_in(tmp_path, monkeypatch, capsys):
    import packedss.analysis.__main__ as analysis

    def analysed(argv):  # the analysis's tables, as it writes them: every row with its runs' regime column
        tables = tmp_path / "run" / "analysis" / "tables"
        tables.mkdir(parents=True)
        for name, header, row in (("concurrency", "Method,C,Responses,Time / Linear-SS", "Packed-SS,8,2,0.9"),
                                  ("crossover", "Method,Crossover C,CI above 1", "Packed-SS,8,no")):  # fmt: skip
            (tables / f"{name}.csv").write_text(f'{header},measured_in\n{row},"{CONCURRENCY_MEASURED_IN}"\n')
            (tables / f"{name}.md").write_text(f"| the {name} table |\n")
        (tables / "runs.csv").write_text("Equal,Numerical,Context,Unexplained\n2,0,1,0\n")
        return 0

    monkeypatch.setitem(gpu_concurrency["main"].__globals__, "subprocess",
                        SimpleNamespace(run=lambda command, **kwargs: SimpleNamespace(returncode=0)))  # fmt: skip
    monkeypatch.setattr(analysis, "main", analysed)
    out = tmp_path / "concurrency.json"
    assert gpu_concurrency["main"](["--device", "cpu", "--shape", "test", "--concurrency", "1,8", "--schedules",
                                    "ar,linear,packed", "--out", str(tmp_path / "run"), "--json", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"regime: eager, host-bound; measured in: {CONCURRENCY_MEASURED_IN} (the test cost twin")
    assert printed[2:4] == ["| the concurrency table |", ""]  # the tables under it
    report = json.loads(out.read_text())
    assert report["measured_in"] == CONCURRENCY_MEASURED_IN and report["done"]
    assert report["audit"] == {"Equal": 2, "Numerical": 0, "Context": 1, "Unexplained": 0}  # every class of the audit


def plan_of(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], env={**os.environ, "PY": sys.executable, "PLAN": "1", **env},
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def check_plan(stdout: str, steps=PLAN_STEPS) -> int:
    """The plan's lines: every step with its budget, then the plan line; returns the budgets' sum."""
    budgets = dict(re.findall(r"^  (\S+) +(\d+) s  ", stdout, re.M))
    assert list(budgets) == steps, stdout
    total = sum(map(int, budgets.values()))
    assert f"\nplan: {len(steps)} steps, budgets sum to {total} s\n" in stdout and total <= WINDOW_S
    return total


def test_the_plan_fits_the_window_and_is_the_same_for_a_dry_run():
    gpu, dry = plan_of({}), plan_of({"DRY": "1"})
    assert gpu.returncode == dry.returncode == 0, gpu.stderr + dry.stderr
    assert check_plan(gpu.stdout) == check_plan(dry.stdout) == 465
    budgets = dict(re.findall(r"^  (\S+) +(\d+) s  ", gpu.stdout, re.M))
    assert budgets["graphs-8b"] == "260" and 45 <= int(budgets["preflight"]) <= 60  # docs/performance.md §8
    assert "--shape nemotron8b --compile reduce-overhead --blocks 32,16,8" in gpu.stdout  # 3 blocks: 3 compiles
    assert "--limit 5 --max-new-tokens 64" in gpu.stdout  # the audits at 5 questions
    assert "--concurrency 1,8" in gpu.stdout and "--shape test" in dry.stdout
    assert "bench_sampler.py --device cuda --vocab 131072 --rows 64,2048" in gpu.stdout  # Nemotron's vocabulary
    assert "not run" not in gpu.stdout


def test_only_and_skip_plan_just_the_steps_named_with_wheels_summary_and_pack():
    only = plan_of({"DRY": "1", "ONLY": "graphs-8b"})
    assert only.returncode == 0, only.stderr
    assert check_plan(only.stdout, ["wheels", "graphs-8b", "summary", "pack"]) == 285
    assert "not run (ONLY/SKIP): preflight audit-fp32 audit-bf16 syncs sampler concurrency-8b" in only.stdout
    skip = plan_of({"SKIP": "graphs-8b,concurrency-8b"})
    assert check_plan(skip.stdout, [s for s in PLAN_STEPS if s not in ("graphs-8b", "concurrency-8b")]) == 150


# A Python for gpu_check.sh whose steps stand in for the real ones (they print the command and end),
# but whose preflight hangs (and, with ignore-term, ignores timeout's TERM: killed, 137) or refuses.
FAKE_PYTHON = """#!/usr/bin/env bash
case "$*" in
  *packedss.preflight*)
    case $PREFLIGHT in
      refuse) echo "error: transformers 5.17.0: Ministral3Model.forward takes no 'cache' keyword; carry the wheels" >&2; exit 2 ;;
      ignore-term) trap '' TERM; sleep 30 & wait; sleep 30 ;;
      *) exec sleep 30 ;;
    esac ;;
  *) echo "ran: $*" ;;
esac
"""


@pytest.mark.parametrize("preflight,rc", [("hang", 124), ("ignore-term", 137), ("refuse", 2)])
def test_only_runs_the_named_steps_and_a_preflight_cut_short_is_not_fatal_but_a_refusal_is(tmp_path, preflight, rc):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    results = tmp_path / "results"
    env = {**os.environ, "PY": str(fake), "DRY": "1", "DRY_SLACK": "0.1", "ONLY": "preflight,syncs",
           "PREFLIGHT": preflight, "RESULTS": str(results), "OUT": str(tmp_path / "out")}  # preflight: 5 s  # fmt: skip
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
    assert ("plan: 5 steps, budgets sum to 90 s\nnot run (ONLY/SKIP): audit-fp32 audit-bf16 graphs-8b sampler "
            "concurrency-8b\n") in done.stdout
    ran = [line.split("\t") for line in (results / "steps.tsv").read_text().splitlines()]
    assert [row[0] for row in ran][:2] == ["wheels", "preflight"] and ran[1][2] == str(rc), ran
    assert (results / "plan.tsv").read_text().split()[::2] == ["wheels", "preflight", "syncs", "summary", "pack"]
    if rc == 2:  # a refused version stops the run: its one line, status 2
        assert done.returncode == 2 and done.stderr.strip().splitlines() == [
            "error: transformers 5.17.0: Ministral3Model.forward takes no 'cache' keyword; carry the wheels"]  # fmt: skip
        assert "syncs" not in [row[0] for row in ran]
        return
    assert f"=== preflight: rc={rc} in " in done.stdout and "(cut short by its budget)" in done.stdout
    assert "preflight cut short by its budget: not fatal; the steps run" in done.stdout
    assert [row[0] for row in ran][2] == "syncs" and ran[2][2] == "0"  # the run went on, to the named step only
    assert "ran: scripts/check_decode.py --device cpu --dtype bfloat16 --checks syncs" in done.stdout
    assert "audit-fp32" not in [row[0] for row in ran] and "ran: scripts/gpu_calls.py" not in done.stdout
    assert done.returncode == 1 and "rerun what failed: ONLY=preflight OUT=<a new folder> bash scripts/gpu_check.sh" in done.stdout
    summary.main(["--results", str(results)])  # the verdicts of what the run left (its own summary step had 1 s)
    text = (results / "summary.md").read_text()
    assert re.search(rf"^\| preflight \| 45 \| \d+ \| {rc} \(cut short by its budget\) \|$", text, re.M), text
    assert "FAIL: preflight:" in text and "cut short by its budget: not fatal, the steps ran" in text
    assert "SKIP: fp32-exact: the checks of step audit-fp32 -- step audit-fp32 was not in this run's plan" in text


def test_bad_input_is_one_error_line_and_status_2(tmp_path):
    run = lambda env: subprocess.run(["bash", str(SCRIPT)], env={**os.environ, "PY": sys.executable, **env},  # noqa: E731
                                     capture_output=True, text=True, timeout=600)  # fmt: skip
    (tmp_path / "empty").mkdir()
    for env, message in (({"PASS": "1"}, "error: PASS=1: the check is one plan now (no passes); unset PASS"),
                         ({"DRY": "yes"}, "error: DRY=yes; use DRY=1"),
                         ({"PLAN": "2"}, "error: PLAN=2; use PLAN=1"),
                         ({"COMPILE": "none"}, "error: COMPILE=none; use reduce-overhead"),
                         ({"ONLY": "graphs"}, "error: no step 'graphs' (ONLY=graphs, SKIP=); the steps: wheels preflight"),
                         ({"SKIP": "syncs,bogus"}, "error: no step 'bogus'"),
                         ({"ONLY": "syncs", "SKIP": "pack"}, "error: ONLY=syncs and SKIP=pack both set; give one"),
                         ({"SKIP": "summary"}, "error: SKIP=summary: summary always runs"),
                         ({"DRY": "1", "DRY_SLACK": "0"}, "error: DRY_SLACK=0; give a positive number"),
                         ({"DRY": "1", "DRY_SLACK": "lots"}, "error: DRY_SLACK=lots; give a positive number"),
                         ({"PY": str(tmp_path / "no-python")}, "error: no Python found"),
                         ({"WHEELS": str(tmp_path / "nowhere")}, "is not a folder; give the folder scripts/gpu_wheels.sh"),
                         ({"WHEELS": str(tmp_path / "empty")}, "holds no .whl files"),
                         ({"DRY": "1", "RESULTS": "/proc/gpu_check"}, "error: cannot write to RESULTS=/proc/gpu_check"),
                         ({"DRY": "1", "RESULTS": str(tmp_path / "r"), "OUT": "/proc/out"}, "error: cannot write to OUT"),
                         ({"DRY": "1", "RESULTS": str(tmp_path / "r"), "OUT": str(tmp_path / "r")},
                          "error: OUT and RESULTS are the same folder")):  # fmt: skip
        done = run(env)
        assert done.returncode == 2 and message in done.stderr and done.stderr.startswith("error: "), (env, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "; " in done.stderr  # what was wrong; how to fix it
    # no CUDA device: the preflight refuses; the verdicts and the packing still come, then the one line
    done = run({"RESULTS": str(tmp_path / "r"), "OUT": str(tmp_path / "o")})
    if not torch.cuda.is_available():
        assert done.returncode == 2 and done.stderr.startswith("error: no CUDA device visible to torch"), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["gpu_check.json", "gpu_check.tar.gz", "summary.md"]
    done = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "gpu_summary.py"), "--results",
                           str(tmp_path / "absent")], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and done.stderr.strip().startswith("error: --results ") and "is not a folder" in done.stderr


def test_the_wheels_script_refuses_bad_arguments_in_one_line(tmp_path):
    script = PROJECT_ROOT / "scripts" / "gpu_wheels.sh"
    (tmp_path / "file").write_text("")
    for argv, env, message in ((["a", "b"], {}, "error: too many arguments (a b); give at most one folder"),
                               ([str(tmp_path / "file")], {}, "is a file; give a folder for the wheels"),
                               ([str(tmp_path / "w")], {"PY": str(tmp_path / "nope")}, "error: no Python at PY="),
                               ([str(tmp_path / "w")], {"PY": str(tmp_path / "file")}, "error: no Python at PY=")):  # fmt: skip
        done = subprocess.run(["bash", str(script), *argv], env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert done.returncode == 2 and done.stderr.startswith("error: ") and message in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 1


DRY_SLACK = "20"  # each step of the suite's dry run may take 20x its H200 budget: the machine's load never decides


def dry_run(tmp_path, python: str, env: dict) -> dict:
    """DRY=1 gpu_check.sh end to end with `python`: the plan line, every step run, every check as
    the CPU allows, each step's JSON, at most 8 packed files. Returns the summary."""
    started = time.monotonic()
    results, out = tmp_path / "results", tmp_path / "out"
    # Bytecode writing off, as in many images (and on the machine this suite was written on).
    env = {**env, "DRY": "1", "DRY_SLACK": DRY_SLACK, "PY": python, "RESULTS": str(results), "OUT": str(out),
           "MPLCONFIGDIR": str(tmp_path / "mpl"), "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=3600)  # a hang guard only
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert check_plan(done.stdout) <= WINDOW_S
    assert done.stdout.strip().splitlines()[-1] == f"gpu_check: all checks passed; results in {results}, packed in {out}"
    ran = [line.split("\t") for line in (results / "steps.tsv").read_text().splitlines()]
    assert [row[0] for row in ran] == PLAN_STEPS and all(row[2] == "0" for row in ran), ran
    packed = sorted(p.name for p in out.iterdir())
    assert packed == ["gpu_check.json", "gpu_check.tar.gz", "summary.md"] and len(packed) <= 8
    assert all((out / name).stat().st_size < 16 * 2**20 for name in packed)
    report = json.loads((out / "gpu_check.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    passed = ("preflight", "fp32-exact", "audit-bf16-cpu", "graph-vs-eager-8b", "syncs-readbacks-cpu", "sampler-peak",
              "concurrency-runs", "concurrency-audit")
    skipped = ("audit-bf16", "graph-replays-8b", "memory-bound-8b", "hbm-floor-8b", "syncs")
    for name in passed:
        assert checks[name]["status"] == "PASS", checks[name]
        assert f"PASS: {name}: {checks[name]['criterion']}" in done.stdout
    for name in skipped:
        assert checks[name]["status"] == "SKIP" and "no CUDA device" in checks[name]["detail"], checks[name]
    graphs = report["steps"]["graphs-8b"]["runs"]["packedss"]
    assert sorted(graphs["compile_s"]) == ["C=8: 2 rows", "C=8: 4 rows"]  # DRY: B = 2, 1, one compilation each
    assert [r["block"] for r in graphs["ratios_2B_B"]] == [2]
    check_step_reports(report)
    assert report["commit"] and not report["partial"] and report["steps_planned"] == PLAN_STEPS
    print(f"DRY=1 gpu_check: {time.monotonic() - started:.0f} s")
    return report


def check_step_reports(report: dict) -> None:
    """What each step of the dry run measured, as its JSON holds it."""
    steps = report["steps"]
    graphs = steps["graphs-8b"]["runs"]["packedss"]
    timed = {(c["block"], c["kind"]) for c in graphs["calls"]}
    assert timed == {(2, "linear-draft"), (2, "linear-verify"), (2, "packed"), (1, "packed"), (1, "quadratic")}
    compared = {(c["block"], c["kind"]): c for c in graphs["graph_vs_eager"]}
    assert set(compared) == timed and all(c["pass"] and c["argmax_agreement"] >= 0.99 for c in compared.values())
    assert all(c["traffic"]["total"] == c["weight_bytes"] + c["traffic"]["kv_read"] for c in graphs["calls"])  # CPU: no repeat
    assert checks_by_name(report)["graph-vs-eager-8b"]["status"] == "PASS"
    for step in ("audit-fp32", "audit-bf16"):
        assert steps[step]["done"] and [(a["schedule"], a["width"]) for a in steps[step]["audit"]] == [
            ("linear", 8), ("quadratic", 8), ("packed", 8)]  # fmt: skip
    assert all(a["equal"] == 2 for a in steps["audit-fp32"]["audit"])
    assert steps["syncs"]["done"] and len(steps["syncs"]["syncs"]) == 8 and all(r["pass"] for r in steps["syncs"]["syncs"])
    drawn = steps["sampler"]
    assert drawn["done"] and drawn["device"] == "cpu" and [(r["vocab"], r["rows"]) for r in drawn["results"]] == [(1000, 2048)]
    assert checks_by_name(report)["sampler-peak"]["detail"].startswith("cpu: V=1000 R=2048: peak whole ")
    concurrency = steps["concurrency-8b"]
    assert concurrency["done"] and concurrency["regime"] == "eager, host-bound" and concurrency["audit"]["Unexplained"] == 0
    assert concurrency["measured_in"] == "eager, float32, 1 thread, cpu, cost:test:2L:bfloat16:cpu"
    assert sorted(concurrency["responses"].values()) == [2] * 6  # 3 schedules x C = 1, 2, 2 questions each
    assert steps["preflight"]["refused"] is None and steps["preflight"]["versions"]["transformers"].startswith("5.24")


def checks_by_name(report: dict) -> dict:
    return {c["name"]: c for c in report["checks"]}


@pytest.mark.slow
@pytest.mark.xdist_group("gpu-dry-run")
def test_the_dry_run_goes_through_on_the_cpu(gpu_dry_run):
    # the empty environment's run (tests/test_gpu_rehearsal.py) when the package index is reachable, else the
    # project's Python: dry_run's checks hold for either
    assert gpu_dry_run.report["steps"]["preflight"]["versions"]["transformers"] == __import__("transformers").__version__


def test_the_summarys_own_copies_of_the_kits_labels_are_the_kits():
    """gpu_summary.py imports no torch, so it keeps its own copies of two labels: they must stay
    the words the steps write."""
    import runpy

    from packedss.benchmark.graph_check import GRAPH_DIFFERS

    concurrency = runpy.run_path(str(PROJECT_ROOT / "scripts" / "gpu_concurrency.py"), run_name="not_main")
    assert summary.GRAPH_DIFFERS == GRAPH_DIFFERS
    assert summary.CONCURRENCY_REGIME == concurrency["REGIME"]
