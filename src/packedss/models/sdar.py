"""The SDAR layout (JetLM/SDAR-{1.7B,4B,8B,30B-A3B}-Chat; code: github JetAstra/SDAR,
training/model/SDAR-*-Chat/modeling_sdar.py, a Qwen3 modification), loaded on transformers' own
Qwen3Model without trust_remote_code (the release imports flash-attn and pins transformers 4.52.4).

How the released directory is laid out (docs/models.md §11):
- config.json is a Qwen3 config with `model_type: "sdar"`, `architectures: ["SDARForCausalLM"]`,
  `block_size` (the training block, 4 for the Chat models), `mask_token_id` (151669) and one
  `eos_token_id` (151643); generation_config.json lists the EOS ids the release stops on
  ([151645, 151643]: <|im_end|> and <|endoftext|>).
- the weights are Qwen3ForCausalLM's: the backbone under `model.*` (per-head `q_norm`/`k_norm`
  included) and the head under `lm_head.weight` (tied to the embeddings when
  `tie_word_embeddings` says so).
- the tokenizer names the mask token `<|MASK|>` in tokenizer_config.json and `<MASK>` in
  added_tokens.json and special_tokens_map.json; the id is config.json's `mask_token_id` in both,
  so the id is read from the config and the name is never looked up.
- a mask row at position i predicts the token at i (no next-token shift); the mask token's own
  logit is left as the network gives it (the release's decoders do not remove it).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
from torch import nn
from transformers import Qwen3Config, Qwen3Model

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

FAMILY = "sdar"
BACKBONE_PREFIXES = ("model.",)
HEAD_NAMES = ("lm_head.weight",)
EMBED = "backbone.embed_tokens.weight"
REQUIRED_KEYS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "mask_token_id"]
_CONFIG_FIELDS = set(inspect.signature(Qwen3Config.__init__).parameters) - {"self", "kwargs"}
# Token ids and the release's own keys stay out of the backbone config.
_SKIP = {"bos_token_id", "eos_token_id", "pad_token_id", "rope_scaling", "rope_theta"}


def qwen3_config(config: dict) -> Qwen3Config:
    """The Qwen3Config of an SDAR config.json (its Qwen3 fields; rope_theta as default RoPE)."""
    fields = {k: v for k, v in config.items() if (k in _CONFIG_FIELDS or k == "head_dim") and k not in _SKIP}
    if "rope_parameters" not in fields:  # the release's rope_theta and rope_scaling (null), as rope_parameters
        rope = {"rope_type": "default", "rope_theta": float(config.get("rope_theta", 10000.0))}
        scaling = config.get("rope_scaling")
        if isinstance(scaling, dict):
            rope.update(scaling, rope_type=scaling.get("rope_type", scaling.get("type", "default")))
            rope.pop("type", None)
        fields["rope_parameters"] = rope
    with quiet_transformers():
        qwen = Qwen3Config(**fields)
    qwen._attn_implementation = ATTENTION
    return qwen


def eos_token_ids(directory: Path, config: dict) -> tuple[int, ...]:
    """The EOS ids the release stops on: generation_config.json's list, then config.json's id."""
    ids: list[int] = []
    generation = directory / "generation_config.json"
    if generation.is_file():
        try:
            value = json.loads(generation.read_text()).get("eos_token_id")
        except json.JSONDecodeError as err:
            raise PackedSSError(f"SDAR checkpoint {directory}: {generation} is not valid JSON ({err}); fix it or download the checkpoint again") from None
        ids += value if isinstance(value, list) else [value] if value is not None else []
    value = config.get("eos_token_id")
    ids += value if isinstance(value, list) else [value] if value is not None else []
    return tuple(dict.fromkeys(int(i) for i in ids))


_rename = tensor_renamer(BACKBONE_PREFIXES, HEAD_NAMES)


class _Network(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.backbone = Qwen3Model(config)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)


def load_sdar(path: str | Path, device: str | torch.device = "cpu", dtype="float32") -> BackboneAdapter:
    """An SDAR checkpoint directory as a call adapter (family "sdar")."""
    directory = Path(path)
    what = f"SDAR checkpoint {path}"
    config = read_config(directory, what)
    require_keys(config, REQUIRED_KEYS, f"{what}: config.json")
    torch_dtype = resolve_dtype(dtype)
    device = torch.device(device)
    qwen = qwen3_config(config)
    tensors = load_tensors(directory, what, _rename, device, torch_dtype)
    if EMBED not in tensors:
        raise PackedSSError(f"{what}: no backbone tensors found (expected names starting with model., e.g. model.embed_tokens.weight)")
    if "head.weight" not in tensors:
        if not qwen.tie_word_embeddings:
            raise PackedSSError(f"{what}: no LM head weight (expected lm_head.weight) and the embeddings are not tied")
        tensors["head.weight"] = tensors[EMBED]
    with torch.device(device), default_dtype(torch_dtype), quiet_transformers():
        network = _Network(qwen)
    load_module_state(network, tensors, what)
    block = config.get("block_size")
    return BackboneAdapter(
        network.backbone,
        network.head,
        mask_token_id=int(config["mask_token_id"]),
        eos_token_ids=eos_token_ids(directory, config),
        block_size=int(block) if block is not None else None,
        name=directory.name,
    )


def save_sdar(path: str | Path, backbone: Qwen3Model, head: nn.Linear, mask_token_id: int,
              eos_token_ids: tuple[int, ...], block_size: int) -> None:  # fmt: skip
    """Write a checkpoint in the released SDAR layout (the shipped tiny-sdar and the tests' random
    checkpoints): config.json as the release writes it, generation_config.json with the EOS list,
    weights under `model.*` and `lm_head.weight`."""
    qwen = backbone.config.to_dict()
    config = {k: qwen[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                   "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
                                   "max_position_embeddings", "vocab_size", "attention_bias", "attention_dropout",
                                   "tie_word_embeddings", "initializer_range")}  # fmt: skip
    rope = qwen.get("rope_parameters") or {}
    config.update(
        architectures=["SDARForCausalLM"],
        model_type="sdar",
        auto_map={"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                  "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},  # fmt: skip
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        rope_scaling=None,
        block_size=int(block_size),
        mask_token_id=int(mask_token_id),
        bos_token_id=int(eos_token_ids[-1]),
        eos_token_id=int(eos_token_ids[-1]),
        use_cache=False,
        torch_dtype="float32",
    )
    tensors = {f"model.{k}": v for k, v in backbone.state_dict().items()}
    tensors["lm_head.weight"] = head.weight
    save_tensors(path, tensors, config)
    generation = {"bos_token_id": int(eos_token_ids[-1]), "eos_token_id": [int(i) for i in eos_token_ids],
                  "pad_token_id": int(eos_token_ids[-1]), "do_sample": True}  # fmt: skip
    (Path(path) / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
