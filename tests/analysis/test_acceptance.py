"""Acceptance analytics on synthetic records with a known acceptance process: exact values by
depth, the histograms, the profile file, latency percentiles, pooled and per-request rates."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from packedss.analysis import load_results
from packedss.analysis.__main__ import main
from packedss.analysis.acceptance import (
    SCHEMA,
    acceptance_profiles,
    latency,
    read_profiles,
    response_latency,
    write_profiles,
)
from packedss.analysis.acceptance_tables import acceptance_table, latency_table
from packedss.analysis.bootstrap import paired_bootstrap, sum_ratio
from packedss.analysis.figures import make_figure
from packedss.analysis.measured_tables import runs_table
from packedss.analysis.metrics import rates
from tests.analysis.conftest import N_RESAMPLES
from tests.analysis.synthetic import make_record, write_records

# Linear-SS at W = 4 verifies 4 drafts every iteration; these are the drafts each iteration accepts.
LINEAR = {0: [0, 1, 4, 2], 1: [4, 3, 1]}
# Packed-SS at W = 4: drafts verified 3 (the prefill's), then W - A of the previous iteration;
# [3, 0, 2, 1] verifies [3, 0, 3, 1].
PACKED = {0: [3, 0, 2, 1]}


def _load(tmp_path, records, n_resamples=N_RESAMPLES):
    write_records(tmp_path / "records", records)
    return load_results(tmp_path, n_resamples=n_resamples)


def _profile(tmp_path, schedule, process, **kw):
    records = [make_record(schedule=schedule, width=4, question=q, accepted_drafts=h, **kw) for q, h in process.items()]
    results = _load(tmp_path, records)
    (profile,) = acceptance_profiles(results.per_response, N_RESAMPLES)
    return profile


def test_linear_known_process_gives_exact_values(tmp_path):
    p = _profile(tmp_path, "linear", LINEAR)
    assert p["schema"] == SCHEMA and p["width"] == 4 and p["block"] == 5 and p["depth"] == [1, 2, 3, 4]
    assert p["identity"]["schedule"] == "linear" and p["source"] == f"linear-W4-T0-s0-{p['identity']['config_hash']}.jsonl"
    assert p["marginal"]["estimate"] == pytest.approx([6 / 7, 4 / 7, 3 / 7, 2 / 7])
    assert p["conditional"]["estimate"] == pytest.approx([6 / 7, 4 / 6, 3 / 4, 2 / 3])
    assert p["drafted_share"] == [1.0, 1.0, 1.0, 1.0]
    assert p["draft_length_histogram"] == [0, 0, 0, 0, 7]
    # Tokens emitted = accepted drafts + 1: [1, 2, 5, 3] and [5, 4, 2].
    assert p["emitted_histogram"] == [0, 1, 2, 1, 1, 2]
    assert p["emitted"] == {"mean": pytest.approx(22 / 7), "median": 3.0, "full_accept_share": pytest.approx(2 / 7)}
    assert p["counts"] == {
        "questions": 2, "responses": 2, "iterations": 7, "draft_proposed": 28, "draft_accepted": 15,
        "tokens_emitted": 22, "full_accepts": 2, "output_tokens": 24, "truncated_tokens": 0,
    }  # fmt: skip
    for curve in (p["marginal"], p["conditional"]):
        for est, low, high in zip(curve["estimate"], curve["low"], curve["high"], strict=True):
            assert low <= est + 1e-12 and est <= high + 1e-12


def test_packed_stale_drafts_are_shorter_and_conditional_needs_a_draft(tmp_path):
    p = _profile(tmp_path, "packed", PACKED)
    assert p["draft_length_histogram"] == [1, 1, 0, 2, 0]
    assert p["drafted_share"] == [0.75, 0.5, 0.5, 0.0]
    assert p["marginal"]["estimate"] == pytest.approx([3 / 4, 2 / 4, 1 / 4, 0.0])
    # Depth 4 was never verified: the conditional is undefined there (null in the file).
    assert p["conditional"]["estimate"][:3] == pytest.approx([1.0, 1.0, 1 / 2]) and p["conditional"]["estimate"][3] is None
    assert p["conditional"]["method"][3] == "none"
    assert p["emitted_histogram"] == [0, 1, 1, 1, 1, 0] and p["emitted"]["median"] == 2.5
    assert p["emitted"]["full_accept_share"] == 0.5  # 3 of 3 and 1 of 1 accepted; an empty draft is no full accept


def test_bootstrap_resamples_questions_with_all_their_samples(tmp_path):
    """Two samples per question: the CI is that of per-question sums, not of responses."""
    process = {(0, 0): [0, 1], (0, 1): [4, 4], (1, 0): [2, 2], (1, 1): [0, 0], (2, 0): [1], (2, 1): [3, 4, 0]}
    records = [
        make_record(schedule="linear", width=4, question=q, sample=k, temperature=1.0, accepted_drafts=h)
        for (q, k), h in process.items()
    ]
    (p,) = acceptance_profiles(_load(tmp_path, records).per_response, N_RESAMPLES)
    accepted = np.array([3, 2, 3], dtype=float)  # iterations with >= 1 accepted draft, per question
    iterations = np.array([4, 4, 4], dtype=float)
    expected = paired_bootstrap(sum_ratio, (accepted, iterations), N_RESAMPLES)
    assert p["counts"]["questions"] == 3 and p["counts"]["responses"] == 6
    assert p["marginal"]["estimate"][0] == pytest.approx(8 / 12)
    assert (p["marginal"]["low"][0], p["marginal"]["high"][0]) == pytest.approx((expected.low, expected.high))


def test_profiles_round_trip_through_their_files(tmp_path):
    p = _profile(tmp_path, "packed", PACKED)
    (path,) = write_profiles([p], tmp_path / "acceptance")
    stem = f"packed-W4-T0-s0-{p['identity']['config_hash']}"
    assert path == tmp_path / "acceptance" / "tiny" / "arith" / stem / "acceptance_profile.json"
    assert "NaN" not in path.read_text() and read_profiles(tmp_path / "acceptance") == [json.loads(json.dumps(p))]
    path.write_text(json.dumps(p | {"schema": "other/9"}))
    with pytest.raises(ValueError, match="other/9"):
        read_profiles(tmp_path / "acceptance")


def test_records_without_draft_counts_have_no_profile(tmp_path):
    old = make_record(schedule="linear", width=4)
    del old["drafted"], old["accepted_drafts"]
    results = _load(tmp_path, [old])
    assert acceptance_profiles(results.per_response, N_RESAMPLES) == []
    assert "No records with per-iteration draft counts" in " ".join(acceptance_table([]).notes)


def _timed(schedule, accepted_drafts, calls, nonmodel_per_call):
    nfe = len(calls)
    record = make_record(schedule=schedule, width=4, accepted_drafts=accepted_drafts, call_s=0.0, nonmodel_s=nonmodel_per_call * nfe)
    record["call_model_s"] = calls
    record["model_s"] = sum(calls)
    record["wall_s"] = record["model_s"] + nonmodel_per_call * nfe
    record["nonmodel_s"] = record["wall_s"] - record["model_s"]
    return record


def test_latency_percentiles_and_rows_are_exact():
    # Linear-SS, 3 iterations (2 calls each) emitting 1, 3 and 5 tokens; 1 ms non-model per call.
    calls = [0.020, 0.001, 0.003, 0.002, 0.004, 0.010, 0.010]
    record = _timed("linear", [0, 2, 4], calls, 0.001)
    ttft, times, tokens = response_latency(pd.Series(record))
    assert ttft == pytest.approx(0.021) and times == pytest.approx([0.006, 0.008, 0.022]) and tokens == [1, 3, 5]
    assert ttft + sum(times) == pytest.approx(record["wall_s"])
    out = latency(pd.DataFrame([record | {"call_model_s": calls}]))
    assert out["TTFT p50 (ms)"] == pytest.approx(21.0) and out["TTFT p99 (ms)"] == pytest.approx(21.0)
    assert out["Iteration p50 (ms)"] == pytest.approx(8.0)
    assert out["Iteration p95 (ms)"] == pytest.approx(8.0 + 0.9 * 14.0)  # linear interpolation at rank 1.9
    tpot = sorted([6.0, 8.0 / 3, 22.0 / 5])
    assert out["TPOT p50 (ms)"] == pytest.approx(tpot[1])
    assert out["TPOT p99 (ms)"] == pytest.approx(tpot[1] + 0.98 * (tpot[2] - tpot[1]))
    assert out["Rows/NFE"] == pytest.approx(5.0)  # every call after prefill has B = 5 rows
    assert out["Rows/token"] == pytest.approx(30 / 9)


def test_latency_table_is_blank_without_per_call_times(tmp_path):
    results = _load(tmp_path, [make_record(schedule="linear", width=4, accepted_drafts=[1, 2])])
    row = latency_table(results.loaded.frame).data.iloc[0]
    assert math.isnan(row["TTFT p50 (ms)"]) and row["Rows/NFE"] == 5.0 and row["Records"] == 1


def _flip_records():
    """Linear-SS answers q0 slowly and q1 fast, Packed-SS the other way round, so that Packed-SS's
    tokens per NFE are lower pooled but higher per request."""
    return [
        make_record(schedule="linear", width=4, question=0, accepted_drafts=[0] * 9, call_s=0.01, nonmodel_s=0.0),
        make_record(schedule="linear", width=4, question=1, accepted_drafts=[4] * 20, call_s=0.01, nonmodel_s=0.0),
        make_record(schedule="packed", width=4, question=0, accepted_drafts=[3], call_s=0.01, nonmodel_s=0.0),
        make_record(schedule="packed", width=4, question=1, accepted_drafts=[0] * 50, call_s=0.01, nonmodel_s=0.0),
    ]


def test_pooled_and_per_request_rates_and_the_sign_flip_note(tmp_path):
    results = _load(tmp_path, _flip_records())
    linear = results.per_response[results.per_response["schedule"] == "linear"]
    r = rates(linear)
    assert r["Tokens/NFE"] == pytest.approx((111 / 60, (10 / 19 + 101 / 41) / 2))
    assert r["Acceptance (%)"] == pytest.approx((100 * 80 / 116, 50.0))
    notes = results.comparisons.sign_flips()
    assert len(notes) == 2, notes  # Tokens/NFE and Tokens/s; acceptance is 50% per request for both
    assert "Tokens/NFE of Packed-SS (W=4) minus Linear-SS (W=4)" in notes[0] and "pooled but +" in notes[0]
    assert "Tokens/s of Packed-SS" in notes[1]
    table = runs_table(results.per_question, results.comparisons)
    assert notes[0] in table.notes and any("aggregate totals" in n for n in table.notes)
    row = table.data.set_index("Method").loc["Linear-SS"]
    assert row["Tokens/NFE (per request)"] == pytest.approx((10 / 19 + 101 / 41) / 2)
    assert row["Tokens/NFE"] == pytest.approx(111 / 60) and row["Acceptance (%)"] == pytest.approx(100 * 80 / 116)


def test_no_sign_flip_note_when_both_averages_agree(tmp_path):
    """One response per run: its pooled and per-request rates are the same number."""
    records = [make_record(schedule=s, width=4, accepted_drafts=[2, 0, 3]) for s in ("linear", "packed")]
    assert _load(tmp_path, records).comparisons.sign_flips() == []


def test_acceptance_table_rows(tmp_path):
    records = [make_record(schedule="linear", width=4, question=q, accepted_drafts=h) for q, h in LINEAR.items()]
    records += [make_record(schedule="packed", width=4, question=q, accepted_drafts=h) for q, h in PACKED.items()]
    records += [make_record(schedule="ar", width=4, question=0, iterations=5)]
    results = _load(tmp_path, records)
    table = acceptance_table(acceptance_profiles(results.per_response, N_RESAMPLES))
    data = table.data.set_index("Method")
    assert list(data.index) == ["AR", "Linear-SS", "Packed-SS"]
    assert data.loc["Linear-SS", "Drafted/iteration"] == 4.0 and data.loc["Packed-SS", "Drafted/iteration"] == 7 / 4
    assert data.loc["Linear-SS", "Acceptance (%)"] == pytest.approx(100 * 15 / 28)
    assert data.loc["Packed-SS", "Full accepts (%)"] == 50.0 and data.loc["Linear-SS", "Tokens/iteration"] == pytest.approx(22 / 7)
    assert data.loc["Linear-SS", "Conditional d=2"] == pytest.approx(4 / 6)
    assert math.isnan(data.loc["AR", "Marginal d=1"])  # AR reads no W: it has no draft depths (W = 0)
    assert math.isnan(data.loc["AR", "Acceptance (%)"])
    assert any("aggregate totals" in n for n in table.notes)


def test_figures_a1_a2_plot_the_profiles(tmp_path):
    records = [make_record(schedule="linear", width=4, question=q, accepted_drafts=h) for q, h in LINEAR.items()]
    records += [make_record(schedule="packed", width=4, question=q, accepted_drafts=h) for q, h in PACKED.items()]
    records += [make_record(schedule="ar", width=4, question=0, iterations=5)]
    results = _load(tmp_path, records)
    a1 = make_figure("A1", results.comparisons)
    assert set(a1.data["run"]) == {"Linear-SS", "Packed-SS"}  # AR verifies no draft
    packed = a1.data[a1.data["run"] == "Packed-SS"].set_index("depth")
    assert packed["marginal"].tolist()[:3] == pytest.approx([0.75, 0.5, 0.25]) and packed.loc[2, "drafted_share"] == 0.5
    # depth 4 was never drafted (Packed-SS verifies at most W - 1): no point, not "0 accepted"
    assert packed.loc[4, "drafted_share"] == 0 and packed.loc[4, ["marginal", "marginal_high", "conditional"]].isna().all()
    linear = a1.data[a1.data["run"] == "Linear-SS"].set_index("depth")
    assert linear.loc[4, "marginal"] == pytest.approx(2 / 7)  # two of its 7 iterations accepted all 4
    a2 = make_figure("A2", results.comparisons)
    shares = a2.data[a2.data["run"] == "Linear-SS"].set_index("tokens")["share"]
    assert shares.loc[5] == pytest.approx(2 / 7) and shares.sum() == pytest.approx(1.0)
    ar_panel = a2.figure.axes[0]  # AR runs without a W: its panel names none, its one bin the tick 1
    assert ar_panel.get_title() == "Tiny Arith, T=0" and [t for t in ar_panel.get_xticks() if 0.2 <= t <= 1.8] == [1]
    axes = a1.figure.axes
    assert axes[0].get_title() == "Tiny Arith, W=4, T=0" and len(axes[0].get_lines()) == 3  # marginal x2, drafted share
    for ax in axes[:2]:  # the marginal and conditional panels: Packed-SS's curve ends at depth 3
        [drawn] = [line for line in ax.get_lines() if line.get_label() == "Packed-SS"]
        assert np.isfinite(drawn.get_ydata()[:2]).all() and np.isnan(drawn.get_ydata()[3])


def test_figure_a2_shows_its_outer_bins_and_labels_only_decades(tmp_path):
    full = {q: [8] * 6 for q in range(3)}  # every iteration of W = 8 accepts all: one bin, share 1
    records = [make_record(schedule="linear", width=8, question=q, accepted_drafts=h) for q, h in full.items()]
    records += [make_record(schedule="linear", width=16, question=q, accepted_drafts=h) for q, h in LINEAR.items()]
    a2 = make_figure("A2", _load(tmp_path, records).comparisons)
    a2.figure.canvas.draw()
    for ax in (ax for ax in a2.figure.axes if ax.get_title()):  # the panels, not their legends' rows
        longest = int(a2.data.loc[(a2.data["panel"] == ax.get_title()) & (a2.data["iterations"] > 0), "tokens"].max())
        low, high = ax.get_xlim()
        assert low < 0.5 and high > max(longest, 17 if "W=16" in ax.get_title() else 9) + 0.5  # bin edges inside
        bottom, top = ax.get_ylim()
        labelled = [t.get_text() for t in ax.get_yticklabels() if t.get_text() and bottom <= t.get_position()[1] <= top]
        assert len(labelled) >= 2 and set(labelled) <= {"1", "0.1", "0.01", "0.001", "0.0001"}, labelled
        assert not [t.get_text() for t in ax.get_yticklabels(minor=True) if t.get_text()]


def test_cli_writes_acceptance_tables_profiles_and_figures(tmp_path, capsys):
    write_records(tmp_path / "records", _flip_records())
    assert main([str(tmp_path), "--tables", "acceptance", "--figures", "A1,a2", "--n-resamples", "99"]) == 0
    for name in ("tables/acceptance.md", "tables/latency.csv", "tables/runs.md", "figures/figureA1.png", "figures/figureA2.pdf"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert len(read_profiles(tmp_path / "acceptance")) == 2
    assert not (tmp_path / "tables" / "table6.md").exists()
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--figures", "A3"])
    err = capsys.readouterr().err
    assert "no figure a3" in err and "valid: 3, 4, 5, A1, A2" in err


def test_every_table_states_its_averaging(results_dir):
    """Each table says whether its rates are pooled (aggregate totals) or per request."""
    from packedss.analysis.tables import TABLES

    results = load_results(results_dir, n_resamples=99)
    tables = [TABLES[n].function(results.per_question, results.comparisons, False) for n in TABLES]
    tables += [
        runs_table(results.per_question, results.comparisons),
        acceptance_table(acceptance_profiles(results.per_response, 99)),
        latency_table(results.loaded.frame),
    ]
    for table in tables:
        assert "pooled" in " ".join(table.notes).lower(), table.stem
