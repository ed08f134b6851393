"""The Hydra runner end to end: records, sweeps, crash safety, bad input, the local launcher."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from packedss.config import register_configs
from packedss.paths import CONF_DIR, PROJECT_ROOT
from packedss.errors import PackedSSError
from packedss.records import RECORD_FIELDS, read_records
from packedss.runner import run_job
from tests import bad_inputs

TIMING_FIELDS = {"wall_s", "model_s", "nonmodel_s", "call_model_s", "latency_s", "code_version"}
def offline_env(tmp_path: Path) -> dict:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), PYTHONUNBUFFERED="1")
    return env


def run_py(args: list[str], tmp_path: Path, check: bool = True) -> subprocess.CompletedProcess:
    result = bad_inputs.run_py(args, tmp_path)  # python run.py ..., in a fork server's child
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


HASH_SUFFIX = re.compile(r"-[0-9a-f]{16}\.jsonl$")


def readable_name(path: Path) -> str:
    """A record file's name without its identity hash: `packed-W8-T0-s0.jsonl`."""
    assert HASH_SUFFIX.search(path.name), path.name
    return HASH_SUFFIX.sub(".jsonl", path.name)


def record_file(directory: Path, readable: str) -> Path | None:
    """The record file in `directory` whose name is `readable` plus an identity hash (None: none yet)."""
    found = [p for p in directory.glob("*.jsonl") if HASH_SUFFIX.search(p.name) and readable_name(p) == readable]
    assert len(found) <= 1, found
    return found[0] if found else None


def all_records(out_dir: Path) -> list[dict]:
    records = []
    for path in sorted(out_dir.rglob("*.jsonl")):
        good, bad = read_records(path)
        assert bad == [], bad
        records += good
    return records


def test_single_job_writes_one_valid_record_per_question(model_overrides, tmp_path):
    out = tmp_path / "out"
    run_py([*model_overrides, "task=arith", "schedule=packed", "width=8", "limit=5", f"out_dir={out}",
            "max_new_tokens=48"], tmp_path)  # fmt: skip
    files = list(out.rglob("*.jsonl"))
    assert [f.parent.relative_to(out).as_posix() + "/" + readable_name(f) for f in files] == ["tiny/arith/packed-W8-T0-s0.jsonl"]
    records = all_records(out)  # read_records validates schema and identities
    assert len(records) == 5
    assert len({r["question_id"] for r in records}) == 5
    for record in records:
        assert set(RECORD_FIELDS) <= set(record)
        assert record["block"] == 9 and record["verify"] == "greedy"
        assert len(record["call_model_s"]) == record["nfe_total"]
    # A rerun resumes: nothing new is written.
    rerun = run_py([*model_overrides, "task=arith", "schedule=packed", "width=8", "limit=5", f"out_dir={out}",
                    "max_new_tokens=48"], tmp_path)  # fmt: skip
    assert "0 records written, 5 already recorded" in rerun.stdout
    assert len(all_records(out)) == 5


def test_sweep_over_schedules_gives_identical_greedy_outputs(model_overrides, tmp_path):
    out = tmp_path / "out"
    run_py(["-m", *model_overrides, "schedule=ar,linear,quadratic,packed", "width=4", "limit=3",
            "max_new_tokens=40", f"out_dir={out}"], tmp_path)  # fmt: skip
    records = all_records(out)
    assert len(records) == 12
    by_question: dict[str, set] = {}
    for record in records:
        by_question.setdefault(record["question_id"], set()).add(record["output_hash"])
    assert len(by_question) == 3
    assert all(len(hashes) == 1 for hashes in by_question.values())
    assert {r["schedule"] for r in records} == {"ar", "linear", "quadratic", "packed"}


def _strip_timing(records):
    return sorted(({k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records),
                  key=lambda r: r["question_id"])  # fmt: skip


def test_kill_9_mid_run_then_rerun_loses_and_duplicates_nothing(model_overrides, tmp_path):
    questions = 16  # enough that the job cannot finish between two polls of its record file
    args = [*model_overrides, "schedule=linear", "width=4", f"limit={questions}", "max_new_tokens=96", "warmup=false"]
    reference_dir, crash_dir = tmp_path / "reference", tmp_path / "crash"
    run_py([*args, f"out_dir={reference_dir}"], tmp_path)
    target = None
    process = subprocess.Popen(
        [sys.executable, str(PROJECT_ROOT / "run.py"), *args, f"out_dir={crash_dir}", f"hydra.run.dir={tmp_path}/h2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=offline_env(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        target = target or ((crash_dir / "tiny" / "arith").is_dir() and record_file(crash_dir / "tiny" / "arith", "linear-W4-T0-s0.jsonl"))
        if target and target.read_bytes().count(b"\n") >= 2:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the job finished before it could be killed"
    partial = target.read_bytes().count(b"\n")
    assert 2 <= partial < questions
    # Simulate a crash in the middle of a write as well: a torn last line.
    with open(target, "ab") as handle:
        handle.write(b'{"model": "tiny", "task": "ari')
    run_py([*args, f"out_dir={crash_dir}"], tmp_path)
    assert _strip_timing(all_records(crash_dir)) == _strip_timing(all_records(reference_dir))


@pytest.fixture(scope="module")
def composed():
    register_configs()

    def make(overrides: list[str]):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=overrides)

    return make


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["width=0"], "invalid width=0; the speculative width must be >= 1"),
        (["temperature=-1"], "invalid temperature=-1.0; use 0 for greedy or a positive value"),
        (["width=40"], "valid widths: 1..31"),
        (["verify=bogus", "temperature=1"], "invalid verify='bogus'; valid choices: rejection, match"),
        (["dtype=int8"], "valid choices: auto, float32, float64, bfloat16, float16"),
        (["model=nemotron8b"], "weights nvidia/Nemotron-Labs-Diffusion-8B are not available locally"),
        (["task=gsm8k"], "gsm8k"),
        (["order=confidence"], "order=confidence needs an any-order model"),
        (["timing=bogus"], "invalid timing='bogus'; valid choices: sync, events"),
    ],
)
def test_bad_input_fails_at_start_with_one_clear_message(composed, model_overrides, tmp_path, hub_offline,
                                                         overrides, message):  # fmt: skip
    base = [] if any(o.startswith("model=") for o in overrides) else model_overrides
    cfg = composed([*base, *overrides, f"out_dir={tmp_path / 'out'}"])
    with pytest.raises(PackedSSError) as err:
        run_job(cfg)
    assert message in str(err.value)
    if overrides == ["task=gsm8k"]:
        assert "data_dir" in str(err.value)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.jsonl"))


def test_unknown_schedule_and_unknown_key_fail_in_hydra_with_the_choices(composed):
    from hydra.errors import ConfigCompositionException, MissingConfigException

    with pytest.raises(MissingConfigException) as err:
        composed(["schedule=bogus"])
    assert "Could not find 'schedule/bogus'" in str(err.value)
    assert all(name in str(err.value) for name in ("ar", "linear", "quadratic", "packed"))
    with pytest.raises(ConfigCompositionException, match="wdth"):
        composed(["wdth=3"])


def test_run_py_reports_bad_input_without_a_traceback(model_overrides, tmp_path):
    result = run_py([*model_overrides, "width=0", f"out_dir={tmp_path / 'out'}"], tmp_path, check=False)
    assert result.returncode == 2
    assert "error: invalid width=0" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
    result = run_py(["schedule=bogus", f"out_dir={tmp_path / 'out'}"], tmp_path, check=False)
    assert result.returncode != 0 and "Could not find 'schedule/bogus'" in result.stderr
    assert not (tmp_path / "out").exists()


def test_local_launcher_runs_a_two_job_sweep(model_overrides, tmp_path):
    out = tmp_path / "out"
    run_py(["-m", "hydra/launcher=local", *model_overrides, "schedule=ar,packed", "limit=2", "max_new_tokens=24",
            f"out_dir={out}"], tmp_path)  # fmt: skip
    names = sorted(readable_name(p) for p in out.rglob("*.jsonl"))
    assert names == ["ar-T0-s0.jsonl", "packed-W8-T0-s0.jsonl"]
    assert len(all_records(out)) == 4


def test_experiment_preset_runs_offline_on_the_tiny_model(model_overrides, tmp_path):
    out = tmp_path / "out"
    result = run_py(["-m", "+experiment=table6", *model_overrides, "task=arith", "limit=1", "max_new_tokens=16",
                     f"out_dir={out}"], tmp_path)  # fmt: skip
    names = sorted(readable_name(p) for p in out.rglob("*.jsonl"))
    assert names == ["linear-W31-T0-s0.jsonl", "packed-W31-T0-s0.jsonl", "quadratic-W7-T0-s0.jsonl"], result.stdout


def test_any_order_family_runs_through_the_same_runner(tmp_path):
    from tests.anyorder_fixtures import write_random_setdlm
    from tests.conftest import write_test_tokenizer

    checkpoint = tmp_path / "setdlm"
    write_random_setdlm(checkpoint, vocab=write_test_tokenizer(checkpoint))
    out = tmp_path / "out"
    # The test tokenizer has no chat template and no <|im_end|>: plain prompts.
    run_py(["-m", "model=setdlm1.7b", f"model.path={checkpoint}", "model.chat=false", "model.end_of_turn=[]",
            "schedule=ar,linear,packed,native", "width=4", "order=ltr", "limit=2", "max_new_tokens=24", f"out_dir={out}"], tmp_path)  # fmt: skip
    records = all_records(out)
    assert len(records) == 8
    assert {r["family"] for r in records} == {"setdlm"}
    assert {r["lossy"] for r in records if r["schedule"] == "native"} == {True}
    # The released native sampler's window: half the checkpoint's smax (SET_SMAX = 16 here).
    assert {r["native_window"] for r in records if r["schedule"] == "native"} == {8}
    lossless = [r for r in records if r["schedule"] != "native"]
    for question in {r["question_id"] for r in records}:
        assert len({r["output_hash"] for r in lossless if r["question_id"] == question}) == 1


def test_any_order_width_is_bounded_by_smax(composed, tmp_path):
    from tests.anyorder_fixtures import SET_SMAX, write_random_setdlm
    from tests.conftest import write_test_tokenizer

    checkpoint = tmp_path / "setdlm"
    write_random_setdlm(checkpoint, vocab=write_test_tokenizer(checkpoint))
    # A local checkpoint in place of the released ones: its own smax bounds W.
    cfg = composed(["model=setdlm1.7b", f"model.path={checkpoint}", "model.hub_id=null", f"width={SET_SMAX + 1}",
                    f"out_dir={tmp_path / 'o'}"])  # fmt: skip
    with pytest.raises(PackedSSError, match=f"valid widths: 1..{SET_SMAX}"):
        run_job(cfg)


def test_stop_strings_cut_tokens_and_text(tmp_path):
    from transformers import AutoTokenizer

    from packedss.tasks.stops import make_stop_check, output_text
    from tests.conftest import write_test_tokenizer

    write_test_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    ids = tokenizer(" 3 * 4 = 12.\n#### 12\nQuestion: Tom has", add_special_tokens=False)["input_ids"]
    check = make_stop_check(tokenizer, ["\nQuestion:"])
    keep = None
    for end in range(1, len(ids) + 1):  # tokens arrive a few at a time, as from a schedule
        keep = check(ids[:end], 1)
        if keep is not None:
            break
    assert keep is not None
    assert tokenizer.decode(ids[:keep]).endswith("\nQuestion:")
    assert "\nQuestion:" not in tokenizer.decode(ids[: keep - 1])
    assert output_text(tokenizer, ids[:keep], ["\nQuestion:"]) == " 3 * 4 = 12.\n#### 12"
    assert make_stop_check(tokenizer, []) is None
