"""A one-node SLURM cluster for the tests: scripts/local_slurm.sh, started once per test session
(by the first pytest-xdist worker that needs it, under a file lock; the last one stops it), and
what the tests ask of it (job states, requeue, release). Where SLURM cannot be had (not root,
no apt-get, the install fails) the tests skip with the script's reason; a cluster that does not
come up fails them."""

from __future__ import annotations

import getpass
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from packedss.paths import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "local_slurm.sh"
UNAVAILABLE = 3  # the script's exit status when SLURM cannot be had on this machine


@dataclass(frozen=True)
class Cluster:
    folder: Path

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    def env(self, env: dict | None = None) -> dict:
        """`env` (default: this process's) with the cluster's SLURM_CONF."""
        return {**(os.environ if env is None else env), "SLURM_CONF": str(self.conf)}

    def command(self, *args: str) -> str:
        return subprocess.run(args, env=self.env(), capture_output=True, text=True, check=True, timeout=60).stdout

    def jobs(self, name: str) -> dict[str, tuple[str, str]]:
        """{job id: (state, reason)} of the jobs named `name`, ended ones included."""
        lines = self.command("squeue", "--noheader", "--array", "--states=all", f"--name={name}", "--format=%i|%T|%r")
        return {job: (state, reason) for job, state, reason in (line.split("|") for line in lines.split())}

    def daemon_log(self, job_id: str) -> str:
        """What the controller's and the node's logs say of job `job_id`, to tell why it ended as
        it did (the cluster's folder is removed when the session ends)."""
        said = re.compile(rf"(JobId=|job |StepId=|\[){re.escape(job_id)}\b")
        lines = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.folder / "log" / name
            if path.exists():
                lines += [f"{name}: {line}" for line in path.read_text(errors="replace").splitlines() if said.search(line)]
        return "\n".join(lines[-60:])

    def restarts(self, job_id: str) -> int:
        fields = self.command("scontrol", "show", "job", job_id).split()
        return int(next(field for field in fields if field.startswith("Restarts=")).split("=")[1])

    def release(self, job_id: str, *updates: str) -> None:
        """Start a requeued job two seconds from now: SLURM holds it back for two minutes (its
        BeginTime) because the requeue revokes the job's credential, to the second; a run launched
        within that same second is refused ("Job credential revoked") and the job ends FAILED."""
        self.command("scontrol", "update", f"JobId={job_id}", "StartTime=now+2", *updates)


def _script(folder: Path, command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOCAL_SLURM_DIR": str(folder)}
    return subprocess.run(["bash", str(SCRIPT), command], env=env, capture_output=True, text=True, timeout=900)


def shared_folder(tmp_path_factory) -> Path:
    """A folder all xdist workers of this session share (pytest's own temporary folder without them)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> Iterator[Cluster]:
    shared = shared_folder(tmp_path_factory)
    # not in pytest's folders, which only their owner may enter: munged's socket must be reachable by all
    cluster = Cluster(Path(tempfile.gettempdir()) / f"packedss-slurm-{getpass.getuser()}-{shared.name}")
    users, unavailable = shared / "slurm.users", shared / "slurm.unavailable"
    with FileLock(str(shared / "slurm.lock")):
        if unavailable.exists():
            pytest.skip(unavailable.read_text())
        count = int(users.read_text()) if users.exists() else 0
        if count == 0:
            started = _script(cluster.folder, "start")
            if started.returncode == UNAVAILABLE:
                reason = f"SLURM cannot be had here: {started.stderr.strip().splitlines()[-1].removeprefix('error: ')}"
                unavailable.write_text(reason)
                pytest.skip(reason)
            assert started.returncode == 0, f"the local SLURM cluster did not start:\n{started.stderr[-3000:]}"
        users.write_text(str(count + 1))
    try:
        yield cluster
    finally:
        with FileLock(str(shared / "slurm.lock")):
            count = int(users.read_text()) - 1
            users.write_text(str(count))
            if count == 0:
                pids = [int(path.read_text()) for path in (cluster.folder / "run").glob("*.pid")]
                stopped = _script(cluster.folder, "stop")
                assert stopped.returncode == 0, stopped.stderr[-3000:]
                assert len(pids) == 3 and not [pid for pid in pids if Path(f"/proc/{pid}").exists()], stopped.stdout
                shutil.rmtree(cluster.folder)
