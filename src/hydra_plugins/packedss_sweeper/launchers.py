"""The submitit launchers of conf/hydra/launcher (`local`, `slurm`), whose sweep outlives a job that
dies without a result.

hydra-submitit-launcher collects the results of a sweep's jobs in order and stops at the first job
whose process ended without one (killed for memory, by a signal, a crash, or out of requeues): the
jobs after it are never read and the sweeper's summary is lost. These launchers read every job; a
job without a result becomes a failed job of the summary (its error names the job's log), so the
sweeper reports all failures and every other job's outcome."""

# No `from __future__ import annotations`: Hydra executes plugin modules outside sys.modules.
from contextlib import contextmanager
from typing import Any, Iterator, List, Sequence

from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher as SubmititLocalLauncher
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher


class _Job:
    """A submitit job whose `results()` is a failed JobReturn when the job produced no result."""

    def __init__(self, job: Any, overrides: List[str]):
        self.job = job
        self.overrides = overrides

    def results(self) -> List[JobReturn]:
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
                f"a crash, or out of requeues); its log: {self.job.paths.stdout} and {self.job.paths.stderr}. "
                "The records it wrote are kept: rerunning resumes after them"
            )
        returned = JobReturn(overrides=self.overrides, status=JobStatus.FAILED)
        returned.return_value = error
        return [returned]


@contextmanager
def _every_job_read() -> Iterator[None]:
    """While a sweep's jobs are submitted, wrap each submitted job in _Job."""
    import submitit

    submit_array = submitit.AutoExecutor.map_array

    def map_array(executor: Any, fn: Any, *iterables: Sequence[Any]) -> List[_Job]:
        overrides = list(iterables[0]) if iterables else []
        jobs = submit_array(executor, fn, *iterables)
        return [_Job(job, list(overrides[i]) if i < len(overrides) else []) for i, job in enumerate(jobs)]

    submitit.AutoExecutor.map_array = map_array
    try:
        yield
    finally:
        submitit.AutoExecutor.map_array = submit_array


class LocalLauncher(SubmititLocalLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        with _every_job_read():
            return super().launch(job_overrides, initial_job_idx)


class SlurmLauncher(SubmititSlurmLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        with _every_job_read():
            return super().launch(job_overrides, initial_job_idx)
