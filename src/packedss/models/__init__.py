"""Model adapters: execute calls on transformers backbones. `resolve_path` finds a model config's
local checkpoint directory (never downloading unless asked); `load_model` loads the adapter of
the model's family (from the family table) and the tokenizer."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from packedss.errors import PackedSSError
from packedss.paths import PROJECT_ROOT


@dataclass(frozen=True)
class Checkpoint:
    """The weights one job runs on: a hub id, a local directory, or both."""

    hub_id: str | None
    path: str | None

    def label(self) -> str:
        return self.path or self.hub_id or "?"


def select_checkpoint(model_cfg, checkpoint_dirs=None) -> Checkpoint:
    """The checkpoint a job runs on (reads no file): model.path when set, else model.hub_id with
    its local directory from `checkpoint_dirs` (hub id -> directory, a paths file) when listed."""
    hub_id, path = model_cfg.hub_id, model_cfg.path
    if not path and hub_id and checkpoint_dirs and hub_id in checkpoint_dirs:
        path = checkpoint_dirs[hub_id]
    return Checkpoint(hub_id=hub_id, path=path)


def resolve_path(model_cfg, checkpoint: Checkpoint) -> Path:
    """The local directory of a checkpoint: its path, else the local hub cache of its hub id, else
    a download when model.download=true. Otherwise one clear error naming the id and the fix."""
    if checkpoint.path:
        path = Path(os.path.expanduser(checkpoint.path))
        if not path.is_absolute() and not path.exists():
            path = PROJECT_ROOT / path
        if not path.is_dir():
            raise PackedSSError(f"model {model_cfg.name}: directory {path} does not exist; set model.path=/local/dir to a checkpoint directory")
        return path
    hub_id = checkpoint.hub_id
    if not hub_id:
        raise PackedSSError(f"model {model_cfg.name}: no model.path and no hub id; set model.path=/local/dir")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(hub_id, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass
    if not model_cfg.download:
        raise PackedSSError(
            f"model {model_cfg.name}: weights {hub_id} are not available locally; download them "
            f"(huggingface-cli download {hub_id}) and pass model.path=/local/dir, list the directory in a "
            f"paths file (conf/paths/, e.g. +paths=local), or set model.download=true"
        )
    try:
        return Path(snapshot_download(hub_id))
    except Exception as err:  # network and hub errors come in many types
        raise PackedSSError(
            f"model {model_cfg.name}: could not download {hub_id} ({type(err).__name__}); "
            f"download it elsewhere and pass model.path=/local/dir"
        ) from None


def load_model(model_cfg, family, path: Path, device, dtype):
    """The adapter of the model's family, plus its tokenizer (loaded offline from the same directory)."""
    return load_adapter(model_cfg, family, path, device, dtype), load_tokenizer(model_cfg, path)


def load_adapter(model_cfg, family, path: Path, device, dtype):
    """The adapter of the model's family on `device` in `dtype`, with its proposal LoRA when configured."""
    adapter = family.load_adapter(path, device, dtype)
    if model_cfg.lora:
        from packedss.models.lora import attach_proposal_lora

        lora_path = Path(model_cfg.lora_path or "linear_spec_lora")
        if not lora_path.is_absolute():
            lora_path = path / lora_path if (path / lora_path).exists() else PROJECT_ROOT / lora_path
        attach_proposal_lora(adapter, lora_path)
    return adapter


def load_tokenizer(model_cfg, path: Path):
    """The checkpoint's tokenizer, loaded offline from its directory, never with the checkpoint's
    own code: a directory whose config.json or tokenizer_config.json has an `auto_map` (the SDAR
    releases: a custom config class, a copied Qwen2Tokenizer module) gets the tokenizer class its
    `tokenizer_class` names from transformers, instead of transformers asking on the terminal
    whether to run that code (docs/models.md §11)."""
    from transformers import AutoTokenizer

    from packedss.models.checkpoint import quiet_transformers

    try:
        with quiet_transformers(), warnings.catch_warnings():
            # A config.json with `rope_scaling: null` (the SDAR releases') read as a plain config.
            warnings.filterwarnings("ignore", message="`rope_scaling` is deprecated", category=FutureWarning)
            return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as err:
        raise PackedSSError(f"model {model_cfg.name}: cannot load the tokenizer from {path} ({err}); the checkpoint directory needs its tokenizer files (tokenizer.json, tokenizer_config.json): download it again") from None
