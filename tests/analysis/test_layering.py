"""The analysis modules import one another one way: each only from modules on a lower floor."""

import ast
from pathlib import Path

import packedss.analysis

PACKAGE = Path(packedss.analysis.__file__).parent
FLOORS = {
    "paper_numbers": 0,
    "bootstrap": 0,
    "load": 0,
    "audit": 1,
    "metrics": 1,
    "table": 1,
    "compare": 2,
    "concurrency": 2,
    "acceptance": 2,
    "select": 2,
    "render": 2,
    "measured_tables": 3,
    "paired_tables": 3,
    "acceptance_tables": 3,
    "acceptance_figures": 3,
    "concurrency_figures": 3,
    "specbench": 3,
    "tables": 4,
    "figures": 4,
    "__init__": 5,
    "__main__": 6,
}
MAX_LINES = 400


def _siblings(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "packedss.analysis":
            names |= {alias.name for alias in node.names if alias.name in FLOORS}
            if any(alias.name not in FLOORS for alias in node.names):
                names.add("__init__")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("packedss.analysis."):
            names.add(node.module.rsplit(".", 1)[1])
    return names


def test_every_module_has_a_floor_and_imports_only_lower_floors():
    modules = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert modules == sorted(FLOORS), "give every analysis module a floor in FLOORS"
    for name in modules:
        for sibling in _siblings(PACKAGE / f"{name}.py"):
            assert FLOORS[sibling] < FLOORS[name], f"{name} (floor {FLOORS[name]}) imports {sibling} (floor {FLOORS[sibling]})"


def test_render_reads_only_the_table_model():
    assert _siblings(PACKAGE / "render.py") == {"table"}


def test_no_module_is_long():
    for path in PACKAGE.glob("*.py"):
        assert len(path.read_text().splitlines()) <= MAX_LINES, path.name
