"""Helpers of the bad-input tests (docs/errors.md): run an entry point as a user does and check
that it ended with exactly one `error: ` line, its exit status, and no record file touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from packedss.paths import PROJECT_ROOT

SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"


def offline_env(tmp_path: Path, **extra: str) -> dict:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), PYTHONUNBUFFERED="1")
    env.pop("PACKEDSS_TRACEBACK", None)
    env.update(extra)
    return env


def run_py_command(args: list[str], tmp_path: Path) -> list[str]:
    return [sys.executable, str(PROJECT_ROOT / "run.py"), *args, f"hydra.run.dir={tmp_path}/hydra",
            f"hydra.sweep.dir={tmp_path}/hydra-multi"]  # fmt: skip


def run(command: list[str], tmp_path: Path, cwd: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, env=offline_env(tmp_path), cwd=cwd or tmp_path,
                          timeout=600, **kwargs)  # fmt: skip


def run_py(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return run(run_py_command(args, tmp_path), tmp_path)


def module(name: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", name, *args], tmp_path)


def script(name: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return run([sys.executable, str(PROJECT_ROOT / "scripts" / name), *args], tmp_path)


def error_line(result: subprocess.CompletedProcess, status: int = 2) -> str:
    """The one line the entry point wrote on stderr, checked to be an error line with `status`."""
    lines = result.stderr.splitlines()
    assert result.returncode == status, f"exit status {result.returncode}, stderr:\n{result.stderr[-3000:]}"
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{result.stderr[-3000:]}"
    assert lines[0].startswith("error: ") and "; " in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under a folder and its bytes ({} when the folder does not exist)."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
