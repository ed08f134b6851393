"""Run an untrusted Python program in a separate, limited process (docs/sandbox.md).

- a fresh working directory, deleted afterwards; the config over stdin, then /dev/null; only
  fds 0-2; a scrubbed environment; ``python -I``; its own session/process group;
- a time limit (wall clock, or the program's own CPU time with ``cpu_clock``: §8) enforced
  with SIGKILL to the group and, as root, to every process of the sandbox's uid; RLIMIT_CPU,
  memory, file size, open files, processes, no core; ``alone=True`` runs it with no other
  program of this process beside it (packedss.tasks.gate);
- where the kernel offers them, for every user: Landlock (writes only under the working
  directory, reads only of the Python installation and system libraries, no execve; TCP from
  ABI 4, signals and abstract unix sockets from ABI 6) and an empty network namespace;
- as root, a fresh unprivileged uid/gid that owns only the working directory
  (``PACKEDSS_SANDBOX_NO_DROP=1`` skips it, to see what a non-root user gets);
- the kernel layers are probed once per process and interpreter; a missing one is one warning
  on stderr, and every result says which protections were active (``ExecResult.sandbox``);
- output read incrementally, at most ``max_output_bytes`` (more kills it), short tails kept;
- a pass needs exit status 0 and a random nonce that the wrapper prints only after the whole
  program returned; the nonce is in no command line, environment, file or open descriptor of
  the program, only in its interpreter's memory (§7 says what that leaves open).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from packedss.tasks._sandbox_child import SETUP_FAILED, SETUP_FAILED_MESSAGE
from packedss.tasks.gate import PROGRAMS

CHILD = str(Path(__file__).resolve().with_name("_sandbox_child.py"))
#: imported before privileges are dropped (cheap, commonly used by HumanEval/MBPP code).
PRELOAD = (
    "math", "cmath", "re", "string", "collections", "collections.abc", "itertools", "functools",
    "operator", "heapq", "bisect", "copy", "typing", "fractions", "decimal", "statistics",
    "random", "datetime", "calendar", "json", "hashlib", "array", "time", "numbers", "enum",
    "dataclasses", "textwrap", "unicodedata", "struct", "io", "abc", "contextlib", "types",
    "shutil", "subprocess", "traceback", "linecache", "encodings.idna", "sys", "os",
)
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([A-Za-z_][\w.]*)[ \t]+import|import[ \t]+([A-Za-z_][\w., \t]*))", re.M)
TAIL = 4096
NO_DROP_ENV = "PACKEDSS_SANDBOX_NO_DROP"
#: the child's environment (and the probe's).
ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


@dataclass
class ExecResult:
    status: str  # passed | failed | timeout | output_limit | error
    returncode: Optional[int]
    duration_s: float
    stdout_tail: str
    stderr_tail: str
    #: the protections that were active (see :func:`protections`)
    sandbox: Optional[dict] = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict:
        return asdict(self)


def _preload(program: str) -> list[str]:
    names = list(PRELOAD)
    for m in _IMPORT.finditer(program):
        if m.group(1):
            names.append(m.group(1))
        else:
            for part in m.group(2).split(","):
                part = part.strip().split()
                if part:
                    names.append(part[0])
    seen, out = set(), []
    for n in names:
        if n and n not in seen and all(p.isidentifier() for p in n.split(".")):
            seen.add(n)
            out.append(n)
    return out[:200]


def privilege_drop_enabled() -> bool:
    """Whether programs run under a fresh unprivileged uid: as root, unless
    PACKEDSS_SANDBOX_NO_DROP=1 asks to see what a non-root user gets."""
    value = os.environ.get(NO_DROP_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{NO_DROP_ENV}={value!r}: set it to 1 to skip the root-only privilege drop, or to 0 or unset to keep it")
    return os.geteuid() == 0 and value != "1"


@dataclass(frozen=True)
class KernelLayers:
    """What the kernel let a probe process apply (one probe per interpreter and netns mode)."""

    landlock_abi: int
    landlock_error: Optional[str]
    netns_error: Optional[str]


_PROBED: dict[tuple[str, bool], KernelLayers] = {}
_PROBE_LOCK = threading.Lock()


def kernel_layers(python: str, netns_with_user_namespace: bool) -> KernelLayers:
    """Probe once per process which kernel layers work, and warn once if any is missing."""
    key = (python, netns_with_user_namespace)
    with _PROBE_LOCK:
        if key not in _PROBED:
            layers = _probe(python, netns_with_user_namespace)
            _PROBED[key] = layers
            warning = missing_layers_warning(layers, privilege_drop=not netns_with_user_namespace)
            if warning:
                print(warning, file=sys.stderr, flush=True)
        return _PROBED[key]


def _probe(python: str, netns_with_user_namespace: bool) -> KernelLayers:
    cfg = json.dumps({"netns_with_user_namespace": netns_with_user_namespace})
    try:
        done = subprocess.run(
            [python, "-I", "-X", "utf8", "-B", CHILD, "--probe", cfg],
            cwd=tempfile.gettempdir(), env=ENV, stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
        )  # fmt: skip
        report = json.loads(done.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        return KernelLayers(int(report["landlock_abi"]), report["landlock_error"], report["netns_error"])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError) as exc:
        error = f"the probe {python} {CHILD} --probe failed: {exc!r}"
        return KernelLayers(0, error, error)


def protections(layers: KernelLayers, privilege_drop: bool, guard: bool) -> dict:
    """The record of which protections a program ran under."""
    abi = 0 if layers.landlock_error else layers.landlock_abi
    net = [name for name, active in (("landlock", abi >= 4), ("netns", not layers.netns_error)) if active]
    return {
        "landlock_abi": abi,
        "fs": "landlock" if abi else "none",
        "net": "+".join(net) or "none",
        "signals": "landlock" if abi >= 6 else "none",
        "privilege_drop": privilege_drop,
        "rlimits": True,
        "python_guard": guard,
    }


def missing_layers_warning(layers: KernelLayers, privilege_drop: bool) -> Optional[str]:
    """One warning naming the kernel layers that are missing, or None when all are active."""
    missing = []
    if layers.landlock_error:
        missing.append(f"Landlock filesystem, network and signal rules ({layers.landlock_error})")
    else:
        if layers.landlock_abi < 4:
            missing.append(f"Landlock TCP rules (Landlock ABI {layers.landlock_abi} < 4)")
        if layers.landlock_abi < 6:
            missing.append(f"Landlock signal scoping (Landlock ABI {layers.landlock_abi} < 6)")
    if layers.netns_error:
        missing.append(f"an empty network namespace ({layers.netns_error})")
    if not missing:
        return None
    rest = (
        "the unprivileged sandbox uid and the in-process Python guard"
        if privilege_drop
        else "only the in-process Python guard, which determined code can bypass"
    )
    return (
        "packedss sandbox WARNING: generated code runs without " + "; without ".join(missing)
        + f". What is missing is left to {rest}. Each code grade records its protections in"
        " 'sandbox'; see docs/sandbox.md."
    )  # fmt: skip


def _pick_uid(tmp: str) -> tuple[Optional[int], Optional[int]]:
    """As root: a fresh uid/gid owning ``tmp`` (falls back to nobody:nogroup)."""
    if os.geteuid() != 0:
        return None, None
    for uid in (secrets.randbelow(1_000_000_000) + 1_000_000_000, 65534):
        try:
            os.chown(tmp, uid, uid)
            return uid, uid
        except OSError:
            continue
    return None, None


def _procs_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as fh:
                text = fh.read(2048).decode("ascii", "replace")
        except OSError:
            continue
        state = re.search(r"^State:\s*(\S)", text, re.M)
        uids = re.search(r"^Uid:\s*(\d+)\s+(\d+)\s+(\d+)", text, re.M)
        if uids and uid in {int(x) for x in uids.groups()} and not (state and state.group(1) in "ZX"):
            pids.append(int(entry.name))
    return pids


def _kill_all(proc: subprocess.Popen, uid: Optional[int]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None:
        for _ in range(200):  # a fork bomb may race us; RLIMIT_NPROC bounds it
            pids = [p for p in _procs_of_uid(uid) if p != os.getpid()]
            if not pids:
                break
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.005)


def _rm(path: str) -> None:
    def onerror(func, p, exc):
        try:
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)


#: with the limit on CPU time (``cpu_clock``), the wall clock stops a program that waits
#: without computing at this many times the limit
WALL_BACKSTOP = 10


@dataclass(frozen=True)
class Limits:
    """What one program may use: seconds (wall-clock, or its own CPU time), memory, output, file size."""

    time_s: float
    memory_mb: int
    max_output_bytes: int
    fsize_mb: int
    cpu_clock: bool

    @property
    def wall_s(self) -> float:
        return self.time_s * WALL_BACKSTOP if self.cpu_clock else self.time_s


def run_program(
    program: str,
    time_limit_s: float = 10.0,
    memory_limit_mb: int = 1024,
    max_output_bytes: int = 1 << 20,
    fsize_limit_mb: int = 16,
    python: Optional[str] = None,
    guard: bool = True,
    alone: bool = False,
    cpu_clock: bool = False,
) -> ExecResult:
    """Run ``program`` (Python source) in the sandbox; see the module docstring. ``alone``: wait
    until no other sandboxed program of this process runs, and start none beside it.
    ``cpu_clock``: the time limit counts the program's own CPU seconds, which the machine's load
    does not stretch (RLIMIT_CPU; WALL_BACKSTOP times it on the wall clock)."""
    drop = privilege_drop_enabled()
    limits = Limits(float(time_limit_s), int(memory_limit_mb), int(max_output_bytes), int(fsize_limit_mb), cpu_clock)
    with PROGRAMS.alone() if alone else PROGRAMS.beside_others():
        tmp = _working_directory()
        try:
            return _run_in(tmp, program, limits, python or sys.executable, guard, drop)
        finally:
            _rm(tmp)


def _working_directory() -> str:
    """A fresh directory, readable and writable by its owner only (the sandbox uid, as root)."""
    tmp = tempfile.mkdtemp(prefix="packedss-sbx-")
    os.chmod(tmp, 0o700)
    return tmp


def _run_in(tmp: str, program: str, limits: Limits, python: str, guard: bool, drop: bool) -> ExecResult:
    """The program's run in `tmp`: set up, started, read until it ends or a limit is hit, judged."""
    start = time.monotonic()
    uid, gid = _pick_uid(tmp) if drop else (None, None)
    layers = kernel_layers(python, netns_with_user_namespace=uid is None)
    active = protections(layers, privilege_drop=uid is not None, guard=guard)
    nonce = secrets.token_hex(16)
    cfg = _child_config(program, _write_program(tmp, program), nonce, limits, uid, gid, layers, guard)
    try:
        proc = _start_child(python, tmp, cfg)
    except OSError as exc:
        return ExecResult("error", None, 0.0, "", f"cannot start the sandbox: {exc}", active)
    try:
        status, out, err = _communicate(proc, start + limits.wall_s, limits.max_output_bytes)
        rc = _reap(proc, uid, killed=status != "running")
    finally:
        if proc.poll() is None:
            _kill_all(proc, uid)
            proc.wait()
    status, stdout, stderr = _verdict(status, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), nonce)
    return ExecResult(status, rc, round(time.monotonic() - start, 4), stdout[-TAIL:], stderr[-TAIL:], active)


def _write_program(tmp: str, program: str) -> str:
    path = os.path.join(tmp, ".program.py")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass") as fh:
        fh.write(program)
    return path


def _child_config(program: str, path: str, nonce: str, limits: Limits, uid: Optional[int], gid: Optional[int],
                  layers: KernelLayers, guard: bool) -> dict:  # fmt: skip
    """What the child reads from its stdin (docs/sandbox.md §1)."""
    if uid is not None:
        nproc = 16 if uid != 65534 else 256
    else:
        nproc = len(_procs_of_uid(os.getuid())) + 32
    return {
        "program": path,
        "nonce": nonce,
        "preload": _preload(program),
        "memory_bytes": limits.memory_mb << 20,
        "cpu_s": max(1, math.ceil(limits.time_s)) + (0 if limits.cpu_clock else 1),
        "fsize_bytes": limits.fsize_mb << 20,
        "nproc": nproc,
        "uid": uid,
        "gid": gid,
        "guard": bool(guard),  # False only in tests of the OS-level layers
        "landlock": not layers.landlock_error,
        "netns": not layers.netns_error,
        "netns_with_user_namespace": uid is None,
    }


def _start_child(python: str, tmp: str, cfg: dict) -> subprocess.Popen:
    # the config (nonce included) travels over stdin, never the command line, which
    # /proc/<pid>/cmdline shows; the child reads it and puts /dev/null in its place
    proc = subprocess.Popen(
        [python, "-I", "-X", "utf8", "-B", CHILD],
        cwd=tmp,
        env={**ENV, "HOME": tmp, "TMPDIR": tmp},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        close_fds=True,
        start_new_session=True,
    )
    try:
        with proc.stdin:
            proc.stdin.write(json.dumps(cfg).encode("utf-8"))
    except OSError:  # the child died before reading it: its stderr says why
        pass
    return proc


def _reap(proc: subprocess.Popen, uid: Optional[int], killed: bool) -> int:
    """The child's exit status, once it and every process it left behind are gone."""
    if killed:
        _kill_all(proc, uid)
    try:
        rc = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        _kill_all(proc, uid)
        rc = proc.wait()
    _kill_all(proc, uid)  # leftovers (background children) of a finished program
    return rc


def _verdict(status: str, rc: int, stdout: str, stderr: str, nonce: str) -> tuple[str, str, str]:
    """(status, stdout, stderr) of a finished run: a pass needs exit status 0 and the nonce at
    the end of stdout (then cut off); elsewhere the nonce is masked. The CPU limit's SIGXCPU
    is a timeout."""
    marker = "\n" + nonce + "\n"
    if status == "running":
        status = "passed" if rc == 0 and stdout.endswith(marker) else "timeout" if rc == -signal.SIGXCPU else "failed"
        if rc == SETUP_FAILED and SETUP_FAILED_MESSAGE in stderr:
            status = "error"
    if status == "passed":
        return status, stdout[: -len(marker)], stderr
    return status, stdout.replace(nonce, "<nonce>"), stderr


def _communicate(proc: subprocess.Popen, deadline: float, max_bytes: int) -> tuple[str, bytes, bytes]:
    """Read both pipes until EOF, the deadline, or ``max_bytes`` in total; keep tails."""
    sel = selectors.DefaultSelector()
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    for f in bufs:
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    total = 0
    status = "running"
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                status = "timeout"
                break
            for key, _ in sel.select(timeout=min(left, 0.5)):
                f = key.fileobj
                try:
                    chunk = os.read(f.fileno(), 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(f)
                    continue
                total += len(chunk)
                buf = bufs[f]
                buf += chunk
                if len(buf) > 2 * TAIL:
                    del buf[: len(buf) - 2 * TAIL]
            if total > max_bytes:
                status = "output_limit"
                break
        if status == "running":
            # pipes closed: wait for the exit within what is left of the deadline
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                status = "timeout"
    finally:
        sel.close()
        for f in bufs:
            f.close()
    return status, bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr])
