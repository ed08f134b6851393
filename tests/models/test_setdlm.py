"""The SetDLM loader: the released directory layout, the set-causal call semantics of the
adapter (cache + calls == one dense forward), and one clear error per malformed directory."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from packedss.decoding.anyorder import set_call
from packedss.errors import PackedSSError
from packedss.models.setdlm import SetDLMAdapter, load_setdlm
from tests.anyorder_fixtures import SET_EOS, SET_MASK, SET_SMAX, SET_VOCAB, plain_predict, write_random_setdlm


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_setdlm(tmp_path_factory.mktemp("setdlm-ckpt"))


@pytest.fixture(scope="module")
def model(checkpoint):
    return load_setdlm(checkpoint, dtype="float64")


def copy_of(checkpoint, tmp_path):
    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint, target)
    return target


def test_the_written_checkpoint_has_the_released_layout(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"] == ["SetDLM"]
    assert config["backbone_config"]["pretrained_model_name_or_path"] == "Qwen/Qwen3-1.7B-Base"
    assert config["noise_config"]["max_block_size"] == SET_SMAX and config["mask_token_id"] == SET_MASK
    names = set(load_file(str(checkpoint / "model.safetensors")))
    assert "backbone.model.model.embed_tokens.weight" in names and "backbone.model.lm_head.weight" in names
    assert "backbone.model.model.layers.0.self_attn.q_norm.weight" in names


def test_loader_reads_family_ids_and_window(model):
    assert isinstance(model, SetDLMAdapter) and model.family == "setdlm"
    assert model.mask_token_id == SET_MASK and model.eos_token_ids == (SET_EOS,)
    assert model.window == SET_SMAX == model.block_size
    assert model.dtype == torch.float64
    assert model.backbone.config.vocab_size == SET_VOCAB and model.backbone.config.num_hidden_layers == 2


def test_calls_with_a_cache_equal_one_dense_forward(model):
    """Prompt + a correction + clean drafts in a non-positional order + mask queries, over two
    calls with a commit in between, give the logits of the plain set-causal forward."""
    model.reset()
    prompt = [(0, 5), (1, 9), (2, 11)]
    t = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
    b = lambda xs: torch.tensor(xs, dtype=torch.bool)  # noqa: E731
    first = set_call(t([5, 9, 11]), t([0, 1, 2]), t([]), t([]), b([]), t([3]), t([0]), b([True]), SET_MASK)
    logits = model.run(first)
    model.commit(3)
    torch.testing.assert_close(logits[-1], plain_predict(model, prompt, [3])[0])
    # p = token 7 at 3; drafts 13 at 5 then 8 at 4 (confidence order); queries for ranks 0, 1.
    second = set_call(t([7]), t([3]), t([13, 8]), t([5, 4]), b([True, True]), t([5, 4, 6]), t([0, 1, 2]), b([True] * 3), SET_MASK)
    logits = model.run(second)
    model.commit(3)
    history = prompt + [(3, 7)]
    torch.testing.assert_close(logits[3], plain_predict(model, history, [5])[0])
    torch.testing.assert_close(logits[4], plain_predict(model, history + [(5, 13)], [4])[0])
    torch.testing.assert_close(logits[5], plain_predict(model, history + [(5, 13), (4, 8)], [6])[0])
    assert torch.isneginf(logits[:, SET_MASK]).all()
    assert model.cached_rows == 6
    model.reset()


def test_pytorch_bin_and_tied_head_load(checkpoint, model, tmp_path):
    tensors = load_file(str(checkpoint / "model.safetensors"))
    binary = copy_of(checkpoint, tmp_path)
    (binary / "model.safetensors").unlink()
    torch.save(tensors, binary / "pytorch_model.bin")
    other = load_setdlm(binary, dtype="float64")
    assert torch.equal(other.head.weight, model.head.weight)
    tied = tmp_path / "tied"
    shutil.copytree(checkpoint, tied)
    config = json.loads((tied / "config.json").read_text())
    config["backbone_config"]["tie_word_embeddings"] = True
    (tied / "config.json").write_text(json.dumps(config))
    tensors.pop("backbone.model.lm_head.weight")
    save_file(tensors, str(tied / "model.safetensors"))
    assert torch.equal(load_setdlm(tied, dtype="float64").head.weight, model.backbone.embed_tokens.weight)


def test_missing_directory_names_the_override(tmp_path):
    with pytest.raises(PackedSSError, match="model.path="):
        load_setdlm(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "config.json").unlink(), "no config.json"),
        (lambda d: (d / "config.json").write_text("{"), "not valid JSON"),
        (lambda d: (d / "model.safetensors").unlink(), "no weights"),
        (lambda d: _edit(d, lambda c: c.pop("mask_token_id") and c.pop("tokenization_config")), "mask_token_id"),
        (lambda d: _edit(d, lambda c: c.pop("backbone_config")), "backbone_config"),
        (lambda d: _edit(d, lambda c: c["backbone_config"].update(pretrained_model_name_or_path="org/unknown") or [c["backbone_config"].pop(k) for k in ("hidden_size", "intermediate_size")]), "hidden_size, intermediate_size"),
        (lambda d: _drop(d, "backbone.model.model.layers.1.mlp.up_proj.weight"), "layers.1.mlp.up_proj.weight"),
        (lambda d: _drop(d, "backbone.model.lm_head.weight"), "LM head"),
        (lambda d: (d / "model.safetensors").write_bytes(b"not a safetensors file"), "cannot read"),
    ],
)
def test_malformed_directories_fail_with_one_clear_error(checkpoint, tmp_path, damage, message):
    directory = copy_of(checkpoint, tmp_path)
    damage(directory)
    with pytest.raises(PackedSSError, match=message):
        load_setdlm(directory, dtype="float64")


def _edit(directory, change):
    config = json.loads((directory / "config.json").read_text())
    change(config)
    (directory / "config.json").write_text(json.dumps(config))


def _drop(directory, name):
    tensors = load_file(str(directory / "model.safetensors"))
    tensors.pop(name)
    save_file(tensors, str(directory / "model.safetensors"))
