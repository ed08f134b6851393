"""`make plan-specbench` (and with MODEL=tiny) lists exactly the jobs tests/plans/specbench.yaml
(specbench-tiny.yaml) describes: the comparison of tests/test_plan_tables.py, with Spec-Bench's
names of tests/plans/specbench-vocabulary.yaml. An altered preset fails it."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest
import yaml

from packedss.paths import CONF_DIR, PROJECT_ROOT
from packedss.plan import plan, split_sweeps
from tests import test_plan_tables as plans


@pytest.fixture
def vocabulary(monkeypatch):
    extra = yaml.safe_load((plans.PLANS / "specbench-vocabulary.yaml").read_text())
    merged = {key: dict(plans.VOCABULARY[key]) | extra.get(key, {}) for key in plans.VOCABULARY}
    monkeypatch.setattr(plans, "VOCABULARY", merged)


def _sweep(tiny: bool) -> list[str]:
    """The sweep `make plan-specbench [MODEL=tiny]` plans, from make's dry run."""
    command = ["make", "-n", "-s", "plan-specbench", "STAMP="] + (["MODEL=tiny"] if tiny else [])
    result = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    [line] = [line for line in result.stdout.splitlines() if "-m packedss.plan" in line]
    arguments = shlex.split(line)
    [sweep] = split_sweeps(arguments[arguments.index("packedss.plan") + 1 :])
    return sweep


@pytest.mark.parametrize("tiny", [False, True])
def test_the_specbench_plan_equals_its_description(vocabulary, tiny):
    expected = plans.expected_jobs(plans.description("specbench-tiny" if tiny else "specbench"))
    planned = [plans.planned_job(job) for job in plan([_sweep(tiny)])]
    assert plans.differences(expected, planned) == []


@pytest.mark.parametrize(("old", "new", "reported"), [
    ("schedule: ar,pld,linear,packed", "schedule: ar,linear,packed", "missing"),
    ("width: ${schedule.paper_width}", "width: 8", "missing"),
    ("limit: null", "limit: 40", "different n"),
])  # fmt: skip
def test_an_altered_specbench_preset_fails_the_comparison(vocabulary, tmp_path, old, new, reported):
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    path = conf / "experiment" / "specbench.yaml"
    text = path.read_text()
    assert old in text, f"specbench.yaml no longer holds {old!r}; update this test"
    path.write_text(text.replace(old, new))
    altered = [plans.planned_job(job) for job in plan([_sweep(False)], config_dir=conf)]
    found = plans.differences(plans.expected_jobs(plans.description("specbench")), altered)
    assert any(line.startswith(reported) for line in found), found
