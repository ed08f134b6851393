"""The success nonce never reaches the program through the operating system: not its command
line, its environment, its parent's command line, an open descriptor or a file it can read.

Each hostile program looks for a 32-digit hex string in one place and, if it finds one, prints
it as the success marker and exits 0 before its tests would run; the tests after it fail, so a
pass can only come from a forged marker. What the nonce cannot hide (the interpreter's own
memory) is shown by test_interpreter_introspection_can_still_forge_the_marker and stated in
docs/sandbox.md."""

import os

import pytest

from packedss.tasks.sandbox import NO_DROP_ENV, run_program

LIMIT = 5.0
# Prints the first candidate found in `data` as the marker and exits 0, skipping the tests.
FORGE = (
    "import os, re, sys\n"
    "def forge(data):\n"
    "    for c in re.findall(rb'(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])', data):\n"
    "        sys.stdout.write('\\n' + c.decode() + '\\n'); sys.stdout.flush(); os._exit(0)\n"
)
# As in test_sandbox_kernel.py: fresh copies of builtin modules bring back what the guard removed.
REIMPORT = "if os.fork is None:\n    for _m in ('os', 'posix'):\n        sys.modules.pop(_m, None)\n    import os\n"
FAIL = "\nassert False, 'the tests ran: nothing was forged'\n"
# 200 long module names to preload: a config of about 160 KB
LARGE_CONFIG_PROGRAM = "".join(f"if False:\n    import module_{i}_{'x' * 1000}\n" for i in range(200)) + "print('ran')\n"

LEAKS = {
    "self_cmdline": "forge(open('/proc/self/cmdline', 'rb').read())\n",
    "sys_orig_argv": "forge(' '.join(sys.orig_argv).encode())\n",
    "self_environ": "forge(open('/proc/self/environ', 'rb').read())\nforge(repr(dict(os.environ)).encode())\n",
    "parent_cmdline": "forge(open(f'/proc/{os.getppid()}/cmdline', 'rb').read())\n",
    # a forked process's parent is the interpreter that runs the program (and the wrapper)
    "forked_child_reads_parent_cmdline": REIMPORT + (
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    forge(open(f'/proc/{os.getppid()}/cmdline', 'rb').read())\n"
        "    os._exit(1)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "if status == 0:\n    os._exit(0)\n"
    ),
    "open_descriptors": (
        "names = set(range(64))\n"
        "try:\n    names |= {int(n) for n in os.listdir('/proc/self/fd')}\nexcept OSError:\n    pass\n"
        "for fd in sorted(names):\n"
        "    for read in (lambda: os.pread(fd, 1 << 20, 0), lambda: os.read(fd, 1 << 20),\n"
        "                 lambda: os.read(os.open(f'/proc/self/fd/{fd}', os.O_RDONLY | os.O_NONBLOCK), 1 << 20)):\n"
        "        try:\n"
        "            if fd not in (1, 2):\n                os.set_blocking(fd, False)\n"
        "            forge(read())\n"
        "        except OSError:\n"
        "            pass\n"
    ),
    "working_directory_files": (
        "for root, dirs, files in os.walk('.'):\n"
        "    for name in files:\n"
        "        forge(open(os.path.join(root, name), 'rb').read())\n"
        "forge(repr(sorted(os.listdir('.'))).encode())\n"
    ),
}


def test_the_forger_passes_when_it_finds_the_nonce(mode):
    """The hostile programs' forge() is a working attack: handed the nonce, it is graded passed."""
    program = FORGE + "import inspect\nforge(repr(inspect.stack()[1].frame.f_locals).encode())\n" + FAIL
    res = run_program(program, time_limit_s=LIMIT)
    assert res.passed, res


@pytest.mark.parametrize("name", sorted(LEAKS))
def test_the_nonce_is_not_reachable_through_the_os(name, mode):
    res = run_program(FORGE + LEAKS[name] + FAIL, time_limit_s=LIMIT)
    assert res.status == "failed", (name, res)
    assert res.sandbox["privilege_drop"] is (mode == "drop")


def test_the_issue_program_is_graded_failed(mode):
    program = (
        "import json, os, sys\n"
        "args = open('/proc/self/cmdline', 'rb').read().split(b'\\0')\n"
        "cfg = json.loads(args[-2])\n"
        "sys.stdout.write('\\n' + cfg['nonce'] + '\\n'); sys.stdout.flush()\n"
        "os._exit(0)\n"
    )
    res = run_program(program + FAIL, time_limit_s=LIMIT)
    assert res.status == "failed", res


def test_stdin_is_dev_null_and_only_fds_0_to_2_are_open(mode):
    program = (
        "import os, stat, sys\n"
        "def is_open(fd):\n    try:\n        os.fstat(fd)\n        return True\n    except OSError:\n        return False\n"
        "print(repr(sys.stdin.read()), repr(os.read(0, 100)), stat.S_ISCHR(os.fstat(0).st_mode))\n"
        "print([fd for fd in range(64) if is_open(fd)])\n"
    )
    res = run_program(program, time_limit_s=LIMIT)
    assert res.passed and res.stdout_tail.splitlines() == ["'' b'' True", "[0, 1, 2]"], res


def test_a_config_larger_than_a_pipe_buffer_arrives_whole():
    """The config carries the names the program imports (preloaded); long ones make it larger than
    a pipe's 64 KiB buffer, so the child reads it in several pieces."""
    res = run_program(LARGE_CONFIG_PROGRAM, time_limit_s=LIMIT)
    assert res.passed and res.stdout_tail == "ran\n", res


def test_an_interpreter_that_exits_without_reading_its_config_is_a_failure(tmp_path):
    """Writing the config to a child that closed its stdin fails (EPIPE; the config is larger
    than the pipe's buffer, so the write is still waiting when it closes): the grade is `failed`
    with the child's stderr, not an exception in the harness."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexec 0<&-\necho 'no config read' >&2\nexit 3\n")
    python.chmod(0o755)
    res = run_program(LARGE_CONFIG_PROGRAM, time_limit_s=LIMIT, python=str(python))
    assert res.status == "failed" and res.returncode == 3 and "no config read" in res.stderr_tail, res
