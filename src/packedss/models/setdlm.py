"""The SetDLM layout (kuleshov-group/setdlm-gsm8k-smax8 / -smax16; code: github
kuleshov-group/setdlms, class SetDLM(BD3LM)), loaded without trust_remote_code.

How the released directory is laid out (read from the setdlms code; see docs/models.md §5):
- config.json is the denoiser config (`architectures: ["SetDLM"]`), NOT a Qwen3 config. It holds
  `mask_token_id`, `eos_token_id`, `pad_token_id`, `vocab_size` (also inside
  `tokenization_config`), `length`, `block_size`, a `noise_config` whose `max_block_size` is the
  "smax" of the model name, and a `backbone_config` naming the base model
  (`pretrained_model_name_or_path`, e.g. Qwen/Qwen3-1.7B-Base), `num_layers` (-1 = all) and
  keyword overrides for the base model's config.
- the weights are the denoiser's state dict: the Qwen3 backbone under `backbone.model.model.*`
  and the LM head under `backbone.model.lm_head.weight` (absent when tied to the embeddings), in
  safetensors shards or `pytorch_model.bin` (the release code saves with safe_serialization=False).
- predictions come from mask rows only; the mask token's own logit is set to -inf (SetDLM._forward).

The Qwen3 architecture comes from, in order: a built-in copy of the base model's public config
(Qwen/Qwen3-1.7B-Base), or `<base>/config.json` when the base is a local directory; then the
Qwen3 fields given in `backbone_config`; then `num_layers`; `vocab_size` is read off the
embedding tensor.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
from torch import nn
from transformers import Qwen3Config, Qwen3Model

from packedss.decoding.calls import Call
from packedss.errors import PackedSSError
from packedss.models.adapter import BackboneAdapter
from packedss.models.attention import ATTENTION
from packedss.models.checkpoint import (
    default_dtype,
    load_module_state,
    load_tensors,
    read_config,
    resolve_dtype,
    save_tensors,
    tensor_renamer,
)

FAMILY = "setdlm"
BACKBONE_PREFIXES = ("backbone.model.model.", "model.backbone.model.model.")
HEAD_NAMES = ("backbone.model.lm_head.weight", "model.backbone.model.lm_head.weight")
EMBED = "backbone.embed_tokens.weight"

# The public config.json of the base model the released SetDLMs were fine-tuned from.
KNOWN_BASES = {
    "Qwen/Qwen3-1.7B-Base": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 6144,
        "max_position_embeddings": 32768,
        "max_window_layers": 28,
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }
}
ARCHITECTURE_KEYS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"]
_CONFIG_FIELDS = set(inspect.signature(Qwen3Config.__init__).parameters) - {"self", "kwargs"}
_EXTRA_FIELDS = {"rope_theta", "rope_scaling", "head_dim", "vocab_size"}


class SetDLMAdapter(BackboneAdapter):
    """A set model seen through calls. Every row's logits come back; the mask token can never be
    predicted (its logit is -inf), as in SetDLM. `window` is the model's smax (None: unknown).

    `context` is the trained sequence length (config.json `length`). As the released decoder
    does, once the cache plus a call would exceed it, the oldest cache entries are dropped from
    the left (their keys keep the positions they were computed at); each call reports how many
    rows it dropped (`cache_rows_dropped`)."""

    family = FAMILY

    def __init__(self, *args, window: int | None = None, context: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.window = window
        self.context = context
        self._dropped = 0  # cache rows the current call dropped

    def prompt_budget(self, max_new_tokens: int, call_rows: int) -> int | None:
        """The model drops its oldest cache rows itself, so only the prefill call (the prompt and
        at most `call_rows`) must fit the context (the base rule when the checkpoint states none)."""
        if self.context is None:
            return super().prompt_budget(max_new_tokens, call_rows)
        return self.context - call_rows

    def before_call(self, call: Call) -> None:
        super().before_call(call)
        self._dropped = 0
        if self.context is not None:
            self._dropped = max(0, self.cached_rows + call.rows - self.context)
            if self._dropped:
                self._drop_oldest(self._dropped, call.rows)

    def after_call(self, call: Call, logits: torch.Tensor) -> torch.Tensor:
        logits = super().after_call(call, logits)
        logits[:, self.mask_token_id] = float("-inf")
        if self.context is not None:
            self.call_stats = {**self.call_stats, "cache_rows_dropped": self._dropped}
        return logits

    def _drop_oldest(self, rows: int, call_rows: int) -> None:
        if call_rows > self.context:
            raise PackedSSError(
                f"model {self.name}: a call of {call_rows} rows does not fit its context length {self.context}; "
                "use a smaller width"
            )
        drop = getattr(self.static, "drop_oldest", None)  # a batch slot's cache drops its own rows
        if drop is not None:
            drop(rows)
            return
        if self.static is not None:
            raise PackedSSError(
                f"model {self.name}: this response outgrows the context length {self.context}, and the compiled "
                "static path cannot drop the oldest cache entries; run it with model.compile=none"
            )
        for layer in self.cache.layers:
            layer.keys = layer.keys[:, :, rows:]
            layer.values = layer.values[:, :, rows:]


def _base_fields(backbone: dict, directory: Path, what: str) -> dict:
    base = backbone.get("pretrained_model_name_or_path")
    if base in KNOWN_BASES:
        return dict(KNOWN_BASES[base])
    if isinstance(base, str):
        for candidate in (Path(base), directory / base):
            if (candidate / "config.json").is_file():
                try:
                    return json.loads((candidate / "config.json").read_text())
                except json.JSONDecodeError as err:
                    raise PackedSSError(f"{what}: {candidate / 'config.json'} is not valid JSON ({err})") from None
    return {}


def qwen3_config(config: dict, directory: Path, what: str, vocab_size: int | None) -> Qwen3Config:
    """The Qwen3Config of the backbone (see the module docstring for where each field comes from)."""
    backbone = config.get("backbone_config")
    if not isinstance(backbone, dict):
        raise PackedSSError(f"{what}: config.json has no backbone_config object (is this a SetDLM checkpoint?)")
    fields = _base_fields(backbone, directory, what)
    fields.update({k: v for k, v in backbone.items() if k in _CONFIG_FIELDS | _EXTRA_FIELDS})
    missing = [k for k in ARCHITECTURE_KEYS if k not in fields]
    if missing:
        base = backbone.get("pretrained_model_name_or_path")
        raise PackedSSError(
            f"{what}: cannot build the Qwen3 backbone: {', '.join(missing)} unknown. The base model "
            f"{base!r} is neither one of {', '.join(KNOWN_BASES)} nor a local directory with a config.json, "
            "and backbone_config does not give these fields"
        )
    layers = backbone.get("num_layers", -1)
    if isinstance(layers, int) and layers > 0:
        fields["num_hidden_layers"] = layers
    if vocab_size is not None:
        fields["vocab_size"] = vocab_size
    rope_theta = fields.pop("rope_theta", None)
    # Special token ids live in the denoiser config; the backbone does not need them.
    skip = {"bos_token_id", "eos_token_id", "pad_token_id"}
    kwargs = {k: v for k, v in fields.items() if (k in _CONFIG_FIELDS or k in ("head_dim", "vocab_size")) and k not in skip}
    if rope_theta is not None and "rope_parameters" not in kwargs:
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": float(rope_theta)}
    qwen = Qwen3Config(**kwargs)
    qwen._attn_implementation = ATTENTION
    return qwen


_rename = tensor_renamer(BACKBONE_PREFIXES, HEAD_NAMES)


def _load_bin(directory: Path, what: str, device: torch.device, dtype: torch.dtype) -> dict:
    """Tensors of pytorch_model.bin shards (loaded with weights_only: no code runs)."""
    index = directory / "pytorch_model.bin.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as err:
            raise PackedSSError(f"{what}: {index} is malformed ({err!r})") from None
        files = [directory / n for n in names]
    else:
        files = [directory / "pytorch_model.bin"]
    absent = [f.name for f in files if not f.is_file()]
    if absent:
        raise PackedSSError(f"{what}: weight files missing: {', '.join(absent)}")
    tensors = {}
    for file in files:
        try:
            state = torch.load(str(file), map_location="cpu", weights_only=True)
        except Exception as err:  # pickle errors on truncated or foreign files
            raise PackedSSError(f"{what}: cannot read {file} ({err})") from None
        for name, tensor in state.items():
            target = _rename(name)
            if target is not None and isinstance(tensor, torch.Tensor):
                tensors[target] = tensor.to(device=device, dtype=dtype)
    return tensors


class _Network(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.backbone = Qwen3Model(config)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)


def _token_ids(config: dict, key: str) -> tuple[int, ...]:
    value = config.get(key, (config.get("tokenization_config") or {}).get(key))
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, list) else (int(value),)


def load_setdlm(path: str | Path, device: str | torch.device = "cpu", dtype="float32") -> SetDLMAdapter:
    """A SetDLM checkpoint directory as a call adapter (family "setdlm")."""
    directory = Path(path)
    what = f"SetDLM checkpoint {path}"
    config = read_config(directory, what)
    mask = _token_ids(config, "mask_token_id")
    if not mask:
        raise PackedSSError(f"{what}: config.json is missing mask_token_id (top level or in tokenization_config)")
    torch_dtype = resolve_dtype(dtype)
    device = torch.device(device)
    has_safetensors = (directory / "model.safetensors.index.json").is_file() or any(directory.glob("*.safetensors"))
    has_bin = (directory / "pytorch_model.bin").is_file() or (directory / "pytorch_model.bin.index.json").is_file()
    if has_safetensors:
        tensors = load_tensors(directory, what, _rename, device, torch_dtype)
    elif has_bin:
        tensors = _load_bin(directory, what, device, torch_dtype)
    else:
        raise PackedSSError(f"{what}: {directory} has no weights (*.safetensors or pytorch_model.bin)")
    if EMBED not in tensors:
        raise PackedSSError(
            f"{what}: no backbone tensors found (expected names starting with {BACKBONE_PREFIXES[0]}, "
            f"e.g. {BACKBONE_PREFIXES[0]}embed_tokens.weight)"
        )
    qwen = qwen3_config(config, directory, what, vocab_size=int(tensors[EMBED].shape[0]))
    if "head.weight" not in tensors:
        if not qwen.tie_word_embeddings:
            raise PackedSSError(f"{what}: no LM head weight (expected {HEAD_NAMES[0]}) and the embeddings are not tied")
        tensors["head.weight"] = tensors[EMBED]
    with torch.device(device), default_dtype(torch_dtype):
        network = _Network(qwen)
    load_module_state(network, tensors, what)
    smax = (config.get("noise_config") or {}).get("max_block_size")
    return SetDLMAdapter(
        network.backbone,
        network.head,
        mask_token_id=mask[0],
        eos_token_ids=_token_ids(config, "eos_token_id"),
        block_size=int(smax) if smax is not None else None,
        name=directory.name,
        window=int(smax) if smax is not None else None,
        context=int(config["length"]) if config.get("length") is not None else None,
    )


def save_setdlm(
    path: str | Path,
    backbone: Qwen3Model,
    head: nn.Linear,
    mask_token_id: int,
    eos_token_id: int,
    smax: int,
    base: str = "Qwen/Qwen3-1.7B-Base",
) -> None:
    """Write a checkpoint in the released SetDLM layout (used by the tests for tiny random
    models). The Qwen3 fields of `backbone.config` go into backbone_config as overrides of the
    base model's config, as the release's AutoModelFromPreTrained keyword arguments would."""
    qwen = backbone.config.to_dict()
    overrides = {k: qwen[k] for k in ARCHITECTURE_KEYS + ["num_key_value_heads", "head_dim", "rms_norm_eps",
                                                         "max_position_embeddings", "tie_word_embeddings"]}
    rope = qwen.get("rope_parameters") or {}
    if "rope_theta" in rope:
        overrides["rope_theta"] = rope["rope_theta"]
    vocab = int(backbone.config.vocab_size)
    config = {
        "architectures": ["SetDLM"],
        "model_type": "bd3lm",
        "auto_map": {"AutoConfig": "diffusion.BD3LMConfig", "AutoModelForMaskedLM": "diffusion.SetDLM"},
        "backbone_config": {
            "_target_": "backbone_automodel.AutoModelFromPreTrained",
            "automodel_cls": "AutoModelForCausalLM",
            "pretrained_model_name_or_path": base,
            "num_layers": int(qwen["num_hidden_layers"]),
            "keep_top_layers": False,
            "reinit_model": False,
            **overrides,
        },
        "noise_config": {
            "_target_": "noise_schedule_noise_schedules.StaggeredNoise",
            "block_size": 1024,
            "desired_block_size": smax // 2,
            "max_block_size": smax,
            "length": 1024,
        },
        "length": 1024,
        "block_size": 1024,
        "eval_block_size": 1024,
        "attn_backend": "sdpa",
        "vocab_size": vocab,
        "mask_token_id": mask_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": mask_token_id,
        "tokenization_config": {"vocab_size": vocab, "mask_token_id": mask_token_id, "eos_token_id": eos_token_id},
    }
    tensors = {f"backbone.model.model.{k}": v for k, v in backbone.state_dict().items()}
    tensors["backbone.model.lm_head.weight"] = head.weight
    save_tensors(path, tensors, config)
