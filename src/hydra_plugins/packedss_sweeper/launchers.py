"""The submitit launchers of conf/hydra/launcher (`local`, `slurm`), whose sweep outlives a job that
dies without a result, and whose SLURM sweep is checked before anything is submitted.

hydra-submitit-launcher collects the results of a sweep's jobs in order and stops at the first job
whose process ended without one (killed for memory, by a signal, cancelled, a crash, or out of
requeues): the jobs after it are never read and the sweeper's summary is lost. These launchers
read every job; a job without a result becomes a failed job of the summary (its error names the
job's log), so the sweeper reports all failures and every other job's outcome. An array that
sbatch refuses makes every job of it a failed job that names sbatch's reason.

The SLURM launcher also
- checks the sweep's job array with `sbatch --test-only` before the sweep starts (the sweeper asks
  it through `submission_problem`): a partition, account or resource request that the cluster
  refuses is one error line and nothing is submitted;
- polls job states with squeue where sacct cannot give them (accounting disabled, as on small
  clusters): it says so once, instead of submitit's warning at every poll. A poll the controller
  does not answer (an error, or no answer within POLL_TIMEOUT_S) leaves every job's state as it
  was, and the sweep keeps waiting: only a job that squeue no longer knows has ended."""

# No `from __future__ import annotations`: Hydra executes plugin modules outside sys.modules.
import re
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher as SubmititLocalLauncher
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher

# squeue states of a job that may still run (or is being requeued); any other state is final
WAITING_STATES = {
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING",
    "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "PREEMPTED", "RESV_DEL_HOLD", "READY", "UNKNOWN",
}  # fmt: skip
# squeue no longer lists a job some minutes after it ended (MinJobAge): its state is then unknown
GONE = "ENDED"
# seconds a job-state poll (sacct, squeue) may take; a poll that fails or takes longer is asked again
POLL_TIMEOUT_S = 120
SETTINGS_HINT = ("fix hydra.launcher.partition, account, cpus_per_task, gpus_per_node or mem_gb for this cluster "
                 "(sinfo lists its partitions and nodes)")  # fmt: skip


def failed_return(overrides: List[str], error: Exception) -> JobReturn:
    returned = JobReturn(overrides=overrides, status=JobStatus.FAILED)
    returned.return_value = error
    return returned


class _Job:
    """A submitit job whose `results()` is a failed JobReturn when the job produced no result, and
    which tells `on_result` (the sweep's progress) once it has its result."""

    def __init__(self, job: Any, overrides: List[str], on_result: Optional[Callable[..., None]] = None):
        self.job = job
        self.overrides = overrides
        self.on_result = on_result

    def results(self) -> List[JobReturn]:
        returns = self._results()
        if self.on_result is not None:
            self.on_result(failed=any(r.status != JobStatus.COMPLETED for r in returns))
        return returns

    def _results(self) -> List[JobReturn]:
        import submitit
        from packedss.errors import PackedSSError

        try:
            return self.job.results()
        except submitit.core.utils.FailedJobError as err:  # raised in the job, outside Hydra's run of it
            trace = [line for line in str(err).splitlines() if line.strip() and not line.startswith("-")]
            last = next((line.strip() for line in reversed(trace) if not line.startswith(("You can", "or at", "  - "))), "")
            error = PackedSSError(
                f"job {self.job.job_id} failed before or after its run ({last}); its log: {self.job.paths.stdout} "
                f"and {self.job.paths.stderr}"
            )
        except submitit.core.utils.UncompletedJobError as err:
            state = str(err).split("(state: ", 1)[1].split(")", 1)[0] if "(state: " in str(err) else "unknown"
            error = PackedSSError(
                f"job {self.job.job_id} ended without a result (state: {state}; killed for memory, by a signal, "
                f"cancelled, a crash, or out of requeues); its log: {self.job.paths.stdout} and {self.job.paths.stderr}. "
                "The records it wrote are kept: rerunning resumes after them"
            )
        return [failed_return(self.overrides, error)]


class _Refused:
    """A job of an array that sbatch refused: its result is a failed JobReturn naming sbatch's reason."""

    def __init__(self, overrides: List[str], reason: str, on_result: Optional[Callable[..., None]] = None):
        self.overrides = overrides
        self.reason = reason
        self.on_result = on_result

    def results(self) -> List[JobReturn]:
        from packedss.errors import PackedSSError

        if self.on_result is not None:
            self.on_result(failed=True)
        return [failed_return(self.overrides, PackedSSError(f"sbatch refused the job ({self.reason}); {SETTINGS_HINT}"))]


def sbatch_reason(output: str) -> str:
    """sbatch's error lines as one clause (`sbatch: error: ` left out)."""
    lines = [line.strip() for line in output.splitlines() if line.strip() and not line.startswith("sbatch: Job ")]
    return "; ".join(re.sub(r"^sbatch: error: ", "", line) for line in lines) or "no reason given"


@contextmanager
def _every_job_read(on_result: Optional[Callable[..., None]] = None) -> Iterator[None]:
    """While a sweep's jobs are submitted, wrap each submitted job in _Job (_Refused when sbatch
    refuses the array), each telling `on_result` when its result is read."""
    import submitit

    submit_array = submitit.AutoExecutor.map_array

    def map_array(executor: Any, fn: Any, *iterables: Sequence[Any]) -> List[Any]:
        overrides = [list(job) for job in iterables[0]] if iterables else []
        try:
            jobs = submit_array(executor, fn, *iterables)
        except (submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError) as err:
            return [_Refused(job, sbatch_reason(str(err)), on_result) for job in overrides]
        return [_Job(job, overrides[i] if i < len(overrides) else [], on_result) for i, job in enumerate(jobs)]

    submitit.AutoExecutor.map_array = map_array
    try:
        yield
    finally:
        submitit.AutoExecutor.map_array = submit_array


def _squeue_states(output: str) -> Dict[str, str]:
    """{job id: state} of `squeue --array --format=%i|%T` lines (array tasks as `<array id>_<task>`)."""
    from submitit.slurm.slurm import read_job_id

    states = {}
    for line in output.splitlines():
        job_id, _, state = line.strip().partition("|")
        if not state:
            continue
        for parts in read_job_id(job_id):  # a pending array may still be shown as `12_[0-3]`
            if len(parts) == 3:
                states.update({f"{parts[0]}_{task}": state for task in range(int(parts[1]), int(parts[2]) + 1)})
            else:
                states["_".join(parts[:2])] = state
    return states


def _polled(command: List[str]) -> "Optional[subprocess.CompletedProcess]":
    """A job-state poll's answer; None when it could not run or did not finish in POLL_TIMEOUT_S
    (a controller that does not answer), which leaves every job's state as it was."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=POLL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _watcher_class() -> type:
    from submitit.slurm.slurm import SlurmInfoWatcher

    class QuietWatcher(SlurmInfoWatcher):
        """submitit's job-state poller, which asks sacct until sacct fails (accounting disabled),
        then squeue: it says so once. A job that squeue no longer lists has ended (GONE)."""

        def __init__(self, delay_s: int) -> None:
            super().__init__(delay_s=delay_s)
            self.use_squeue = False

        def is_done(self, job_id: str, mode: str = "standard") -> bool:
            return self.get_state(job_id, mode=mode).split()[0].upper() not in WAITING_STATES

        def update(self) -> None:
            job_ids = sorted({job.split("_")[0] for job in self._registered - self._finished})
            if not job_ids:
                return
            self._num_calls += 1
            if not self.use_squeue:
                self._poll_sacct()
            if self.use_squeue:
                self._poll_squeue(job_ids)
            self._last_status_check = time.time()
            for job_id in self._registered - self._finished:
                if self.is_done(job_id, mode="cache"):
                    self._finished.add(job_id)

        def _poll_sacct(self) -> None:
            answer = _polled(self._make_command())
            if answer is None:
                return  # no answer: keep the states known, ask again at the next poll
            if answer.returncode == 0:
                self._info_dict.update(self.read_info(answer.stdout))
                return
            self.use_squeue = True
            reason = " ".join((answer.stderr or answer.stdout).split()) or f"exit status {answer.returncode}"
            print(f"sacct cannot tell job states on this cluster ({reason}); polling them with squeue instead",
                  file=sys.stderr, flush=True)  # fmt: skip

        def _poll_squeue(self, job_ids: List[str]) -> None:
            command = ["squeue", "--noheader", "--array", "--states=all", "--format=%i|%T", f"--jobs={','.join(job_ids)}"]
            answer = _polled(command)
            if answer is None or (answer.returncode != 0 and "Invalid job id" not in answer.stderr):
                return  # the controller did not answer: keep the states known, ask again at the next poll
            states = _squeue_states(answer.stdout) if answer.returncode == 0 else {}
            for job_id in self._registered - self._finished:
                if job_id.split("_")[0] in job_ids:
                    self._info_dict[job_id] = {"State": states.get(job_id, GONE)}

    return QuietWatcher


@contextmanager
def _watched_by(watcher: Any) -> Iterator[None]:
    from submitit.slurm.slurm import SlurmJob

    submitit_watcher = SlurmJob.watcher
    SlurmJob.watcher = watcher
    try:
        yield
    finally:
        SlurmJob.watcher = submitit_watcher


class LocalLauncher(SubmititLocalLauncher):
    reports_each_result = True  # the sweeper passes on_result (its progress); not kept on the pickled launcher

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
               on_result: Optional[Callable[..., None]] = None) -> Sequence[JobReturn]:  # fmt: skip
        with _every_job_read(on_result):
            return super().launch(job_overrides, initial_job_idx)


class SlurmLauncher(SubmititSlurmLauncher):
    # One per process, made at the first launch (submitit's is made at import): it says once that
    # it polls with squeue. A class attribute, so that the launcher pickled into each job leaves it.
    watcher: Any = None
    reports_each_result = True

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
               on_result: Optional[Callable[..., None]] = None) -> Sequence[JobReturn]:  # fmt: skip
        if SlurmLauncher.watcher is None:
            SlurmLauncher.watcher = _watcher_class()(delay_s=600)
        with _every_job_read(on_result), _watched_by(SlurmLauncher.watcher):
            return super().launch(job_overrides, initial_job_idx)

    def submission_problem(self, jobs: int) -> Optional[str]:
        """Why SLURM would refuse an array of `jobs` jobs with these settings, as `sbatch
        --test-only` says (nothing is submitted); None when it would take them."""
        import submitit
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
        from omegaconf import OmegaConf
        from submitit.slurm.slurm import _make_sbatch_string

        params = dict(self.params)
        folder = params.pop("submitit_folder")
        init = {"slurm_max_num_timeout": params.pop("max_num_timeout")} if "max_num_timeout" in params else {}
        common = set(OmegaConf.structured(BaseQueueConf).keys())
        try:
            executor = submitit.AutoExecutor(folder=folder, cluster="slurm", **init)
        except RuntimeError as err:  # submitit: no srun on PATH
            return (f"hydra/launcher=slurm needs SLURM's sbatch and srun on PATH ({err}); run the sweep where SLURM "
                    "is, or try SLURM on this machine with scripts/local_slurm.sh start (docs/reproducing.md)")  # fmt: skip
        executor.update_parameters(**{key if key in common else f"slurm_{key}": value for key, value in params.items()})
        # the script submitit writes for the sweep: one job alone, more as an array
        script = _make_sbatch_string(command="true", folder=executor._executor.folder,
                                     map_count=jobs if jobs > 1 else None, **executor._executor.parameters)  # fmt: skip
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory, "test-only.sh")
            path.write_text(script)
            try:
                answer = subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as err:
                return f"sbatch --test-only did not answer ({err}); check that the SLURM controller runs (sinfo)"
        if answer.returncode != 0:
            reason = sbatch_reason(answer.stderr + answer.stdout)
            return f"sbatch --test-only refuses this sweep's jobs ({reason}); {SETTINGS_HINT}"
        return None
