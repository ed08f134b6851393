"""The Nemotron-Labs-Diffusion layout: a transformers Ministral3Model backbone (`encoder.*` in
the checkpoint) plus a bias-free Linear `diffusion_head` used by both modes, and a
`mask_token_id` in config.json. The shipped tiny model uses the same format and loader."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from torch import nn
from transformers import Ministral3Config, Ministral3Model

from packedss.errors import PackedSSError
from packedss.models.adapter import BackboneAdapter
from packedss.models.attention import ATTENTION
from packedss.models.checkpoint import (
    default_dtype,
    load_module_state,
    load_tensors,
    quiet_transformers,
    read_config,
    require_keys,
    resolve_dtype,
    save_tensors,
    tensor_renamer,
)

FAMILY = "nemotron"
BACKBONE_PREFIXES = ("model.encoder.", "encoder.")
HEAD_NAMES = ("diffusion_head.weight", "model.diffusion_head.weight")
REQUIRED_KEYS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "mask_token_id"]
_CONFIG_FIELDS = set(inspect.signature(Ministral3Config.__init__).parameters) - {"self", "kwargs"}


def backbone_config(config: dict) -> Ministral3Config:
    """Ministral3Config from the checkpoint's config.json (a nested text_config is accepted)."""
    text = config.get("text_config", config)
    fields = {k: v for k, v in text.items() if k in _CONFIG_FIELDS}
    backbone = Ministral3Config(**fields)
    backbone._attn_implementation = ATTENTION
    return backbone


_rename = tensor_renamer(BACKBONE_PREFIXES, HEAD_NAMES)


class _Network(nn.Module):
    def __init__(self, config: Ministral3Config):
        super().__init__()
        self.backbone = Ministral3Model(config)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)


def load_nemotron(path: str | Path, device: str | torch.device = "cpu", dtype="float32") -> BackboneAdapter:
    what = f"Nemotron-format checkpoint {path}"
    config = read_config(path, what)
    text = config.get("text_config", config)
    require_keys({**text, **config}, REQUIRED_KEYS, f"{what}: config.json")
    torch_dtype = resolve_dtype(dtype)
    device = torch.device(device)
    with torch.device(device), default_dtype(torch_dtype), quiet_transformers():
        network = _Network(backbone_config(config))
    tensors = load_tensors(path, what, _rename, device, torch_dtype)
    if "head.weight" not in tensors and text.get("tie_word_embeddings"):
        tensors["head.weight"] = tensors.get("backbone.embed_tokens.weight")
    if "head.weight" not in tensors:
        raise PackedSSError(f"{what}: no diffusion head weight (expected one of {', '.join(HEAD_NAMES)})")
    load_module_state(network, tensors, what)
    eos = config.get("eos_token_id", text.get("eos_token_id"))
    return BackboneAdapter(
        network.backbone,
        network.head,
        mask_token_id=config["mask_token_id"] if "mask_token_id" in config else text["mask_token_id"],
        eos_token_ids=tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ()),
        block_size=config.get("block_size"),
        name=Path(path).name,
    )


def save_nemotron(path: str | Path, backbone: Ministral3Model, head: nn.Linear, extra_config: dict) -> None:
    """Write a checkpoint in the Nemotron-Labs-Diffusion format (used for the shipped tiny model
    and for the random checkpoints the tests write). `extra_config` must hold mask_token_id."""
    config = backbone.config.to_dict()
    for key in ("_attn_implementation_autoset", "torch_dtype", "dtype", "transformers_version"):
        config.pop(key, None)
    config.update(architectures=["NemotronLabsDiffusionModel"], model_type="nemotron_labs_diffusion")
    config.update(extra_config)
    tensors = {f"encoder.{k}": v for k, v in backbone.state_dict().items()}
    tensors["diffusion_head.weight"] = head.weight
    save_tensors(path, tensors, config)
