"""Model adapters: execute calls on transformers backbones. `load_model` resolves a model config
to a local checkpoint directory (never downloading unless asked) and loads adapter + tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

from packedss.errors import PackedSSError

PROJECT_ROOT = Path(__file__).resolve().parents[3]


def resolve_path(model_cfg) -> Path:
    """The local directory of a model: model.path, else the local hub cache of model.hub_id, else
    a download when model.download=true. Otherwise one clear error naming the id and the override."""
    if model_cfg.path:
        path = Path(os.path.expanduser(model_cfg.path))
        if not path.is_absolute() and not path.exists():
            path = PROJECT_ROOT / path
        if not path.is_dir():
            raise PackedSSError(f"model {model_cfg.name}: directory {path} does not exist (set model.path=/local/dir)")
        return path
    if not model_cfg.hub_id:
        raise PackedSSError(f"model {model_cfg.name}: no model.path and no hub id; set model.path=/local/dir")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(model_cfg.hub_id, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass
    if not model_cfg.download:
        raise PackedSSError(
            f"model {model_cfg.name}: weights {model_cfg.hub_id} are not available locally; download them "
            f"(huggingface-cli download {model_cfg.hub_id}) and pass model.path=/local/dir, or set model.download=true"
        )
    try:
        return Path(snapshot_download(model_cfg.hub_id))
    except Exception as err:  # network and hub errors come in many types
        raise PackedSSError(
            f"model {model_cfg.name}: could not download {model_cfg.hub_id} ({type(err).__name__}); "
            f"download it elsewhere and pass model.path=/local/dir"
        ) from None


def read_block_size(path: Path, family: str) -> int | None:
    """The largest block the drafter holds, read from config.json without loading weights."""
    from packedss.models.checkpoint import read_config

    config = read_config(path, f"model {path.name}")
    if family == "setdlm":  # the released config keeps smax (= the window W) in noise_config
        value = (config.get("noise_config") or {}).get("max_block_size")
    else:
        value = config.get("block_size")
    return int(value) if value is not None else None


def load_model(model_cfg, path: Path, device, dtype):
    """The adapter for the model's family, plus its tokenizer (loaded offline from the same directory)."""
    from transformers import AutoTokenizer

    if model_cfg.family == "nemotron":
        from packedss.models.nemotron import load_nemotron

        adapter = load_nemotron(path, device=device, dtype=dtype)
    elif model_cfg.family == "setdlm":
        from packedss.models.setdlm import load_setdlm

        adapter = load_setdlm(path, device=device, dtype=dtype)
    else:
        raise PackedSSError(f"unknown model family {model_cfg.family!r}; valid: nemotron, setdlm")
    if model_cfg.lora:
        from packedss.models.lora import attach_proposal_lora

        lora_path = Path(model_cfg.lora_path or "linear_spec_lora")
        if not lora_path.is_absolute():
            lora_path = path / lora_path if (path / lora_path).exists() else PROJECT_ROOT / lora_path
        attach_proposal_lora(adapter, lora_path)
    from packedss.models.checkpoint import quiet_transformers

    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as err:
        raise PackedSSError(f"model {model_cfg.name}: cannot load the tokenizer from {path} ({err})") from None
    return adapter, tokenizer
