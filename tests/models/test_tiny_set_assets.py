"""The shipped any-order model `tiny-set` (SetDLM layout): offline loading, special tokens, size,
and lossless greedy order=ltr schedules on a few held-out arith prompts (W = 8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packedss.decoding.anyorder import AnyOrderSettings, decode_anyorder
from packedss.decoding.verify import Sampling
from packedss.models.setdlm import load_setdlm
from tests.anyorder_fixtures import plain_ar

TINY_SET = Path(__file__).resolve().parents[2] / "assets" / "models" / "tiny-set"
MAX_BYTES = 15 * 1024 * 1024
WIDTH = 8
MAX_NEW = 96


@pytest.fixture(scope="module")
def tokenizer():
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY_SET), local_files_only=True)


@pytest.fixture(scope="module")
def model():
    return load_setdlm(TINY_SET, dtype="float64")


@pytest.fixture(scope="module")
def prompts(tokenizer):
    from packedss.tasks import load_task, load_task_config

    task = load_task(load_task_config("arith", split="test", n=3, seed=0))
    return task, [tokenizer.encode(task.build_prompt(q), add_special_tokens=False) for q in task.questions()]


def test_files_and_size():
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"):
        assert (TINY_SET / name).is_file(), name
    size = sum(f.stat().st_size for f in TINY_SET.iterdir() if f.is_file())
    assert size <= MAX_BYTES, f"{TINY_SET} is {size} bytes"
    config = json.loads((TINY_SET / "config.json").read_text())
    assert config["architectures"] == ["SetDLM"]
    assert "auto_map" not in config  # no custom code: AutoTokenizer must not ask to trust any
    assert config["noise_config"]["max_block_size"] == 16


def test_special_tokens_match_config(tokenizer, model):
    config = json.loads((TINY_SET / "config.json").read_text())
    assert tokenizer.mask_token is not None and tokenizer.eos_token is not None and tokenizer.pad_token is not None
    assert tokenizer.mask_token_id == config["mask_token_id"] == model.mask_token_id
    assert model.eos_token_ids == (tokenizer.eos_token_id,) == (config["eos_token_id"],)
    assert len({tokenizer.mask_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}) == 3
    assert model.window == model.block_size == 16  # smax: W in {8, 16}
    assert tokenizer.encode("<|mask|>", add_special_tokens=False) == [tokenizer.mask_token_id]
    assert tokenizer.mask_token_id not in tokenizer.encode("Question: mask pad eos", add_special_tokens=False)


def test_same_tokenizer_as_tiny():
    tiny = TINY_SET.parent / "tiny" / "tokenizer.json"
    if not tiny.is_file():
        pytest.skip("assets/models/tiny is absent")
    assert json.loads((TINY_SET / "tokenizer.json").read_text())["model"] == json.loads(tiny.read_text())["model"]


def test_ltr_schedules_identical_and_model_is_trained(model, tokenizer, prompts):
    task, prompt_ids = prompts
    eos = model.eos_token_ids
    sampling = Sampling(0.0, "rejection", None)
    for q, ids in zip(task.questions(), prompt_ids):
        outputs = {
            schedule: decode_anyorder(model, ids, AnyOrderSettings(schedule, WIDTH, MAX_NEW, eos, sampling, order="ltr"))
            for schedule in ("ar", "linear", "packed", "quadratic")
        }
        reference = outputs["ar"]
        assert reference.finish_reason == "eos", tokenizer.decode(reference.tokens)
        for schedule, out in outputs.items():
            assert out.tokens == reference.tokens, schedule
        # the cached call protocol equals plain (dense, uncached) left-to-right set decoding
        assert plain_ar(model, ids, len(reference.tokens)) == reference.tokens
        # trained: the answer format of the arith task (a "#### <number>" line, then EOS)
        assert "####" in tokenizer.decode(reference.tokens, skip_special_tokens=True)
        assert outputs["packed"].nfe_total < reference.nfe_total


def test_training_rows_are_the_inference_rule(tmp_path):
    """packedss.training (scripts/train_tiny.py --family setdlm): every mask row of a training
    sequence (one forward pass, custom 4D mask) has the logits the loaded checkpoint gives a mask
    query that sees the same clean history (dense plain_predict, the reading of set_call's rule)."""
    import random

    import torch

    from packedss.training.layouts import collate, sample_set_rows, set_sequence
    from tests.anyorder_fixtures import SET_EOS, SET_MASK, plain_predict, write_random_setdlm

    model = load_setdlm(write_random_setdlm(tmp_path / "set"), dtype="float64")
    rng = random.Random(0)
    ids = [5, 6, 7, 8] + [rng.randrange(4, 24) for _ in range(10)] + [SET_EOS]
    for order in ("ltr", "local", "random"):
        rows = sample_set_rows(ids, 4, rng, SET_EOS, 2, ltr=float(order == "ltr"), local=float(order == "local"))
        sequence = set_sequence(rows, SET_MASK)
        call = sequence.call
        batch = collate([sequence], pad_id=0, dtype=torch.float64)
        with torch.no_grad():
            inputs = {"input_ids": batch.tokens, "position_ids": batch.positions, "attention_mask": batch.mask}
            logits = model.head(model.backbone(**inputs).last_hidden_state[0])
        toks, pos = call.tokens.tolist(), call.positions.tolist()
        clean = len(rows.prompt) + len(rows.sigma)
        assert all(t == SET_MASK for t in toks[clean:]) and all(t != SET_MASK for t in toks[:clean])
        assert sorted(pos[4:clean]) == list(range(4, clean))  # every answer position once, as a clean row
        targets = batch.draft_targets[0]
        for row in range(clean, len(toks)):
            sees = [k for k in range(clean) if call.attend[row, k]]
            assert sees == list(range(len(sees)))  # a prefix of the decoding order
            history = list(zip(pos[: len(sees)], toks[: len(sees)]))
            assert pos[row] not in [p for p, _ in history[4:]]  # a mask row never sees its own token
            expected = plain_predict(model, history, [pos[row]])[0]
            got = logits[row].clone()
            got[SET_MASK] = float("-inf")
            assert torch.allclose(got, expected, atol=1e-9), (order, row)
            assert targets[row] == ids[pos[row]] if pos[row] < len(ids) else targets[row] == SET_EOS
