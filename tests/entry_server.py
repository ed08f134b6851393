"""A fork server for the bad-input tests (tests/bad_inputs.py): it imports what the entry points
import once, then runs each request in a forked child as `python SCRIPT ARGS` or `python -m
MODULE ARGS` would, with the request's environment, working directory, argv and output files,
and answers with the child's exit status. Each child starts from the same untouched state (the
server only imports), so a case costs what its entry point does past the imports: about 0.5 s
where a fresh interpreter spends 3-6 s loading torch and transformers first.

Protocol: one JSON request per line on stdin ({"path" or "module", "argv", "env", "cwd",
"stdout", "stderr"}), one JSON answer per line on stdout ({"status": exit status, negative for a
signal as subprocess gives it})."""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import traceback

# Imported before the first fork: the entry points' own modules and the libraries behind them.
PRELOAD = ("torch", "transformers", "hydra", "omegaconf", "datasets", "pandas", "scipy.stats", "matplotlib.pyplot",
           "packedss.config", "packedss.runner", "packedss.plan", "packedss.grade", "packedss.analysis.__main__",
           "packedss.benchmark.schedules", "packedss.benchmark.calls", "packedss.models.nemotron")  # fmt: skip


def exit_code(err: SystemExit) -> int:
    """The status an interpreter exits with for an uncaught SystemExit."""
    if err.code is None:
        return 0
    if isinstance(err.code, int):
        return err.code
    print(err.code, file=sys.stderr)
    return 1


def run_request(request: dict) -> None:
    """In the forked child: become the entry point's process, run it, exit with its status."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        out = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    sys.argv = list(request["argv"])
    status = 0
    try:
        if request.get("module"):
            sys.path[0] = request["cwd"]  # `python -m` puts the working directory first
            for name in (request["module"], request["module"] + ".__main__"):
                sys.modules.pop(name, None)  # run as __main__, as a fresh interpreter does, not beside the preloaded copy
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(request["path"]))  # `python SCRIPT` puts its folder first
            runpy.run_path(request["path"], run_name="__main__")
    except SystemExit as err:
        status = exit_code(err)
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def serve() -> None:
    for name in PRELOAD:
        __import__(name)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_request(request)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve()
