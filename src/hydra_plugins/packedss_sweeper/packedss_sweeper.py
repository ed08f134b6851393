"""The project's Hydra sweeper (`hydra/sweeper=packedss`): Hydra's basic grid sweeper, plus named
grids (`hydra.sweeper.grids`, see packedss.sweep), which

- composes and checks every job before the first one starts: when any is invalid, one message
  lists them all, nothing runs, and the exit status is 2; a launcher with `submission_problem`
  (SLURM's: `sbatch --test-only`) is asked whether the cluster takes the jobs, and its answer
  is one error line before anything is submitted;
- runs every job even when some fail at run time (a data error, an out-of-memory, a model that
  cannot load), then lists the failed jobs with their error and the command to rerun each, and
  exits with status 1;
- says, when the sweep starts and as each job ends, how many jobs are done and left and the time
  left estimated from the jobs finished so far (packedss.progress).

It hands the jobs to the configured launcher (basic, submitit local, submitit slurm), so every
launcher goes through the same checks. packedss is imported only when a sweep starts: Hydra
imports every plugin at each start."""

# No `from __future__ import annotations`: Hydra executes plugin modules outside sys.modules,
# where dataclasses cannot resolve string annotations.
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobStatus
from omegaconf import OmegaConf


@dataclass
class PackedSSSweeperConf:
    _target_: str = "hydra_plugins.packedss_sweeper.packedss_sweeper.PackedSSSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None
    # name -> overrides: the sweep is the union of params x grid over the grids (None: params
    # alone); a grid set to null is dropped (a preset that extends another leaves it out)
    grids: Optional[Dict[str, Any]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="packedss", node=PackedSSSweeperConf, provider="packedss")


class PackedSSSweeper(BasicSweeper):
    def __init__(
        self,
        max_batch_size: Optional[int],
        params: Optional[Dict[str, str]] = None,
        grids: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.grids = grids

    def sweep(self, arguments: List[str]) -> Any:
        from packedss.progress import SweepProgress
        from packedss.sweep import Failure, compose_jobs, failures_message, invalid_jobs_message

        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        tic = time.perf_counter()
        jobs = compose_jobs(self.hydra_context.config_loader, self.config, self.params, self.grids, arguments)
        message = invalid_jobs_message(jobs)
        if message is not None:
            print(f"error: {message}", file=sys.stderr)
            raise SystemExit(2)
        submission_problem = getattr(self.launcher, "submission_problem", None)  # the SLURM launcher's
        if submission_problem is not None:
            problem = submission_problem(min(len(jobs), self.max_batch_size or len(jobs)))
            if problem is not None:
                print(f"error: {problem}", file=sys.stderr)
                raise SystemExit(2)
        print(f"{len(jobs)} jobs checked in {time.perf_counter() - tic:.1f} s", file=sys.stderr)

        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        # The basic launcher runs a batch in this process, one job after another: one job a
        # batch, so that the progress line follows each job.
        batch_size = self.max_batch_size or (1 if isinstance(self.launcher, BasicLauncher) else None)
        self.overrides = list(self.split_overrides_to_chunks([job.overrides for job in jobs], batch_size))
        returns = []
        failures: List[Failure] = []
        progress = SweepProgress(len(jobs))
        # A launcher that reads its jobs' results one by one (the submitit ones) reports each as it is read.
        reporting = getattr(self.launcher, "reports_each_result", False)
        first = 0
        while not self.is_done():
            batch = self.get_job_batch()
            if reporting:
                results = self.launcher.launch(batch, initial_job_idx=first, on_result=progress.job_finished)
            else:
                results = self.launcher.launch(batch, initial_job_idx=first)
            for number, (overrides, result) in enumerate(zip(batch, results), start=first):
                if result.status != JobStatus.COMPLETED:
                    failures.append(Failure(number, list(overrides), result._return_value))
                if not reporting:
                    progress.job_finished(failed=result.status != JobStatus.COMPLETED)
            first += len(batch)
            returns.append(results)
        if failures:
            print(failures_message(failures, len(jobs)), file=sys.stderr)
            raise SystemExit(1)
        return returns
