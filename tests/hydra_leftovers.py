"""Which Hydra run directories in the repository a test session left behind.

Hydra's default run and sweep directories (outputs/<date>/<time>, multirun/<date>/<time>) appear
in the repository when a run.py is started there without a hydra.run.dir or hydra.sweep.dir of
its own. The user's own runs make them too, also while the suite runs, so a directory counts as
the suite's only when it appeared after the session started and the configuration Hydra saved of
its runs (.hydra/overrides.yaml and config.yaml, a sweep's overrides) names a path under the
session's temporary root: every test's tmp_path lies there, and a test's run.py is given its
record, data or checkpoint folders there. Hydra saves no environment variables, so a marker in the
children's environment could not be read back from the directory."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

HYDRA_DEFAULT_DIRS = ("outputs", "multirun")


def hydra_run_dirs(root: Path) -> set[str]:
    """The run directories under root's outputs/ and multirun/ (two levels: date, time)."""
    return {str(p.relative_to(root)) for name in HYDRA_DEFAULT_DIRS for p in (root / name).glob("*/*")}


def saved_run_config(run_dir: Path) -> str:
    """What the runs in run_dir were told: each job's overrides and composed config
    (.hydra/overrides.yaml, .hydra/config.yaml) and a sweep's overrides (multirun.yaml's
    hydra.overrides.task). Not Hydra's own settings, which name the run directory and the working
    directory, in the repository whoever started the run."""
    texts = [p.read_text(errors="replace") for name in ("overrides.yaml", "config.yaml") for p in sorted(run_dir.glob(f"**/.hydra/{name}"))]
    for sweep in run_dir.glob("multirun.yaml"):
        try:
            saved = yaml.safe_load(sweep.read_text(errors="replace")) or {}
            texts += [str(o) for o in saved.get("hydra", {}).get("overrides", {}).get("task", [])]
        except (yaml.YAMLError, AttributeError):  # a sweep still writing it, or another tool's file
            continue
    return "\n".join(texts)


def names_folder(run_dir: Path, folder: Path) -> bool:
    """Whether the runs in run_dir were given `folder` or a path under it (a path that only begins
    with the same characters, such as pytest-12 for pytest-1, does not count)."""
    spellings = sorted({str(folder), str(folder.resolve())}, key=len, reverse=True)
    pattern = re.compile(f"(?:{'|'.join(map(re.escape, spellings))})(?![^/\\s'\",\\]}}])")
    return pattern.search(saved_run_config(run_dir)) is not None


@dataclass
class Leftovers:
    suite: list[str]  # appeared during the session, its configuration names the session's temporary root
    others: list[str]  # appeared during the session, a run of someone else's (the user's own README commands)


def leftovers(root: Path, before: set[str], temp_root: Path) -> Leftovers:
    suite, others = [], []
    for name in sorted(hydra_run_dirs(root) - before):
        (suite if names_folder(root / name, temp_root) else others).append(name)
    return Leftovers(suite, others)


def report_lines(left: Leftovers) -> tuple[str | None, str | None]:
    """(the error line on the suite's leftovers, the note on the other runs left alone), None when none."""
    error = note = None
    if left.suite:
        error = (f"error: the suite left Hydra run directories in the repository ({', '.join(left.suite)}); "
                 "give each run.py a hydra.run.dir or hydra.sweep.dir under tmp_path")  # fmt: skip
    if left.others:
        note = (f"note: {', '.join(left.others)} appeared in the repository while the suite ran, from runs that name "
                "none of its temporary folders (your own?): not counted as the suite's, left in place")  # fmt: skip
    return error, note
