"""What both tiny-model families share: the run settings, the optimizer loop and checkpointing.

Deterministic from the seed for a fixed number of steps (the wall-clock cap `max_minutes` only
stops a run early; the model card records the steps actually run). Checkpoints are written
every `save_every` steps, so a stopped run still leaves a usable model.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from packedss.training.corpus import Sampler

Losses = Callable[[], tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], int]]


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a run; scripts/train_tiny.py has one flag per field."""

    seed: int = 0
    data_dir: str | None = None  # holds gsm8k_train.jsonl (None: GSM8K left out)
    arith_n: int = 40000
    code_bytes: int = 1_500_000
    vocab: int = 1024
    max_len: int = 256  # longest question+answer in tokens (longer ones are dropped)
    hidden: int = 192
    intermediate: int = 512
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    steps: int = 3800
    batch: int = 16
    lr: float = 3e-3
    warmup: int = 60
    weight_decay: float = 0.05
    diff_weight: float = 1.0  # nemotron: weight of the draft loss next to the AR loss
    draft_ratio: float = 0.8  # nemotron: draft rows per answer token
    mask_blocks: float = 0.3  # nemotron: share of pure-mask (Quadratic-SS) blocks
    mix_arith: float = 0.9
    mix_gsm8k: float = 0.05
    mix_code: float = 0.05
    max_minutes: float = 43.0  # wall-clock cap for the whole run (0: none)
    save_every: int = 200
    log_every: int = 25
    smax: int = 16  # setdlm: the model's max block size (W <= smax)
    set_ltr: float = 0.6  # setdlm: share of left-to-right orders
    set_local: float = 0.2  # setdlm: share of block-local permutations
    stop_after: int = 0  # stop after this many steps of the `steps` schedule (0: run it all)
    set_eos_tail: int = 8  # setdlm: up to this many EOS after the answer
    sdar_ar: float = 0.4  # sdar: share of batches with block size 1 (the AR mode)
    sdar_block: int = 4  # sdar: the block size of the other batches (config.json block_size)
    lora_steps: int = 400
    lora_lr: float = 2e-3
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_ce: float = 0.5  # weight of the CE on the verifier's greedy token next to the KL
    lora_draft_ratio: float = 1.5  # draft rows per answer token
    lora_targets: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )

    @property
    def mix(self) -> dict[str, float]:
        return {"arith": self.mix_arith, "gsm8k": self.mix_gsm8k, "code": self.mix_code}


def backbone_config(config_class, config: TrainConfig, vocab: int, ids: dict[str, int], **architecture):
    """A transformers config of `config_class` with the tiny model's sizes and special ids (EOS
    doubles as BOS); `architecture`: the family's own fields (rotary parameters, norm epsilon)."""
    model_config = config_class(
        vocab_size=vocab,
        hidden_size=config.hidden,
        intermediate_size=config.intermediate,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads,
        head_dim=config.hidden // config.heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        pad_token_id=ids["pad"],
        bos_token_id=ids["eos"],
        eos_token_id=ids["eos"],
        initializer_range=0.02,
        **architecture,
    )
    model_config._attn_implementation = "sdpa"
    return model_config


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def make_sampler(examples, config: TrainConfig) -> Sampler:
    return Sampler(examples, config.mix, config.seed)


def record_training(directory: Path, extra: dict) -> None:
    """Add the training record to a written checkpoint's config.json (the loaders ignore it) and
    drop the release's `auto_map`: no custom code ships here, and without it AutoTokenizer loads
    the directory offline without asking whether to trust (nonexistent) remote code."""
    config_path = Path(directory) / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("auto_map", None)
    config.update(extra)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def save_checkpoint(out_dir: Path, backbone, head, tok, extra: dict, writer: Callable) -> None:
    """Write the checkpoint next to out_dir and swap it in (a crash never leaves half a model).
    `writer(tmp_dir, backbone, head, extra)` writes the weights and config; the tokenizer and the
    model card (README.md, kept from out_dir) go next to them."""
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    writer(tmp, backbone, head, extra)
    tok.save_pretrained(str(tmp))
    card = out_dir / "README.md"
    if card.exists():
        shutil.copy(card, tmp / "README.md")
    old = out_dir.with_name(out_dir.name + ".old")
    if out_dir.exists():
        if old.exists():
            shutil.rmtree(old)
        out_dir.rename(old)
    tmp.rename(out_dir)
    if old.exists():
        shutil.rmtree(old)


def train_steps(
    config: TrainConfig,
    started: float,
    backbone,
    head,
    losses: Losses,
    names: tuple[str, str],
    save: Callable[[], None],
    extra: dict,
) -> tuple[int, torch.Tensor | None]:
    """The training loop both families share: learning-rate schedule, AdamW (no decay on
    vectors), gradient clipping at 1.0, a moving average of two losses for the log, periodic
    checkpoints, and the wall-clock / stop_after caps. `losses()` builds one batch and
    returns (loss to minimize, (two losses to log), rows per sequence). Returns the number of
    steps run and the final moving averages."""
    params_list = list(backbone.parameters()) + list(head.parameters())
    decay = [p for p in params_list if p.dim() >= 2]
    no_decay = [p for p in params_list if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr, betas=(0.9, 0.98), eps=1e-8,
    )  # fmt: skip
    backbone.train()
    head.train()
    t0 = time.time()
    ema = None
    steps_run = 0
    for step in range(config.steps):
        if config.max_minutes and time.time() - started > config.max_minutes * 60:
            print(f"[train] wall-clock cap reached after {step} steps", flush=True)
            break
        if config.stop_after and step >= config.stop_after:
            print(f"[train] stop_after: stopping after {step} of {config.steps} steps", flush=True)
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, config.steps, config.lr, config.warmup)
        loss, logged, rows = losses()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params_list, 1.0)
        opt.step()
        steps_run = step + 1
        values = torch.stack([value.detach() for value in logged])
        ema = values if ema is None else 0.95 * ema + 0.05 * values
        if step % config.log_every == 0 or step == config.steps - 1:
            rate = (time.time() - t0) / (step + 1)
            print(
                f"[train] step {step} {names[0]} {ema[0]:.3f} {names[1]} {ema[1]:.3f} "
                f"lr {opt.param_groups[0]['lr']:.2e} rows {rows} {rate:.2f}s/step "
                f"elapsed {(time.time() - started) / 60:.1f}min",
                flush=True,
            )
        if config.save_every and (step + 1) % config.save_every == 0:
            extra["packedss_training"].update(steps_run=step + 1, train_minutes=round((time.time() - started) / 60, 1))
            save()
    return steps_run, ema


def train_and_save(config: TrainConfig, started: float, backbone, head, tok, losses: Losses, names: tuple[str, str],
                   extra: dict, parameters: int, out_dir: Path, writer: Callable) -> None:  # fmt: skip
    """train_steps with checkpoints to out_dir, then the training record's final fields (written
    into the checkpoint's config.json) and the final checkpoint."""

    def save():
        save_checkpoint(out_dir, backbone, head, tok, extra, writer)

    steps_run, ema = train_steps(config, started, backbone, head, losses, names, save, extra)
    extra["packedss_training"].update(
        steps_run=steps_run,
        train_minutes=round((time.time() - started) / 60, 1),
        **{f"final_{name}_loss": round(float(ema[k]), 4) if ema is not None else None for k, name in enumerate(names)},
        parameters=parameters,
    )
    save()
    print(f"[done] saved {out_dir} after {steps_run} steps in {(time.time() - started) / 60:.1f} min", flush=True)
