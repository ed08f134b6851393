"""The shipped tiny model and its proposal LoRA: offline loading, special tokens, size, and
lossless greedy schedules on a few held-out arith prompts (W = 8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling, decode_ltr
from packedss.decoding.calls import Role, causal_segment, pack
from packedss.decoding.schedules import packed_call
from packedss.models.lora import attach_proposal_lora, detach_proposal_lora
from packedss.models.nemotron import load_nemotron

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "models"
TINY = ASSETS / "tiny"
TINY_LORA = ASSETS / "tiny-lora"
MAX_BYTES = 15 * 1024 * 1024


@pytest.fixture(scope="module")
def tokenizer():
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY))


@pytest.fixture(scope="module")
def model():
    return load_nemotron(TINY, dtype="float64")


@pytest.fixture(scope="module")
def prompts(tokenizer):
    from packedss.tasks import load_task, load_task_config

    task = load_task(load_task_config("arith", split="test", n=3, seed=0))
    return task, [tokenizer.encode(task.build_prompt(q), add_special_tokens=False) for q in task.questions()]


def test_files_and_sizes():
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"):
        assert (TINY / name).is_file(), name
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (TINY_LORA / name).is_file(), name
    for directory in (TINY, TINY_LORA):
        size = sum(f.stat().st_size for f in directory.iterdir() if f.is_file())
        assert size <= MAX_BYTES, f"{directory} is {size} bytes"


def test_special_tokens_match_config(tokenizer, model):
    config = json.loads((TINY / "config.json").read_text())
    assert tokenizer.mask_token is not None and tokenizer.eos_token is not None and tokenizer.pad_token is not None
    assert tokenizer.mask_token_id == config["mask_token_id"] == model.mask_token_id
    assert tokenizer.eos_token_id == config["eos_token_id"]
    assert model.eos_token_ids == (tokenizer.eos_token_id,)
    assert tokenizer.pad_token_id == config["pad_token_id"]
    assert len({tokenizer.mask_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}) == 3
    assert config["block_size"] >= 17 and model.block_size == config["block_size"]
    # special tokens are atomic and never produced from plain text
    assert tokenizer.encode("<|mask|>", add_special_tokens=False) == [tokenizer.mask_token_id]
    assert tokenizer.mask_token_id not in tokenizer.encode("Question: mask pad eos", add_special_tokens=False)



def test_lossless_schedules_identical_and_model_is_trained(model, tokenizer, prompts):
    task, prompt_ids = prompts
    eos = model.eos_token_ids
    speculative_tokens = speculative_nfe = 0
    for q, ids in zip(task.questions(), prompt_ids):
        settings = {s: LTRSettings(s, 8, 128, eos, Sampling(0.0, "rejection", None)) for s in ("ar", "linear", "quadratic", "packed")}
        reference = decode_ltr(model, ids, settings["ar"])
        assert reference.finish_reason == "eos"
        text = tokenizer.decode(reference.tokens, skip_special_tokens=True)
        # a trained model answers in the task's worked-solution format and stops with EOS
        assert text.startswith(" ") and "<<" in text and "####" in text, text
        assert task.grade(q, text).extracted_answer is not None
        for schedule in ("linear", "quadratic", "packed"):
            out = decode_ltr(model, ids, settings[schedule])
            assert out.tokens == reference.tokens, schedule
            if schedule == "linear":
                speculative_tokens += len(out.tokens)
                speculative_nfe += out.nfe_total
    # a drafter that agrees with the verifier: Linear-SS (2 NFE per iteration) beats 1 token/NFE
    assert speculative_tokens / speculative_nfe > 1.0


def test_proposal_lora_touches_draft_rows_only(model, prompts):
    _, prompt_ids = prompts
    ids = torch.tensor(prompt_ids[0])
    prefix, last = ids[:-4], ids[-4]
    drafts = ids[-3:]
    call = packed_call(last, drafts, prefix.shape[0], 8, model.mask_token_id, pad_verify=True)

    def run(call):
        model.reset()
        model.run(pack([causal_segment(prefix, 0)]))
        model.commit(prefix.shape[0])
        out = model.run(call)
        model.commit(0)
        return out

    ar_call = pack([causal_segment(ids, 0)])
    model.reset()
    ar_plain = model.run(ar_call)
    model.commit(0)
    plain = run(call)
    attach_proposal_lora(model, TINY_LORA)
    try:
        model.reset()
        ar_adapted = model.run(ar_call)
        model.commit(0)
        adapted = run(call)
        # packed at W = 8: B draft rows of 2B
        assert model.call_stats == {"lora_rows_selected": 9, "lora_rows_evaluated": 18, "attention": "sdpa-mask"}
    finally:
        detach_proposal_lora(model)
    assert torch.equal(ar_plain, ar_adapted)
    verify = call.roles != int(Role.DRAFT)
    assert torch.equal(plain[verify], adapted[verify])
    assert not torch.allclose(plain[~verify], adapted[~verify])
