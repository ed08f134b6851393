"""Bad input to the other entry points, run as a user runs them: `python -m packedss.grade`,
`python -m packedss.analysis`, `python -m packedss.plan`, the benchmark scripts and the make
targets. Each ends with one `error: <what>; <fix>` line and exit status 2, and changes no record
file (docs/errors.md). Also: re-grading works offline from the data directory a record names."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from packedss.paths import PROJECT_ROOT
from packedss.tasks import load_task_config
from tests.test_runner import record_file
from tests.analysis.synthetic import synthetic_results
from tests.bad_inputs import SHARED_DATA, error_line, module, offline_env, run, run_py, script, snapshot

TINY = PROJECT_ROOT / "assets" / "models" / "tiny"
needs_tiny = pytest.mark.skipif(not (TINY / "config.json").is_file(), reason="the shipped tiny model is absent")
ROWS = [{"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}, {"question": "What is 2 + 2?", "answer": "#### 4"}]


# the tests of one gsm8k_run stay on one xdist worker, which runs the job once
shares_the_gsm8k_run = pytest.mark.xdist_group("gsm8k-run")


@pytest.fixture(scope="module")
def gsm8k_run(tmp_path_factory) -> tuple[Path, Path]:
    """(records folder, data folder) of one tiny GSM8K job run offline with data_dir."""
    if not (TINY / "config.json").is_file():
        pytest.skip("the shipped tiny model is absent")
    root = tmp_path_factory.mktemp("gsm8k-run")
    data = root / "data"
    data.mkdir()
    (data / "gsm8k_test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    out = root / "out"
    run_py(["task=gsm8k", f"data_dir={data}", "limit=2", "max_new_tokens=8", f"out_dir={out}"], root).check_returncode()
    return out, data


def _copy(gsm8k_run, tmp_path: Path) -> tuple[Path, Path]:
    out, data = gsm8k_run
    shutil.copytree(out, tmp_path / "out")
    (path,) = (tmp_path / "out").rglob("*.jsonl")
    return path, data


# --------------------------------------------------------------------------- packedss.grade


@shares_the_gsm8k_run
def test_records_remember_their_data_and_regrade_offline_without_flags(gsm8k_run, tmp_path):
    path, data = _copy(gsm8k_run, tmp_path)
    assert {json.loads(line)["data_dir"] for line in path.read_text().splitlines()} == {str(data.resolve())}
    result = module("packedss.grade", [str(tmp_path / "out")], tmp_path)  # a folder
    assert result.returncode == 0 and result.stderr == "", result.stderr[-3000:]
    assert f"{path}: re-graded 2 records" in result.stdout


@shares_the_gsm8k_run
def test_regrading_records_whose_data_moved_names_the_data_dir_flag(gsm8k_run, tmp_path):
    path, data = _copy(gsm8k_run, tmp_path)
    for line in path.read_text().splitlines():
        assert json.loads(line)["data_dir"] == str(data.resolve())
    moved = path.read_text().replace(json.dumps(str(data.resolve())), json.dumps(str(tmp_path / "gone")))
    path.write_text(moved)
    line = error_line(module("packedss.grade", [str(path)], tmp_path))
    assert "pass --data-dir DIR holding gsm8k_test.jsonl" in line and "data_dir=" not in line, line
    assert path.read_text() == moved
    result = module("packedss.grade", [str(path), "--data-dir", str(data)], tmp_path)  # the flag wins
    assert result.returncode == 0, result.stderr[-3000:]


@shares_the_gsm8k_run
def test_a_data_error_in_any_file_changes_none(gsm8k_run, tmp_path):
    first, data = _copy(gsm8k_run, tmp_path)
    broken = tmp_path / "broken.jsonl"
    record = json.loads(first.read_text().splitlines()[0])
    broken.write_text(json.dumps(record | {"data_dir": str(tmp_path / "gone")}) + "\n")
    before = snapshot(tmp_path)
    line = error_line(module("packedss.grade", [str(first), str(broken)], tmp_path))
    assert "gone" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("arguments, expected", [
    (["nowhere.jsonl"], "nowhere.jsonl: no such file or folder; name records files"),
    (["empty-folder"], "empty-folder: no records files (*.jsonl) under this folder"),
    (["--workers", "0", "x.jsonl"], "invalid --workers 0"),
    ([], "the following arguments are required: files"),
])  # fmt: skip
def test_grade_argument_errors(arguments, expected, tmp_path):
    (tmp_path / "empty-folder").mkdir()
    line = error_line(module("packedss.grade", arguments, tmp_path))
    assert expected in line, line


@pytest.mark.parametrize("content", [b"just some notes\n", b'{"a": 1}\n[1, 2]\n', b"\xff\xfe\n"],
                         ids=["text", "json-not-records", "not-utf8"])  # fmt: skip
def test_grade_refuses_a_file_that_is_not_a_records_file(content, tmp_path):
    path = tmp_path / "notes.jsonl"
    path.write_bytes(content)
    line = error_line(module("packedss.grade", [str(path)], tmp_path))
    assert f"{path} is not a records file (line 1: " in line, line
    assert path.read_bytes() == content


@pytest.mark.skipif(not (SHARED_DATA / "MbppPlus.jsonl.gz").is_file(), reason="../shared/data has no MbppPlus.jsonl.gz")
def test_mbpp_records_with_local_data_regrade_without_any_download(tmp_path):
    record = {"task": "mbpp", "task_config": dataclasses.asdict(load_task_config("mbpp")), "data_dir": str(SHARED_DATA),
              "question_id": "mbppplus/2", "output_text": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n",
              "extracted_answer": None, "correct": None, "grader": None}  # fmt: skip
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(record) + "\n")
    dead = "http://127.0.0.1:9"  # any download attempt fails at once, and no cached copy is at hand
    env = offline_env(tmp_path, http_proxy=dead, https_proxy=dead, HTTP_PROXY=dead, HTTPS_PROXY=dead,
                      XDG_CACHE_HOME=str(tmp_path / "cache"), HOME=str(tmp_path / "home"))  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "packedss.grade", str(path)], capture_output=True, text=True,
                            cwd=tmp_path, timeout=600, env=env)  # fmt: skip
    assert result.returncode == 0 and "re-graded 1 records" in result.stdout, result.stderr[-3000:]
    assert json.loads(path.read_text())["grader"]["name"] == "mbpp"


# --------------------------------------------------------------------------- packedss.analysis


def test_analysis_of_a_folder_without_records_creates_nothing(tmp_path):
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "r.jsonl").write_text('{"not": "a record"}\n')
    line = error_line(module("packedss.analysis", [str(tmp_path)], tmp_path))
    assert "no usable records" in line and "r.jsonl:1: missing fields 'model', " in line and " more)" in line, line
    assert len(line) < 400, line  # not every missing field of a junk line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records"]


def test_a_records_line_that_is_not_utf8_is_warned_about_once_and_skipped(tmp_path):
    records = synthetic_results(tmp_path)
    path = next(records.rglob("*.jsonl"))
    with open(path, "ab") as handle:
        handle.write(b'{"model": "\xff"}\n')
    lines = path.read_bytes().count(b"\n")
    result = module("packedss.analysis", [str(tmp_path), "--tables", "6", "--n-resamples", "50"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.splitlines() == [f"warning: bad record line skipped: {path}:{lines}: not UTF-8 text (byte 12)"]


@pytest.mark.parametrize("arguments, expected", [
    (["nowhere"], "no records folder nowhere"),
    (["{tmp}", "--tables", "1"], "no table 1; valid: 2, 3"),
    (["{tmp}", "--tables", "acceptence"], "no table acceptence (did you mean acceptance?); valid: 2, 3"),
    (["{tmp}", "--n-resamples", "0"], "invalid --n-resamples 0"),
])  # fmt: skip
def test_analysis_argument_errors(arguments, expected, tmp_path):
    line = error_line(module("packedss.analysis", [a.format(tmp=tmp_path) for a in arguments], tmp_path))
    assert expected in line, line
    assert not (tmp_path / "tables").exists() and not (tmp_path / "figures").exists()


@needs_tiny
def test_a_bad_record_line_is_warned_about_once(tmp_path):
    out = tmp_path / "records"
    run_py(["-m", "schedule=linear,packed", "width=4", "limit=2", "max_new_tokens=16", f"out_dir={out}"],
           tmp_path).check_returncode()  # fmt: skip
    path = record_file(out / "tiny" / "arith", "packed-W4-T0-s0.jsonl")
    with open(path, "a") as handle:
        handle.write("{torn\n")
    result = module("packedss.analysis", [str(tmp_path), "--tables", "6", "--n-resamples", "100"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count(f"{path}:3") == 1, result.stderr


# --------------------------------------------------------------------------- packedss.plan


@pytest.mark.parametrize("arguments, expected", [
    (["+experiment=tabel6"], "Could not find 'experiment/tabel6' (did you mean table6?)"),
    (["+experiment=table6", "widht=3"], "unknown key widht (did you mean width?)"),
    (["+experiment=table6", "threads=abc"], "invalid value for threads"),
    (["+experiment=table6", "--and", "model=nope"], "valid choices for model:"),
    (["+experiment=table6", "limit=400"], "task mbpp: limit=400 asks for more questions than its 378"),
])  # fmt: skip
def test_plan_errors(arguments, expected, tmp_path):
    line = error_line(module("packedss.plan", arguments, tmp_path))
    assert expected in line, line


def test_plan_lists_each_invalid_job_on_its_own_line(tmp_path):
    result = module("packedss.plan", ["+experiment=table3", "+widht=3"], tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == "error: 6 of 6 jobs of this sweep are invalid; nothing was run. Fix or drop them:"
    assert sum("unknown key widht (did you mean width?)" in line for line in lines) == 6


# --------------------------------------------------------------------------- scripts and make targets


@pytest.mark.parametrize("name, arguments, expected", [
    ("bench_calls.py", ["--shape", "tiyn"], "unknown --shape tiyn (did you mean tiny?)"),
    ("bench_calls.py", ["--blocks", "8,a"], "argument --blocks: expected an integer >= 1, got 'a'"),
    ("bench_calls.py", ["--config", "nowhere"], "does not exist"),
    ("bench_schedules.py", ["--model", "tinyy"], "unknown --model tinyy (did you mean tiny?)"),
    ("bench_schedules.py", ["--schedules", "linear,packd"], "unknown schedules ['packd'] for the nemotron family; valid: ar,"),
    ("bench_schedules.py", ["--temperature", "nan"], "expected a finite number >= 0, got 'nan'"),
    ("bench_schedules.py", ["--task", "gsm8k", "--data-dir", "nowhere"], "pass --data-dir DIR holding gsm8k_test.jsonl"),
    ("bench_concurrency.py", ["--model", "tinyy"], "unknown --model tinyy (did you mean tiny?)"),
    ("bench_concurrency.py", ["--concurrency", "16,64"], "--concurrency 16,64 lacks 1, the reference of the ratio"),
    ("bench_concurrency.py", ["--concurrency", "1,0"], "argument --concurrency: expected an integer >= 1, got '0'"),
    ("bench_concurrency.py", ["--schedules", "linear,packd"], "--schedules: unknown packd for the nemotron family; valid: ar,"),
    ("bench_concurrency.py", ["--concurrency", "1", "--phases"], "--phases times the rounds of a C > 1, but --concurrency holds only 1"),
    ("bench_concurrency.py", ["--concurrency", "1", "--coroutines"], "--coroutines times the rounds of a C > 1, but --concurrency holds only 1"),
    ("bench_sampler.py", ["--vocab", "1"], "argument --vocab: expected an integer >= 2, got '1'"),
    ("bench_sampler.py", ["--rows", "8,a"], "argument --rows: expected an integer >= 1, got 'a'"),
    ("bench_sampler.py", ["--device", "cuda"], "--device cuda, but torch finds no CUDA device here; use --device cpu"),
    ("bench_sampler.py", ["--json", "nowhere/x.json"], "--json nowhere/x.json: its directory does not exist"),
    ("check_decode.py", ["--json", "x.json", "--widths", "8,0"], "argument --widths: expected an integer >= 1, got '0'"),
    ("check_decode.py", ["--json", "x.json", "--dtype", "bf16"], "argument --dtype: invalid choice: 'bf16'"),
    ("check_decode.py", ["--json", "nowhere/x.json", "--device", "cpu"], "its directory does not exist"),
    ("check_decode.py", ["--json", "x.json", "--limit", "-1"], "argument --limit: expected an integer >= 1"),
    ("check_decode.py", ["--json", "x.json", "--checks", "sync"], "argument --checks: unknown sync; valid: syncs, audit"),
    ("gpu_concurrency.py", ["--out", "o", "--json", "x.json", "--shape", "nemotron9b"], "unknown --shape nemotron9b (did you mean nemotron8b?)"),
    ("gpu_concurrency.py", ["--out", "o", "--json", "x.json", "--concurrency", "1,0"], "argument --concurrency: expected an integer >= 1, got '0'"),
    ("gpu_concurrency.py", ["--out", "o", "--json", "nowhere/x.json", "--device", "cpu"], "its directory does not exist"),
    ("gpu_concurrency.py", ["--out", "o", "--json", "x.json", "--schedules", "ar,lineer"], "argument --schedules: unknown lineer; valid: ar, linear"),
    ("gpu_concurrency.py", ["--out", "o", "--json", "x.json", "--device", "cpu", "--schedules", "linear,packed"], "--schedules without ar"),
    ("eval_tiny.py", ["--widht", "8"], "unrecognized arguments: --widht 8; see scripts/eval_tiny.py --help"),
    ("eval_tiny.py", ["--n", "0"], "argument --n: expected an integer >= 1, got '0'"),
    ("eval_tiny.py", ["--schedules", "ar", "packd"], "argument --schedules: invalid choice: 'packd'"),
    ("eval_tiny.py", ["--model", "nowhere"], "model directory nowhere does not exist"),
    ("eval_tiny.py", ["--lora", "nowhere"], "proposal LoRA: nowhere has no adapter_config.json"),
    ("eval_tiny.py", ["--json", "nowhere/x.json"], "--json nowhere/x.json: its directory does not exist"),
    ("eval_tiny.py", ["--card", "nowhere.md"], "--card nowhere.md: no such model card"),
    ("train_tiny.py", ["--out", "o", "--steps", "0"], "argument --steps: expected an integer >= 1, got '0'"),
    ("train_tiny.py", ["--out", "o", "--lr", "fast"], "argument --lr: invalid float value: 'fast'"),
    ("train_tiny.py", ["--out", "o", "--family", "sdar", "--init-from", "nowhere"], "--init-from nowhere: not a checkpoint directory"),
    ("train_tiny.py", ["--out", "o", "--lora", "--base", "nowhere"], "--base nowhere: not a checkpoint directory"),
    ("train_tiny.py", ["--out", "o", "--family", "setdlm", "--init-from", "nowhere"], "--init-from applies to --family nemotron and sdar"),
])  # fmt: skip
def test_script_errors(name, arguments, expected, tmp_path):
    line = error_line(script(name, arguments, tmp_path))
    assert expected in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a refused command wrote something"


@needs_tiny
def test_bench_schedules_asking_for_more_questions_than_the_task_has(tmp_path):
    line = error_line(script("bench_schedules.py", ["--limit", "300", "--schedules", "linear"], tmp_path))
    assert "but the data set holds 200" in line, line


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_targets_pass_the_one_line_on(tmp_path):
    result = run(["make", "-s", "-o", ".venv/.installed", "plan-table6", f"PY={sys.executable}", "OVERRIDES=widht=3"],
                 tmp_path, cwd=PROJECT_ROOT)  # fmt: skip
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr
    # make adds its own "make: *** ... Error 2" ("make[1]: ***" when it runs under another make, as in CI)
    assert [line for line in lines if not re.match(r"make(\[\d+\])?: \*\*\*", line)] == [
        "error: unknown key widht (did you mean width?); fix or remove it (valid keys: model, task, schedule, width, "
        "temperature, verify, order, seed, samples, native_window, repeats, concurrency, limit, max_new_tokens, data_dir, out_dir, "
        "checkpoint_dirs, device, dtype, timing, threads, warmup, progress)"
    ]
