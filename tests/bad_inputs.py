"""Helpers of the bad-input tests (docs/errors.md): run an entry point as a user does and check
that it ended with exactly one `error: ` line, its exit status, and no record file touched."""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
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
    """`command` run as a user runs it, its output captured. A Python entry point (`python
    SCRIPT ...` or `python -m MODULE ...`) runs in a child of the fork server, which has imported
    the libraries already (tests/entry_server.py); anything else in a process of its own.
    tests/test_bad_inputs.py checks that both give the same status and output."""
    env, cwd = offline_env(tmp_path), Path(cwd or tmp_path)
    if command[0] == sys.executable and len(command) > 1 and not kwargs:
        return forked(command, env, cwd)
    return fresh(command, env, cwd, **kwargs)


def fresh(command: list[str], env: dict, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=600, **kwargs)


class ForkServer:
    """tests/entry_server.py in a process of its own, started on first use (one per test process)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None

    def start(self) -> subprocess.Popen:
        if self.process is None or self.process.poll() is not None:
            home = Path(tempfile.mkdtemp(prefix="entry-server-"))
            self.process = subprocess.Popen([sys.executable, str(PROJECT_ROOT / "tests" / "entry_server.py")],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                            env=offline_env(home), cwd=home)  # fmt: skip
            atexit.register(shutil.rmtree, home, ignore_errors=True)
            atexit.register(self.process.kill)  # runs first: atexit calls in reverse order
            assert json.loads(self.answer(self.process, 600)) == {"ready": True}
        return self.process

    @staticmethod
    def answer(process: subprocess.Popen, timeout: float) -> str:
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        if not ready:
            process.kill()
            raise subprocess.TimeoutExpired(process.args, timeout)
        line = process.stdout.readline()
        assert line, f"the fork server ended with status {process.wait()}"
        return line

    def run(self, request: dict, timeout: float = 600) -> int:
        process = self.start()
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        return json.loads(self.answer(process, timeout))["status"]


FORK_SERVER = ForkServer()


def forked(command: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """`command` (sys.executable SCRIPT ... or sys.executable -m MODULE ...) in a fork server child."""
    with tempfile.TemporaryDirectory(prefix="entry-output-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        request = {"env": env, "cwd": str(cwd), "stdout": str(out), "stderr": str(err)}
        if command[1] == "-m":
            request |= {"module": command[2], "argv": [command[2], *command[3:]]}
        else:
            request |= {"path": command[1], "argv": command[1:]}
        status = FORK_SERVER.run(request)
        return subprocess.CompletedProcess(command, status, out.read_text(), err.read_text())


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
