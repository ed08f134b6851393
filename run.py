"""Entry point: `python run.py [overrides]` runs one job; `python run.py -m ...` sweeps.

    python run.py                                   # embedded default: tiny model, arith, CPU
    python run.py model=nemotron8b task=gsm8k schedule=packed width=31 model.path=/local/dir
    python run.py -m schedule=linear,quadratic,packed width=8,16
    python run.py -m +experiment=table6 +paths=local  # a paper preset, checkpoints from conf/paths/local.yaml

A sweep checks every job before the first starts, runs every job even when some fail, and
lists the failed ones at the end (hydra_plugins/packedss_sweeper). Bad input, Hydra's own
composition errors included, ends with one `error: ...` line and exit status 2
(packedss.errors; PACKEDSS_TRACEBACK=1 shows the traceback).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from pathlib import Path

from packedss.errors import INTERRUPTED, PackedSSError, exit_status, raise_stopped, report, run_cli, stop_received, user_message

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, raise_stopped)  # stops like Ctrl-C, also while the libraries load
try:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import DictConfig

    from packedss.config import check_before_loading, register_configs
    from packedss.progress import JobHeartbeat

    register_configs()
except KeyboardInterrupt:  # Ctrl-C while torch and transformers load
    report(INTERRUPTED)
    sys.exit(130)
except Exception as err:  # Stopped, or what a library's import made of it
    stopped = stop_received()
    if stopped is None:
        raise
    report(str(stopped))
    sys.exit(stopped.exit_status)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        check_before_loading(cfg)
        label = f"{cfg.model.name}/{cfg.task.name}/{cfg.schedule.name}"
        with JobHeartbeat(label, enabled=cfg.progress):  # lines in a log while the job loads and warms up
            from packedss.runner import run_job  # torch's compiler and transformers: seconds

            result = run_job(cfg)
    except Exception as err:
        err = stop_received() or err
        if not isinstance(err, PackedSSError):
            if HydraConfig.get().mode == RunMode.MULTIRUN:
                traceback.print_exc()  # the job's log keeps where it failed; the summary keeps the message
            raise
        report(user_message(err), err)
        if HydraConfig.get().mode == RunMode.MULTIRUN and exit_status(err) == 2:
            raise  # Hydra records the job as failed and the sweep goes on; the sweeper lists it at the end
        if exit_status(err) == 2:
            remove_hydra_files()
        sys.exit(exit_status(err))  # a signal stops the whole sweep too
    print(f"{result.path}: {result.written} records written, {result.skipped} already recorded")


def remove_hydra_files() -> None:
    """Bad input leaves no run directory: remove what Hydra wrote for the job (its config copies
    and an empty log), then the run directory and its parents below the working directory while
    they are empty. A log with lines in it, and anything else, stays."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.output_subdir is not None:
        saved = run_dir / hydra_cfg.output_subdir
        for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
            (saved / name).unlink(missing_ok=True)
        remove_if_empty(saved)
    log = run_dir / f"{hydra_cfg.job.name}.log"
    if log.is_file() and log.stat().st_size == 0:
        log.unlink()
    cwd = Path.cwd()
    folder = run_dir.absolute()
    while remove_if_empty(folder) and folder.parent != cwd and cwd in folder.parent.parents:
        folder = folder.parent


def remove_if_empty(folder: Path) -> bool:
    try:
        folder.rmdir()
    except OSError:  # not empty, or already gone
        return False
    return True


if __name__ == "__main__":
    # Hydra then raises its composition errors instead of printing them in several lines with
    # its own exit status; run_cli prints each as one line.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    run_cli(main)
