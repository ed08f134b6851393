"""One way to assemble a job: the runner and the side-by-side benchmark both decode what the job's
spec says (packedss.job.job_spec), through the same resources (packedss.runner.job_resources).

Each test changes one setting in the spec after `job_spec` built it. Both the runner's records
and the benchmark's decodes must show the change; a caller that derived the setting again from
its own config or settings would decode without it."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hydra import compose, initialize_config_dir

from packedss.benchmark import schedules
from packedss.config import register_configs
from packedss.job import job_spec
from packedss.paths import CONF_DIR, PROJECT_ROOT
from packedss.records import read_records
from packedss import runner

QUESTIONS = 2  # timed by the benchmark after its one warm-up question; the runner's 2nd and 3rd
WIDTH = 3
CONTEXT = 64  # positions of the short-context checkpoint


@pytest.fixture(scope="module")
def short_context(tmp_path_factory):
    """The shipped tiny checkpoint with a context of CONTEXT positions (its other files linked)."""
    tiny, directory = PROJECT_ROOT / "assets" / "models" / "tiny", tmp_path_factory.mktemp("short-context")
    for path in tiny.iterdir():
        if path.name != "config.json":
            (directory / path.name).symlink_to(path)
    config = json.loads((tiny / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"max_position_embeddings": CONTEXT}))
    return directory


def _runner_records(tmp_path, max_new_tokens: int = 16, model_path=None) -> dict[str, dict]:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=tiny", "schedule=packed", f"width={WIDTH}", f"limit={1 + QUESTIONS}", f"max_new_tokens={max_new_tokens}",
            "device=cpu", "dtype=float32", "progress=false", f"out_dir={tmp_path / 'records'}",
            *([f"model.path={model_path}"] if model_path else [])])  # fmt: skip
    records, bad = read_records(runner.run_job(cfg).path)
    assert bad == [] and len(records) == 1 + QUESTIONS
    return {r["question_id"]: r for r in records}


def _bench_rows(max_new_tokens: int = 16, model: str = "tiny") -> dict[str, dict]:
    settings = schedules.BenchSettings(model=model, task="arith", limit=QUESTIONS, warmup=1, schedules=["packed"],
                                       widths=[WIDTH], max_new_tokens=max_new_tokens, device="cpu", dtype="float32",
                                       grade=False, n_resamples=50, stream_mib=1)  # fmt: skip
    rows = schedules.run(settings).rows
    assert len(rows) == QUESTIONS
    return {r["question_id"]: r for r in rows}


def _changed_in_the_spec(monkeypatch, change) -> list:
    """Both entry points' job_spec, with `change(job)` applied to what it returns; the changed jobs."""
    changed = []

    def spec_then_change(cfg):
        changed.append(change(job_spec(cfg)))
        return changed[-1]

    monkeypatch.setattr(runner, "job_spec", spec_then_change)
    monkeypatch.setattr(schedules, "job_spec", spec_then_change)
    return changed


def _same_decodes(records: dict, rows: dict) -> None:
    for question_id, row in rows.items():
        assert row["output_hash"] == records[question_id]["output_hash"], question_id
        assert row["output_tokens"] == records[question_id]["output_tokens"], question_id


def test_a_stop_string_set_in_the_spec_cuts_the_runners_and_the_benchmarks_outputs(tmp_path, monkeypatch):
    stop = " = "  # every tiny arith answer opens with "... 8 * 9 = <<8*9=72>>72"

    def with_the_stop(job):
        task_config = dataclasses.replace(job.task_config, stop=[stop])
        identity = dataclasses.replace(job.identity, task_config=dataclasses.asdict(task_config))
        return dataclasses.replace(job, task_config=task_config, identity=identity)

    jobs = _changed_in_the_spec(monkeypatch, with_the_stop)
    records = _runner_records(tmp_path)
    rows = _bench_rows()
    assert len(jobs) == 2  # the runner's job and the benchmark's one
    for record in records.values():
        assert record["finish_reason"] == "stop" and stop not in record["output_text"], record["output_text"]
        assert record["task_config"]["stop"] == [stop] and record["output_tokens"] < 16
    _same_decodes(records, rows)


def test_an_output_cap_set_in_the_spec_bounds_the_runners_and_the_benchmarks_responses(tmp_path, monkeypatch):
    cap = 5

    def with_the_cap(job):
        return dataclasses.replace(job, identity=dataclasses.replace(job.identity, max_new_tokens=cap))

    jobs = _changed_in_the_spec(monkeypatch, with_the_cap)
    records = _runner_records(tmp_path)
    rows = _bench_rows()
    assert len(jobs) == 2
    assert {r["output_tokens"] for r in records.values()} == {cap}
    assert {r["max_new_tokens"] for r in records.values()} == {cap}
    assert {r["finish_reason"] for r in records.values()} == {"max_tokens"}
    _same_decodes(records, rows)


@pytest.mark.parametrize("entry", ["runner", "benchmark"])
def test_a_bad_setting_is_refused_by_job_spec_before_anything_loads(entry, tmp_path, monkeypatch):
    from packedss.errors import PackedSSError

    def refuse(*args, **kwargs):
        raise AssertionError("something loaded")

    monkeypatch.setattr(runner, "load_adapter", refuse)
    monkeypatch.setattr(schedules, "load", refuse)
    with pytest.raises(PackedSSError, match="invalid model.cost_dtype='int8'"):
        if entry == "runner":
            register_configs()
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose(config_name="config", overrides=["model.cost_shape=test", "model.cost_dtype=int8",
                                                               f"out_dir={tmp_path / 'out'}"])  # fmt: skip
            runner.run_job(cfg)
        else:
            schedules.run(schedules.BenchSettings(cost_shape="test", cost_dtype="int8", device="cpu"))
    assert not (tmp_path / "out").exists()


def test_the_threads_the_spec_resolves_are_the_ones_the_job_runs_with(tmp_path):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:  # threads=0 on a CPU: one intra-op thread, set before the job decodes and kept in its identity
        records = _runner_records(tmp_path)
        assert {r["threads"] for r in records.values()} == {1} and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_prompts_longer_than_the_context_leaves_are_cut_alike_by_the_runner_and_the_benchmark(short_context, tmp_path):
    records = _runner_records(tmp_path, max_new_tokens=40, model_path=short_context)
    rows = _bench_rows(max_new_tokens=40, model=str(short_context))
    budget = CONTEXT - 40  # prompt + cap fit the positions, whatever the schedule's calls (its last ones reach past)
    assert {r["prompt_tokens"] for r in records.values()} == {budget}
    assert all(r["prompt_truncated_tokens"] > 0 for r in records.values())
    _same_decodes(records, rows)


def test_an_output_cap_that_leaves_no_room_for_a_prompt_is_refused_by_both(short_context, tmp_path):
    from packedss.errors import PackedSSError

    no_room = CONTEXT
    with pytest.raises(PackedSSError, match=f"max_new_tokens={no_room} leaves no room for a prompt"):
        _runner_records(tmp_path, max_new_tokens=no_room, model_path=short_context)
    assert not (tmp_path / "records").exists()
    with pytest.raises(PackedSSError, match="leaves no room for a prompt"):
        _bench_rows(max_new_tokens=no_room, model=str(short_context))


def test_timing_repeats_decode_each_response_again_in_the_runner_and_the_benchmark(tmp_path, monkeypatch):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=tiny", "schedule=packed", f"width={WIDTH}", f"limit={QUESTIONS}", "max_new_tokens=8", "repeats=3",
            "device=cpu", "dtype=float32", "progress=false", f"out_dir={tmp_path / 'records'}"])  # fmt: skip
    records, bad = read_records(runner.run_job(cfg).path)
    assert bad == [] and len(records) == 3 * QUESTIONS
    for question_id in {r["question_id"] for r in records}:
        same = [r for r in records if r["question_id"] == question_id]
        assert sorted(r["repeat"] for r in same) == [0, 1, 2]
        assert len({r["output_hash"] for r in same}) == 1  # a repeat times the same response

    calls = []
    decode = schedules.decode
    monkeypatch.setattr(schedules, "decode", lambda job, question: calls.append(question.question_id) or decode(job, question))
    settings = schedules.BenchSettings(model="tiny", task="arith", limit=QUESTIONS, warmup=1, schedules=["packed"],
                                       widths=[WIDTH], max_new_tokens=8, device="cpu", dtype="float32", grade=False,
                                       n_resamples=50, stream_mib=1, repeats=3)  # fmt: skip
    rows = schedules.run(settings).rows
    assert len(rows) == QUESTIONS
    timed = {row["question_id"] for row in rows}
    assert all(calls.count(question_id) == 3 for question_id in timed)  # each timed question decoded 3 times


def test_a_models_end_of_turn_tokens_end_every_response_like_eos(tmp_path):
    from packedss.job import job_spec as spec_of

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=tiny", "schedule=packed", f"width={WIDTH}", "limit=1", "max_new_tokens=8", 'model.end_of_turn=["<|pad|>"]',
            "device=cpu", "dtype=float32", "progress=false", f"out_dir={tmp_path / 'records'}"])  # fmt: skip
    resources = runner.job_resources(spec_of(cfg))
    pad = resources.tokenizer.convert_tokens_to_ids("<|pad|>")
    settings = resources.settings(resources.questions[0].question_id, 0)
    assert pad in settings.eos_token_ids and set(resources.eos_token_ids) > {pad}


@pytest.mark.parametrize("rule", ["rejection", "match"])
def test_the_configured_verification_rule_is_the_one_every_response_samples_with(tmp_path, rule):
    from packedss.job import job_spec as spec_of

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=tiny", "schedule=packed", f"width={WIDTH}", "limit=1", "temperature=1.0", f"verify={rule}",
            "device=cpu", "dtype=float32", "progress=false", f"out_dir={tmp_path / 'records'}"])  # fmt: skip
    job = spec_of(cfg)
    resources = runner.job_resources(job)
    sampling = resources.settings(resources.questions[0].question_id, 0).sampling
    assert (sampling.rule, sampling.temperature, job.identity.verify) == (rule, 1.0, rule)
