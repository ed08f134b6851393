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


DOCS = PROJECT_ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SECTION_REFERENCE = re.compile(r"\b([a-z]+)\.md §(\d+(?:\.\d+)?)")
SECTION_HEADING = re.compile(r"^#{2,4} (\d+(?:\.\d+)?)\.? ", re.M)
# Where the documentation's sections are referred to by number.
REFERRING = ("README.md", "Makefile", "docs/*.md", "src/**/*.py", "scripts/*", "tests/**/*.py", "conf/**/*.yaml")


def anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(document: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", document.read_text(), flags=re.M | re.S)  # a fence's '#' lines are no headings
    return {anchor(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


@pytest.mark.parametrize("document", ["README.md", *sorted(str(p.relative_to(PROJECT_ROOT)) for p in DOCS.glob("*.md"))])
def test_every_relative_link_reaches_a_file_and_its_heading(document):
    path = PROJECT_ROOT / document
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, fragment = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists() or (fragment and linked.suffix == ".md" and fragment not in anchors(linked)):
            broken.append(target)
    assert not broken, f"{document}: {broken}"


def test_every_numbered_section_reference_names_a_section_of_its_document():
    numbered = {doc.stem: set(SECTION_HEADING.findall(doc.read_text())) for doc in DOCS.glob("*.md")}
    wrong = []
    for pattern in REFERRING:
        for path in sorted(PROJECT_ROOT.glob(pattern)):
            if not path.is_file() or ".venv" in path.parts:
                continue
            for stem, number in SECTION_REFERENCE.findall(path.read_text(errors="replace")):
                if stem in numbered and number not in numbered[stem]:
                    wrong.append(f"{path.relative_to(PROJECT_ROOT)}: {stem}.md §{number}")
    assert not wrong, wrong


def test_the_readme_shows_the_commands_and_statuses_a_reader_needs():
    readme = (PROJECT_ROOT / "README.md").read_text()
    for shown in ("--tables concurrency", "--figures C1", "--strict", "run.py model.cost_shape=", "jupyter execute notebooks/",
                  "make reproduce-table6 MODEL=tiny LIMIT=10", "make demo", "make test", "run.py -m "):  # fmt: skip
        assert shown in readme, shown
    assert re.search(r"Exit status 2 when no usable record was found", readme)
    fenced = "\n".join(re.findall(r"^```\w*\n(.*?)^```", readme, re.M | re.S)).splitlines()
    fenced += [line.strip() for line in readme.splitlines() if line.startswith("    ")]  # indented command blocks
    bare = [line for line in fenced if re.match(r"\s*(python|python3) (run\.py|-m packedss|scripts/)", line)]
    assert not bare, bare  # without the venv activated, a bare python has none of the project's packages


def _table_rows(text: str, header_start: str) -> list[list[str]]:
    """The cells of the Markdown table whose header line starts with `header_start`."""
    rows = []
    for line in text[text.index(header_start) :].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_readmes_performance_figures_are_those_of_performance_md():
    readme = (PROJECT_ROOT / "README.md").read_text()
    performance = (DOCS / "performance.md").read_text()
    section = performance[performance.index("### 10.1 ") : performance.index("### 10.2 ")]
    measured = {(row[0], row[1]): row for row in _table_rows(section, "| Schedule | Regime |")}
    shown = _table_rows(readme, "| Schedule | Tok/s eager |")
    assert len(shown) == 4
    for schedule, eager, compiled, ratio, _ in shown:
        assert measured[(schedule, "eager")][3] == eager and measured[(schedule, "compiled:default")][3] == compiled, schedule
        assert measured[(schedule, "compiled:default")][15] == ratio, schedule
    command = ".venv/bin/python scripts/bench_schedules.py --model tiny --schedules ar,linear,quadratic,packed --limit 100 --compile default --replay"
    assert command in readme and command in section
