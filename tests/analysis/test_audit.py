"""The divergence audit: records carry output_ids and near_ties; the analysis classes every
lossless greedy response against AR's as equal, numerical or unexplained, prints unexplained ones
and fails `--strict` on them."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from packedss.analysis.compare import Comparisons
from packedss.analysis import audit, load_records, per_response
from packedss.analysis.__main__ import main as analysis_main
from packedss.analysis.measured_tables import runs_table, table6, table8
from packedss.analysis.metrics import per_question
from packedss.decoding import verify as verify_module
from packedss.records import read_records
from packedss.runner import run_job
from tests.test_fidelity import _compose

WIDTHS = {"tiny": (4, 8, 16, 31), "tiny-set": (4, 8, 16)}  # tiny-set's drafter holds blocks of 16
LOSSLESS = ("linear", "quadratic", "packed")


def test_classify_names_equal_numerical_and_unexplained():
    assert audit.classify([1, 2, 3], [], [1, 2, 3], []) == ("equal", None)
    assert audit.classify([1, 2, 4], [[2, 0.01]], [1, 2, 3], []) == ("numerical", 2)
    assert audit.classify([1, 2, 4], [], [1, 2, 3], [[0, 0.0]]) == ("numerical", 2)  # AR's tie counts too
    assert audit.classify([1, 2, 4], [[3, 0.0]], [1, 2, 3], []) == ("unexplained", 2)  # a tie after it does not
    assert audit.classify([1, 2], [], [1, 2, 3], []) == ("unexplained", 2)  # a prefix differs at its end


def _run(overrides: list[str]) -> None:
    run_job(_compose([*overrides, "warmup=false", "progress=false"]))


def _sweep(out, model: str, dtype: str) -> None:
    common = [f"model={model}", "task=arith", "limit=2", "max_new_tokens=16", f"dtype={dtype}", f"out_dir={out}"]
    # The set family's AR reads W (its identity holds it): one AR run per width.
    for width in WIDTHS[model] if model == "tiny-set" else (4,):
        _run([*common, "schedule=ar", f"width={width}"])
    for schedule in LOSSLESS:
        for width in WIDTHS[model]:
            _run([*common, f"schedule={schedule}", f"width={width}"])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("model", ["tiny", "tiny-set"])
def test_reduced_precision_runs_have_no_unexplained_divergence(model, dtype, tmp_path, capsys):
    _sweep(tmp_path, model, dtype)
    records = [r for path in tmp_path.rglob("*.jsonl") for r in read_records(path)[0]]
    assert all(r["output_ids"] and len(r["output_ids"]) == r["output_tokens"] for r in records)
    assert all(isinstance(r["near_ties"], list) for r in records)
    frame = per_response(load_records(tmp_path).frame)
    audited = audit.audit(frame)
    assert len(audited) == len(LOSSLESS) * len(WIDTHS[model]) * 2  # every lossless response has its AR
    assert audit.counts(audited)["unexplained"] == 0
    assert analysis_main([str(tmp_path), "--tables", "6,8", "--figures", "none", "--strict", "--n-resamples", "10"]) == 0
    assert "0 unexplained" in capsys.readouterr().out
    pq = per_question(frame)
    note_table = table6(pq, None) if model == "tiny" else table8(pq, None)
    assert any("0 unexplained" in n for n in note_table.notes)
    runs = runs_table(pq, Comparisons(frame, n_resamples=10))
    assert sum(int(v or 0) for v in runs.data["Equal"]) + sum(int(v or 0) for v in runs.data["Numerical"]) == len(audited)


def test_a_wrong_acceptance_rule_gives_unexplained_divergences(tmp_path, monkeypatch, capsys):
    # Long enough, and wide enough, for the tiny drafter to miss some drafts.
    common = ["model=tiny", "task=arith", "limit=4", "max_new_tokens=64", "dtype=bfloat16", f"out_dir={tmp_path}"]
    _run([*common, "schedule=ar"])
    # One draft more than the accepted prefix (a rejected draft slips through).
    monkeypatch.setattr(
        verify_module, "_accepted_prefix", lambda accept: (accept.to(torch.long).cumprod(0).sum() + 1).clamp(max=accept.numel())
    )
    _run([*common, "schedule=linear", "width=16"])
    audited = audit.audit(per_response(load_records(tmp_path).frame))
    assert audit.counts(audited)["unexplained"] > 0
    assert analysis_main([str(tmp_path), "--tables", "6", "--figures", "none", "--n-resamples", "10"]) == 0
    assert "UNEXPLAINED DIVERGENCE" in capsys.readouterr().err
    assert analysis_main([str(tmp_path), "--tables", "6", "--figures", "none", "--strict", "--n-resamples", "10"]) == 3


def test_float32_runs_equal_ar_exactly_with_exact_reductions(tmp_path):
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    _sweep(tmp_path, "tiny", "float32")
    assert not torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    assert not torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
    assert torch.get_float32_matmul_precision() == "highest"
    audited = audit.audit(per_response(load_records(tmp_path).frame))
    assert len(audited) == len(LOSSLESS) * len(WIDTHS["tiny"]) * 2
    assert audit.counts(audited) == {"equal": len(audited), "numerical": 0, "context": 0, "unexplained": 0}


def test_near_ties_are_recorded_below_the_dtype_threshold_only():
    ties = verify_module.NearTies()
    logits = torch.tensor([[10.0, 10.25, 0.0], [10.0, 5.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.bfloat16)
    ties.note([0, 1, 2], logits)
    # bf16 at 10: 8 ulps of 0.0625 = 0.5; at 1: 8 ulps of 0.0078 = 0.0625.
    assert ties.read(3) == [[0, 0.25], [2, 0.0]]
    assert ties.read(2) == [[0, 0.25]]  # output indexes past the output (cut by a stop) are dropped
    assert verify_module.NearTies().read(5) == []


def test_only_an_ar_run_of_the_same_identity_is_a_counterpart():
    linear = {"model": "m", "task": "t", "schedule": "linear", "width": 4, "temperature": 0.0, "verify": "",
              "order": "", "seed": 0, "family": "nemotron", "lora": False, "pad_verify": "", "native_window": 0, "max_ngram": 0, "concurrency": 1,
              "config": "", "lossy": False, "question_id": "q", "sample": 0, "dtype": "bfloat16", "output_ids": [1],
              "near_ties": []}  # fmt: skip
    assert audit.audit(pd.DataFrame([linear])).empty
    ar = linear | {"schedule": "ar", "width": 0, "output_ids": [2]}
    assert audit.audit(pd.DataFrame([linear, ar | {"dtype": "float32"}])).empty
    assert list(audit.audit(pd.DataFrame([linear, ar]))["audit"]) == ["unexplained"]
