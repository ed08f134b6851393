"""The SDAR table (`--tables sdar`): every SDAR schedule's Table 6 measurements beside its paired
comparison with the AR run of the same model and task, the lossy schedules marked, the regime
named; built from synthetic SDAR records (whose block-diffusion runs carry `resolved` and
`call_kinds` per call, as the decoders write them) and from one run of the shipped tiny-sdar
model. Also the presets behind it (`sdar`, `sdar-tiny`, `sdar-cost`), their plan and the SDAR-8B
cost-twin shape."""

from __future__ import annotations

import csv
import math
import shutil
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from packedss.analysis import analyse, load_results
from packedss.analysis.__main__ import main
from packedss.analysis.acceptance import acceptance_profiles
from packedss.analysis.figures import make_figure
from packedss.analysis.metrics import schedule_label
from packedss.analysis.tables import TABLES
from packedss.families import FAMILIES
from packedss.records import validate_record
from tests.analysis.synthetic import make_record, write_records
from tests import bad_inputs

ROOT = Path(__file__).resolve().parents[2]
TINY_SDAR = ROOT / "assets" / "models" / "tiny-sdar"
N = 199  # bootstrap resamples
WIDTH = 3
SCHEDULES = FAMILIES["sdar"].schedules  # ar, linear, packed, sdar-native, s2d2, s2d2-always, pld
LOSSY = {"sdar-native", "s2d2", "s2d2-always"}
MODELS = ("sdar8b", "sdar4b")
TASKS = ("gsm8k", "arith")
QUESTIONS = 10
# Tokens per iteration and seconds per call of each schedule; sdar4b's calls are half as dear, so
# a comparison with the other model's AR run gives other ratios.
PROFILE = {"ar": (1, 0.010), "linear": (4, 0.012), "packed": (3, 0.013), "sdar-native": (2, 0.010),
           "s2d2": (4, 0.011), "s2d2-always": (4, 0.012), "pld": (2, 0.011)}  # fmt: skip
TWIN = "sdar8b:4L:bfloat16:cpu"


def _correct(schedule: str, model: str, task: str, question: int) -> bool:
    """AR (and so every lossless schedule) answers questions 0-5 of 10; SDAR native loses 1 and 2
    and gains 8; the S2D2 runs lose question 0 (sdar4b on arith: 0 and 3)."""
    ar = question < 6
    if schedule == "sdar-native":
        return (ar and question not in (1, 2)) or question == 8
    if schedule.startswith("s2d2"):
        lost = {0, 3} if (model, task) == ("sdar4b", "arith") else {0}
        return ar and question not in lost
    return ar


def _block_diffusion(record: dict, schedule: str) -> dict:
    """A synthetic record reshaped as the block-diffusion decoders write theirs: a prefill that
    resolves and emits nothing (`resolved` starts with 0, its tokens come with the first
    iteration), `resolved` and `call_kinds` per call, and S2D2's drafts of a whole block (B = W + 1)."""
    record["accepted"][0] += 1  # the token make_record gives the prefill
    calls = record["nfe_total"]
    record["resolved"] = [0] + record["accepted"]
    kinds = ("draft", "verify") if schedule.startswith("s2d2") else ("denoise",)
    record["call_kinds"] = ["prefill"] + [kinds[i % len(kinds)] for i in range(calls - 1)]
    if schedule.startswith("s2d2"):
        record["drafted"] = [WIDTH + 1] * record["iterations"]
        record["accepted_drafts"] = [min(a, WIDTH + 1) for a in record["accepted"]]
    else:
        record["drafted"] = [0] * record["iterations"]
        record["accepted_drafts"] = [0] * record["iterations"]
    record["draft_proposed"], record["draft_accepted"] = sum(record["drafted"]), sum(record["accepted_drafts"])
    assert validate_record(record) == [], validate_record(record)
    return record


def sdar_record(schedule: str, model: str, task: str, question: int, **fields) -> dict:
    tokens, call_s = PROFILE[schedule]
    call_s *= (0.5 if model == "sdar4b" else 1.0) * (1.0 + 0.03 * ((question * 7 + len(schedule)) % 5))
    record = make_record(model=model, task=task, schedule=schedule, width=WIDTH, question=question, family="sdar",
                         tokens_per_iteration=tokens, iterations=8 + question % 4, call_s=call_s,
                         correct=_correct(schedule, model, task, question), **fields)  # fmt: skip
    return _block_diffusion(record, schedule) if schedule in LOSSY else record


def sdar_records(models=MODELS, tasks=TASKS, schedules=SCHEDULES, skip=None, **fields) -> list[dict]:
    """Every schedule of every model and task; s2d2-always answers questions 0-7 only (8 pairs)."""
    return [
        sdar_record(s, m, t, q, **fields)
        for m in models for t in tasks for s in schedules for q in range(QUESTIONS)
        if not (s == "s2d2-always" and q >= 8) and not (skip and skip(s, m, t, q))
    ]  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sdar")
    write_records(root / "records", sdar_records())
    return root


@pytest.fixture(scope="module")
def table(folder):
    results = load_results(folder, n_resamples=N)
    return TABLES["sdar"].function(results.per_question, results.comparisons, False)


def _rows(table) -> pd.DataFrame:
    return table.data.set_index(["Model", "Task", "Method"])


def _expected_against_ar(model: str, task: str, schedule: str) -> dict:
    """The comparison computed by hand from the records: the run's responses joined with those
    of AR of the same model and task by question."""
    records = pd.DataFrame(sdar_records(models=(model,), tasks=(task,), schedules=("ar", schedule)))
    method = records[records["schedule"] == schedule].set_index("question_id")
    base = records[records["schedule"] == "ar"].set_index("question_id").loc[method.index]
    return {
        "pairs": len(method),
        "throughput": (method.output_tokens.sum() / method.wall_s.sum()) / (base.output_tokens.sum() / base.wall_s.sum()),
        "nfe": method.nfe_total.sum() / base.nfe_total.sum(),
        "wall": float((method.wall_s - base.wall_s).mean()),
        "accuracy": 100.0 * float((method.correct.astype(float) - base.correct.astype(float)).mean()),
    }


def test_the_table_has_a_row_per_model_task_schedule_and_w(table):
    data = table.data
    assert table.key == "sdar" and table.stem == "sdar" and table.measured
    expected = {(label, t, schedule_label(s)) for label, m in (("SDAR 8B", "sdar8b"), ("SDAR 4B", "sdar4b"))
                for t in ("GSM8K", "Arith") for s in SCHEDULES}  # fmt: skip
    assert set(zip(data["Model"], data["Task"], data["Method"])) == expected and len(data) == len(expected)
    assert list(data.loc[(data["Model"] == "SDAR 4B") & (data["Task"] == "GSM8K"), "Method"]) == [
        "AR", "Linear-SS", "Packed-SS", "PLD", "SDAR native", "S2D2", "S2D2 (always verify)"]  # fmt: skip
    assert set(data.loc[data["Method"] == "AR", "W"]) == {"-"} and set(data.loc[data["Method"] == "AR", "B"]) == {"-"}
    others = data[data["Method"] != "AR"]
    assert set(others["W"]) == {WIDTH} and set(others["B"]) == {WIDTH + 1}
    for column in ("Tokens/s", "Tokens/NFE", "Time/NFE (ms)", "Accuracy (%)", "Tokens", "Wall (s)", "NFE"):
        assert column in data.columns and data[column].notna().all(), column  # Table 6's columns
    assert {"Tokens/s", "Accuracy (%)"} <= set(table.display.columns)


def test_each_schedule_is_paired_with_the_ar_run_of_its_own_model_and_task(table):
    rows = _rows(table)
    for model, label in (("sdar8b", "SDAR 8B"), ("sdar4b", "SDAR 4B")):
        for task, task_label in (("gsm8k", "GSM8K"), ("arith", "Arith")):
            for schedule in SCHEDULES[1:]:
                row = rows.loc[(label, task_label, schedule_label(schedule))]
                want = _expected_against_ar(model, task, schedule)
                assert row["Pairs"] == str(want["pairs"])
                assert row["Throughput vs AR"] == pytest.approx(want["throughput"], rel=1e-9)
                assert row["NFE vs AR"] == pytest.approx(want["nfe"], rel=1e-9)
                assert row["Δ wall vs AR (s)"] == pytest.approx(want["wall"], rel=1e-9)
                assert row["Accuracy vs AR (pp)"] == pytest.approx(want["accuracy"], abs=1e-9)
                for name in ("Throughput vs AR", "NFE vs AR", "Δ wall vs AR (s)", "Accuracy vs AR (pp)"):
                    low, high = row[f"{name} CI low"], row[f"{name} CI high"]
                    assert low <= row[name] <= high, (label, task_label, schedule, name)
    # the lossy schedules' accuracy against AR, from the answers above; the lossless ones equal AR's
    assert rows.loc[("SDAR 8B", "GSM8K", "SDAR native"), "Accuracy vs AR (pp)"] == pytest.approx(-10.0)
    assert rows.loc[("SDAR 4B", "Arith", "S2D2"), "Accuracy vs AR (pp)"] == pytest.approx(-20.0)
    assert rows.loc[("SDAR 8B", "Arith", "S2D2"), "Accuracy vs AR (pp)"] == pytest.approx(-10.0)
    lossless = table.data[table.data["Method"].isin(["Linear-SS", "Packed-SS"])]
    assert (lossless["Accuracy vs AR (pp)"] == 0).all() and (lossless["Accuracy vs AR (pp) CI high"] == 0).all()
    assert set(table.data.loc[table.data["Method"] == "S2D2 (always verify)", "Pairs"]) == {"8"}
    assert set(table.data.loc[table.data["Method"] == "SDAR native", "Pairs"]) == {str(QUESTIONS)}


def test_ar_is_the_base_and_the_cells_show_cis(table):
    display = table.display.set_index(["Model", "Task", "Method"])
    ar = display.loc[("SDAR 8B", "GSM8K", "AR")]
    assert all(ar[c] == "-" for c in ("Throughput vs AR [95% CI]", "NFE vs AR [95% CI]", "Pairs"))
    cell = display.loc[("SDAR 8B", "GSM8K", "Packed-SS"), "Throughput vs AR [95% CI]"]
    assert cell.count("[") == 1 and cell.endswith("]")
    assert any("Against AR" in note and "paired bootstrap" in note for note in table.notes)


def test_the_lossy_schedules_are_marked(table):
    lossy = dict(zip(table.data["Method"], table.data["Lossy"]))
    assert lossy == {schedule_label(s): "yes" if s in LOSSY else "no" for s in SCHEDULES}
    assert {schedule_label(s) for s in FAMILIES["sdar"].lossy_schedules} == {m for m, v in lossy.items() if v == "yes"}
    assert any(note.startswith("Lossy = yes") for note in table.notes)


def test_bold_marks_the_fastest_schedule_of_each_model_and_task(table):
    bolded = {(table.data.loc[i, "Model"], table.data.loc[i, "Task"]): table.data.loc[i, "Method"] for i, _ in table.bold}
    assert len(bolded) == len(MODELS) * len(TASKS)
    for (model, task), method in bolded.items():
        group = table.data[(table.data["Model"] == model) & (table.data["Task"] == task)]
        assert method == group.loc[group["Tokens/s"].idxmax(), "Method"]


def test_the_schedule_labels():
    assert [schedule_label(s) for s in ("sdar-native", "s2d2", "s2d2-always")] == ["SDAR native", "S2D2", "S2D2 (always verify)"]


def test_the_written_table_names_its_regime_and_cost_model(folder, tmp_path):
    analyse(folder, tables=["sdar"], figures=[], n_resamples=N, out_dir=tmp_path / "plain")
    text = (tmp_path / "plain" / "tables" / "sdar.md").read_text()
    assert "Measured in: eager, float32, 1 thread, cpu (every run of these records)." in text
    assert "Cost model: none" in text and "Lossy" in text
    tex = (tmp_path / "plain" / "tables" / "sdar.tex").read_text()
    assert "Measured in: eager, float32, 1 thread, cpu" in tex
    with open(tmp_path / "plain" / "tables" / "sdar.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and {row["measured_in"] for row in rows} == {"eager, float32, 1 thread, cpu"}
    assert "Throughput vs AR CI low" in rows[0]
    twin = tmp_path / "twin"
    write_records(twin / "records", sdar_records(models=("tiny-sdar",), tasks=("arith",), cost_model=TWIN))
    analyse(twin, tables=["sdar"], figures=[], n_resamples=N)
    text = (twin / "tables" / "sdar.md").read_text()
    assert f"Measured in: eager, float32, 1 thread, cpu, cost:{TWIN} (every run of these records)." in text
    assert f"Cost model: {TWIN}" in text and f"cost_model={TWIN}" in text  # the note and each row's Config


def test_a_default_analysis_writes_it_only_from_sdar_records(folder, tmp_path):
    assert main([str(folder), "--tables", "sdar", "--n-resamples", "99", "--out", str(tmp_path / "named")]) == 0
    assert (tmp_path / "named" / "tables" / "sdar.md").is_file()
    written = analyse(folder, figures=[], n_resamples=49, out_dir=tmp_path / "default")  # every table the records fill
    assert (tmp_path / "default" / "tables" / "sdar.md").is_file() and "sdar" not in written.skipped
    nemotron = tmp_path / "nemotron"
    write_records(nemotron / "records", [make_record(schedule=s, question=q) for s in ("ar", "packed") for q in range(3)])
    other = analyse(nemotron, figures=[], n_resamples=49)
    assert "sdar" in other.skipped and not (nemotron / "tables" / "sdar.md").exists()


def test_a_model_task_without_ar_gets_rows_without_comparisons(tmp_path):
    write_records(tmp_path / "records", sdar_records(skip=lambda s, m, t, q: s == "ar" and m == "sdar4b"))
    results = load_results(tmp_path, n_resamples=N)
    table = TABLES["sdar"].function(results.per_question, results.comparisons, False)
    sdar4b = table.data[table.data["Model"] == "SDAR 4B"]
    assert len(sdar4b) == 2 * (len(SCHEDULES) - 1) and sdar4b["Throughput vs AR"].isna().all()
    assert table.data.loc[table.data["Model"] == "SDAR 8B", "Throughput vs AR"].notna().sum() == 2 * (len(SCHEDULES) - 1)
    assert any("No AR run of SDAR 4B Arith, SDAR 4B GSM8K" in note for note in table.notes)


def test_each_width_is_its_own_row_against_the_one_ar_run(tmp_path):
    records = sdar_records(models=("sdar8b",), tasks=("gsm8k",), schedules=("ar", "linear", "s2d2"))
    wide = [make_record(model="sdar8b", task="gsm8k", schedule="linear", width=7, question=q, family="sdar",
                        tokens_per_iteration=6, iterations=5, call_s=0.02) for q in range(QUESTIONS)]  # fmt: skip
    write_records(tmp_path / "records", records + wide)
    results = load_results(tmp_path, n_resamples=N)
    data = TABLES["sdar"].function(results.per_question, results.comparisons, False).data
    assert list(zip(data["Method"], data["W"], data["B"])) == [("AR", "-", "-"), ("Linear-SS", 3, 4), ("Linear-SS", 7, 8), ("S2D2", 3, 4)]
    ar = pd.DataFrame([r for r in records if r["schedule"] == "ar"])
    wide_nfe = sum(r["nfe_total"] for r in wide) / ar["nfe_total"].sum()
    assert data.loc[data["W"] == 7, "NFE vs AR"].item() == pytest.approx(wide_nfe) and set(data["Pairs"][1:]) == {str(QUESTIONS)}


def test_of_both_paddings_only_the_padded_packed_run_is_compared(tmp_path):
    records = sdar_records(models=("sdar8b",), tasks=("arith",))
    records += [sdar_record("packed", "sdar8b", "arith", q, pad_verify=False) for q in range(QUESTIONS)]
    write_records(tmp_path / "records", records)
    results = load_results(tmp_path, n_resamples=N)
    table = TABLES["sdar"].function(results.per_question, results.comparisons, False)
    packed = table.data[table.data["Method"] == "Packed-SS"].set_index("Padded")
    assert set(packed.index) == {"yes", "no"} and set(table.data.loc[table.data["Method"] != "Packed-SS", "Padded"]) == {""}
    assert packed.loc["yes", "Pairs"] == str(QUESTIONS) and math.isnan(packed.loc["no", "Throughput vs AR"])
    assert any("only the padded run is compared" in note for note in table.notes)


def test_block_diffusion_records_load_and_feed_the_acceptance_analytics(folder):
    results = load_results(folder, n_resamples=N)
    assert results.loaded.bad_lines == []
    frame = results.loaded.frame
    assert frame.loc[frame["schedule"].isin(LOSSY), "resolved"].map(lambda r: r[0] == 0).all()
    assert frame.loc[~frame["schedule"].isin(LOSSY), "resolved"].isna().all()
    profiles = acceptance_profiles(results.per_response, N)
    by = {(p["identity"]["model"], p["identity"]["task"], p["identity"]["schedule"]): p for p in profiles}
    s2d2 = by[("sdar8b", "gsm8k", "s2d2")]
    assert s2d2["depth"] == [1, 2, 3, 4]  # S2D2 verifies a whole block: B = W + 1 drafts
    assert s2d2["draft_length_histogram"][WIDTH + 1] == s2d2["counts"]["iterations"]
    assert s2d2["marginal"]["estimate"][WIDTH] == pytest.approx(1.0)
    native = by[("sdar8b", "gsm8k", "sdar-native")]
    assert native["counts"]["draft_proposed"] == 0 and native["depth"] == [1, 2, 3]
    for key in ("A1", "A2"):
        figure = make_figure(key, results.comparisons, profiles)
        plt.close(figure.figure)
        assert not figure.data.empty


# ----------------------------------------------------------------- one tiny-sdar run


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    if not (TINY_SDAR / "model.safetensors").exists():
        pytest.skip("tiny-sdar not trained yet (assets/models/tiny-sdar)")
    root = tmp_path_factory.mktemp("tiny-sdar")
    checkpoint = root / "tiny-sdar"  # a copy: a checkpoint being rewritten is never read half-written
    shutil.copytree(TINY_SDAR, checkpoint)
    done = bad_inputs.run(
        [sys.executable, str(ROOT / "run.py"), "-m", "+experiment=sdar-tiny", "limit=3", "max_new_tokens=32", "threads=1",
         "device=cpu", "progress=false", f"model.path={checkpoint}", f"out_dir={root / 'records'}",
         f"hydra.sweep.dir={root / 'hydra'}"], root,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert main([str(root), "--tables", "sdar,2", "--n-resamples", "99"]) == 0
    return root


def test_the_table_of_a_tiny_sdar_run(tiny_run):
    results = load_results(tiny_run, n_resamples=99)
    assert results.loaded.bad_lines == []
    table = TABLES["sdar"].function(results.per_question, results.comparisons, False)
    preset = ("ar", "linear", "packed", "sdar-native", "s2d2")
    assert list(table.data["Method"]) == [schedule_label(s) for s in preset]
    assert list(table.data["Lossy"]) == ["no", "no", "no", "yes", "yes"]
    compared = table.data[table.data["Method"] != "AR"]
    assert set(compared["Pairs"]) == {"3"}
    for name in ("Throughput vs AR", "NFE vs AR"):
        assert compared[name].notna().all()
        assert (compared[f"{name} CI low"] <= compared[name]).all() and (compared[name] <= compared[f"{name} CI high"]).all()
    responses = results.per_response
    ar = responses[responses["schedule"] == "ar"].set_index("question_id")
    by_method = table.data.set_index("Method")
    for schedule in preset[1:]:  # each against AR's responses to the same questions
        run = responses[responses["schedule"] == schedule].set_index("question_id")
        base = ar.loc[run.index]
        row = by_method.loc[schedule_label(schedule)]
        assert row["NFE vs AR"] == pytest.approx(run["nfe_total"].sum() / base["nfe_total"].sum(), rel=1e-9)
        assert row["Throughput vs AR"] == pytest.approx(
            (run["output_tokens"].sum() / run["wall_s"].sum()) / (base["output_tokens"].sum() / base["wall_s"].sum()), rel=1e-9)
    # the lossless schedules emit AR's tokens (float32 on a CPU: exactly)
    assert (table.data.loc[table.data["Method"].isin(["Linear-SS", "Packed-SS"]), "Accuracy vs AR (pp)"] == 0).all()
    assert any("0 unexplained" in note for note in table.notes)
    text = (tiny_run / "tables" / "sdar.md").read_text()
    assert "Measured in: eager, float32, 1 thread, cpu (every run of these records)." in text
    assert "Cost model: none" in text
    for label in ("SDAR native", "S2D2"):
        assert sum(line.startswith(f"| Tiny-SDAR | Arith | {label} |") for line in text.splitlines()) == 1
    frame = results.loaded.frame
    lossy = frame[frame["lossy"]]
    assert lossy["resolved"].map(len).eq(lossy["nfe_total"]).all() and lossy["call_kinds"].map(len).eq(lossy["nfe_total"]).all()
    profiles = acceptance_profiles(results.per_response, 99)
    assert {p["identity"]["schedule"] for p in profiles} == set(preset)
    assert all(math.isfinite(p["emitted"]["mean"]) for p in profiles)


# ----------------------------------------------------------------- presets, plan, cost shape


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir

    from packedss.config import register_configs
    from packedss.paths import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def test_the_tiny_and_cost_presets_compose():
    tiny = _compose("+experiment=sdar-tiny")
    assert (tiny.model.name, tiny.task.name, tiny.width, tiny.temperature) == ("tiny-sdar", "arith", 3, 0.0)
    assert tiny.hydra.sweeper.params.schedule == "ar,linear,packed,sdar-native,s2d2"
    assert tiny.out_dir == "results/sdar/records"  # beside the sdar preset's, as make passes it
    cost = _compose("+experiment=sdar-cost")
    assert (cost.model.name, cost.model.cost_shape, cost.model.cost_layers, cost.model.cost_dtype) == (
        "tiny-sdar", "sdar8b", 4, "bfloat16")  # fmt: skip
    assert cost.hydra.sweeper.params.schedule == tiny.hydra.sweeper.params.schedule and cost.width == 3


def test_the_cost_preset_passes_the_sweep_checks():
    from packedss.plan import plan

    jobs = plan([["+experiment=sdar-cost"]])
    assert [j.schedule for j in jobs] == ["ar", "linear", "packed", "sdar-native", "s2d2"]


def test_the_sdar8b_cost_shape():
    import torch
    from transformers import Ministral3Model

    from packedss.models.cost_twin import ShapeConfig, _SHAPE_FIELDS, cost_spec, parameter_count, shape_config

    config = shape_config("sdar8b")
    assert {k: config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                   "num_key_value_heads", "head_dim", "vocab_size")} == {
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936}  # fmt: skip
    assert config["rope_parameters"]["rope_type"] == "default" and config["rope_parameters"]["rope_theta"] == 1e6
    assert shape_config("nemotron8b")["rope_parameters"]["rope_type"] == "yarn"  # the others keep theirs
    assert parameter_count(config) == pytest.approx(8.19e9, rel=0.001)  # Qwen3-8B's count, q/k norms aside
    assert cost_spec("sdar8b", 4, "bfloat16", torch.device("cpu")).label == "sdar8b:4L:bfloat16:cpu"
    # its RoPE runs in a Ministral3 backbone (a shrunk copy of the shape, the same rope_parameters)
    small = dict(config, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, vocab_size=64)  # fmt: skip
    backbone = Ministral3Model(ShapeConfig(**{k: v for k, v in small.items() if k in _SHAPE_FIELDS}))
    hidden = backbone(input_ids=torch.arange(6)[None]).last_hidden_state
    assert hidden.shape == (1, 6, 32) and torch.isfinite(hidden).all()


def test_the_sdar_plan_equals_its_description(monkeypatch):
    """`make plan-sdar` lists exactly the jobs tests/plans/sdar.yaml describes (the comparison of
    tests/test_plan_tables.py, with the SDAR names of tests/plans/sdar-vocabulary.yaml)."""
    import yaml

    from tests import test_plan_tables as plans

    missing = [name for name in ("sdar8b", "sdar4b") if not (ROOT / "conf" / "model" / f"{name}.yaml").exists()]
    if missing:
        pytest.skip(f"conf/model/{missing[0]}.yaml not written yet")
    extra = yaml.safe_load((plans.PLANS / "sdar-vocabulary.yaml").read_text())
    vocabulary = {key: dict(plans.VOCABULARY[key]) | extra.get(key, {}) for key in plans.VOCABULARY}
    monkeypatch.setattr(plans, "VOCABULARY", vocabulary)
    expected = plans.expected_jobs(plans.description("sdar"))
    planned = plans.plan_of_target("sdar")
    assert plans.differences(expected, planned) == []
    assert len(planned) == 40 and sum(j["n"] for j in planned) == 5 * 2 * (378 + 164 + 1319 + 500)
    assert {(j["schedule"], j["width"], j["block"]) for j in planned} == {
        ("ar", 0, 1), ("linear", 3, 4), ("packed", 3, 4), ("sdar-native", 3, 4), ("s2d2", 3, 4)}  # fmt: skip


def test_the_plan_costs_every_sdar_schedule():
    from packedss.plan import rows_per_call

    rows = {s: rows_per_call("sdar", s, WIDTH) for s in SCHEDULES}
    assert all(np.isfinite(v) and v > 0 for v in rows.values()), rows
