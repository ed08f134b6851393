import json

import pandas as pd
import pytest

from packedss.analysis.load import load_records, normalise
from packedss.analysis.metrics import aggregate, iteration_rows, order_group, per_question, per_response
from tests.analysis.synthetic import make_record, write_records


def test_bad_lines_are_reported_with_file_and_line_and_skipped(tmp_path):
    path = tmp_path / "r.jsonl"
    good = make_record(question=0)
    broken = make_record(question=1) | {"nfe_total": 99}
    missing = {k: v for k, v in make_record(question=2).items() if k != "wall_s"}
    path.write_text(
        json.dumps(good) + "\n" + "{not json\n" + json.dumps(broken) + "\n" + json.dumps(missing) + "\n" + "[1, 2]\n"
    )
    loaded = load_records(tmp_path)
    assert list(loaded.frame["question_id"]) == ["q0000"]
    assert [(b.path, b.line) for b in loaded.bad_lines] == [(path, 2), (path, 3), (path, 4), (path, 5)]
    assert "nfe_total" in loaded.bad_lines[1].reason
    assert "wall_s" in loaded.bad_lines[2].reason
    report = loaded.report()
    assert f"{path}:2:" in report and f"{path}:5:" in report


def test_warmup_records_are_excluded_and_counted(tmp_path):
    write_records(tmp_path, [make_record(question=0, warmup=True), make_record(question=1), make_record(question=2, warmup=False)])
    loaded = load_records(tmp_path)
    assert sorted(loaded.frame["question_id"]) == ["q0001", "q0002"]
    assert loaded.warmup_skipped == 1


def test_duplicate_records_are_skipped_and_counted(tmp_path):
    write_records(tmp_path, [make_record(question=0), make_record(question=0)], name="a.jsonl")
    loaded = load_records(tmp_path)
    assert len(loaded.frame) == 1 and loaded.duplicates_skipped == 1


def test_samples_of_a_question_are_not_duplicates(tmp_path):
    records = [make_record(question=0, temperature=1.0, sample=k) for k in range(3)]
    write_records(tmp_path, records + [make_record(question=0, temperature=1.0, sample=2)], name="a.jsonl")
    loaded = load_records(tmp_path)
    assert sorted(loaded.frame["sample"]) == [0, 1, 2] and loaded.duplicates_skipped == 1


def test_records_without_a_sample_are_sample_zero():
    record = make_record(question=0) | {"source": "r.jsonl"}
    del record["sample"]
    assert list(normalise(pd.DataFrame([record]))["sample"]) == [0]


def test_native_under_a_second_order_is_one_run(tmp_path):
    """Native decoding has no verification order: its records under two orders are one run
    (the family's first order is kept), grouped with LTR verification."""
    native = [
        make_record(model="tiny-set", family="setdlm", schedule="native", order=order, question=q, lossy=True, call_s=call_s)
        for order, call_s in (("confidence", 0.02), ("ltr", 0.01))
        for q in range(3)
    ]
    linear = [make_record(model="tiny-set", family="setdlm", schedule="linear", order="confidence", question=q) for q in range(3)]
    write_records(tmp_path, native + linear)
    loaded = load_records(tmp_path)
    assert loaded.unverified_orders_skipped == 3 and "second verification order" in loaded.report()
    frame = loaded.frame
    assert set(frame.loc[frame["schedule"] == "native", "order"]) == {"ltr"}
    groups = dict(zip(frame["schedule"], order_group(frame), strict=False))
    assert groups == {"native": "ltr", "linear": "confidence"}


def test_missing_path_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_records(tmp_path / "nope")


def test_aggregates_use_the_papers_definitions(tmp_path):
    records = [
        make_record(question=0, tokens_per_iteration=2, iterations=4, call_s=0.1, nonmodel_s=0.5, correct=True),
        make_record(question=1, tokens_per_iteration=3, iterations=9, call_s=0.2, nonmodel_s=0.0, correct=False),
    ]
    write_records(tmp_path, records)
    pq = per_question(per_response(load_records(tmp_path).frame))
    agg = aggregate(pq)
    tokens = [r["output_tokens"] for r in records]
    walls = [r["wall_s"] for r in records]
    nfes = [r["nfe_total"] for r in records]
    assert agg["Tokens/s"] == pytest.approx(sum(tokens) / sum(walls))
    assert agg["Tokens/NFE"] == pytest.approx(sum(tokens) / sum(nfes))
    assert agg["Time/NFE (ms)"] == pytest.approx(1000 * sum(walls) / sum(nfes))
    assert agg["Tokens"] == pytest.approx(sum(tokens) / 2)
    assert agg["Wall (s)"] == pytest.approx(sum(walls) / 2)
    assert agg["NFE"] == pytest.approx(sum(nfes) / 2)
    assert agg["Accuracy (%)"] == pytest.approx(50.0)
    # a ratio of totals, not a mean of per-response rates
    assert agg["Tokens/s"] != pytest.approx(sum(t / w for t, w in zip(tokens, walls)) / 2)


def test_speed_only_accuracy_is_nan_and_excluded(tmp_path):
    write_records(tmp_path, [make_record(task="writingbench", question=q, correct=None) for q in range(3)])
    agg = aggregate(per_question(per_response(load_records(tmp_path).frame)))
    assert pd.isna(agg["Accuracy (%)"]) and agg["Tokens/s"] > 0


def test_repeats_are_averaged_per_question_before_aggregation(tmp_path):
    records = [make_record(question=0, repeat=r, call_s=0.01 * (r + 1)) for r in range(3)]
    records.append(make_record(question=1, repeat=0, call_s=0.05))
    write_records(tmp_path, records)
    pq = per_question(per_response(load_records(tmp_path).frame))
    assert len(pq) == 2
    row = pq.set_index("question_id").loc["q0000"]
    assert row["repeats"] == 3
    assert row["wall_s"] == pytest.approx(sum(r["wall_s"] for r in records[:3]) / 3)


def test_samples_are_averaged_per_question_and_repeats_per_sample(tmp_path):
    records = [make_record(question=0, temperature=1.0, sample=k, repeat=r, call_s=0.01 * (1 + k + 3 * r), correct=k == 0)
               for k in range(2) for r in range(2)]  # fmt: skip
    records.append(make_record(question=1, temperature=1.0, sample=0, call_s=0.05))
    write_records(tmp_path, records)
    responses = per_response(load_records(tmp_path).frame)
    assert len(responses) == 3 and set(responses["repeats"]) == {1, 2}
    pq = per_question(responses).set_index("question_id")
    assert pq.loc["q0000", "samples"] == 2 and pq.loc["q0000", "repeats"] == 2 and pq.loc["q0001", "samples"] == 1
    assert pq.loc["q0000", "wall_s"] == pytest.approx(sum(r["wall_s"] for r in records[:4]) / 4)
    assert pq.loc["q0000", "correct_f"] == pytest.approx(0.5)
    # every question weighs the same in the accuracy, whatever its number of samples
    assert aggregate(pq)["Accuracy (%)"] == pytest.approx(100 * (0.5 + 1.0) / 2)


def test_linear_iterations_hold_two_calls():
    record = make_record(schedule="linear", width=4, iterations=3)
    assert iteration_rows(record) == [[5, 5]] * 3
    record = make_record(schedule="quadratic", width=4, iterations=2)
    assert iteration_rows(record) == [[30], [30]]
    record = make_record(family="setdlm", schedule="linear", width=8, iterations=2)
    assert iteration_rows(record) == [[16, 8], [17, 8]]  # p + 2u, then u; p = 0 in the first iteration


def test_a_file_named_twice_is_read_once(tmp_path):
    from packedss.analysis.load import find_record_files

    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "a.jsonl").write_text("")
    files = find_record_files([tmp_path / "records", tmp_path / "records" / "a.jsonl", tmp_path / "records" / ".." / "records"])
    assert files == [tmp_path / "records" / "a.jsonl"]
