"""`--tables specbench` and Figure SB on synthetic Spec-Bench records with known times: the speedup
over AR per leaderboard group and Overall (ratios of pooled totals, checked by hand), a two-turn
question resampled as one unit, the mean accepted tokens, the regime note."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from packedss.analysis import load_results, write_analysis
from packedss.analysis.specbench import GROUPS, OVERALL, speedup_figure, specbench_table
from tests.analysis.synthetic import make_record, write_records

# (question id, category, turn): 3 two-turn MT-bench questions, 2 translations, 2 math_reasoning.
QUESTIONS = [(f"specbench/{q}/{t}", c, t) for q, c in ((81, "writing"), (91, "roleplay"), (151, "humanities"))
             for t in (1, 2)] + [("specbench/161/1", "translation", 1), ("specbench/162/1", "translation", 1),
                                 ("specbench/401/1", "math_reasoning", 1), ("specbench/402/1", "math_reasoning", 1)]  # fmt: skip


def _records():
    records = []
    for k, (question_id, category, turn) in enumerate(QUESTIONS):
        fields = {"task": "specbench", "question": k, "question_id": question_id, "category": category, "turn": turn,
                  "correct": None}  # fmt: skip
        records.append(make_record(schedule="ar", tokens_per_iteration=1, iterations=12, call_s=0.01 + 0.001 * k, **fields))
        # Packed-SS: 3 tokens per iteration, so 4 iterations emit AR's 13 tokens; faster calls on MT-bench.
        call_s = 0.008 if category in ("writing", "roleplay", "humanities") else 0.04 + 0.002 * k
        records.append(make_record(schedule="packed", tokens_per_iteration=3, iterations=4, call_s=call_s, **fields))
    return records


def _pooled(records, schedule, categories=None):
    rows = [r for r in records if r["schedule"] == schedule and (categories is None or r["category"] in categories)]
    return sum(r["output_tokens"] for r in rows) / sum(r["wall_s"] for r in rows)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("specbench")
    write_records(root / "records", _records())
    return root, load_results(root, n_resamples=200)


def test_the_leaderboard_rows_are_the_pooled_speedups_over_ar(results):
    _, loaded = results
    records = _records()
    table = specbench_table(loaded.per_question, loaded.comparisons)
    ar, packed = table.data.to_dict("records")
    assert (ar["Method"], packed["Method"]) == ("AR", "Packed-SS")
    assert ar[OVERALL] == 1.0 and ar["Mean accepted tokens"] == pytest.approx(1.0)
    assert packed["Mean accepted tokens"] == pytest.approx(3.0)
    ran = {"Multi-turn Conversation": ("writing", "roleplay", "humanities"), "Translation": ("translation",),
           "Mathematical Reasoning": ("math_reasoning",)}  # fmt: skip
    for name, _ in GROUPS:
        if name in ran:
            expected = _pooled(records, "packed", ran[name]) / _pooled(records, "ar", ran[name])
            assert packed[name] == pytest.approx(expected), name
        else:  # no question of the group ran
            assert packed[name] != packed[name]  # NaN: '-'
    assert packed[OVERALL] == pytest.approx(_pooled(records, "packed") / _pooled(records, "ar"))
    assert packed["Multi-turn Conversation"] > 1.5 > 1.0 > packed["Translation"]
    assert packed[f"{OVERALL} CI low"] <= packed[OVERALL] <= packed[f"{OVERALL} CI high"]
    shown = table.display.to_dict("records")[1]
    assert shown["Summarization [95% CI]"] == "-"


def test_a_two_turn_question_is_resampled_as_one_unit(results):
    _, loaded = results
    from packedss.analysis.specbench import _ar_pairing, speedups

    pq = loaded.per_question
    pairing = _ar_pairing(loaded.comparisons, pq, pq[pq["schedule"] == "packed"].iloc[0])
    cis = speedups(loaded.comparisons, pairing)
    assert cis["Multi-turn Conversation"].n == 3  # 3 conversations, 6 responses
    assert cis[OVERALL].n == 3 + 2 + 2


def test_the_written_table_names_its_regime_and_the_figure_draws_every_group(results, tmp_path):
    root, loaded = results
    write_analysis(loaded, tmp_path, tables=["specbench"], figures=["SB"])
    text = (tmp_path / "tables" / "specbench.md").read_text()
    assert "Measured in: eager, float32, 1 thread, cpu" in text and "| Packed-SS | 8 |" in text
    assert (tmp_path / "figures" / "figureSB.png").is_file()
    fig, data, _ = speedup_figure(loaded.comparisons)
    assert set(data["group"]) == {"Multi-turn Conversation", "Translation", "Mathematical Reasoning", OVERALL}
    assert "eager, float32, 1 thread, cpu" in fig._suptitle.get_text()
    plt.close(fig)


def test_pld_runs_of_two_n_in_one_folder_are_two_rows_each_against_the_same_ar_run(tmp_path):
    """An n ablation (schedule.max_ngram=2,3) beside one AR run: a row per n with its own
    speedup, both over that AR run (AR reads no n), and an `n` column telling them apart."""
    records = []
    for k, (question_id, category, turn) in enumerate(QUESTIONS):
        fields = {"task": "specbench", "question": k, "question_id": question_id, "category": category, "turn": turn,
                  "correct": None}  # fmt: skip
        records.append(make_record(schedule="ar", tokens_per_iteration=1, iterations=12, call_s=0.01, **fields))
        for n, call_s in ((2, 0.02), (3, 0.03)):  # 3 tokens per call over 4 calls: 0.08 s and 0.12 s against 0.12 s
            records.append(make_record(schedule="pld", width=10, tokens_per_iteration=3, iterations=4, call_s=call_s,
                                       max_ngram=n, **fields))  # fmt: skip
    write_records(tmp_path / "records", records)
    loaded = load_results(tmp_path, n_resamples=200)
    table = specbench_table(loaded.per_question, loaded.comparisons)
    rows = {(r["Method"], r.get("n", "")): r for r in table.data.to_dict("records")}
    assert set(rows) == {("AR", ""), ("PLD", "2"), ("PLD", "3")}
    for n in ("2", "3"):
        pld = [r for r in records if r["schedule"] == "pld" and str(r["max_ngram"]) == n]
        ar = [r for r in records if r["schedule"] == "ar"]
        expected = (sum(r["output_tokens"] for r in pld) / sum(r["wall_s"] for r in pld)) / (
            sum(r["output_tokens"] for r in ar) / sum(r["wall_s"] for r in ar))
        assert rows["PLD", n][OVERALL] == pytest.approx(expected)
    assert rows["PLD", "2"][OVERALL] > rows["PLD", "3"][OVERALL]
    assert "n" in table.display.columns and any(note.startswith("n: PLD's longest n-gram") for note in table.notes)


def test_the_table_and_the_figure_share_one_bootstrap_of_the_leaderboard(results, monkeypatch):
    from packedss.analysis import specbench
    from packedss.analysis.compare import Comparisons

    _, loaded = results
    comparisons = Comparisons(loaded.comparisons.responses, n_resamples=200)
    calls = []
    monkeypatch.setattr(specbench, "speedups", lambda c, p: calls.append(p) or {})
    specbench_table(comparisons.pq, comparisons)
    plt.close(speedup_figure(comparisons)[0])
    assert len(calls) == 1  # the one Packed-SS run against AR, bootstrapped for both
