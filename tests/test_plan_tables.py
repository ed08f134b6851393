"""Each reproduce target's plan (`make plan-tableN`, `plan-figureN`) equals a declarative
description of its paper table or figure (tests/plans/NAME.yaml, written from the paper's
captions and headers in the paper's names, which tests/plans/vocabulary.yaml translates): any
extra, missing or different job fails. The presets are composed only; no model is loaded."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from packedss.plan import PlannedJob, plan, split_sweeps
from packedss.paths import CONF_DIR, PROJECT_ROOT

PLANS = Path(__file__).parent / "plans"
VOCABULARY = yaml.safe_load((PLANS / "vocabulary.yaml").read_text())
TARGETS = [f"table{n}" for n in range(2, 14)] + [f"figure{n}" for n in (3, 4, 5)]

# A job is identified by these; the other compared fields must then be equal.
IDENTITY = ("model", "task", "variant", "schedule", "width", "temperature", "order", "lora")
COMPARED = ("checkpoint", "n", "block", "verify", "samples", "max_new_tokens", "chat")


def _method(text: str) -> tuple[str, int | None]:
    """'Packed-SS B=32' -> ('packed', 32); 'Native' -> ('native', None)."""
    match = re.fullmatch(r"(.+?)(?: B=(\d+))?", text)
    return VOCABULARY["methods"][match.group(1)], int(match.group(2)) if match.group(2) else None


def _expected_job(values: dict) -> dict:
    model = VOCABULARY["models"][values["model"]]
    task = VOCABULARY["tasks"][values["task"]]
    schedule, block = _method(values["method"])
    temperature = float(values["temperature"])
    job = {
        "model": model["model"],
        "task": task["task"],
        "variant": task["variant"],
        "n": values.get("n", task["n"]),
        "schedule": schedule,
        "temperature": temperature,
        "verify": values.get("verify", "greedy" if temperature == 0 else None),
        "samples": values["samples"],
        "max_new_tokens": values["max_new_tokens"],
        "lora": values["lora"],
        "chat": model["chat"],
    }
    if model["family"] == "anyorder":
        width = values["window"]
        serving = min(window for window in model["checkpoint_by_window"] if window >= width)
        job |= {"width": width, "block": width, "order": VOCABULARY["orders"][values["order"]],
                "checkpoint": model["checkpoint_by_window"][serving]}  # fmt: skip
    else:
        block = values.get("B", block) if "W" not in values else values["W"] + 1
        job |= {"width": block - 1, "block": block, "order": None, "checkpoint": model["checkpoint"]}
    return job


def expected_jobs(description: dict) -> list[dict]:
    """The jobs a description's rows stand for: each `rows` block is a product of its lists,
    with the description's settings and the vocabulary's defaults."""
    jobs = []
    for block in description["rows"]:
        fixed = {**VOCABULARY["defaults"], **description.get("settings", {})}
        keys = list(block)
        for combination in itertools.product(*(block[key] for key in keys)):
            jobs.append(_expected_job({**fixed, **dict(zip(keys, combination))}))
    return jobs


def planned_job(job: PlannedJob) -> dict:
    return {field: getattr(job, field) for field in IDENTITY + COMPARED}


def differences(expected: list[dict], planned: list[dict]) -> list[str]:
    """Every extra, missing or different job, one line each (empty when the two are equal)."""

    def by_identity(jobs: list[dict]) -> dict[tuple, dict]:
        table = {}
        for job in jobs:
            key = tuple(job[field] for field in IDENTITY)
            assert key not in table, f"two jobs with the same identity: {key}"
            table[key] = job
        return table

    want, have = by_identity(expected), by_identity(planned)
    lines = [f"missing: {key}" for key in want if key not in have]
    lines += [f"extra: {key}" for key in have if key not in want]
    for key in want.keys() & have.keys():
        for field in COMPARED:
            if want[key][field] != have[key][field]:
                lines.append(f"different {field} in {key}: paper {want[key][field]!r}, plan {have[key][field]!r}")
    return lines


def make_plan_sweeps(target: str) -> list[list[str]]:
    """The sweeps that `make plan-TARGET` plans, from make's dry run."""
    result = subprocess.run(["make", "-n", "-s", f"plan-{target}", "STAMP="], cwd=PROJECT_ROOT,
                            capture_output=True, text=True, check=True)  # fmt: skip
    [line] = [line for line in result.stdout.splitlines() if "-m packedss.plan" in line]
    arguments = shlex.split(line)
    return split_sweeps(arguments[arguments.index("packedss.plan") + 1 :])


@functools.cache
def _plan_of_sweep(sweep: tuple[str, ...]) -> tuple[PlannedJob, ...]:
    return tuple(plan([list(sweep)]))


def plan_of_target(target: str) -> list[dict]:
    """The target's jobs, each listed once (as `plan` lists the jobs of several sweeps)."""
    jobs = [job for sweep in make_plan_sweeps(target) for job in _plan_of_sweep(tuple(sweep))]
    unique = list(dict.fromkeys(dataclasses.replace(job, overrides=()) for job in jobs))
    return [planned_job(job) for job in unique]


def description(name: str) -> dict:
    return yaml.safe_load((PLANS / f"{name}.yaml").read_text())


@pytest.mark.parametrize("target", TARGETS)
def test_plan_equals_the_papers_table(target):
    assert differences(expected_jobs(description(target)), plan_of_target(target)) == []


def test_table6_plan_is_the_24_jobs_of_the_paper():
    jobs = plan_of_target("table6")
    assert len(jobs) == 24
    assert {(j["task"], j["n"]) for j in jobs} == {("mbpp", 378), ("humaneval", 164), ("gsm8k", 1319), ("math500", 500)}
    assert {(j["schedule"], j["block"]) for j in jobs} == {("linear", 32), ("quadratic", 8), ("packed", 32)}


def test_table8_plan_runs_each_window_on_its_checkpoint_and_native_once():
    jobs = plan_of_target("table8")
    assert {(j["width"], j["checkpoint"]) for j in jobs} == {
        (8, "kuleshov-group/setdlm-gsm8k-smax8"),
        (16, "kuleshov-group/setdlm-gsm8k-smax16"),
    }
    assert sorted(j["width"] for j in jobs if j["schedule"] == "native") == [8, 16]


# Each alteration of a preset (old text -> new text) and a difference the comparison must report.
ALTERATIONS = [
    ("table6", "task: mbpp,humaneval,gsm8k,math500", "task: mbpp,humaneval,gsm8k", "missing: ('nemotron3b', 'math500'"),
    ("table3", "width: 7,15,31", "width: 7,15", "missing: ('nemotron8b', 'gsm8k', '', 'linear', 31"),
    ("table9", "      native:\n        schedule: native", "      native:\n        schedule: native\n        order: ltr,confidence", "extra: ('setdlm1.7b', 'gsm8k', '', 'native', 8, 0.0, 'confidence'"),
    ("table4", "limit: null", "limit: 100", "different n in ('nemotron8b', 'gsm8k', '', 'linear', 31, 0.0, None, True): paper 1319, plan 100"),
    ("table7", "samples: 23", "samples: 8", "different samples"),
    ("table2", "width: 8,16", "width: 8,15", "missing: ('setdlm1.7b', 'gsm8k', '', 'linear', 16"),
]  # fmt: skip


@pytest.mark.parametrize("preset,old,new,reported", ALTERATIONS)
def test_an_altered_preset_fails_the_comparison(tmp_path, preset, old, new, reported):
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    path = conf / "experiment" / f"{preset}.yaml"
    text = path.read_text()
    assert old in text, f"{preset}.yaml no longer holds {old!r}; update this test"
    path.write_text(text.replace(old, new))
    [sweep] = make_plan_sweeps(preset)
    altered = [planned_job(job) for job in plan([sweep], config_dir=conf)]
    found = differences(expected_jobs(description(preset)), altered)
    assert any(line.startswith(reported) for line in found), found


def test_each_presets_own_records_folder_is_the_one_make_passes():
    """`python run.py -m +experiment=NAME` and `make reproduce-...` write to the same folder."""
    from hydra import compose, initialize_config_dir

    from packedss.config import register_configs

    register_configs()
    sweeps = make_plan_sweeps("all")
    assert len(sweeps) == len({sweep[0] for sweep in sweeps})
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for sweep in sweeps:
            [out_dir] = [o.split("=", 1)[1] for o in sweep if o.startswith("out_dir=")]
            assert compose(config_name="config", overrides=[sweep[0]]).out_dir == out_dir, sweep[0]


def _achievable(percent: float, questions: int, samples: int) -> bool:
    """Whether some whole number of correct responses out of questions x samples rounds to percent."""
    total = questions * samples
    nearest = round(percent / 100 * total)
    return any(abs(100 * c / total - percent) <= 0.005 for c in (nearest - 1, nearest, nearest + 1))


def test_t1_samples_are_the_smallest_k_that_make_the_papers_accuracies_whole_counts():
    from packedss.analysis.paper_numbers import TABLE7

    sizes = {"MBPP": VOCABULARY["tasks"]["MBPP+"]["n"], "HumanEval": VOCABULARY["tasks"]["HumanEval"]["n"]}
    accuracies = [(row["Accuracy (%)"], sizes[row["Task"]]) for row in TABLE7]
    smallest = next(k for k in itertools.count(1) if all(_achievable(a, n, k) for a, n in accuracies))
    assert not all(_achievable(a, n, 1) for a, n in accuracies)  # one sample per question cannot give them
    assert {job["samples"] for job in plan_of_target("table7")} == {smallest}
