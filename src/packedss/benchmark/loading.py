"""The model and task a benchmark of the schedules runs: the run config `python run.py` would
compose for them, and the model it loads (or random weights of a shape with its tokenizer)."""

from __future__ import annotations

from pathlib import Path

import torch

from packedss.benchmark.settings import BenchSettings
from packedss.families import family_named


def compose_run_config(overrides: list[str]):
    """The run config that `python run.py OVERRIDES` would run (Hydra's compose API over conf/)."""
    from hydra import compose, initialize_config_dir

    from packedss.config import register_configs
    from packedss.paths import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="bench"):
        return compose(config_name="config", overrides=overrides)


def model_overrides(s: BenchSettings) -> list[str]:
    if Path(s.model).is_dir():  # a checkpoint directory: read as the tiny model's format and tokenizer
        directory = Path(s.model).resolve()
        return ["model=tiny", f"model.path='{directory}'", f"model.name='{directory.name}'", "model.lora=false"]
    return [f"model={s.model}"] + ([f"model.path='{s.model_path}'"] if s.model_path else [])


def load(s: BenchSettings, device: torch.device, dtype: str):
    """(run config, adapter, tokenizer, label) of the settings' model and task."""
    from packedss.models import load_model, resolve_path, select_checkpoint
    from packedss.models.checkpoint import read_config, resolve_dtype

    cfg = compose_run_config(model_overrides(s) + [f"task={s.task}"])
    family = family_named(cfg.model.family)
    path = resolve_path(cfg.model, select_checkpoint(cfg.model, cfg.checkpoint_dirs))
    if not (s.shape or s.config):
        adapter, tokenizer = load_model(cfg.model, family, path, device, dtype)
        return cfg, adapter, tokenizer, cfg.model.name
    from transformers import AutoTokenizer

    from packedss.benchmark.calls import random_adapter, shape_config

    if family.name != "nemotron":
        raise SystemExit(f"--shape/--config build random Nemotron-layout weights; {s.model} is a {family.name} model")
    checkpoint = read_config(path, f"model {cfg.model.name}")
    eos = checkpoint.get("eos_token_id")
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    what = s.shape or Path(s.config).name
    adapter = random_adapter(
        shape_config(s.shape, s.config), device, resolve_dtype(dtype), vocab_at_least=len(tokenizer),
        mask_token_id=int(checkpoint["mask_token_id"]),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ()), name=f"random-{what}",
    )  # fmt: skip
    return cfg, adapter, tokenizer, f"{cfg.model.name} tokenizer + random {what} weights"
