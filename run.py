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

from packedss.errors import INTERRUPTED, PackedSSError, Stopped, exit_status, raise_stopped, report, run_cli, user_message

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, raise_stopped)  # stops like Ctrl-C, also while the libraries load
try:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import DictConfig

    from packedss.config import register_configs
    from packedss.runner import run_job
except KeyboardInterrupt:  # Ctrl-C while torch and transformers load
    report(INTERRUPTED)
    sys.exit(130)
except Stopped as err:
    report(str(err))
    sys.exit(err.exit_status)

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        result = run_job(cfg)
    except PackedSSError as err:
        report(user_message(err), err)
        if HydraConfig.get().mode == RunMode.MULTIRUN and exit_status(err) == 2:
            raise  # Hydra records the job as failed and the sweep goes on; the sweeper lists it at the end
        sys.exit(exit_status(err))  # a signal stops the whole sweep too
    except Exception:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            traceback.print_exc()  # the job's log keeps where it failed; the summary keeps the message
        raise
    print(f"{result.path}: {result.written} records written, {result.skipped} already recorded")


if __name__ == "__main__":
    # Hydra then raises its composition errors instead of printing them in several lines with
    # its own exit status; run_cli prints each as one line.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    run_cli(main)
