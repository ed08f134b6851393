"""The benchmark modules (packedss.benchmark) import one another one way: no module imports one
that imports it back, at run time or for type checking."""

from __future__ import annotations

import ast

from packedss.paths import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "src" / "packedss" / "benchmark"


def imported_benchmark_modules(path) -> set[str]:
    """The packedss.benchmark modules that a module's import statements name (anywhere in it)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name.split(".")[2] for name in names if name.startswith("packedss.benchmark.") and name.count(".") >= 2}


def test_no_benchmark_module_imports_one_that_imports_it_back():
    modules = {path.stem: path for path in PACKAGE.glob("*.py") if path.stem != "__init__"}
    graph = {name: imported_benchmark_modules(path) & set(modules) - {name} for name, path in modules.items()}
    circles = []

    def visit(name: str, trail: list[str]) -> None:
        for other in sorted(graph[name]):
            if other in trail:
                circles.append(trail[trail.index(other):] + [other])
            elif len(trail) < len(graph):
                visit(other, trail + [other])

    for name in sorted(graph):
        visit(name, [name])
    assert circles == [], " ; ".join(" -> ".join(circle) for circle in circles)
