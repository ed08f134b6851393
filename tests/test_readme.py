"""The README's commands run as written: every fenced block marked `<!-- test -->` on the line
before its fence runs line by line from the project root, with the venv not activated."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from packedss.paths import PROJECT_ROOT

MARKER = "<!-- test -->"
VENV_PYTHON = ".venv/bin/python"


def marked_commands(readme: Path) -> list[str]:
    """The command lines of the README's marked fences (comment-only and blank lines left out)."""
    commands = []
    for block in re.findall(rf"^{re.escape(MARKER)}\n```\w*\n(.*?)^```", readme.read_text(), re.M | re.S):
        commands += [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return commands


def test_the_readme_marks_some_commands():
    commands = marked_commands(PROJECT_ROOT / "README.md")
    assert len(commands) >= 3 and all(c.startswith(VENV_PYTHON) for c in commands), commands


@pytest.mark.parametrize("command", marked_commands(PROJECT_ROOT / "README.md"))
def test_a_marked_readme_command_runs_as_written(command):
    # A checkout whose environment lives elsewhere (a worktree) runs the same interpreter there.
    if not (PROJECT_ROOT / VENV_PYTHON).exists():
        command = command.replace(VENV_PYTHON, sys.executable, 1)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    result = subprocess.run(["bash", "-c", command], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() and "Traceback" not in result.stderr, result.stderr[-2000:]
