"""Loaders: counts and stable ids from ../shared/data, clear errors, prompts, real code graders."""

import gzip
import json

import pytest

from packedss.errors import PackedSSError
from packedss.tasks import TASK_NAMES, DataUnavailable, TaskConfig, load_task, load_task_config


@pytest.mark.parametrize(
    "name, overrides, count, first_id, last_id",
    [
        ("gsm8k", {}, 1319, "gsm8k/0", "gsm8k/1318"),
        ("math500", {}, 500, "math500/0", "math500/499"),
        ("humaneval", {}, 164, "HumanEval/0", "HumanEval/163"),
        ("writingbench", {}, 1000, "writingbench/1", "writingbench/1000"),
        ("mbpp", {"variant": "original"}, 500, "mbpp/11", "mbpp/510"),
        ("mbpp", {}, 378, "mbppplus/2", "mbppplus/809"),
    ],
)
def test_loads_from_shared_data(shared_data, name, overrides, count, first_id, last_id):
    task = load_task(load_task_config(name, **overrides), str(shared_data))
    qs = task.questions()
    assert len(qs) == count
    assert (qs[0].question_id, qs[-1].question_id) == (first_id, last_id)
    assert len({q.question_id for q in qs}) == count
    again = load_task(load_task_config(name, **overrides), str(shared_data)).questions()
    assert [q.question_id for q in again] == [q.question_id for q in qs]
    assert [q.text for q in again] == [q.text for q in qs]
    assert task.questions(limit=3) == qs[:3]
    json.dumps([q.reference for q in qs[:5]])  # JSON-serialisable


def test_humaneval_from_the_package_matches_local(shared_data):
    pkg = load_task(load_task_config("humaneval"), None).questions()
    local = load_task(load_task_config("humaneval"), str(shared_data)).questions()
    assert len(pkg) == 164 and [q.question_id for q in pkg] == [q.question_id for q in local]


def test_mbpp_plus_local_files(tmp_path, h):
    # hub rows (evalplus/mbppplus: a `test` program) and EvalPlus's release format
    hub = [{"task_id": 2, "prompt": "Write a function to double a number.", "code": "def dbl(x):\n    return 2 * x\n",
            "test_imports": [], "test_list": ["assert dbl(2) == 4"],
            "test": "inputs = [[1], [5]]\nresults = [2, 10]\nfor inp, exp in zip(inputs, results):\n    assert dbl(*inp) == exp\n"}]
    h.write_jsonl(tmp_path / "mbppplus.jsonl", hub)
    t = load_task(load_task_config("mbpp"), str(tmp_path))
    (q,) = t.questions()
    assert q.question_id == "mbppplus/2" and "assert dbl(2) == 4" in q.text
    assert t.grade(q, hub[0]["code"]).correct is True
    assert t.grade(q, "def dbl(x):\n    return x\n").correct is False

    # the prompt holds the first test (EvalPlus's release) or it is the first of `assertion`
    release = [{"task_id": "Mbpp/3", "prompt": '"""\nWrite a function to halve.\nassert half(4) == 2.0\n"""\n',
                "entry_point": "half", "canonical_solution": "def half(x):\n    return x / 2\n",
                "base_input": [[4], [3]], "plus_input": [[7.5]], "atol": 0, "contract": "", "assertion": ""}]
    with gzip.open(tmp_path / "MbppPlus.jsonl.gz", "wt") as fh:
        fh.write(json.dumps(release[0]) + "\n")
    (tmp_path / "mbppplus.jsonl").unlink()
    t = load_task(load_task_config("mbpp"), str(tmp_path))
    (q,) = t.questions()
    assert q.question_id == "mbppplus/3" and q.text == "Write a function to halve.\nassert half(4) == 2.0"
    assert t.grade(q, "```python\ndef half(x):\n    return x * 0.5\n```").correct is True
    assert t.grade(q, "def half(x):\n    return x // 2\n").correct is False

    release[0].update(prompt="'''\nWrite a function to halve.\n'''", assertion="\nassert half(4) == 2.0\nassert half(3) == 1.5\n")
    with gzip.open(tmp_path / "MbppPlus.jsonl.gz", "wt") as fh:
        fh.write(json.dumps(release[0]) + "\n")
    (q,) = load_task(load_task_config("mbpp"), str(tmp_path)).questions()
    assert q.text == "Write a function to halve.\nYour code should pass these tests:\n\nassert half(4) == 2.0"


@pytest.mark.parametrize("name", [n for n in TASK_NAMES if n != "arith"])
def test_missing_data_dir_is_one_clear_error(tmp_path, name):
    missing = tmp_path / "nowhere"
    with pytest.raises(DataUnavailable) as err:
        load_task(load_task_config(name), str(missing))
    msg = str(err.value)
    assert str(missing) in msg and "data_dir" in msg and name in msg
    assert "docs/data.md" in msg and "shared" not in msg
    assert "\n" not in msg
    assert err.value.__cause__ is None and (err.value.__context__ is None or err.value.__suppress_context__)
    assert isinstance(err.value, PackedSSError)
    # an existing directory without the file
    with pytest.raises(DataUnavailable, match="data_dir"):
        load_task(load_task_config(name), str(tmp_path))


def test_offline_hub_gives_the_clear_error(monkeypatch, hub_offline):
    monkeypatch.setenv("HF_DATASETS_CACHE", "/nonexistent-packedss-cache")
    try:
        task = load_task(load_task_config("gsm8k"), None)
    except DataUnavailable as exc:
        assert "openai/gsm8k" in str(exc) and "data_dir" in str(exc)
    else:  # a machine with a warm cache
        assert len(task.questions()) == 1319


def test_configs_mirror_the_dataclass():
    import dataclasses

    import yaml

    from packedss.tasks import CONF_DIR

    names = {f.name for f in dataclasses.fields(TaskConfig)}
    for name in TASK_NAMES:
        raw = yaml.safe_load((CONF_DIR / "task" / f"{name}.yaml").read_text())
        assert set(raw) == names, name
        cfg = load_task_config(name)
        assert cfg.name == name and cfg.max_new_tokens > 0 and "{question}" in cfg.prompt_plain
        assert "{question}" in cfg.prompt_chat
    with pytest.raises(PackedSSError, match="valid tasks"):
        load_task_config("nope")
    with pytest.raises(PackedSSError, match="unknown task config keys"):
        load_task_config("gsm8k", bogus=1)


def test_hydra_structured_config_accepts_the_yaml():
    from omegaconf import OmegaConf

    from packedss.tasks import CONF_DIR

    schema = OmegaConf.structured(TaskConfig)
    for name in TASK_NAMES:
        merged = OmegaConf.merge(schema, OmegaConf.load(CONF_DIR / "task" / f"{name}.yaml"))
        task_cfg = OmegaConf.to_object(merged)
        assert isinstance(task_cfg, TaskConfig)


def test_prompts(shared_data):
    gsm = load_task(load_task_config("gsm8k"), str(shared_data))
    q = gsm.questions(limit=1)[0]
    assert gsm.build_prompt(q) == f"Question: {q.text}\nAnswer:"
    assert gsm.stop == ["\nQuestion:"]

    class Tok:
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            (m,) = messages
            return f"<user>{m['content']}</user><assistant>"

    chat = gsm.build_prompt(q, tokenizer=Tok(), chat=True)
    assert chat.startswith("<user>" + q.text) and "####" in chat
    with pytest.raises(PackedSSError):
        gsm.build_prompt(q, chat=True)
    m5 = load_task(load_task_config("math500"), str(shared_data))
    assert "\\boxed{}" in m5.build_prompt(m5.questions(limit=1)[0], tokenizer=Tok(), chat=True)
    he = load_task(load_task_config("humaneval"), None)
    hq = he.questions(limit=1)[0]
    assert he.build_prompt(hq) == hq.text  # plain: the model continues the code
    assert he.stop_for(chat=True) == []


def test_writingbench_from_inspect_evals_when_installed():
    pytest.importorskip("inspect_evals", reason="inspect-evals (which bundles WritingBench) is not installed")
    qs = load_task(load_task_config("writingbench"), None).questions()
    assert len(qs) == 1000 and qs[0].question_id == "writingbench/1"
