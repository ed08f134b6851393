"""Shared fixtures for the task tests."""

import json
import os
from pathlib import Path

import pytest

from packedss.tasks import load_task, load_task_config
from packedss.tasks.sandbox import NO_DROP_ENV

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "README.md").is_file():
        pytest.skip(f"benchmark data not present at {SHARED_DATA} (see ../shared/data/README.md)")
    return SHARED_DATA


def need(shared_data: Path, name: str) -> Path:
    p = shared_data / name
    if not p.is_file():
        pytest.skip(f"{p} not present")
    return p


@pytest.fixture(scope="session")
def task_from_shared(shared_data):
    cache = {}

    def get(name, **overrides):
        key = (name, tuple(sorted(overrides.items())))
        if key not in cache:
            cache[key] = load_task(load_task_config(name, **overrides), str(shared_data))
        return cache[key]

    return get


def fast(task, time_limit_s=3.0, memory_limit_mb=512):
    """The same task with small sandbox limits (keeps the suite fast)."""
    task.cfg.time_limit_s = time_limit_s
    task.cfg.memory_limit_mb = memory_limit_mb
    return task


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


class _Helpers:
    need = staticmethod(need)
    fast = staticmethod(fast)
    write_jsonl = staticmethod(write_jsonl)


@pytest.fixture(scope="session")
def h():
    """Helper functions (tests/ is not a package, so tests cannot import conftest)."""
    return _Helpers


@pytest.fixture(params=["drop", "no_drop"])
def mode(request, monkeypatch):
    """Each sandbox test once with the privilege drop (as root only) and once without it."""
    if request.param == "drop":
        if os.geteuid() != 0:
            pytest.skip("the privilege drop only happens when the harness runs as root")
        monkeypatch.setenv(NO_DROP_ENV, "0")
    else:
        monkeypatch.setenv(NO_DROP_ENV, "1")
    return request.param
