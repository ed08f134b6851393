"""Spec-Bench (docs/data.md): its 480 questions, the per-category selection, second turns whose
prompt holds the model's own first answer, and the runner's turn passes (resume, C > 1)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer

from packedss.config import register_configs
from packedss.errors import PackedSSError
from packedss.paths import CONF_DIR, PROJECT_ROOT
from packedss.records import read_records
from packedss.runner import run_job
from packedss.tasks import DataUnavailable, load_task, load_task_config
from packedss.tasks.prompts import encode_prompt
from packedss.tasks.specbench import CATEGORIES, SHARED_DATA
from packedss.tasks.turns import ready_turns

pytestmark = pytest.mark.skipif(not (SHARED_DATA / "spec_bench_question.jsonl").is_file(),
                                reason=f"Spec-Bench's file is not in {SHARED_DATA}")  # fmt: skip
TINY = PROJECT_ROOT / "assets" / "models" / "tiny"


def _questions(**overrides):
    return load_task(load_task_config("specbench", **overrides)).questions(None)


def test_the_480_questions_and_their_turns():
    questions = _questions()
    assert len(questions) == 560  # 80 two-turn MT-bench questions and 400 of one turn
    counts = Counter((q.metadata["category"], q.metadata["turn"]) for q in questions)
    assert all(counts[(c, 1)] == counts[(c, 2)] == 10 for c in CATEGORIES[:8])
    assert all(counts[(c, 1)] == 80 and counts[(c, 2)] == 0 for c in CATEGORIES[8:])
    second = next(q for q in questions if q.question_id == "specbench/81/2")
    assert second.metadata["earlier_ids"] == ["specbench/81/1"]
    assert second.metadata["earlier_texts"][0].startswith("Compose an engaging travel blog post about a recent trip to Hawaii")


def test_per_category_selects_that_many_questions_of_each_category():
    questions = _questions(per_category=2)
    assert len(questions) == 8 * 2 * 2 + 5 * 2
    assert Counter(q.metadata["category"] for q in questions if q.metadata["turn"] == 1) == dict.fromkeys(CATEGORIES, 2)
    assert [q.question_id for q in questions[:5]] == ["specbench/81/1", "specbench/81/2", "specbench/82/1",
                                                     "specbench/82/2", "specbench/91/1"]  # fmt: skip


class ChatTemplate:
    """A tokenizer stand-in whose chat template shows the messages it got."""

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return json.dumps(messages) + ("<assistant>" if add_generation_prompt else "")


def test_a_second_turn_waits_for_the_first_and_then_holds_its_answer():
    task = load_task(load_task_config("specbench", per_category=1))
    first, second = task.questions(2)
    ready, waiting = ready_turns([first, second], lambda: {}, samples=1)
    assert ready == [first] and waiting == [second]
    (_, second), _ = ready_turns([first, second], lambda: {first.question_id: " MY ANSWER"}, samples=1)
    plain = task.build_prompt(second)
    assert plain == f"Instruction: {first.text}\nResponse: MY ANSWER\nInstruction: {second.text}\nResponse:"
    chat = json.loads(task.build_prompt(second, ChatTemplate(), chat=True).removesuffix("<assistant>"))
    assert chat == [{"role": "user", "content": first.text}, {"role": "assistant", "content": " MY ANSWER"},
                    {"role": "user", "content": second.text}]  # fmt: skip
    with pytest.raises(PackedSSError, match="samples=1"):
        ready_turns([first, second], lambda: {}, samples=2)


def test_a_data_dir_file_in_another_format_is_one_clear_error(tmp_path):
    (tmp_path / "spec_bench_question.jsonl").write_text('{"question_id": 1, "category": "poetry", "turns": ["x"]}\n')
    with pytest.raises(DataUnavailable, match="category 'poetry'"):
        load_task(load_task_config("specbench"), data_dir=str(tmp_path))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    register_configs()

    def go(out_dir: Path, *overrides: str) -> list[dict]:
        args = ["model=tiny", "task=specbench", "task.per_category=1", "schedule=pld", "max_new_tokens=12", "progress=false",
                f"out_dir={out_dir}", *overrides]  # fmt: skip
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            run_job(compose(config_name="config", overrides=args))
        (path,) = (out_dir / "tiny" / "specbench").glob("*.jsonl")
        records, bad = read_records(path)
        assert bad == []
        return records

    return go


def _decoded(records):
    return {r["question_id"]: (r["output_ids"], r["prompt_tokens"]) for r in records}


def test_runs_record_the_second_turn_with_the_first_answer_however_they_are_resumed_or_batched(run, tmp_path):
    whole = run(tmp_path / "whole", "limit=4")  # 81/1, 81/2, 91/1, 91/2
    assert [(r["question_id"], r["category"], r["turn"]) for r in whole] == [
        ("specbench/81/1", "writing", 1), ("specbench/91/1", "roleplay", 1),
        ("specbench/81/2", "writing", 2), ("specbench/91/2", "roleplay", 2)]  # fmt: skip
    # The second turn's prompt is the first turn's prompt, the recorded answer and the second message.
    task, tokenizer = load_task(load_task_config("specbench", per_category=1)), AutoTokenizer.from_pretrained(str(TINY))
    first, second = task.questions(2)
    answer = next(r["output_text"] for r in whole if r["question_id"] == first.question_id)
    conversation = f"Instruction: {first.text}\nResponse:{answer}\nInstruction: {second.text}\nResponse:"
    expected = encode_prompt(tokenizer, conversation, chat=False)
    recorded = next(r for r in whole if r["question_id"] == second.question_id)
    assert answer.strip() and recorded["prompt_tokens"] + recorded["prompt_truncated_tokens"] == len(expected)
    # Resumed after the first turn of 91 (its second turn then follows the recorded first answer),
    # and at C = 3, where a second turn never starts before its first is recorded.
    run(tmp_path / "resumed", "limit=3")
    assert _decoded(run(tmp_path / "resumed", "limit=4")) == _decoded(whole)
    assert _decoded(run(tmp_path / "batched", "limit=4", "concurrency=3")) == _decoded(whole)


def test_several_samples_of_a_multi_turn_task_fail_before_any_record(run, tmp_path):
    with pytest.raises(PackedSSError, match="samples=1"):
        run(tmp_path / "sampled", "limit=2", "samples=2", "temperature=1")
    assert not list((tmp_path / "sampled").rglob("*.jsonl"))
