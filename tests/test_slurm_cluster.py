"""The SLURM path (`hydra/launcher=slurm`) against a real one-node cluster (tests/slurm_cluster.py):
a sweep writes the local run's records; a job requeued mid-run, and one stopped by its time
limit, complete with every question once and records that say which attempt wrote them; a
cancelled job is a failed job of the sweep's summary; settings the cluster refuses are one error
line before anything is submitted, or, where sbatch --test-only cannot tell, named by the summary.

The cluster runs its jobs side by side, so the scenarios run together, once per session (the
first xdist worker runs them, under a file lock; their outcomes are kept in a JSON file), and
each test checks one of them. The time-limit job is sized from this machine's time per
response, to outlast its first attempt, and the requeued job to outlast the requeue's delivery."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from filelock import FileLock
from hydra import compose, initialize_config_dir
from submitit.core.utils import DelayedSubmission

from packedss.config import register_configs
from packedss.paths import CONF_DIR, PROJECT_ROOT
from packedss.records import read_records
from packedss.runner import run_job
from tests.bad_inputs import error_line
from tests.slurm_cluster import SCRIPT, Cluster, shared_folder, slurm_cluster  # noqa: F401 - the fixture
from tests.test_runner import TIMING_FIELDS, offline_env

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]

# The launcher's CPU settings on this cluster (its defaults ask for a GPU and 8 CPUs).
LAUNCHER = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0", "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.mem_gb=2"]  # fmt: skip
VOLATILE_FIELDS = TIMING_FIELDS | {"compile_s", "slurm"}
SWEEP = ["schedule=ar,packed", "limit=3"]
# The requeued job's questions: at least 32, and enough that the decoding left after its second
# record outlasts the requeue's delivery whatever this machine's speed (32 once all finished first).
REQUEUED_QUESTIONS = 32
REQUEUED_WORK_S = 10
# SLURM signals a job at its first time-limit check (every 30 s) that falls within
# signal_delay_s + 30 s of the limit. The time-limited job starts with a long limit, cut to whole
# minutes at least LIMIT_MARGIN_S ahead once its first run has written a record (its start-up
# takes longer on a loaded machine than a short limit leaves): the signal then comes at most
# max(30, 60 + LIMIT_MARGIN_S - SIGNAL_DELAY_S) seconds after the cut, 30 with this delay, which
# still leaves the job SIGNAL_DELAY_S seconds to stop at a record boundary before its limit.
SIGNAL_DELAY_S = 35
LIMIT_MARGIN_S = 5
# More decoding than a first run can do between the cut and its signal, even when the calibration
# ran 1.5 times slower than the job does (its second run decodes the rest).
TIME_LIMITED_WORK_S = 50
DEADLINE_S = 400
STARTED = time.monotonic()


def sweep_command(folder: Path, overrides: list[str], launcher: list[str]) -> list[str]:
    return [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", *launcher, *overrides, f"out_dir={folder / 'out'}",
            f"hydra.sweep.dir={folder / 'multirun'}"]  # fmt: skip


class Sweep:
    """A sweep through the slurm launcher whose jobs are named `name`, run in `folder`; what the
    scenario saw of it goes into `facts`."""

    def __init__(self, cluster: Cluster, folder: Path, name: str, overrides: list[str]):
        self.cluster, self.folder, self.name = cluster, folder, name
        self.facts: dict = {"timeline": {}}  # seconds from the start of the scenarios to each event
        folder.mkdir(parents=True)
        command = sweep_command(folder, [f"hydra.launcher.name={name}", *overrides], LAUNCHER)
        with open(folder / "stdout", "w") as stdout, open(folder / "stderr", "w") as stderr:
            self.process = subprocess.Popen(command, stdout=stdout, stderr=stderr,
                                            env=cluster.env(offline_env(folder)), cwd=folder)  # fmt: skip

    def mark(self, event: str) -> None:
        self.facts["timeline"][event] = round(time.monotonic() - STARTED, 1)

    def wait_for(self, condition, every: float = 0.2):
        """condition()'s first true value; None when the sweep ended first or after DEADLINE_S."""
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            value = condition()
            if value or self.process.poll() is not None:
                return value or None
            time.sleep(every)
        return None

    def job(self, states: tuple[str, ...], reason: str | None = None, task: str | None = None) -> str | None:
        """The id of its job (the array's `task` when given) once it is in one of `states`."""

        def found():
            for job, (state, why) in sorted(self.cluster.jobs(self.name).items()):
                if state in states and reason in (None, why) and task in (None, job.rpartition("_")[2]):
                    return job
            return None

        return self.wait_for(found)

    def release_after_requeue(self, *updates: str) -> bool:
        """Start the job as soon as it is requeued (see Cluster.release)."""
        job = self.job(("PENDING",), reason="BeginTime")
        if job is not None:
            self.mark("requeued")
            self.cluster.release(job, *updates)
        return job is not None

    def records(self) -> int:
        return sum(path.read_bytes().count(b"\n") for path in (self.folder / "out").rglob("*.jsonl"))

    def outcome(self) -> dict:
        try:
            status = self.process.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            status = f"still running after {DEADLINE_S} s"
        self.mark("ended")
        job = self.facts.get("job")
        return {"status": status, "stderr": (self.folder / "stderr").read_text(), "folder": str(self.folder),
                "daemon_log": self.cluster.daemon_log(job) if job else "", **self.facts}  # fmt: skip

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def scenario(function):
    """Run a scenario on a Sweep and give its outcome; an error in it is its outcome's `error`."""

    def run(cluster: Cluster, folder: Path, name: str, overrides: list[str], queued: threading.Event | None = None) -> dict:
        """`queued` is set once SLURM lists the sweep's jobs: they run before any submitted later."""
        sweep = Sweep(cluster, folder, name, overrides)
        error = {}
        try:
            if queued is not None:
                try:
                    sweep.wait_for(lambda: sweep.cluster.jobs(name))
                finally:
                    queued.set()
            function(sweep)
        except Exception as err:  # noqa: BLE001 - reported by the test that reads this outcome
            error = {"error": f"{type(err).__name__}: {err}"}
            sweep.end()
        try:
            return {**sweep.outcome(), **error}
        finally:
            sweep.end()

    return run


@scenario
def finished(sweep: Sweep) -> None:
    """Only waited for."""


@scenario
def time_limited(sweep: Sweep) -> None:
    job = sweep.facts["job"] = sweep.job(("RUNNING",))
    running = time.monotonic()
    sweep.mark("running")
    if job and sweep.wait_for(lambda: sweep.records() >= 1, 0.05):
        minutes = math.ceil((time.monotonic() - running + LIMIT_MARGIN_S) / 60)
        sweep.cluster.command("scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}")
        sweep.mark("limit cut")
    # its second run gets a longer limit, so that two runs finish the job whatever this machine's speed
    sweep.facts["requeued"] = sweep.release_after_requeue("TimeLimit=10")


@scenario
def requeued_and_cancelled(sweep: Sweep) -> None:
    """The array runs one job at a time: its job 1 waits while job 0 runs, is cancelled, and job 0
    is requeued once it has written two records."""
    job = sweep.facts["job"] = sweep.job(("RUNNING",), task="0")
    sweep.mark("running")
    waiting = sweep.facts["cancelled"] = sweep.job(("PENDING",), task="1")
    if waiting:
        sweep.cluster.command("scancel", waiting)
    recorded = sweep.facts["recorded_at_requeue"] = sweep.wait_for(lambda: sweep.records() >= 2 and sweep.records(), 0.05)
    if job and recorded:
        sweep.cluster.command("scontrol", "requeue", job)
        sweep.facts["requeued"] = sweep.release_after_requeue()


def reference_run(folder: Path) -> dict:
    """The sweep run on this machine (Hydra's basic launcher): the records SLURM's must equal."""
    folder.mkdir(parents=True)
    result = subprocess.run(sweep_command(folder, SWEEP, []), capture_output=True, text=True, env=offline_env(folder),
                            cwd=folder, timeout=DEADLINE_S)  # fmt: skip
    return {"status": result.returncode, "stderr": result.stderr, "folder": str(folder)}


def refused(cluster: Cluster, folder: Path, name: str, launcher: list[str]) -> dict:
    """A sweep the cluster refuses: what it printed, and whether anything was submitted or written."""
    folder.mkdir(parents=True)
    command = sweep_command(folder, [f"hydra.launcher.name={name}", *SWEEP], launcher)
    result = subprocess.run(command, capture_output=True, text=True, env=cluster.env(offline_env(folder)), cwd=folder,
                            timeout=DEADLINE_S)  # fmt: skip
    return {"status": result.returncode, "stderr": result.stderr, "stdout": result.stdout, "submitted": cluster.jobs(name),
            "written": sorted(path.name for path in folder.iterdir())}  # fmt: skip


def seconds_per_ar_response(folder: Path) -> float:
    """This machine's decoding time per response of the time-limited job's settings (in this
    process), on its CPU clock: the difference of a 12-response and a 2-response job, so that
    neither the job's start nor the machine's load at this moment counts. A wall-clock figure
    taken while the machine was busy once sized a job that then ran faster and finished before
    its time limit's signal; a job sized on CPU time lasts at least that long on any load.
    Wall-clock time per response over 3 bounds it below (a CPU clock that barely moved)."""
    register_configs()
    cpu, records = {}, []
    for limit in (2, 12):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=["schedule=ar", f"limit={limit}", f"out_dir={folder / str(limit)}"])
        started = time.thread_time()
        path = run_job(cfg).path
        cpu[limit] = time.thread_time() - started
        records, _ = read_records(path)
    wall = sum(record["wall_s"] for record in records) / len(records)
    return max((cpu[12] - cpu[2]) / 10, wall / 3)


def run_scenarios(cluster: Cluster, folder: Path) -> dict:
    global STARTED
    STARTED = time.monotonic()
    per_response = seconds_per_ar_response(folder / "calibration")
    responses = math.ceil(TIME_LIMITED_WORK_S / per_response)
    requeued_questions = max(REQUEUED_QUESTIONS, math.ceil(REQUEUED_WORK_S / per_response))
    requeued = ["schedule=ar,packed", f"limit={requeued_questions}", f"task.n={max(200, requeued_questions)}",
                "hydra.launcher.array_parallelism=1"]  # fmt: skip
    time_limit = ["schedule=ar", f"limit={responses}", f"task.n={max(200, responses)}", "hydra.launcher.timeout_min=10",
                  f"hydra.launcher.signal_delay_s={SIGNAL_DELAY_S}"]  # fmt: skip
    with ThreadPoolExecutor(max_workers=6) as pool:
        # the longest chain first: the time-limited job takes one CPU, the requeued one then the other
        futures = {}
        for name, function, overrides in (("time_limit", time_limited, time_limit),
                                          ("requeue", requeued_and_cancelled, requeued)):  # fmt: skip
            queued = threading.Event()
            futures[name] = pool.submit(function, cluster, folder / name, name, overrides, queued)
            queued.wait(timeout=DEADLINE_S)
        futures |= {
            "reference": pool.submit(reference_run, folder / "reference"),
            "sweep": pool.submit(finished, cluster, folder / "sweep", "sweep", SWEEP),
            "partition": pool.submit(refused, cluster, folder / "partition", "partition",
                                     [*LAUNCHER, "hydra.launcher.partition=nowhere"]),
            "gpu": pool.submit(refused, cluster, folder / "gpu", "gpu", ["hydra/launcher=slurm"]),  # its defaults: a GPU
        }  # fmt: skip
        runs = {name: future.result() for name, future in futures.items()}
    runs["time_limit"]["responses"] = responses
    runs["requeue"]["questions"] = requeued_questions
    return runs


@pytest.fixture(scope="module")
def slurm_runs(request, tmp_path_factory) -> dict:
    shared = shared_folder(tmp_path_factory)
    kept = shared / "slurm-runs.json"
    with FileLock(str(shared / "slurm-runs.lock")):
        if not kept.exists():
            cluster = request.getfixturevalue("slurm_cluster")
            kept.write_text(json.dumps(run_scenarios(cluster, shared / "slurm-runs")))
    return json.loads(kept.read_text())


def records_by_file(folder: str) -> dict[str, list[dict]]:
    out = Path(folder, "out")
    files = {}
    for path in sorted(out.rglob("*.jsonl")):
        records, bad = read_records(path)
        assert bad == [], bad
        files[path.relative_to(out).as_posix()] = records
    return files


def without_volatile(records: list[dict]) -> list[dict]:
    return [{key: value for key, value in record.items() if key not in VOLATILE_FIELDS} for record in records]


def attempts(records: list[dict]) -> list[int]:
    """The restart count of each record in file order: which run of the job wrote it."""
    return [record["slurm"]["restart_count"] for record in records]


def job_logs(run: dict) -> str:
    """The tails of the sweep's job logs (submitit's, one pair per job run), to say why a job failed."""
    logs = sorted(Path(run["folder"]).glob("multirun/.submitit/*/*_log.*"))
    logs = "".join(f"\n--- {path.name}:\n{path.read_text(errors='replace')[-1500:]}" for path in logs)
    return logs + (f"\n--- the cluster's daemons on its job:\n{run['daemon_log']}" if run.get("daemon_log") else "")


def assert_completed(run: dict) -> None:
    assert "error" not in run and run["status"] == 0, run.get("error", "") + run["stderr"][-3000:] + job_logs(run)


def test_a_sweep_through_slurm_writes_the_records_of_the_local_run(slurm_runs):
    reference, sweep = slurm_runs["reference"], slurm_runs["sweep"]
    assert_completed(reference)
    assert_completed(sweep)
    local, remote = records_by_file(reference["folder"]), records_by_file(sweep["folder"])
    assert sorted(local) == sorted(remote) and len(local) == 2
    for name in local:
        assert len(local[name]) == 3 and without_volatile(remote[name]) == without_volatile(local[name]), name
        assert all("slurm" not in record for record in local[name])
        assert {record["slurm"]["restart_count"] for record in remote[name]} == {0}
    assert sorted(records[0]["slurm"]["job_id"].split("_")[1] for records in remote.values()) == ["0", "1"]
    # accounting is disabled on this cluster: said once, then squeue alone
    assert sweep["stderr"].count("sacct cannot tell job states") == 1
    assert "Bypassing sacct error" not in sweep["stderr"] + Path(sweep["folder"], "stdout").read_text()


def test_a_job_requeued_mid_run_completes_with_every_question_once(slurm_runs):
    run = slurm_runs["requeue"]
    assert "error" not in run and run["requeued"], run.get("error", "") + run["stderr"][-3000:]
    [records] = [records for name, records in records_by_file(run["folder"]).items() if "/ar-" in name]
    questions = run["questions"]
    assert sorted(record["question_id"] for record in records) == sorted(f"arith/test/{i}" for i in range(questions))
    assert 2 <= run["recorded_at_requeue"] < questions
    done_first = attempts(records).count(0)
    assert run["recorded_at_requeue"] <= done_first < questions  # the first run stopped, the second finished
    assert attempts(records) == [0] * done_first + [1] * (questions - done_first)


def test_a_job_at_its_time_limit_stops_at_a_record_boundary_and_is_requeued(slurm_runs):
    run = slurm_runs["time_limit"]
    assert_completed(run)
    [records] = records_by_file(run["folder"]).values()  # read_records: no torn or invalid line
    responses = run["responses"]
    assert run["requeued"], "the job ended in its first run: it was never signalled"
    assert len(records) == responses == len({record["question_id"] for record in records})
    done_first = attempts(records).count(0)
    assert 0 < done_first < responses and attempts(records) == [0] * done_first + [1] * (responses - done_first)
    [log] = Path(run["folder"], "multirun").rglob(f"{run['job']}_0_log.err")
    assert re.search(r"Caught signal SIGUSR2 .*this job is timed-out", log.read_text()), log.read_text()[-3000:]
    # submitit requeued it with one time-out of max_num_timeout = 3 used
    [submitted] = Path(run["folder"], "multirun").rglob(f"{run['job']}_submitted.pkl")
    assert DelayedSubmission.load(submitted)._timeout_countdown == 2


def test_a_cancelled_job_is_a_failed_job_of_the_summary_and_the_others_complete(slurm_runs):
    run = slurm_runs["requeue"]  # its job 1 was cancelled while job 0 ran
    assert "error" not in run and run["status"] == 1 and run["cancelled"], run.get("error", "") + run["stderr"][-3000:]
    summary = run["stderr"][run["stderr"].index("1 of 2 jobs failed") :]
    questions = run["questions"]
    assert f"#1 schedule=packed limit={questions} task.n={max(200, questions)}" in summary
    assert f"job {run['cancelled']} ended without a result (state: CANCELLED" in summary
    assert re.search(rf"rerun: \S*python\S* \S*run\.py schedule=packed limit={questions} ", summary), summary
    assert [name.split("/")[-1][:3] for name in records_by_file(run["folder"])] == ["ar-"]  # job 0 completed


@pytest.mark.parametrize("case, reason", [("partition", "invalid partition specified: nowhere"),
                                          ("gpu", "Invalid generic resource (gres) specification")])  # fmt: skip
def test_settings_the_cluster_refuses_are_one_error_line_before_anything_is_submitted(slurm_runs, case, reason):
    run = slurm_runs[case]
    lines = run["stderr"].splitlines()
    assert run["status"] == 2 and len(lines) == 1, run["stderr"][-3000:]
    assert lines[0].startswith("error: sbatch --test-only refuses this sweep's jobs (") and reason in lines[0]
    assert "fix hydra.launcher.partition, account" in lines[0]
    assert run["submitted"] == {} and run["written"] == [] and run["stdout"] == ""


FAKE_SBATCH = """#!/bin/sh
# a cluster whose sbatch --test-only takes what its submission refuses (an account check)
case " $* " in
  *" --test-only "*) echo "sbatch: Job 1 to start at 2030-01-01T00:00:00 using 1 processors" >&2; exit 0 ;;
esac
echo "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified" >&2
exit 1
"""


def test_an_array_that_sbatch_refuses_at_submission_is_named_by_the_sweep_summary(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "sbatch").write_text(FAKE_SBATCH)
    (tools / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit looks for srun to tell a SLURM host
    for tool in tools.iterdir():
        tool.chmod(0o755)
    env = offline_env(tmp_path) | {"PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    command = sweep_command(tmp_path, ["hydra.launcher.account=nobody", "schedule=ar,packed", "limit=1"], LAUNCHER)
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=DEADLINE_S)
    assert result.returncode == 1, result.stderr[-3000:]
    summary = result.stderr[result.stderr.index("2 of 2 jobs failed") :]
    assert summary.count("error: sbatch refused the job (Batch job submission failed: Invalid account or "
                         "account/partition combination specified); fix hydra.launcher.partition, account") == 2
    assert "#1 schedule=packed limit=1" in summary, summary
    assert re.search(r"rerun: \S*python\S* \S*run\.py schedule=packed limit=1 ", summary), summary
    assert not (tmp_path / "out").exists()


def test_a_slurm_sweep_without_slurm_is_one_error_line(tmp_path):
    env = offline_env(tmp_path) | {"PATH": str(tmp_path / "no-tools")}
    result = subprocess.run(sweep_command(tmp_path, SWEEP, LAUNCHER), capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=DEADLINE_S)  # fmt: skip
    assert error_line(result).startswith("error: hydra/launcher=slurm needs SLURM's sbatch and srun on PATH (")
    assert not (tmp_path / "out").exists() and not (tmp_path / "multirun").exists()


def test_local_slurm_bad_usage_is_one_error_line(slurm_cluster, tmp_path):  # noqa: F811 - the fixture
    folder = tmp_path / "cluster"
    unknown = subprocess.run(["bash", str(SCRIPT), "nope"], capture_output=True, text=True,
                             env={**os.environ, "LOCAL_SLURM_DIR": str(folder)}, timeout=60)  # fmt: skip
    assert error_line(unknown) == f"error: unknown command 'nope'; use {SCRIPT} start, status or stop"
    assert not folder.exists()
    cpus = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LOCAL_SLURM_DIR": str(folder), "LOCAL_SLURM_CPUS": "zero"})  # fmt: skip
    assert error_line(cpus).startswith("error: LOCAL_SLURM_CPUS=zero is not a CPU count from 1 to this machine's ")
    assert list((folder / "run").iterdir()) == []  # no daemon started


def test_local_slurm_status_names_the_running_daemons(slurm_cluster):  # noqa: F811 - the fixture
    status = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "LOCAL_SLURM_DIR": str(slurm_cluster.folder)})  # fmt: skip
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    for daemon in ("munged", "slurmctld", "slurmd"):
        assert re.fullmatch(rf"{daemon}: running \(pid \d+\)", lines.pop(0))
    assert lines[0] == f"export SLURM_CONF={slurm_cluster.conf}" and "local*" in status.stdout  # sinfo's partition


FAKE_SACCT = """#!/bin/sh
echo "Slurm accounting storage is disabled" >&2
exit 1
"""


def test_without_accounting_job_states_come_from_squeue_said_once(tmp_path, monkeypatch, capsys):
    from hydra_plugins.packedss_sweeper.launchers import GONE, _watcher_class

    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "sacct").write_text(FAKE_SACCT)
    # squeue lists the array's tasks (a pending range folded) and not job 6, which ended long ago
    (tools / "squeue").write_text("#!/bin/sh\nprintf '5_0|RUNNING\\n5_1|CANCELLED\\n7_[0-1]|PENDING\\n'\n")
    for tool in tools.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    watcher = _watcher_class()(delay_s=600)
    for job in ("5_0", "5_1", "6", "7_1"):
        watcher.register_job(job)
    watcher.update()
    watcher.update()
    states = {job: watcher.get_state(job, mode="cache") for job in ("5_0", "5_1", "6", "7_1")}
    assert states == {"5_0": "RUNNING", "5_1": "CANCELLED", "6": GONE, "7_1": "PENDING"}
    assert [watcher.is_done(job, mode="cache") for job in states] == [False, True, True, False]
    assert capsys.readouterr().err.count("sacct cannot tell job states on this cluster (Slurm accounting storage is "
                                         "disabled); polling them with squeue instead") == 1
