"""Every schedule and width of a model decodes the same prompt: an over-long prompt is cut to one
budget per model (`Family.prompt_reserve`, `prompt_budget`), not to each schedule's own calls, so
the runs a table pairs (an AR run with the runs of every W) start from the same tokens, and a
lossless schedule equals AR on the cut prompts too. Held on Spec-Bench's long prompts with the
shipped tiny-set (a context of 1,024 positions), and on the reserve of each shipped tiny model."""

from __future__ import annotations

import json

import pytest

from packedss.benchmark.loading import compose_run_config
from packedss.decoding.driver import run_alone
from packedss.families import FAMILIES
from packedss.job import job_spec
from packedss.paths import PROJECT_ROOT
from packedss.runner import job_resources
from packedss.tasks.specbench import SHARED_DATA

MAX_NEW_TOKENS = 64  # the specbench-tiny preset's cap
SCHEDULES = [("ar", 8), ("pld", 8), ("packed", 4), ("packed", 16), ("quadratic", 16), ("native", 16)]


def _config(name: str) -> dict:
    return json.loads((PROJECT_ROOT / "assets" / "models" / name / "config.json").read_text())


def test_each_model_reserves_its_widest_call_at_the_largest_width_its_drafter_holds():
    # tiny-set: smax 16, any-order Quadratic-SS's 1 + 2W + W^2 rows at W = 16; tiny: block 32 (W = 31)
    # and Quadratic-SS's calls; tiny-sdar: no stated limit, its training block of 4 (W = 3), Packed-SS's 2(W + 1) + 2.
    assert FAMILIES["setdlm"].prompt_reserve(_config("tiny-set")) == 1 + 2 * 16 + 16 * 16
    assert FAMILIES["nemotron"].prompt_reserve(_config("tiny")) == FAMILIES["nemotron"].schedule("quadratic").largest_call_rows(31)
    assert FAMILIES["sdar"].prompt_reserve(_config("tiny-sdar")) == FAMILIES["sdar"].schedule("packed").largest_call_rows(3)


@pytest.fixture(scope="module")
def specbench_resources():
    if not (SHARED_DATA / "spec_bench_question.jsonl").is_file():
        pytest.skip(f"Spec-Bench's questions are not at {SHARED_DATA} (../shared/data)")
    resources, weights = {}, None
    for schedule, width in SCHEDULES:
        cfg = compose_run_config(["model=tiny-set", "task=specbench", "task.per_category=2", "limit=null", f"schedule={schedule}",
                                  f"width={width}", f"max_new_tokens={MAX_NEW_TOKENS}", "device=cpu", "dtype=float32",
                                  "progress=false", "out_dir=/nonexistent/records"])  # fmt: skip
        resources[schedule, width] = job_resources(job_spec(cfg), weights)
        weights = resources[schedule, width].weights
    return resources


def test_every_schedule_and_width_of_a_model_decodes_the_same_cut_prompts(specbench_resources):
    prompts = {key: {q: (p.ids, p.truncated) for q, p in r.prompts.items()} for key, r in specbench_resources.items()}
    reference = prompts["ar", 8]
    cut = [q for q, (_, truncated) in reference.items() if truncated]
    assert cut, "no Spec-Bench prompt is longer than tiny-set's context leaves: the test holds nothing"
    context = _config("tiny-set")["length"]
    assert {len(reference[q][0]) for q in cut} == {context - FAMILIES["setdlm"].prompt_reserve(_config("tiny-set"))}
    for key, fitted in prompts.items():
        assert fitted == reference, f"{key} decodes other prompts than ar"


def test_pld_and_packed_equal_ar_on_the_cut_prompts(specbench_resources):
    """The cut prompts are the ones whose responses reach the end of the context: with the same
    prompt, every lossless schedule emits AR's tokens there too."""
    ar = specbench_resources["ar", 8]
    cut = [q for q, p in ar.prompts.items() if p.truncated]
    for key in (("pld", 8), ("packed", 16)):
        other = specbench_resources[key]
        for question_id in cut:
            expected = run_alone(ar.response(ar.model, question_id, 0))
            got = run_alone(other.response(other.model, question_id, 0))
            assert got.tokens == expected.tokens, f"{key[0]} W={key[1]} differs from ar on {question_id}"


def test_a_resume_onto_records_of_other_prompts_is_refused_and_leaves_the_file(tmp_path):
    """Records decoded from prompts of another length (an older cut rule, template or tokenizer)
    are not resumed under the same identity: one error, the file unchanged."""
    from packedss.errors import PackedSSError
    from packedss.runner import run_job

    overrides = ["model=tiny", "task=arith", "schedule=ar", "limit=2", "max_new_tokens=4", "device=cpu",
                 "dtype=float32", "progress=false", f"out_dir={tmp_path / 'records'}"]  # fmt: skip
    path = run_job(compose_run_config(overrides)).path
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    first["prompt_tokens"] += 1
    altered = "\n".join([json.dumps(first), *lines[1:-1]]) + "\n"  # the last response is to be decoded again
    path.write_text(altered)
    with pytest.raises(PackedSSError, match=rf"holds {first['question_id']} decoded from a prompt of \d+ tokens, but"):
        run_job(compose_run_config(overrides))
    assert path.read_text() == altered
    path.write_text("\n".join(lines[:-1]) + "\n")  # the same records, their prompts as built: resumed
    assert run_job(compose_run_config(overrides)).written == 1
