"""Sweeps (packedss.sweep, the packedss Hydra sweeper) and plans (packedss.plan): grids expand as
Hydra's, every job is checked before the first starts, a job that fails at run time does not
stop the others, and the plan lists, checks and costs jobs without loading a model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from packedss.errors import PackedSSError
from tests import bad_inputs
from tests.test_runner import readable_name, record_file
from packedss.plan import TASK_SIZES, format_plan, main, plan, task_size
from packedss.paths import PROJECT_ROOT
from packedss.records import read_records
from packedss.sweep import expand, rerun_command
from tests.conftest import SHARED_DATA

SWEEPER = "hydra/sweeper=packedss"


def run_sweep(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """python run.py -m ..., in a fork server's child (tests/bad_inputs.py)."""
    return bad_inputs.run([sys.executable, str(PROJECT_ROOT / "run.py"), "-m", SWEEPER, *args,
                           f"hydra.sweep.dir={tmp_path}/multirun"], tmp_path)  # fmt: skip


def test_grids_expand_as_hydras_product_each_and_their_union():
    parser = OverridesParser.create()
    params = {"width": "8,16"}
    grids = {"speculative": {"schedule": "linear,packed", "order": "ltr,confidence"}, "native": {"schedule": "native"},
             "dropped": None}  # fmt: skip
    jobs = expand(parser, params, grids, ["limit=2"])
    assert jobs == [
        ["width=8", "schedule=linear", "order=ltr", "limit=2"],
        ["width=8", "schedule=linear", "order=confidence", "limit=2"],
        ["width=8", "schedule=packed", "order=ltr", "limit=2"],
        ["width=8", "schedule=packed", "order=confidence", "limit=2"],
        ["width=16", "schedule=linear", "order=ltr", "limit=2"],
        ["width=16", "schedule=linear", "order=confidence", "limit=2"],
        ["width=16", "schedule=packed", "order=ltr", "limit=2"],
        ["width=16", "schedule=packed", "order=confidence", "limit=2"],
        ["width=8", "schedule=native", "limit=2"],
        ["width=16", "schedule=native", "limit=2"],
    ]
    # The command line wins over params and grids.
    assert expand(parser, params, grids, ["schedule=packed", "width=4"]) == [
        ["width=4", "schedule=packed", "order=ltr"],
        ["width=4", "schedule=packed", "order=confidence"],
        ["width=4", "schedule=packed"],
    ]
    assert expand(parser, {}, None, ["a=1,2"]) == [["a=1"], ["a=2"]]


def test_rerun_command_names_the_interpreter_and_quotes_each_part(tmp_path):
    overrides = ["task=gsm8k", "data_dir=/my data", "+experiment=table6"]
    venv_python = str(PROJECT_ROOT / ".venv" / "bin" / "python")
    # from the repository's root: the README's own rule, relative paths
    assert rerun_command(overrides, interpreter=venv_python, cwd=PROJECT_ROOT) == (
        ".venv/bin/python run.py task=gsm8k 'data_dir=/my data' +experiment=table6"
    )
    # from elsewhere: absolute paths, a path with a space quoted
    assert rerun_command(overrides[:1], interpreter="/opt/my env/bin/python", cwd=tmp_path) == (
        f"'/opt/my env/bin/python' {PROJECT_ROOT / 'run.py'} task=gsm8k"
    )
    # an interpreter in the directory itself is not a bare name the shell would look up on PATH
    assert rerun_command([], interpreter=str(tmp_path / "python"), cwd=tmp_path).startswith("./python ")
    # by default: the interpreter that runs the sweep
    assert rerun_command([], cwd=tmp_path).split()[0] in (sys.executable, "./" + Path(sys.executable).name)


def test_every_invalid_job_is_listed_before_any_job_runs(tmp_path):
    out = tmp_path / "out"
    result = run_sweep(["model=setdlm1.7b", "width=8,16,32", "schedule=linear,native", "limit=1", f"out_dir={out}"], tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "error: 2 of 6 jobs of this sweep are invalid; nothing was run" in result.stderr
    assert "#4 model=setdlm1.7b width=32 schedule=linear" in result.stderr
    assert "#5 model=setdlm1.7b width=32 schedule=native" in result.stderr
    assert result.stderr.count("checkpoints serve widths up to 16") == 2
    assert "Launching" not in result.stderr and not out.exists()


def test_a_width_beyond_the_local_checkpoints_drafter_is_refused_for_every_job():
    with pytest.raises(PackedSSError) as err:
        plan([["+experiment=table8", "model=tiny-set", "width=8,32"]])
    message = str(err.value)
    assert message.startswith("4 of 8 jobs of this sweep are invalid")
    assert message.count("invalid width=32: model tiny-set holds blocks of at most 16 rows") == 4


def _write_gsm8k(directory: Path, questions: int) -> None:
    directory.mkdir()
    rows = [{"question": f"Tom has {i} apples and buys 2 more. How many?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"}
            for i in range(questions)]  # fmt: skip
    (directory / "gsm8k_test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.mark.parametrize("launcher", ["basic", pytest.param("local", marks=pytest.mark.slow)])
def test_a_job_that_fails_at_run_time_does_not_stop_the_sweep(tmp_path, launcher):
    data, out = tmp_path / "data", tmp_path / "out"
    _write_gsm8k(data, 2)  # no math500 file: the middle job fails when it loads its data
    result = run_sweep([f"hydra/launcher={launcher}", "model=tiny", "task=gsm8k,math500,arith", "limit=2",
                        "max_new_tokens=16", f"data_dir={data}", f"out_dir={out}"], tmp_path)  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    for task in ("gsm8k", "arith"):
        records, bad = read_records(record_file(out / "tiny" / task, "packed-W8-T0-s0.jsonl"))
        assert bad == [] and len(records) == 2, task
    assert not (out / "tiny" / "math500").exists()
    summary = result.stderr[result.stderr.index("1 of 3 jobs failed") :]
    assert "#1 model=tiny task=math500" in summary
    assert "math500_test.jsonl" in summary
    rerun = next(line for line in summary.splitlines() if "rerun: " in line).split("rerun: ", 1)[1]
    assert rerun == f"{sys.executable} {PROJECT_ROOT / 'run.py'} model=tiny task=math500 limit=2 max_new_tokens=16 data_dir={data} out_dir={out}"
    progress = [line for line in result.stderr.splitlines() if line.startswith("sweep: ")]
    assert progress[0] == "sweep: 0 of 3 jobs done, 3 left, 0 s so far; no estimate of the time left yet (none finished)"
    assert [line.split(",")[0] for line in progress] == [f"sweep: {n} of 3 jobs done" for n in range(4)]
    assert progress[-1].endswith("so far (1 failed)")
    if launcher == "basic":
        # the printed line, as printed, in a shell without the venv on PATH: it reruns the job, now with its data
        (data / "math500_test.jsonl").write_text("".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                                                         for i in range(2)))  # fmt: skip
        env = bad_inputs.offline_env(tmp_path, PATH="/usr/bin:/bin")
        env.pop("VIRTUAL_ENV", None)
        again = subprocess.run(rerun, shell=True, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
        assert again.returncode == 0, again.stderr[-3000:]
        records, bad = read_records(record_file(out / "tiny" / "math500", "packed-W8-T0-s0.jsonl"))
        assert bad == [] and len(records) == 2


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_DATA / "gsm8k_test.jsonl").is_file(), reason=f"benchmark data not present at {SHARED_DATA}")
def test_table8_preset_runs_every_job_on_the_tiny_any_order_model(tmp_path):
    out = tmp_path / "out"
    result = run_sweep(["+experiment=table8", "model=tiny-set", "limit=1", "max_new_tokens=8", f"data_dir={SHARED_DATA}",
                        f"out_dir={out}"], tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    names = sorted(readable_name(path) for path in out.rglob("*.jsonl"))
    assert names == sorted(f"{s}-W{w}-T0-ltr-s0.jsonl" for s in ("linear", "quadratic", "packed", "native") for w in (8, 16)), names


def test_plan_lists_jobs_and_ends_with_the_totals(capsys):
    assert main(["+experiment=table3", "--and", "+experiment=table4", "limit=3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["#", "model", "checkpoint", "task"]
    assert len(lines[1 : lines.index("")]) == 9
    assert lines[-1] == f"9 jobs, {6 * 10 + 3 * 3} question-runs"
    assert "  nemotron8b: n/a (the paper has no figure for its 9 jobs)" in lines


def test_plan_of_an_invalid_sweep_lists_every_problem(capsys):
    assert main(["model=tiny", "order=ltr,confidence", "width=4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 2 of 2 jobs of this sweep are invalid")
    assert err.count("needs an any-order model") == 2


def test_a_job_that_two_sweeps_or_two_grids_share_is_listed_once():
    assert len(plan([["+experiment=table8"], ["+experiment=table9"]])) == 14
    # packed with the family's default order (the native grid, overridden) is packed with order=ltr
    jobs = plan([["+experiment=table9", "model=tiny-set", "schedule=packed"]])
    assert sorted((job.width, job.order) for job in jobs) == [(8, "confidence"), (8, "ltr"), (16, "confidence"), (16, "ltr")]


def test_estimate_is_the_papers_time_per_nfe_times_its_nfe_per_response():
    from packedss.analysis.paper_numbers import TABLE6

    [row] = [r for r in TABLE6 if r["Task"] == "MBPP" and r["Method"] == "Linear-SS"]
    jobs = plan([["+experiment=table6", "model=nemotron3b", "task=mbpp", "schedule=linear,packed", "width=31,15"]])
    estimates = {(job.schedule, job.width): job.estimate_s for job in jobs}
    assert estimates[("linear", 31)] == pytest.approx(row["Time/NFE (ms)"] / 1000 * row["NFE"] * 378)
    assert estimates[("linear", 15)] is None  # the paper measured B = 32 only
    text = format_plan(jobs)
    assert "nemotron3b: " in text and "for 2 of its 4 jobs (n/a for 2: the paper has no figure)" in text


def test_t1_jobs_count_every_sample():
    [job] = plan([["+experiment=table7", "model=nemotron3b", "task=humaneval", "schedule=packed"]])
    assert (job.n, job.samples, job.question_runs, job.verify) == (164, 23, 164 * 23, "rejection")


@pytest.mark.skipif(not (SHARED_DATA / "README.md").is_file(), reason=f"benchmark data not present at {SHARED_DATA}")
def test_task_sizes_are_the_data_files_question_counts():
    from packedss.tasks import load_task, load_task_config

    for (name, split, variant), size in TASK_SIZES.items():
        cfg = load_task_config(name, **({"variant": variant} if variant else {}))
        assert cfg.split == split
        assert len(load_task(cfg, str(SHARED_DATA)).questions()) == size == task_size(cfg), (name, variant)


def test_a_paths_file_gives_each_job_of_a_sweep_its_own_checkpoint_directory():
    nemotron = plan([["+paths=local", "model=nemotron3b,nemotron8b", "task=gsm8k", "limit=1"]])
    assert [job.checkpoint for job in nemotron] == [
        "nvidia/Nemotron-Labs-Diffusion-3B @ models/Nemotron-Labs-Diffusion-3B",
        "nvidia/Nemotron-Labs-Diffusion-8B @ models/Nemotron-Labs-Diffusion-8B",
    ]
    setdlm = plan([["+paths=local", "model=setdlm1.7b", "task=gsm8k", "width=4,8,12,16", "limit=1"]])
    assert [job.checkpoint.split(" @ ")[1] for job in setdlm] == [
        "models/setdlm-gsm8k-smax8", "models/setdlm-gsm8k-smax8", "models/setdlm-gsm8k-smax16", "models/setdlm-gsm8k-smax16"
    ]


# A Hydra app over the project's configs whose task=math500 job kills its own process (as the
# kernel's OOM killer would) and whose other jobs write a file named after their task.
_DYING_APP = """
import os, signal, sys
from pathlib import Path
from types import SimpleNamespace
import hydra
from packedss.config import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path={conf!r}, config_name="config")
def main(cfg):
    if cfg.task.name == "math500":
        os.kill(os.getpid(), signal.SIGKILL)
    Path({out!r}, cfg.task.name).write_text("done")


main()
"""


@pytest.mark.slow
def test_a_job_killed_outright_is_a_failed_job_of_the_summary_with_the_local_launcher(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    app = tmp_path / "app.py"
    app.write_text(_DYING_APP.format(conf=str(PROJECT_ROOT / "conf"), out=str(out)))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, str(app), "-m", SWEEPER, "hydra/launcher=local", "model=tiny", "task=gsm8k,math500,arith",
         f"hydra.sweep.dir={tmp_path}/multirun"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    assert sorted(path.name for path in out.iterdir()) == ["arith", "gsm8k"]
    summary = result.stderr[result.stderr.index("1 of 3 jobs failed") :]
    assert "#1 model=tiny task=math500" in summary
    assert "ended without a result" in summary and "_log.out" in summary
    assert f"rerun: {sys.executable} {PROJECT_ROOT / 'run.py'} model=tiny task=math500" in summary


@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_the_submitit_launchers_are_the_projects_subclasses(launcher):
    from hydra import compose, initialize_config_dir
    from hydra.utils import get_class
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher

    from packedss.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    cls = get_class(cfg.hydra.launcher._target_)
    assert cls.__module__ == "hydra_plugins.packedss_sweeper.launchers"
    assert issubclass(cls, getattr(submitit_launcher, f"{launcher.capitalize()}Launcher"))


@pytest.mark.parametrize("kind", ["killed", "raised"])
def test_a_job_without_a_result_becomes_a_failed_job_return(kind, tmp_path):
    from hydra.core.utils import JobStatus
    from submitit.core.utils import FailedJobError, UncompletedJobError

    from hydra_plugins.packedss_sweeper.launchers import _Job

    class Lost:  # what submitit's Job.results raises for a job killed outright, or raising outside its run
        job_id = "123_4"
        paths = SimpleNamespace(stdout=tmp_path / "123_4_log.out", stderr=tmp_path / "123_4_log.err")

        def results(self):
            if kind == "killed":
                raise UncompletedJobError("Job 123_4 (task: 0) with path x_result.pkl\nhas not produced any output "
                                          "(state: OUT_OF_MEMORY)\nNo error stream produced.")  # fmt: skip
            raise FailedJobError("Job (task=0) failed during processing with trace:\n----------------------\n"
                                 "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: bad value\n"
                                 "----------------------\nYou can check full logs with 'job.stderr(0)'\nor at paths:\n"
                                 "  - a.err\n  - a.out")  # fmt: skip

    [returned] = _Job(Lost(), ["task=math500"]).results()
    assert returned.status == JobStatus.FAILED and returned.overrides == ["task=math500"]
    message = str(returned._return_value)
    assert "job 123_4" in message and "123_4_log.out" in message and "123_4_log.err" in message
    if kind == "killed":
        assert "ended without a result (state: OUT_OF_MEMORY" in message
    else:
        assert "failed before or after its run (ValueError: bad value)" in message
