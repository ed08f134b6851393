"""What a test can check of the architecture: data flows one way (the decoding core imports no
model, no task, no I/O stage), nothing outside the model adapters reaches into a backbone, and
each schedule's facts live on its class, not in tables keyed by schedule name elsewhere."""

from __future__ import annotations

import ast
from pathlib import Path

import packedss

PACKAGE = Path(packedss.__file__).parent
SCHEDULE_NAMES = {"ar", "linear", "quadratic", "packed", "native"}
# Tables keyed by schedule name that are not a schedule's facts: display labels and colours,
# the paper's published per-call times, and the benchmark's builders of one iteration's calls.
SCHEDULE_KEYED_ALLOWED = {"analysis/metrics.py", "benchmark/calls.py"}


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (PACKAGE / folder).rglob("*.py")) if folders else sorted(PACKAGE.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names


def test_the_decoding_core_imports_only_itself_torch_numpy_and_the_standard_library():
    """NumPy for the round's readout on a CPU (batched_ops._Greedy); every GPU image holds it too."""
    for path in _modules("decoding"):
        for name in _imports(path):
            if name.startswith("packedss"):
                assert name.startswith(("packedss.decoding", "packedss.errors")), f"{path.name} imports {name}"
            else:
                assert name.split(".")[0] in {"torch", "numpy", "__future__", "abc", "array", "collections", "dataclasses", "enum",
                                              "functools", "gc", "hashlib", "math", "time", "typing"}, f"{path.name}: {name}"  # fmt: skip


def test_nothing_outside_the_adapters_reaches_into_a_backbone():
    outside = [p for p in _modules() if not {"models", "training", "benchmark"} & set(p.relative_to(PACKAGE).parts)]
    for path in outside:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                assert node.attr != "backbone", f"{path.relative_to(PACKAGE)}:{node.lineno} reads .backbone"


def test_no_table_keyed_by_schedule_name_outside_the_schedules():
    for path in _modules():
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("decoding/") or relative in SCHEDULE_KEYED_ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                assert len(keys & SCHEDULE_NAMES) < 3, f"{relative}:{node.lineno}: a table keyed by schedule name"


def test_schedule_names_are_not_zipped_to_classes_by_position():
    for path in _modules():
        source = path.read_text()
        assert "zip(LTR_SCHEDULES" not in source and "zip(ANYORDER_SCHEDULES" not in source, path.name


def test_every_schedule_states_its_facts():
    from packedss.families import FAMILIES

    for family in FAMILIES.values():
        for decoder in family.decoders:
            assert decoder.name and decoder.calls_per_iteration >= 1
            assert all(decoder.largest_call_rows(w) >= 1 for w in (1, 8, 31))
            if decoder.rows_formula:
                assert decoder.rows_per_iteration(8) >= decoder.largest_call_rows(8)


def _main_blocks(path: Path) -> list[ast.If]:
    """The module's `if __name__ == "__main__":` blocks."""
    return [
        node for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
    ]  # fmt: skip


def test_every_entry_point_runs_its_main_through_run_cli():
    """run_cli gives each command its one error line, its exit status and its SIGTERM handling
    (tests/test_bad_inputs.py holds run_cli to them): every command a user runs goes through it.
    The sandbox's child is not one: the grader starts it and reads its status."""
    root = PACKAGE.parent.parent
    commands = [root / "run.py", *sorted((root / "scripts").glob("*.py")), *_modules()]
    entry_points = [p for p in commands if _main_blocks(p) and p.name != "_sandbox_child.py"]
    without = [
        str(p.relative_to(root)) for p in entry_points
        if not any(isinstance(call, ast.Call) and getattr(call.func, "id", None) == "run_cli"
                   for block in _main_blocks(p) for call in ast.walk(block))
    ]  # fmt: skip
    assert len(entry_points) >= 14 and without == []
