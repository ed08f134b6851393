"""Entry point: `python run.py [overrides]` runs one job; `python run.py -m ...` sweeps.

    python run.py                                   # embedded default: tiny model, arith, CPU
    python run.py model=nemotron8b task=gsm8k schedule=packed width=31 model.path=/local/dir
    python run.py -m schedule=linear,quadratic,packed width=8,16
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from packedss.config import register_configs
from packedss.errors import PackedSSError
from packedss.runner import run_job

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        result = run_job(cfg)
    except PackedSSError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"{result.path}: {result.written} records written, {result.skipped} already recorded")


if __name__ == "__main__":
    main()
