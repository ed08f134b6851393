"""Bad input to `python run.py` (one job and sweeps), run as a user runs it: each ends with one
`error: <what>; <fix>` line on stderr, exit status 2 (130 / 143 for SIGINT / SIGTERM), and no
record file created or changed (docs/errors.md lists every case)."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packedss.errors import Stopped
from packedss.paths import PROJECT_ROOT
from packedss.records import read_records
from tests import bad_inputs
from tests.bad_inputs import error_line, offline_env, run, run_py, run_py_command
from tests.test_runner import record_file

TINY = PROJECT_ROOT / "assets" / "models" / "tiny"
needs_tiny = pytest.mark.skipif(not (TINY / "config.json").is_file(), reason="the shipped tiny model is absent")


CONFIGURATION = [
    (["model=nope"], ["Could not find 'model/nope'", "valid choices for model:", "tiny-set"]),
    (["schedule=bogus"], ["Could not find 'schedule/bogus'", "valid choices for schedule: ar, linear, native, packed",
                          "quadratic, s2d2, s2d2-always, sdar-native"]),
    (["+experiment=tabel6"], ["(did you mean table6?)"]),
    (["widht=3"], ["unknown key widht (did you mean width?)"]),
    (["+widht=3"], ["unknown key widht (did you mean width?)"]),
    (["+model.pth=x"], ["unknown key model.pth (did you mean path?)"]),
    (["threads=abc"], ["invalid value for threads", "'abc'"]),
    (["width=[1"], ["cannot parse the override"]),
    (["threads=-3"], ["invalid threads=-3"]),
    (["width=0"], ["invalid width=0"]),
    (["model=tiny-sdar", "model.width=0"], ["invalid model.width=0", "must be >= 1, or null for the default"]),
    (["temperature=inf"], ["invalid temperature=inf", "finite"]),
    (["temperature=nan"], ["invalid temperature=nan", "finite"]),
    (["temperature=-1"], ["invalid temperature=-1"]),
    (["concurrency=0"], ["invalid concurrency=0", "must be >= 1"]),
    (["concurrency=1.5"], ["invalid value for concurrency", "'1.5'"]),
    (["concurrency=two"], ["invalid value for concurrency", "'two'"]),
    (["concurrency=100000000"], ["concurrency=100000000: 100000000 caches of", "lower concurrency"]),
    (["limit=-1"], ["invalid limit=-1", "must be >= 1"]),
    (["samples=2"], ["samples=2 at temperature=0"]),
    # SetDLM's settings read a window of 0 as unset: it would run the default window silently
    (["model=tiny-set", "schedule=native", "native_window=0"], ["invalid native_window=0", "must be >= 1"]),
    (["schedule=native"], ["invalid schedule='native' for model tiny", "runs on model=setdlm1.7b, tiny-set"]),
    (["schedule=pld", "schedule.max_ngram=0"], ["invalid schedule.max_ngram=0", "must be >= 1 (default 2)"]),
    (["schedule=pld", "schedule.max_ngram=-2"], ["invalid schedule.max_ngram=-2", "must be >= 1"]),
    (["schedule=pld", "schedule.max_ngram=1.5"], ["invalid value for schedule.max_ngram", "'1.5'"]),
    (["schedule=pld", "schedule.max_ngram=two"], ["invalid value for schedule.max_ngram", "'two'"]),
    (["schedule=packed", "schedule.max_ngram=0"], ["invalid schedule.max_ngram=0"]),
    (["task=specbench", "task.per_category=-1"], ["invalid task.per_category=-1", "must be >= 0"]),
    (["task=arith", "task.per_category=2"], ["task.per_category=2 is read by task=specbench only", "leave it out"]),
    (["task=specbench", "temperature=1", "samples=2"], ["samples=2: task=specbench has conversations of several turns",
                                                        "run it with samples=1"]),
]


@pytest.mark.parametrize("overrides, expected", CONFIGURATION, ids=[" ".join(case[0]) for case in CONFIGURATION])
def test_configuration_errors(overrides, expected, tmp_path):
    out = tmp_path / "out"
    line = error_line(run_py(["limit=1", *overrides, f"out_dir={out}"], tmp_path))
    assert all(text in line for text in expected), line
    assert not out.exists() and not (tmp_path / "hydra").exists()


def test_missing_weights_name_the_paths_option_with_its_plus(tmp_path):
    line = error_line(run_py(["model=nemotron8b", f"out_dir={tmp_path / 'out'}"], tmp_path))
    assert "+paths=local" in line and " paths=local" not in line, line
    assert not (tmp_path / "out").exists() and not (tmp_path / "hydra").exists()


@pytest.mark.parametrize("override", ["width=0", "out_dir=a-file"])
def test_bad_input_leaves_no_hydra_run_directory(override, tmp_path):
    (tmp_path / "a-file").write_text("")
    command = [sys.executable, str(PROJECT_ROOT / "run.py"), override]  # Hydra's own outputs/<date>/<time>
    error_line(run(command, tmp_path))
    assert not (tmp_path / "outputs").exists()


ENTRY_POINTS = [
    # (command past the interpreter, extra environment): each kind of entry point once, with what
    # the fork server must hand on (the working directory, the environment, argv)
    ([str(PROJECT_ROOT / "run.py"), "widht=3"], {}),
    ([str(PROJECT_ROOT / "run.py"), "threads=-3"], {"PACKEDSS_TRACEBACK": "1"}),
    (["-m", "packedss.grade", "present.jsonl"], {}),
    (["-m", "packedss.plan", "+experiment=tabel6"], {}),
    (["-m", "packedss.analysis", "nowhere", "--tables", "6"], {}),
    ([str(PROJECT_ROOT / "scripts" / "bench_schedules.py"), "--model", "tinyy"], {}),
]


@pytest.mark.parametrize("arguments,extra", ENTRY_POINTS, ids=lambda v: " ".join(v)[-40:] if isinstance(v, list) else "")
def test_the_fork_server_gives_what_a_fresh_interpreter_gives(arguments, extra, tmp_path):
    """The bad-input tests run their entry points in a fork server's children (tests/bad_inputs.py);
    each kind of entry point gives there the status and output it gives from a fresh interpreter."""
    (tmp_path / "present.jsonl").write_text("not records\n")  # found only from the working directory
    command = [sys.executable, *arguments]
    if command[1].endswith("run.py"):
        command += [f"hydra.run.dir={tmp_path}/hydra"]
    env = offline_env(tmp_path, **extra)
    fresh, forked = bad_inputs.fresh(command, env, tmp_path), bad_inputs.forked(command, env, tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.returncode == 2 and fresh.stderr.splitlines()[-1].startswith("error: ")


def test_the_traceback_is_shown_behind_the_variable(tmp_path):
    result = subprocess.run(run_py_command(["threads=-3"], tmp_path), capture_output=True, text=True, cwd=tmp_path,
                            env=offline_env(tmp_path, PACKEDSS_TRACEBACK="1"), timeout=600)  # fmt: skip
    assert result.returncode == 2
    assert "Traceback" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: invalid threads=-3")


# --------------------------------------------------------------------------- data


def _gsm8k(tmp_path: Path, text: str) -> list[str]:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "gsm8k_test.jsonl").write_text(text)
    return ["task=gsm8k", f"data_dir={data}"]


ROW = json.dumps({"question": "1 + 1?", "answer": "so #### 2"})


@pytest.mark.parametrize(
    "content, limit, expected",
    [
        (None, 1, ["does not exist", "pass data_dir=DIR holding gsm8k_test.jsonl"]),
        ("", 1, ["holds no rows"]),
        (f"{ROW}\n\n{{\"question\": \"b\",\n{ROW}\n", 1, ["gsm8k_test.jsonl: line 3 is not valid JSON"]),
        (f"{ROW}\n{json.dumps({'problem': 'x', 'answer': '#### 1'})}\n", 1, ["row 2 of", "has no field 'question'"]),
        (f"{ROW}\n{json.dumps({'question': 'x', 'answer': 'no number'})}\n", 1, ["row 2", "'#### N'"]),
        (f"{ROW}\n{ROW}\n", 5, ["5 questions asked for", "holds 2", "lower the limit to 2"]),
    ],
    ids=["missing", "empty", "malformed-line-3", "wrong-fields", "no-gold-number", "fewer-rows-than-limit"],
)
def test_data_errors(content, limit, expected, tmp_path):
    overrides = _gsm8k(tmp_path, content) if content is not None else ["task=gsm8k", f"data_dir={tmp_path / 'nowhere'}"]
    out = tmp_path / "out"
    line = error_line(run_py([*overrides, f"limit={limit}", f"out_dir={out}"], tmp_path))
    assert all(text in line for text in expected), line
    assert not out.exists() and not (tmp_path / "hydra").exists()


# --------------------------------------------------------------------------- file system


def _unwritable_dir(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o500)
        return folder
    if os.access("/sys", os.W_OK) and not Path("/sys").is_mount():
        pytest.skip("running as root without a read-only /sys: no unwritable folder to try")
    return Path("/sys")  # read-only even for root


@pytest.mark.parametrize("where", ["file", "below-a-file", "unwritable"])
def test_out_dir_that_is_no_writable_folder_fails_before_loading(where, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("keep\n")
    out = {"file": a_file, "below-a-file": a_file / "records", "unwritable": _unwritable_dir(tmp_path) / "records"}[where]
    line = error_line(run_py([f"out_dir={out}", "limit=1"], tmp_path))
    assert f"out_dir={out}" in line and ("is a file" in line if where != "unwritable" else "cannot write in" in line)
    assert a_file.read_text() == "keep\n" and (where == "file" or not out.exists())
    assert not (tmp_path / "hydra").exists()


@needs_tiny
def test_a_full_disk_while_a_record_is_written_cuts_the_partial_line(tmp_path):
    out = tmp_path / "out"
    args = ["schedule=linear", "width=4", "max_new_tokens=16", "warmup=false", "progress=false", f"out_dir={out}"]
    run_py([*args, "limit=1"], tmp_path).check_returncode()
    (path,) = out.rglob("*.jsonl")
    before = path.read_bytes()
    limit = len(before) + 200  # the next record crosses it: the write fails part way (EFBIG, as ENOSPC would)

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    quiet = ["hydra.output_subdir=null", "hydra/job_logging=disabled"]  # Hydra's own files stay below the limit too
    result = run(run_py_command([*args, "limit=3", *quiet], tmp_path), tmp_path, preexec_fn=small_files)
    line = error_line(result)
    assert f"cannot write a record to {path}" in line and "rerun the same command to resume" in line
    assert path.read_bytes() == before  # the torn line is cut: the file is as it was


def test_a_full_disk_before_the_job_starts_is_one_line_too(tmp_path):
    def tiny_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (300, 300))  # Hydra's config.yaml of the run is larger

    out = tmp_path / "out"
    line = error_line(run(run_py_command(["limit=1", f"out_dir={out}"], tmp_path), tmp_path, preexec_fn=tiny_files))
    assert line.startswith("error: File too large") and "free space on its disk" in line, line
    assert not out.exists()


# --------------------------------------------------------------------------- model


def _model_dir(tmp_path: Path, kind: str) -> Path:
    folder = tmp_path / kind
    if kind == "missing":
        return folder
    folder.mkdir()
    links = {"no-config": [], "bad-config": ["model.safetensors", "tokenizer.json", "tokenizer_config.json"],
             "no-tokenizer": ["config.json", "model.safetensors"],
             "truncated-weights": ["config.json", "tokenizer.json", "tokenizer_config.json"]}[kind]  # fmt: skip
    for name in links:
        (folder / name).symlink_to(TINY / name)
    if kind == "bad-config":
        (folder / "config.json").write_text('{"model_type": \n')
    if kind == "truncated-weights":
        (folder / "model.safetensors").write_bytes((TINY / "model.safetensors").read_bytes()[:100])
    return folder


@needs_tiny
@pytest.mark.parametrize(
    "kind, expected",
    [
        ("missing", "does not exist; set model.path"),
        ("no-config", "has no config.json; point model.path"),
        ("bad-config", "config.json is not valid JSON"),
        ("no-tokenizer", "cannot load the tokenizer"),
        ("truncated-weights", "model.safetensors ("),
    ],
)
def test_model_errors(kind, expected, tmp_path):
    out = tmp_path / "out"
    line = error_line(run_py([f"model.path={_model_dir(tmp_path, kind)}", "limit=1", f"out_dir={out}"], tmp_path))
    assert expected in line, line
    assert not out.exists() and not (tmp_path / "hydra").exists()


@needs_tiny
@pytest.mark.parametrize("kind, expected", [("missing", "has no adapter_config.json; set model.lora_path"),
                                            ("malformed", "adapter_config.json is not valid JSON")])  # fmt: skip
def test_lora_adapter_errors(kind, expected, tmp_path):
    adapter = tmp_path / "adapter"
    if kind == "malformed":
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text('{"peft_type": ')
    out = tmp_path / "out"
    line = error_line(run_py(["model.lora=true", f"model.lora_path={adapter}", "limit=1", f"out_dir={out}"], tmp_path))
    assert expected in line, line
    assert not out.exists()


# --------------------------------------------------------------------------- signals


def default_sigint() -> None:
    """A shell starts a background job with SIGINT ignored, and a child inherits that; the child
    under test must see SIGINT as a terminal's Ctrl-C delivers it, however pytest was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@needs_tiny
@pytest.mark.parametrize("signum, status, message", [
    (signal.SIGINT, 130, "error: interrupted; rerun the same command to resume"),
    (signal.SIGTERM, 143, "error: stopped by SIGTERM; rerun the same command to resume"),
])  # fmt: skip
def test_a_signal_mid_run_keeps_whole_records_and_says_how_to_resume(signum, status, message, tmp_path):
    out = tmp_path / "out"
    # 60 questions: the signal comes after the second record, so the run must outlast the test's
    # polling by a wide margin also on a loaded machine (with 12 it once finished before the signal).
    args = ["schedule=linear", "width=4", "limit=60", "max_new_tokens=96", "warmup=false", "progress=false", f"out_dir={out}"]
    target, directory = None, out / "tiny" / "arith"
    process = subprocess.Popen(run_py_command(args, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=offline_env(tmp_path), cwd=tmp_path, preexec_fn=default_sigint)  # fmt: skip
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        target = target or (directory.is_dir() and record_file(directory, "linear-W4-T0-s0.jsonl"))
        if target and target.read_bytes().count(b"\n") >= 2:
            process.send_signal(signum)
            break
        time.sleep(0.005)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == status, stderr[-3000:]
    assert stderr.splitlines() == [message]
    kept, bad = read_records(target)
    assert bad == [] and 2 <= len(kept) < 60


@needs_tiny
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_libraries_load_is_one_line_too(signum, status, tmp_path):
    out = tmp_path / "out"
    process = subprocess.Popen(run_py_command([f"out_dir={out}"], tmp_path), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=offline_env(tmp_path), cwd=tmp_path,
                               preexec_fn=default_sigint)  # fmt: skip
    # Hydra's copy of the job's overrides is written just before the job imports its libraries
    # (torch's compiler, transformers: seconds), once the signal handlers are in place.
    ready, deadline = tmp_path / "hydra" / ".hydra" / "overrides.yaml", time.time() + 120
    while not ready.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == status, stderr[-3000:]
    assert len(stderr.splitlines()) == 1 and stderr.startswith("error: ") and "rerun the same command" in stderr
    assert not out.exists()


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_run_py_imports_hydra_and_torch_is_one_line_too(signum, status, tmp_path):
    """The first second of run.py, before Hydra starts: `-X importtime` reports each module once
    it is imported, so the signal is sent once hydra is in and torch is still loading."""
    command = run_py_command([f"out_dir={tmp_path / 'out'}"], tmp_path)
    process = subprocess.Popen([command[0], "-X", "importtime", *command[1:]], stderr=subprocess.PIPE, text=True,
                               stdout=subprocess.DEVNULL, env=offline_env(tmp_path), cwd=tmp_path,
                               preexec_fn=default_sigint)  # fmt: skip
    before = []
    for line in process.stderr:
        before.append(line.rstrip())
        if before[-1].endswith("| hydra"):
            process.send_signal(signum)
            break
    after = process.stderr.readlines()
    process.wait(timeout=120)
    assert not any(line.endswith("| torch") for line in before), "torch was imported before the signal"
    reported = [line for line in after if not line.startswith("import time:")]
    assert (process.returncode, reported) == (status, [f"error: {Stopped(signum)}\n"])
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- sweeps


def test_a_sweep_with_an_unknown_option_is_one_line(tmp_path):
    line = error_line(run_py(["-m", "model=nope", f"out_dir={tmp_path / 'out'}"], tmp_path))
    assert "Could not find 'model/nope'; valid choices for model:" in line
    assert not (tmp_path / "out").exists()


def test_a_sweep_lists_its_job_with_an_unknown_option_on_one_line_and_runs_none(tmp_path):
    result = run_py(["-m", "model=tiny,nope", f"out_dir={tmp_path / 'out'}"], tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    first, job, problem = result.stderr.splitlines()
    assert first == "error: 1 of 2 jobs of this sweep are invalid; nothing was run. Fix or drop them:"
    assert job.split() == ["#1", "model=nope", f"out_dir={tmp_path / 'out'}"]
    assert problem.strip().startswith("Could not find 'model/nope'; valid choices for model:")
    assert not (tmp_path / "out").exists()


def test_a_sweep_lists_its_jobs_whose_out_dir_is_a_file_and_runs_none(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    result = run_py(["-m", "schedule=ar,packed", f"out_dir={a_file}"], tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == "error: 2 of 2 jobs of this sweep are invalid; nothing was run. Fix or drop them:"
    assert sum(f"out_dir={a_file}: {a_file} is a file, not a directory" in line for line in lines) == 2
    assert a_file.read_text() == ""


def test_enospc_part_way_through_a_record_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    import errno

    from packedss import records
    from packedss.errors import PackedSSError

    path = tmp_path / "r.jsonl"
    with records.RecordWriter(path) as writer:
        writer.append({"question_id": "q0", "repeat": 0})
    before = path.read_bytes()
    real_write = os.write

    def disk_fills(fd, data):
        real_write(fd, bytes(data[:10]))  # part of the line reaches the disk, then it is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with records.RecordWriter(path) as writer:
        monkeypatch.setattr(records.os, "write", disk_fills)
        with pytest.raises(PackedSSError, match=r"cannot write a record to .*\(No space left on device\); free space"):
            writer.append({"question_id": "q1", "repeat": 0})
    assert path.read_bytes() == before


SIGTERM_IN_MAIN = """
import os, signal, sys
from packedss.errors import run_cli
if sys.argv[1] == "handled":
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(7))  # a launcher's own handler, e.g. submitit's
run_cli(lambda: os.kill(os.getpid(), signal.SIGTERM))
"""


@pytest.mark.parametrize("before, status, stderr", [
    ("default", 143, "error: stopped by SIGTERM; rerun the same command to resume\n"),
    ("handled", 7, ""),
])  # fmt: skip
def test_every_entry_point_stops_on_sigterm_with_one_line_unless_a_launcher_handles_it(before, status, stderr):
    """The entry points other than run.py (grade, plan, analysis, the scripts) get their SIGTERM
    handling from run_cli alone: a preempted one ends like a stopped job, a handler that a launcher
    installed first is left to it."""
    result = subprocess.run([sys.executable, "-c", SIGTERM_IN_MAIN, before], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")})  # fmt: skip
    assert (result.returncode, result.stderr) == (status, stderr)


def test_a_stop_that_omegaconf_re_raises_keeps_its_signal():
    """OmegaConf re-raises an exception raised inside it as type(err)(its own message); a signal
    arriving while the config is processed must still stop with its own status."""
    from packedss.errors import Stopped

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2):
        rewrapped = Stopped(f"{Stopped(signum)}\n    full_key: model\n    object_type=RunConfig")
        assert (str(rewrapped), rewrapped.exit_status) == (str(Stopped(signum)), 128 + signum)


def test_the_documented_schedule_error_is_what_run_py_prints(tmp_path):
    """docs/errors.md's `schedule=bogus` row, its `...` standing for the names between, matches the line."""
    import re

    row = next(line for line in (PROJECT_ROOT / "docs" / "errors.md").read_text().splitlines()
               if line.startswith("| configuration | run.py | `schedule=bogus` |"))  # fmt: skip
    documented = row.split(" | ")[3].split("`")[1]
    line = error_line(run_py(["schedule=bogus", f"out_dir={tmp_path / 'out'}"], tmp_path))
    assert re.fullmatch(".*".join(map(re.escape, documented.split("..."))), line), (documented, line)
    names = sorted(path.stem for path in (PROJECT_ROOT / "conf" / "schedule").glob("*.yaml"))
    assert line.endswith("valid choices for schedule: " + ", ".join(names)), line


STOP_MADE_AN_IMPORT_ERROR = """
import importlib.abc, os, runpy, signal, sys, time


SIGNALLED = sys.argv[1]


class SignalledImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == SIGNALLED:
            sys.meta_path.remove(self)
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
            except Exception:  # what numpy's import makes of an exception raised inside it
                raise ImportError("cannot load module more than once per process") from None


sys.meta_path.insert(0, SignalledImport())
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("module", ["omegaconf", "torch"])  # before Hydra starts; in the job, before run_job
def test_a_stop_that_a_library_turns_into_another_error_while_it_loads_is_still_the_stop(module, tmp_path):
    """A SIGTERM that lands inside a library's import can come up as another exception: numpy's
    import, interrupted, raises ImportError. The job still ends as a stopped job, in one line."""
    out = tmp_path / "out"
    command = run_py_command([f"out_dir={out}"], tmp_path)
    result = subprocess.run([command[0], "-c", STOP_MADE_AN_IMPORT_ERROR, module, *command[1:]], capture_output=True,
                            text=True, timeout=300, env=offline_env(tmp_path), cwd=tmp_path)  # fmt: skip
    assert (result.returncode, result.stderr) == (143, "error: stopped by SIGTERM; rerun the same command to resume\n")
    assert not out.exists()


def test_an_entry_points_stop_that_became_another_error_is_the_stop_once(capsys):
    """run_reporting (every entry point but run.py) reports a noted stop whatever exception it
    became, and a stop an earlier main caught itself does not turn a later bad input into it."""
    from packedss.errors import PackedSSError, note_stop, run_reporting

    def stopped_while_loading():
        note_stop(signal.SIGTERM)
        raise ImportError("cannot load module more than once per process")

    def bad_input():
        raise PackedSSError("width must be at least 1; give width=1 or more")

    assert run_reporting(stopped_while_loading) == 143
    assert capsys.readouterr().err == "error: stopped by SIGTERM; rerun the same command to resume\n"
    note_stop(signal.SIGTERM)  # a guard's stop that its own main caught (the preemption tests do)
    assert run_reporting(bad_input) == 2
    assert capsys.readouterr().err == "error: width must be at least 1; give width=1 or more\n"
