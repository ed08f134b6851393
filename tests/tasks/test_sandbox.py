"""Hostile programs: each is a failure within its time limit, the harness survives, and a
canary outside the sandbox stays intact."""

import os
import time
from pathlib import Path

import pytest

from packedss.tasks import Question, load_task_config
from packedss.tasks.code import grade_humaneval, grade_mbpp
from packedss.tasks.sandbox import privilege_drop_enabled, run_program

LIMIT = 2.0
SLACK = 3.0  # start-up, kill and clean-up on a busy 2-core machine
# outside the sandbox; one name per test process, since tests/tasks/test_sandbox_kernel.py writes its own
# on purpose while the other worker may run these
EVIL_TMP = f"/tmp/packedss_sandbox_evil-{os.getpid()}.txt"


@pytest.fixture()
def canary(tmp_path_factory):
    d = tmp_path_factory.mktemp("canary")
    os.chmod(d, 0o755)
    f = d / "canary.txt"
    f.write_text("precious\n")
    os.chmod(f, 0o644)
    yield f
    assert f.read_text() == "precious\n", "the canary outside the sandbox was modified"
    assert sorted(p.name for p in d.iterdir()) == ["canary.txt"], "a file appeared next to the canary"


HOSTILE = {
    "os_remove": "import os\nos.remove({canary!r})\n",
    "posix_unlink": "import posix\nposix.unlink({canary!r})\n",
    "rmtree_absolute": "import shutil\nshutil.rmtree({canary_dir!r})\n",
    "os_system": "import os\nos.system('rm -f {canary}')\n",
    "posix_system": "import posix\nposix.system('rm -f {canary}; echo gone > {canary_dir}/evil')\n",
    "subprocess": "import subprocess\nsubprocess.run(['rm', '-f', {canary!r}])\n",
    "posix_spawn_rm": "import posix\npid = posix.posix_spawn('/bin/rm', ['rm', '-f', {canary!r}], {{}})\nposix.waitpid(pid, 0)\n",
    "fork_bomb": "import os\nwhile True:\n    os.fork()\n",
    "posix_fork_bomb": "import posix\nwhile True:\n    try:\n        posix.fork()\n    except OSError:\n        pass\n",
    "infinite_loop": "while True:\n    pass\n",
    "sleep_forever": "import time\ntime.sleep(1000)\n",
    "alloc_10gb": "x = bytearray(10 * 1024 ** 3)\n",
    "alloc_list": "x = [0] * (10 ** 10)\n",
    "sys_exit_0": "import sys\nsys.exit(0)\n",
    "os_exit_0": "import os\nos._exit(0)\n",
    "raise_systemexit": "raise SystemExit(0)\n",
    "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "posix_kill_parent": "import posix, signal\nposix.kill(posix.getppid(), signal.SIGKILL)\n",
    "write_canary": "open({canary!r}, 'w').write('pwned')\n",
    "append_canary_os_open": "import os\nfd = os.open({canary!r}, os.O_WRONLY | os.O_APPEND)\n",
    "write_next_to_canary": "open({canary_dir!r} + '/evil.txt', 'w').write('x')\n",
    "write_tmp": "open({evil_tmp!r}, 'w').write('x')\n",
    "write_parent_dir": "open('../packedss_evil.txt', 'w').write('x')\n",
    "print_100mb": "import sys\nsys.stdout.write('x' * (100 * 1024 * 1024))\n",
    "print_loop": "while True:\n    print('y' * 10000)\n",
    "huge_file": "with open('big', 'wb') as f:\n    while True:\n        f.write(b'z' * (1 << 20))\n",
    "close_stdout_then_exit": "import os\nos.close(1)\nos._exit(0)\n",
    "setsid_escape": "import posix, time\nif posix.fork() == 0:\n    posix.setsid()\n    time.sleep(1000)\nwhile True:\n    pass\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_fails_and_harness_survives(name, canary):
    src = HOSTILE[name].format(canary=str(canary), canary_dir=str(canary.parent), evil_tmp=EVIL_TMP)
    # the tests would pass if they were reached: any pass must come from the wrapper's marker
    program = src + "\nassert True\n"
    t = time.monotonic()
    res = run_program(program, time_limit_s=LIMIT, memory_limit_mb=512)
    took = time.monotonic() - t
    assert res.status != "passed", (name, res)
    assert took < LIMIT + SLACK, (name, took)
    assert not Path(EVIL_TMP).exists()
    # the harness process is alive and can still run programs
    assert run_program("print('ok')", time_limit_s=LIMIT).passed


def test_kill_everything_only_hits_the_sandbox(canary):
    # kill(-1) signals every process the caller may signal: as the sandbox uid, only its own
    res = run_program("import posix, signal\nposix.kill(-1, signal.SIGKILL)\nposix.kill(1, signal.SIGKILL)\n", time_limit_s=LIMIT)
    assert res.status != "passed"  # kill(1) is refused (EPERM)
    assert run_program("print('still here')", time_limit_s=LIMIT).passed


@pytest.mark.parametrize("name", ["posix_system", "posix_unlink", "write_canary", "write_next_to_canary", "posix_kill_parent", "rmtree_absolute"])
def test_os_layer_holds_without_the_python_guard(name, canary):
    """Defence in depth: with the in-process guard switched off, the kernel layers (Landlock,
    and as root the unprivileged uid) still protect the canary (checked by the fixture) and
    the harness (tests/tasks/test_sandbox_kernel.py tests each layer on its own)."""
    probe = run_program("pass\n", time_limit_s=LIMIT)
    if not probe.sandbox["privilege_drop"] and (probe.sandbox["fs"] != "landlock" or probe.sandbox["signals"] != "landlock"):
        pytest.skip(f"neither a privilege drop nor Landlock (ABI >= 6) to test: {probe.sandbox}")
    src = HOSTILE[name].format(canary=str(canary), canary_dir=str(canary.parent), evil_tmp=EVIL_TMP)
    run_program(src, time_limit_s=LIMIT, memory_limit_mb=512, guard=False)
    assert run_program("print('ok')", time_limit_s=LIMIT).passed


def test_no_processes_left_behind():
    if not privilege_drop_enabled():
        pytest.skip("uid-based clean-up only applies with the privilege drop (root, PACKEDSS_SANDBOX_NO_DROP unset)")
    from packedss.tasks import sandbox

    seen = []
    real = sandbox._kill_all

    def spy(proc, uid):
        seen.append(uid)
        real(proc, uid)

    sandbox._kill_all = spy
    try:
        run_program("import posix, time\nif posix.fork() == 0:\n    posix.setsid()\n    time.sleep(1000)\n", time_limit_s=LIMIT)
    finally:
        sandbox._kill_all = real
    assert seen and all(u is not None for u in seen)
    time.sleep(0.1)
    assert sandbox._procs_of_uid(seen[0]) == []


def test_sandbox_basics(tmp_path):
    ok = run_program("import math, numpy\nprint(math.sqrt(16))\n", time_limit_s=5)
    assert ok.passed and ok.stdout_tail.strip() == "4.0", ok
    cwd = run_program("import os\nopen('scratch.txt', 'w').write('fine')\nprint(os.getcwd(), os.environ.get('HOME'), sorted(os.environ))\n")
    assert cwd.passed, cwd
    path, home = cwd.stdout_tail.split()[:2]
    assert path.startswith("/") and path == home and not Path(path).exists()  # fresh dir, removed afterwards
    assert "PYTHONPATH" not in cwd.stdout_tail
    fds = run_program("import os\nprint(sorted(int(x) for x in os.listdir('/proc/self/fd')))\n")
    assert fds.passed
    assert [int(x) for x in fds.stdout_tail.strip().strip("[]").split(",")][:3] == [0, 1, 2]
    assert len(fds.stdout_tail.strip().strip("[]").split(",")) <= 4  # 0-2 plus listdir's own fd
    fail = run_program("assert 1 == 2\n")
    assert fail.status == "failed" and "AssertionError" in fail.stderr_tail
    stdin = run_program("import sys\nprint(repr(sys.stdin.read()))\n")
    assert stdin.passed and stdin.stdout_tail.strip() == "''"
    if privilege_drop_enabled():
        who = run_program("import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n")
        uid, gid = who.stdout_tail.split()[:2]
        assert int(uid) != 0 and int(gid) != 0 and who.stdout_tail.strip().endswith("[]")


def _humaneval_q():
    prompt = 'def add(a, b):\n    """Return a + b."""\n'
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
    return Question("HumanEval/x", prompt, {"prompt": prompt, "test": test, "entry_point": "add"}, {})


@pytest.mark.parametrize(
    "output, correct",
    [
        ("    return a + b\n", True),
        ("    return a - b\n", False),
        ("", False),
        ("    return (\n", False),  # malformed
        ("Sure!\n```python\ndef add(a, b):\n    return a + b\n```\nDone.", True),  # fenced chat reply
        ("```python\ndef add(a, b):\n    return a + b", True),  # unclosed fence
        ("    s = 'héllo ✓ 你好'\n    return a + b\n", True),  # unicode
        ("    import sys\n    sys.exit(0)\n", False),
        ("    return a + b\n" + "# filler\n" * 200000, True),  # huge output
    ],
)
def test_humaneval_grader_hand_written(output, correct):
    cfg = load_task_config("humaneval", time_limit_s=5.0, memory_limit_mb=512)
    g = grade_humaneval(cfg, _humaneval_q(), output)
    assert g.correct is correct, g.details


def test_mbpp_grader_formats():
    cfg = load_task_config("mbpp", time_limit_s=5.0, memory_limit_mb=512)
    asserts = Question("mbpp/x", "t", {"format": "asserts", "test_setup_code": "K = 2", "test_imports": [], "test_list": ["assert twice(3) == 6", "assert twice(K) == 4"]}, {})
    assert grade_mbpp(cfg, asserts, "def twice(x):\n    return 2 * x\n").correct is True
    assert grade_mbpp(cfg, asserts, "def twice(x):\n    return 3 * x\n").correct is False
    assert grade_mbpp(cfg, asserts, "```python\ndef twice(x):\n    return x + x\n```").correct is True
    assert grade_mbpp(cfg, asserts, "").correct is False
    prog = Question("mbppplus/x", "t", {"format": "program", "test_imports": [], "test": "import numpy as np\nfor i in range(5):\n    assert np.isclose(twice(i), 2 * i)\n"}, {})
    assert grade_mbpp(cfg, prog, "def twice(x):\n    return 2 * x\n").correct is True
    assert grade_mbpp(cfg, prog, "def twice(x):\n    return x\n").correct is False
