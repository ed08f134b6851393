"""Sweeps: the jobs a multirun expands to, each job's config composed and checked before any job
starts, and the report of the jobs that failed at run time.

A sweep is Hydra's grid (`hydra.sweeper.params` and the command line's `a=1,2`), optionally a
union of several grids: `hydra.sweeper.grids` names grids whose overrides are added to the
params, one product per grid; a grid set to null is left out (a preset that extends another
drops one of its grids). The experiment presets use it for jobs that are not one product,
e.g. the native decoder, which has no verification order, beside schedules run under both
orders. The command line's overrides apply to every grid and win over the preset's values. Two
grids that expand to the same job run it once.

Used by the Hydra sweeper plugin (`hydra_plugins.packedss_sweeper`, every launcher) and by the
plan (`packedss.plan`), so that the plan lists exactly the jobs that a sweep runs.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

from packedss.errors import PackedSSError, user_message
from packedss.paths import PROJECT_ROOT


@dataclass
class Job:
    number: int  # position in the sweep (Hydra's job number)
    overrides: list[str]  # the overrides that compose this job's config
    cfg: Optional[DictConfig]  # the job's config (without the hydra node); None when it did not compose
    problem: Optional[str] = None  # why the job is invalid; None when it is valid


def _override_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def expand(
    parser: OverridesParser,
    params: Optional[Mapping[str, Any]],
    grids: Optional[Mapping[str, Optional[Mapping[str, Any]]]],
    arguments: Sequence[str],
) -> list[list[str]]:
    """Every job's override list, in Hydra's order: grid after grid, each expanded as Hydra's
    basic sweeper expands params + command line (the command line wins a key both set)."""
    common = [f"{key}={_override_value(value)}" for key, value in (params or {}).items()]
    jobs: list[list[str]] = []
    for grid in (grids or {"": {}}).values():
        if grid is None:
            continue
        own = [f"{key}={_override_value(value)}" for key, value in grid.items()]
        overrides = parser.parse_overrides([*common, *own, *arguments])
        for job in BasicSweeper.split_arguments(overrides, None)[0]:
            if job not in jobs:
                jobs.append(job)
    return jobs


def plain(node) -> dict:
    """A sweeper's params or grids as plain values, interpolations resolved against the master
    config, as Hydra resolves the sweeper's config when it instantiates the sweeper (a per-job
    value such as ${schedule.paper_width} belongs in the preset's top level, not in a grid)."""
    if node is None:
        return {}
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)


def job_config(config_loader, master_config: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """The config a launcher gives the job: composed from the master config's hydra overrides and
    the job's own, without the hydra node (what the task function receives)."""
    cfg = config_loader.load_sweep_config(master_config, list(overrides))
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def local_max_block(cfg, checkpoint) -> Optional[int]:
    """The largest block of the checkpoint's drafter when its config.json is on this machine (a
    local directory or the Hugging Face cache); None when it is not (checked again at run time)."""
    from packedss.families import family_named
    from packedss.models.checkpoint import read_config

    config_file = None
    if checkpoint.path:
        directory = Path(checkpoint.path).expanduser()
        if not directory.is_absolute() and not directory.exists():
            directory = PROJECT_ROOT / directory
        config_file = directory / "config.json"
    elif checkpoint.hub_id:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(checkpoint.hub_id, "config.json")
        config_file = Path(cached) if isinstance(cached, str) else None
    if config_file is None or not config_file.is_file():
        return None
    return family_named(cfg.model.family).max_block(read_config(config_file.parent, f"model {cfg.model.name}"))


def check_job(cfg) -> Optional[str]:
    """Why the job cannot run, from its config alone and without loading any weights or data:
    invalid values, no checkpoint for its width, a width its checkpoint's drafter cannot hold."""
    from packedss.config import check_out_dir, validate, validate_width
    from packedss.models import select_checkpoint

    try:
        validate(cfg)
        check_out_dir(cfg.out_dir)
        checkpoint = select_checkpoint(cfg.model, cfg.checkpoint_dirs)
        validate_width(cfg, local_max_block(cfg, checkpoint))
    except PackedSSError as err:
        return str(err)
    return None


def job_identity(cfg) -> str:
    """Two jobs that make the same records are one job: the same identity (packedss.job, the spec
    built from the config alone: AR at two widths is one job), the same record file, and the same
    selection of responses (limit, samples, repeats)."""
    from packedss.job import configured_spec
    from packedss.models import select_checkpoint

    spec = configured_spec(cfg, local_max_block(cfg, select_checkpoint(cfg.model, cfg.checkpoint_dirs)))
    return json.dumps([str(spec.record_path(cfg.out_dir)), cfg.limit, cfg.samples, cfg.repeats])


def compose_jobs(config_loader, master_config: DictConfig, params, grids, arguments: Sequence[str]) -> list[Job]:
    """The sweep's jobs, each composed and checked; a job that composes like an earlier one is dropped."""
    parser = OverridesParser.create(config_loader=config_loader)
    jobs: list[Job] = []
    seen: set[str] = set()
    for overrides in expand(parser, plain(params), plain(grids), arguments):
        try:
            cfg = job_config(config_loader, master_config, overrides)
        except Exception as err:  # Hydra's composition errors come in several types
            jobs.append(Job(len(jobs), overrides, None, user_message(err) or f"{type(err).__name__}: {err}"))
            continue
        problem = check_job(cfg)
        if problem is None:
            identity = job_identity(cfg)
            if identity in seen:
                continue
            seen.add(identity)
        jobs.append(Job(len(jobs), overrides, cfg, problem))
    return jobs


def invalid_jobs_message(jobs: Sequence[Job]) -> Optional[str]:
    """One message listing every invalid job of a sweep; None when all are valid."""
    invalid = [job for job in jobs if job.problem is not None]
    if not invalid:
        return None
    lines = [f"{len(invalid)} of {len(jobs)} jobs of this sweep are invalid; nothing was run. Fix or drop them:"]
    for job in invalid:
        lines.append(f"  #{job.number} {' '.join(job.overrides)}")
        lines.append(f"      {job.problem}")
    return "\n".join(lines)


def rerun_command(overrides: Sequence[str], interpreter: Optional[str] = None, cwd: Optional[Path] = None) -> str:
    """The command that runs one job of a sweep again, alone (it resumes from its records), as it
    runs when pasted in the directory the sweep ran in (`cwd`): the interpreter running the sweep
    (a bare `python` may be another one, or none, without the venv activated) and run.py, each
    relative to that directory when under it (`.venv/bin/python run.py ...` from the repository's
    root), every part quoted for the shell."""
    where = Path.cwd() if cwd is None else Path(cwd)
    program = [_path_from(where, interpreter or sys.executable or "python3", command=True),
               _path_from(where, PROJECT_ROOT / "run.py")]  # fmt: skip
    return shlex.join([*program, *overrides])


def _path_from(directory: Path, path: str | Path, command: bool = False) -> str:
    """`path` relative to `directory` when under it, else absolute; symbolic links kept (a venv's
    python is one). A command gets `./` where it would be a bare name, which the shell looks up
    on PATH."""
    absolute = Path(os.path.abspath(path))
    try:
        relative = absolute.relative_to(os.path.abspath(directory))
    except ValueError:
        return str(absolute)
    return f"./{relative}" if command and len(relative.parts) == 1 else str(relative)


@dataclass
class Failure:
    number: int
    overrides: list[str]
    error: BaseException


def describe_error(error: BaseException) -> str:
    if isinstance(error, PackedSSError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def failures_message(failures: Sequence[Failure], total: int) -> str:
    """The end-of-sweep summary: each failed job, its error, and the command to rerun it."""
    lines = [f"{len(failures)} of {total} jobs failed; the others ran to the end."]
    for failure in failures:
        lines.append(f"  #{failure.number} {' '.join(failure.overrides)}")
        lines.append(f"      error: {describe_error(failure.error)}")
        lines.append(f"      rerun: {rerun_command(failure.overrides)}")
    return "\n".join(lines)
