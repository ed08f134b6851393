"""The Nemotron-format loader: round trip, shards, and one clear error per malformed directory."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Ministral3Model

from packedss.decoding.calls import causal_segment, pack
from packedss.errors import PackedSSError
from packedss.models import nemotron
from packedss.models.adapter import CACHE_KEYWORD, SUPPORTED_TRANSFORMERS, check_backbone
from packedss.models.nemotron import load_nemotron
from tests.conftest import MASK_ID, write_random_nemotron


@pytest.fixture()
def checkpoint(tmp_path):
    return write_random_nemotron(tmp_path / "ckpt", seed=3)


def _logits(model):
    model.reset()
    out = model.run(pack([causal_segment(torch.tensor([5, 6, 7]), 0)]))
    model.commit(0)
    return out


def test_round_trip_metadata_and_dtype(checkpoint):
    model = load_nemotron(checkpoint, dtype="float64")
    assert model.mask_token_id == MASK_ID
    assert model.eos_token_ids == (2,)
    assert model.block_size == 32
    assert model.dtype == torch.float64
    assert next(model.head.parameters()).dtype == torch.float64


def test_sharded_checkpoint_loads_identically(checkpoint, tmp_path):
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(checkpoint / "config.json", sharded / "config.json")
    tensors = load_file(str(checkpoint / "model.safetensors"))
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, part in halves.items():
        save_file({k: tensors[k] for k in part}, str(sharded / file))
        weight_map.update({k: file for k in part})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert torch.equal(_logits(load_nemotron(checkpoint, dtype="float64")), _logits(load_nemotron(sharded, dtype="float64")))


def test_missing_directory(tmp_path):
    with pytest.raises(PackedSSError, match="does not exist.*model.path"):
        load_nemotron(tmp_path / "nowhere")


def test_missing_config(checkpoint):
    (checkpoint / "config.json").unlink()
    with pytest.raises(PackedSSError, match="no config.json"):
        load_nemotron(checkpoint)


def test_malformed_config(checkpoint):
    (checkpoint / "config.json").write_text("{not json")
    with pytest.raises(PackedSSError, match="not valid JSON"):
        load_nemotron(checkpoint)


def test_config_without_mask_token(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    del config["mask_token_id"]
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(PackedSSError, match="missing mask_token_id"):
        load_nemotron(checkpoint)


def test_no_weights(checkpoint):
    (checkpoint / "model.safetensors").unlink()
    with pytest.raises(PackedSSError, match="no \\*.safetensors"):
        load_nemotron(checkpoint)


def test_missing_tensor_is_named(checkpoint):
    tensors = load_file(str(checkpoint / "model.safetensors"))
    del tensors["encoder.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(checkpoint / "model.safetensors"))
    with pytest.raises(PackedSSError, match="missing tensors: backbone.layers.1.mlp.up_proj.weight"):
        load_nemotron(checkpoint)


def test_missing_head_is_named(checkpoint):
    tensors = load_file(str(checkpoint / "model.safetensors"))
    del tensors["diffusion_head.weight"]
    save_file(tensors, str(checkpoint / "model.safetensors"))
    with pytest.raises(PackedSSError, match="diffusion_head.weight"):
        load_nemotron(checkpoint)


def test_shape_mismatch(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["intermediate_size"] = 48
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(PackedSSError, match="shape mismatch"):
        load_nemotron(checkpoint)


def test_truncated_weights(checkpoint):
    data = (checkpoint / "model.safetensors").read_bytes()
    (checkpoint / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(PackedSSError, match="cannot read"):
        load_nemotron(checkpoint)


def test_missing_shard_listed_in_index(checkpoint):
    (checkpoint / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"encoder.norm.weight": "model-00002-of-00002.safetensors"}})
    )
    with pytest.raises(PackedSSError, match="model-00002-of-00002.safetensors"):
        load_nemotron(checkpoint)


class _OlderMinistral3Model(Ministral3Model):
    """A backbone as transformers before 5.24 defines it: the cache keyword is `past_key_values`,
    and `**kwargs` would swallow the `cache` the adapters pass."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=None, **kwargs):  # fmt: skip
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               cache=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache)  # fmt: skip


def test_a_backbone_without_the_cache_keyword_is_refused_not_ignored(checkpoint, monkeypatch):
    monkeypatch.setattr(nemotron, "Ministral3Model", _OlderMinistral3Model)
    with pytest.raises(PackedSSError) as raised:
        load_nemotron(checkpoint)
    message = str(raised.value)
    assert "\n" not in message and "past_key_values" in message and CACHE_KEYWORD in message
    assert f"transformers~={SUPPORTED_TRANSFORMERS}.0" in message
    check_backbone(Ministral3Model)  # today's backbone names the keyword the adapters pass
