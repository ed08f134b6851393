"""run.py at concurrency C > 1: the outputs of C = 1, one record per response with its batch
fields, its own file (-C<c>), and the job's system throughput."""

from __future__ import annotations

import json

import pytest

from packedss.paths import PROJECT_ROOT
from packedss.runner import run_job
from tests.test_runner import all_records, composed, readable_name  # noqa: F401 (a fixture)

TINY = PROJECT_ROOT / "assets" / "models" / "tiny"
pytestmark = pytest.mark.skipif(not (TINY / "config.json").is_file(), reason="the shipped tiny model is absent")


def _run(composed, out, *overrides):
    return run_job(composed(["limit=5", "max_new_tokens=24", "progress=false", f"out_dir={out}", *overrides]))


@pytest.mark.parametrize("schedule", ["ar", "packed", "quadratic"])
def test_a_batched_job_writes_the_outputs_of_one_at_a_time(composed, tmp_path, schedule):
    alone = _run(composed, tmp_path / "c1", f"schedule={schedule}")
    together = _run(composed, tmp_path / "c3", f"schedule={schedule}", "concurrency=3")
    assert readable_name(together.path).endswith("-s0-C3.jsonl")
    assert together.written == 5
    one = {r["question_id"]: r for r in all_records(tmp_path / "c1")}
    three = {r["question_id"]: r for r in all_records(tmp_path / "c3")}
    assert sorted(one) == sorted(three)
    for question, record in three.items():
        assert record["output_ids"] == one[question]["output_ids"]
        assert record["nfe_total"] == one[question]["nfe_total"]
        assert record["concurrency"] == 3 and one[question]["concurrency"] == 1
        assert one[question]["call_requests"] == [1] * record["nfe_total"]
        assert one[question]["call_batch_rows"] == one[question]["rows_evaluated"]
        assert 1 <= min(record["call_requests"]) and max(record["call_requests"]) <= 3
        assert len(record["call_requests"]) == record["nfe_total"]
        assert all(b >= own for b, own in zip(record["call_batch_rows"], record["rows_evaluated"]))
        assert record["latency_s"] >= record["model_s"] > 0
    assert max(max(r["call_requests"]) for r in three.values()) == 3
    assert three[next(iter(three))]["config_hash"] != one[next(iter(one))]["config_hash"]
    summary = json.loads(together.path.with_name(together.path.stem + ".throughput.json").read_text())
    assert [run["responses"] for run in summary] == [5]
    assert summary[0]["output_tokens"] == sum(r["output_tokens"] for r in three.values())
    assert summary[0]["wall_s"] == pytest.approx(sum(r["wall_s"] for r in three.values()))
    assert summary[0]["concurrency"] == 3


def test_a_resumed_batched_job_appends_its_throughput(composed, tmp_path):
    first = _run(composed, tmp_path / "out", "concurrency=2", "limit=3")
    again = _run(composed, tmp_path / "out", "concurrency=2")
    assert (first.written, again.written, again.skipped) == (3, 2, 3)
    summary = json.loads(again.path.with_name(again.path.stem + ".throughput.json").read_text())
    assert [run["responses"] for run in summary] == [3, 2]


def test_the_any_order_family_batches_too(composed, tmp_path):
    alone = _run(composed, tmp_path / "c1", "model=tiny-set", "schedule=packed", "width=4")
    together = _run(composed, tmp_path / "c4", "model=tiny-set", "schedule=packed", "width=4", "concurrency=4")
    assert (alone.written, together.written) == (5, 5)
    one = {r["question_id"]: r["output_ids"] for r in all_records(tmp_path / "c1")}
    four = {r["question_id"]: r["output_ids"] for r in all_records(tmp_path / "c4")}
    assert one == four


def test_a_cost_twin_times_the_batched_call_of_its_cost_model(composed, tmp_path):
    alone = _run(composed, tmp_path / "c1", "model.cost_shape=test")
    together = _run(composed, tmp_path / "c2", "model.cost_shape=test", "concurrency=2")
    assert "-C2-cost-test-" in together.path.name
    one = {r["question_id"]: r for r in all_records(tmp_path / "c1")}
    two = {r["question_id"]: r for r in all_records(tmp_path / "c2")}
    for question, record in two.items():
        assert record["output_ids"] == one[question]["output_ids"]
        assert record["cost_model"] == one[question]["cost_model"]
        assert record["wall_s"] == pytest.approx(record["model_s"] + record["nonmodel_s"])


# pld's calls are 1 + m rows for a lookup draft of m: a full draft (W + 1), no match (1), and a match near the context's end.
# One worker runs both, linear first, so that pld finds the 2x9 graph linear compiled instead of compiling it again.
@pytest.mark.xdist_group("runner-compiled")
@pytest.mark.parametrize("schedule, shapes", [("linear", ["2x9 rows"]), ("pld", ["2x9 rows", "2x1 rows", "2x4 rows"])])
def test_a_compiled_batched_job_writes_the_eager_outputs(composed, tmp_path, schedule, shapes):
    _run(composed, tmp_path / "eager", f"schedule={schedule}", "limit=4")
    compiled = _run(composed, tmp_path / "compiled", f"schedule={schedule}", "limit=4", "concurrency=2",
                    "model.compile=default")  # fmt: skip
    assert "-C2-compiled-default-" in compiled.path.name
    eager = {r["question_id"]: r["output_ids"] for r in all_records(tmp_path / "eager")}
    records = all_records(tmp_path / "compiled")
    assert {r["question_id"]: r["output_ids"] for r in records} == eager
    assert list(records[0]["compile_s"]) == shapes


@pytest.mark.parametrize("model", ["tiny", "tiny-set"])
def test_a_concurrency_the_memory_cannot_hold_is_refused_before_any_weights_load(composed, tmp_path, monkeypatch,
                                                                                model):  # fmt: skip
    from packedss.errors import PackedSSError

    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr("packedss.runner.load_adapter", refuse)
    monkeypatch.setattr("packedss.runner.available_bytes", lambda device: 64 * 2**20)
    with pytest.raises(PackedSSError, match=r"concurrency=4096: 4096 caches of \d+ rows for .* need .* GiB, but cpu has "
                                            r"0\.1 GiB free; lower concurrency or max_new_tokens"):  # fmt: skip
        _run(composed, tmp_path / "out", f"model={model}", "concurrency=4096")
    assert not (tmp_path / "out").exists()
