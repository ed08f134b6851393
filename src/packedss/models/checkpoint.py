"""Read and write local checkpoint directories (config.json + safetensors shards) without
trust_remote_code: the backbone class comes from transformers, the tensor names are mapped here."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from packedss.errors import PackedSSError

# model.compile: "none" runs the eager path; the others are torch.compile modes of the static path.
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise PackedSSError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}")
    return DTYPES[name]


def read_config(path: str | Path, what: str) -> dict:
    """The checkpoint's config.json (`path` a checkpoint directory, or a config file itself); one
    clear error when the directory or file is missing or malformed."""
    directory = Path(path)
    if directory.is_file():
        directory, config_file = directory.parent, directory
    elif not directory.is_dir():
        raise PackedSSError(f"{what}: model directory {directory} does not exist; set model.path=/local/dir to a checkpoint directory")
    else:
        config_file = directory / "config.json"
    if not config_file.is_file():
        raise PackedSSError(f"{what}: {directory} has no config.json; point model.path at a checkpoint directory (config.json and *.safetensors)")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise PackedSSError(f"{what}: {config_file} is not valid JSON ({err}); fix it or download the checkpoint again") from None
    if not isinstance(config, dict):
        raise PackedSSError(f"{what}: {config_file} must hold a JSON object; fix it or download the checkpoint again")
    return config


def require_keys(config: dict, keys: list[str], where: str) -> None:
    missing = [k for k in keys if k not in config]
    if missing:
        raise PackedSSError(f"{where} is missing {', '.join(missing)}")


def weight_files(path: str | Path, what: str) -> list[Path]:
    """The safetensors shards of a checkpoint (from the index when there is one)."""
    directory = Path(path)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise PackedSSError(f"{what}: {index} is malformed ({err!r}); download the checkpoint again") from None
        files = [directory / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise PackedSSError(f"{what}: shards listed in {index.name} are missing: {', '.join(absent)}; download the checkpoint again")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise PackedSSError(f"{what}: {directory} has no *.safetensors weights; download the checkpoint again or fix model.path")
    return files


def tensor_renamer(backbone_prefixes: tuple[str, ...], head_names: tuple[str, ...]):
    """Map checkpoint tensor names to `backbone.<name>` and `head.weight`; other tensors (adapter
    weights shipped beside the model, buffers) map to None and are skipped."""

    def rename(name: str) -> str | None:
        if name in head_names:
            return "head.weight"
        for prefix in backbone_prefixes:
            if name.startswith(prefix):
                return "backbone." + name[len(prefix) :]
        return None

    return rename


def load_tensors(path: str | Path, what: str, rename, device: torch.device, dtype: torch.dtype) -> dict:
    """All tensors of the checkpoint whose name `rename` maps to a module name (None = skip)."""
    tensors = {}
    for file in weight_files(path, what):
        try:
            with safe_open(str(file), framework="pt", device="cpu") as shard:
                for name in shard.keys():
                    target = rename(name)
                    if target is not None:
                        tensors[target] = shard.get_tensor(name).to(device=device, dtype=dtype)
        except Exception as err:  # safetensors raises plain exceptions on truncated or foreign files
            raise PackedSSError(f"{what}: cannot read {file} ({err}); download the checkpoint again") from None
    return tensors


def load_module_state(module: torch.nn.Module, tensors: dict, what: str) -> None:
    """Load a state dict strictly, reporting missing/unexpected/mis-shaped tensors by name."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = sorted(k for k in set(expected) & set(tensors) if expected[k].shape != tensors[k].shape)
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
    if unexpected:
        problems.append(f"unexpected tensors: {', '.join(unexpected[:6])}{' ...' if len(unexpected) > 6 else ''}")
    if wrong:
        k = wrong[0]
        problems.append(f"shape mismatch for {k}: checkpoint {tuple(tensors[k].shape)} vs model {tuple(expected[k].shape)}")
    if problems:
        raise PackedSSError(f"{what}: the weights do not fit the config ({'; '.join(problems)})")
    module.load_state_dict(tensors, strict=True)


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' load-time warnings that do not apply here: the checkpoints' own
    model_type is not a transformers class, and Ministral3's attention scaling needs rope keys
    that the default RoPE type does not list."""
    from transformers.utils import logging

    previous = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(previous)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def save_tensors(path: str | Path, tensors: dict, config: dict) -> None:
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(directory / "model.safetensors"))
