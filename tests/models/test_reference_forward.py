"""The loaded adapters compute exactly the released network: logits of a causal call equal a
plain reference forward (the transformers backbone with its final norm, then the head) built
here from the checkpoint's own files, independently of the project's loaders. A lost final
norm, a wrong head, or a shifted row fails."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file
from transformers import Ministral3Config, Ministral3Model, Qwen3Config, Qwen3Model

from packedss.decoding.calls import causal_segment, pack
from packedss.models.nemotron import load_nemotron
from packedss.models.setdlm import load_setdlm
from tests.anyorder_fixtures import SET_MASK, write_random_setdlm
from tests.conftest import write_random_nemotron

TOKENS = torch.tensor([4, 9, 13, 22, 5, 6, 17, 7])  # inside both test vocabularies (24, 40)


def _adapter_logits(model) -> torch.Tensor:
    model.reset()
    logits = model.run(pack([causal_segment(TOKENS, 0)]))
    model.commit(0)
    return logits


def _strip(tensors: dict, prefix: str) -> dict:
    return {key[len(prefix) :]: value for key, value in tensors.items() if key.startswith(prefix)}


def test_nemotron_logits_equal_backbone_norm_and_head(tmp_path):
    path = write_random_nemotron(tmp_path / "ckpt", seed=3)
    config = json.loads((path / "config.json").read_text())
    tensors = {k: v.double() for k, v in load_file(str(path / "model.safetensors")).items()}
    fields = {k: v for k, v in config.items() if k in Ministral3Config().to_dict()}
    backbone = Ministral3Model(Ministral3Config(**fields)).double().eval()
    backbone.load_state_dict(_strip(tensors, "encoder."), strict=True)
    with torch.no_grad():
        hidden = backbone(input_ids=TOKENS[None]).last_hidden_state[0]  # causal, positions 0..L-1, final norm
        reference = hidden @ tensors["diffusion_head.weight"].T
    logits = _adapter_logits(load_nemotron(path, dtype="float64"))
    assert (logits - reference).abs().max().item() < 1e-9


def test_setdlm_logits_equal_backbone_norm_and_head(tmp_path):
    path = write_random_setdlm(tmp_path / "ckpt", seed=3)
    config = json.loads((path / "config.json").read_text())
    tensors = {k: v.double() for k, v in load_file(str(path / "model.safetensors")).items()}
    backbone_fields = {k: v for k, v in config["backbone_config"].items() if k in Qwen3Config().to_dict()}
    qwen = Qwen3Config(**backbone_fields, vocab_size=tensors["backbone.model.lm_head.weight"].shape[0])
    backbone = Qwen3Model(qwen).double().eval()
    backbone.load_state_dict(_strip(tensors, "backbone.model.model."), strict=True)
    with torch.no_grad():
        hidden = backbone(input_ids=TOKENS[None]).last_hidden_state[0]
        reference = hidden @ tensors["backbone.model.lm_head.weight"].T
    reference[:, SET_MASK] = float("-inf")  # SetDLM never predicts its mask token
    logits = _adapter_logits(load_setdlm(path, dtype="float64"))
    finite = torch.isfinite(reference)
    assert torch.equal(finite, torch.isfinite(logits))
    assert (logits[finite] - reference[finite]).abs().max().item() < 1e-9
