"""Runs set up the way the released code runs each model: the chat prompt of each model family
(exact prompt ids for a fixed question), one BOS, end-of-turn stops, the checkpoint per width."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer

from packedss.config import register_configs
from packedss.errors import PackedSSError
from packedss.models import select_checkpoint
from packedss.paths import CONF_DIR
from packedss.runner import end_of_turn_ids, question_prompt_ids, task_config_for
from packedss.tasks import Question
from packedss.tasks.core import Task
from tests.conftest import write_test_tokenizer

QUESTION = Question("gsm8k/0", "Tom has 3 apples and buys 4 more. How many apples does he have?", "7")
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MISTRAL_TEMPLATE = "{{ bos_token }}{% for m in messages %}[INST]{{ m['content'] }}[/INST]{% endfor %}"


def _compose(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _tokenizer(path: Path, template: str, adds_bos: bool):
    write_test_tokenizer(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "[INST]", "[/INST]"]})
    tokenizer.chat_template = template
    if adds_bos:  # a post-processor that puts BOS in front, as Llama-style tokenizers do
        from tokenizers import processors

        tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="<bos> $A", special_tokens=[("<bos>", tokenizer.bos_token_id)]
        )
    return tokenizer


def _prompt_ids(overrides: list[str], tokenizer) -> list[int]:
    cfg = _compose(["task=gsm8k", *overrides])
    task = Task(task_config_for(cfg), [QUESTION], lambda *_: None)  # the prompt needs no data set
    return question_prompt_ids(task, tokenizer, QUESTION, chat=cfg.model.chat)


def test_setdlm_gsm8k_prompt_is_the_released_chat_prompt(tmp_path):
    tokenizer = _tokenizer(tmp_path / "qwen", QWEN_TEMPLATE, adds_bos=False)
    tokenizer.bos_token = None  # Qwen3 has no BOS
    ids = _prompt_ids(["model=setdlm1.7b"], tokenizer)
    expected_text = (
        "<|im_start|>user\nPlease reason step by step, and put your final answer within $\\boxed{}$. "
        f"{QUESTION.text}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ids == tokenizer(expected_text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("model", ["nemotron3b", "nemotron8b"])
@pytest.mark.parametrize("template_bos,tokenizer_bos", [(True, True), (True, False), (False, True)])
def test_nemotron_math_prompt_has_exactly_one_bos(tmp_path, model, template_bos, tokenizer_bos):
    template = MISTRAL_TEMPLATE if template_bos else MISTRAL_TEMPLATE.replace("{{ bos_token }}", "")
    tokenizer = _tokenizer(tmp_path / "mistral", template, adds_bos=tokenizer_bos)
    ids = _prompt_ids([f"model={model}"], tokenizer)
    user = (
        "Solve the following math problem. Put the final numerical answer inside \\boxed{} at the very end.\n\n"
        + QUESTION.text
    )
    body = tokenizer(f"[INST]{user}[/INST]", add_special_tokens=False)["input_ids"]
    assert ids == [tokenizer.bos_token_id, *body]


def test_math500_uses_the_same_release_prompt_and_other_tasks_keep_theirs():
    cfg = _compose(["model=nemotron8b", "task=math500"])
    assert task_config_for(cfg).prompt_chat.startswith("Solve the following math problem.")
    cfg = _compose(["model=nemotron8b", "task=humaneval"])
    assert task_config_for(cfg).prompt_chat == cfg.task.prompt_chat


def test_end_of_turn_tokens_stop_like_eos(tmp_path):
    tokenizer = _tokenizer(tmp_path / "qwen", QWEN_TEMPLATE, adds_bos=False)
    cfg = _compose(["model=setdlm1.7b"])
    assert end_of_turn_ids(cfg.model, tokenizer) == (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    with pytest.raises(PackedSSError, match="end-of-turn token '<\\|im_end\\|>' is not in the tokenizer"):
        end_of_turn_ids(cfg.model, AutoTokenizer.from_pretrained(str(tmp_path / "qwen")))


@pytest.mark.parametrize("width,smax", [(4, 8), (8, 8), (9, 16), (16, 16)])
def test_setdlm_checkpoint_follows_the_width(width, smax):
    cfg = _compose(["model=setdlm1.7b", f"width={width}", "+paths=local"])
    checkpoint = select_checkpoint(cfg.model, cfg.checkpoint_dirs)
    assert checkpoint.hub_id == f"kuleshov-group/setdlm-gsm8k-smax{smax}"
    assert checkpoint.path == cfg.checkpoint_dirs[checkpoint.hub_id]
    assert checkpoint.path.endswith(f"smax{smax}")


@pytest.mark.parametrize(
    "ids,budget,expected",
    [
        ([1, 5, 6, 7, 8], None, [1, 5, 6, 7, 8]),
        ([1, 5, 6, 7, 8], 5, [1, 5, 6, 7, 8]),
        ([1, 5, 6, 7, 8], 3, [1, 7, 8]),  # the BOS stays, the oldest text goes
        ([5, 6, 7, 8], 2, [7, 8]),
    ],
)
def test_prompts_longer_than_the_context_are_cut_from_the_left(ids, budget, expected):
    from packedss.runner import fit_prompt

    assert fit_prompt(ids, budget, bos_token_id=1) == expected


def test_prompt_budget_follows_the_model_context(tiny_model):
    positions = tiny_model.backbone.config.max_position_embeddings
    assert tiny_model.prompt_budget(100, 18) == positions - 100  # a call's rows past the cap are never emitted
