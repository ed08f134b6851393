"""The kernel layers (Landlock, an empty network namespace) contain programs that get past the
in-process Python guard, with and without the root-only privilege drop.

The canary lives in a world-writable directory, so that the sandbox uid alone would not
protect it (the drop is not what these tests measure), and each hostile program is shown
to work against the Python guard alone (test_hostile_programs_defeat_the_python_guard)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from packedss.tasks import sandbox
from packedss.tasks.sandbox import NO_DROP_ENV, KernelLayers, missing_layers_warning, protections, run_program

LIMIT = 3.0
EVIL_TMP = f"/tmp/packedss_sandbox_evil-{os.getpid()}.txt"  # one per test process (xdist workers)
# When the guard ran, import fresh copies: builtin modules re-initialise from their original
# function table, which brings back everything the guard set to None. Without the guard the
# modules imported before the sandbox closed are used as they are (the program's imports are
# loaded early, and the sandbox uid may not be able to read the interpreter's files).
REIMPORT = (
    "import sys, posix\nif posix.remove is None:\n"
    "    for _m in ('os', 'posix', 'shutil', 'io', '_io', 'socket', '_socket'):\n        sys.modules.pop(_m, None)\n"
)

HOSTILE_FILES = {
    "fileio_overwrite": REIMPORT + "import _io\nf = _io.FileIO({canary!r}, 'w')\nf.write(b'pwned')\nf.close()\n",
    "fileio_create": REIMPORT + "import _io\n_io.FileIO({canary_dir!r} + '/evil.txt', 'x').write(b'x')\n",
    "fileio_create_tmp": REIMPORT + "import _io\n_io.FileIO({evil_tmp!r}, 'x').write(b'x')\n",
    "posix_open_overwrite": REIMPORT + "import posix\nfd = posix.open({canary!r}, posix.O_WRONLY | posix.O_TRUNC)\nposix.write(fd, b'pwned')\n",
    "posix_open_create": REIMPORT + "import posix\nposix.open({canary_dir!r} + '/evil.txt', posix.O_WRONLY | posix.O_CREAT, 0o644)\n",
    "reimported_os_remove": REIMPORT + "import os\nos.remove({canary!r})\n",
    "reimported_os_rename": REIMPORT + "import os\nos.rename({canary!r}, {canary_dir!r} + '/moved.txt')\n",
    "reimported_shutil_rmtree": REIMPORT + "import shutil\nshutil.rmtree({canary_dir!r})\n",
    "symlink_then_write": REIMPORT + "import os, _io\nos.symlink({canary!r}, 'link')\n_io.open('link', 'w').write('pwned')\n",
    "hardlink_then_write": REIMPORT + "import os, _io\nos.link({canary!r}, 'hard')\n_io.open('hard', 'w').write('pwned')\n",
    "shell_rm": REIMPORT + "import os\nassert os.system('rm -f {canary}') == 0\n",
}


@pytest.fixture()
def active(mode):
    """The protections a program gets in this mode; skips without Landlock."""
    res = run_program("pass\n", time_limit_s=LIMIT)
    assert res.passed, res
    assert res.sandbox["privilege_drop"] is (mode == "drop")
    if res.sandbox["fs"] != "landlock":
        pytest.skip(f"no Landlock on this kernel: {sandbox.kernel_layers(sys.executable, mode == 'no_drop')}")
    return res.sandbox


@pytest.fixture()
def canary():
    d = Path(tempfile.mkdtemp(prefix="packedss-canary-"))
    os.chmod(d, 0o777)
    f = d / "canary.txt"
    f.write_text("precious\n")
    os.chmod(f, 0o666)
    yield f
    try:
        assert f.read_text() == "precious\n", "the canary outside the sandbox was modified"
        assert sorted(p.name for p in d.iterdir()) == ["canary.txt"], "a file appeared next to the canary"
        assert not Path(EVIL_TMP).exists(), f"{EVIL_TMP} was created"
    finally:
        shutil.rmtree(d, ignore_errors=True)
        Path(EVIL_TMP).unlink(missing_ok=True)


def _program(name, canary):
    return HOSTILE_FILES[name].format(canary=str(canary), canary_dir=str(canary.parent), evil_tmp=EVIL_TMP)


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "no_guard"])
@pytest.mark.parametrize("name", sorted(HOSTILE_FILES))
def test_files_outside_the_working_directory_are_safe(name, guard, active, canary):
    res = run_program(_program(name, canary) + "\nassert True\n", time_limit_s=LIMIT, guard=guard)
    assert res.status != "passed", (name, res)
    assert run_program("print('ok')", time_limit_s=LIMIT).passed


@pytest.mark.parametrize("name", sorted(HOSTILE_FILES))
def test_hostile_programs_defeat_the_python_guard(name, canary, tmp_path):
    """Without the kernel layers (here: the guard alone, in an unconfined process) each
    program does harm, so the test above measures the kernel, not a broken program."""
    runner = (
        "import os, sys\nfrom packedss.tasks._sandbox_child import _guard\n"
        "_guard(os.getcwd())\nexec(compile(sys.stdin.read(), 'program.py', 'exec'), {'__name__': '__main__'})\n"
    )
    done = subprocess.run([sys.executable, "-c", runner], input=_program(name, canary), cwd=tmp_path,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    harmed = not canary.exists() or canary.read_text() != "precious\n" or len(list(canary.parent.iterdir())) != 1
    harmed |= Path(EVIL_TMP).exists()
    assert harmed, name
    # restore the canary for the fixture's check
    shutil.rmtree(canary.parent, ignore_errors=True)
    Path(EVIL_TMP).unlink(missing_ok=True)
    canary.parent.mkdir()
    canary.write_text("precious\n")


@pytest.fixture()
def tcp_listener():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    yield srv
    srv.close()


def _tcp_connect(port):
    return REIMPORT + f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'exfiltrated')\ns.close()\n"


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "no_guard"])
def test_tcp_connect_to_a_local_listener_is_refused(guard, active, tcp_listener):
    port = tcp_listener.getsockname()[1]
    res = run_program(_tcp_connect(port), time_limit_s=LIMIT, guard=guard)
    assert res.status != "passed", res
    with pytest.raises(BlockingIOError):
        tcp_listener.accept()  # nothing connected, so nothing was received


def test_the_tcp_program_reaches_an_unconfined_listener(tcp_listener):
    port = tcp_listener.getsockname()[1]
    subprocess.run([sys.executable, "-c", _tcp_connect(port)], check=True, timeout=30)
    tcp_listener.setblocking(True)
    tcp_listener.settimeout(5)
    conn, _ = tcp_listener.accept()
    assert conn.recv(100) == b"exfiltrated"
    conn.close()


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "no_guard"])
def test_tcp_bind_is_refused(guard, active):
    res = run_program(REIMPORT + "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\n", time_limit_s=LIMIT, guard=guard)
    assert res.status != "passed", res


def test_udp_send_to_a_local_socket_is_refused(active):
    if "netns" not in active["net"] and active["landlock_abi"] < 10:
        pytest.skip("UDP is contained only by the network namespace or Landlock ABI >= 10")
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    try:
        port = rx.getsockname()[1]
        prog = REIMPORT + f"import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'exfiltrated', ('127.0.0.1', {port}))\n"
        run_program(prog, time_limit_s=LIMIT, guard=False)
        with pytest.raises(BlockingIOError):
            rx.recvfrom(100)
    finally:
        rx.close()


def test_abstract_unix_socket_outside_is_unreachable(active):
    name = f"\0packedss-test-{os.getpid()}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(name)
    srv.listen(1)
    srv.setblocking(False)
    try:
        prog = REIMPORT + f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({name!r})\ns.sendall(b'x')\n"
        res = run_program(prog, time_limit_s=LIMIT, guard=False)
        assert res.status != "passed", res
        with pytest.raises(BlockingIOError):
            srv.accept()
    finally:
        srv.close()


def test_processes_outside_cannot_be_signalled(active, mode):
    if mode == "no_drop" and active["signals"] != "landlock":
        pytest.skip("without the privilege drop only Landlock (ABI >= 6) scopes signals")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        res = run_program(REIMPORT + f"import os, signal\nos.kill({sleeper.pid}, signal.SIGKILL)\n", time_limit_s=LIMIT, guard=False)
        assert res.status != "passed", res
        assert sleeper.poll() is None, "the sandbox killed a process outside it"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_ordinary_programs_still_work(active):
    """Landlock leaves the working directory, the standard library and /dev/null usable."""
    prog = (
        "import importlib, os\n"
        "for m in ('zoneinfo', 'csv', 'decimal', 'xml.etree.ElementTree', 'email.message', 'uuid'):\n"
        "    importlib.import_module(m)\n"
        "with open('scratch.txt', 'w') as f:\n    f.write('fine')\n"
        "os.mkdir('sub')\nos.rename('scratch.txt', 'sub/moved.txt')\n"
        "print(open('sub/moved.txt').read(), open(os.devnull).read() == '', len(os.urandom(4)))\n"
    )
    res = run_program(prog, time_limit_s=10, guard=False)  # the guard refuses os.rename
    if res.sandbox["privilege_drop"] and "ModuleNotFoundError" in res.stderr_tail:
        pytest.skip(f"the interpreter's files are not readable by the sandbox uid ({sys.base_prefix}); see docs/sandbox.md")
    assert res.passed and res.stdout_tail.split() == ["fine", "True", "4"], res


def test_reading_outside_the_allowed_paths_is_refused(active, canary):
    res = run_program(f"print(open({str(canary)!r}).read())\n", time_limit_s=LIMIT)
    assert res.status != "passed" and "precious" not in res.stdout_tail, res


def test_protections_record_and_warning():
    full = KernelLayers(landlock_abi=7, landlock_error=None, netns_error=None)
    assert protections(full, privilege_drop=False, guard=True) == {
        "landlock_abi": 7, "fs": "landlock", "net": "landlock+netns", "signals": "landlock",
        "privilege_drop": False, "rlimits": True, "python_guard": True,
    }  # fmt: skip
    assert missing_layers_warning(full, privilege_drop=False) is None
    old = KernelLayers(landlock_abi=3, landlock_error=None, netns_error="unshare(CLONE_NEWUSER|CLONE_NEWNET): Operation not permitted")
    assert protections(old, privilege_drop=True, guard=True)["net"] == "none"
    assert protections(old, privilege_drop=True, guard=True)["signals"] == "none"
    warning = missing_layers_warning(old, privilege_drop=True)
    assert "ABI 3 < 4" in warning and "network namespace" in warning and "sandbox uid" in warning
    none = KernelLayers(landlock_abi=0, landlock_error="Landlock unavailable: [Errno 38] Function not implemented", netns_error=None)
    assert protections(none, privilege_drop=False, guard=True)["fs"] == "none"
    assert "only the in-process Python guard" in missing_layers_warning(none, privilege_drop=False)


def test_one_warning_per_process_and_record_without_landlock(monkeypatch, capsys):
    """A kernel without Landlock or user namespaces: programs still run, each result says
    so, and stderr gets one warning for the process, not one per program."""
    monkeypatch.setenv(NO_DROP_ENV, "1")
    monkeypatch.setattr(sandbox, "_PROBED", {})
    monkeypatch.setattr(sandbox, "_probe", lambda python, userns: KernelLayers(0, "Landlock unavailable: test", "unshare: test"))
    first = run_program("print(1)\n", time_limit_s=LIMIT)
    second = run_program("print(2)\n", time_limit_s=LIMIT)
    assert first.passed and second.passed
    assert first.sandbox == second.sandbox
    assert (first.sandbox["fs"], first.sandbox["net"], first.sandbox["landlock_abi"]) == ("none", "none", 0)
    assert capsys.readouterr().err.count("packedss sandbox WARNING") == 1


def test_probe_reports_this_kernel():
    """The probe runs the child's own code; its report has the fields the harness reads."""
    done = subprocess.run([sys.executable, "-I", sandbox.CHILD, "--probe", json.dumps({"netns_with_user_namespace": True})],
                          capture_output=True, text=True, timeout=30, cwd=tempfile.gettempdir())  # fmt: skip
    report = json.loads(done.stdout)
    assert set(report) == {"landlock_abi", "landlock_error", "netns_error"}
    assert report["landlock_error"] is not None or report["landlock_abi"] >= 1, report


def test_bad_no_drop_value_is_refused(monkeypatch):
    monkeypatch.setenv(NO_DROP_ENV, "yes")
    with pytest.raises(ValueError, match="PACKEDSS_SANDBOX_NO_DROP"):
        run_program("pass\n")


@pytest.fixture()
def python_without_landlockpy():
    """The venv's base interpreter, which lacks landlockpy (skips if there is none)."""
    base = shutil.which("python3", path=os.path.join(sys.base_prefix, "bin"))
    if base is None or subprocess.run([base, "-I", "-c", "import landlockpy"], capture_output=True).returncode == 0:
        pytest.skip(f"no interpreter without landlockpy under {sys.base_prefix}")
    return base


def test_a_required_layer_that_fails_stops_the_program(monkeypatch, python_without_landlockpy):
    monkeypatch.setattr(sandbox, "_PROBED", {})
    monkeypatch.setattr(sandbox, "_probe", lambda python, userns: KernelLayers(7, None, None))
    res = run_program("print('ran')\n", time_limit_s=LIMIT, python=python_without_landlockpy)
    assert res.status == "error" and "ran" not in res.stdout_tail, res
    assert "packedss sandbox setup failed: Landlock ruleset" in res.stderr_tail and "landlockpy" in res.stderr_tail


def test_the_probe_reports_a_missing_landlockpy(monkeypatch, capsys, python_without_landlockpy):
    monkeypatch.setattr(sandbox, "_PROBED", {})
    layers = sandbox.kernel_layers(python_without_landlockpy, netns_with_user_namespace=True)
    assert layers.landlock_error and "landlockpy is not importable" in layers.landlock_error
    assert "packedss sandbox WARNING" in capsys.readouterr().err
