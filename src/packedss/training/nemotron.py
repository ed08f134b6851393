"""`tiny`: the dual-mode model in the Nemotron-Labs-Diffusion layout, and its proposal LoRA.

The model is a transformers Ministral3Model backbone plus a bias-free `diffusion_head`, saved
with `packedss.models.nemotron.save_nemotron` and loaded by the same adapter as the real 3B/8B
checkpoints. One forward pass per training sequence (packedss.training.layouts, Nemotron
layout) trains the AR rows and the draft rows through the same head.

The proposal LoRA (attention and MLP projections of every layer) is trained on top of the
frozen base: it is applied to the draft rows only (packedss.models.lora, the same row-selective
code as inference), and the drafter is distilled towards the verifier's own next-token
distribution (AR rows of the same forward pass, unadapted): KL to its distribution plus
cross-entropy on its greedy token, i.e. the token a greedy verification accepts.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from packedss.training.corpus import Sampler, build_corpus, describe_examples, encode_examples, special_ids, train_tokenizer
from packedss.training.layouts import IGNORE, collate, nemotron_layout
from packedss.training.loop import TrainConfig, backbone_config, lr_at, make_sampler, seed_all, train_and_save

BLOCK_SIZE = 32  # config.json block_size of the saved model
TRAINED_BLOCK_MAX = 17  # the largest block the layout trains on (W <= 16, B = W + 1)


def ministral_config(config: TrainConfig, vocab: int, ids: dict[str, int]):
    from transformers import Ministral3Config

    rope = {"rope_type": "default", "rope_theta": 10000.0, "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 4096}  # fmt: skip
    return backbone_config(Ministral3Config, config, vocab, ids, rope_parameters=rope)


def train_nemotron(config: TrainConfig, out_dir: Path, init_from: str | None = None) -> None:
    """Train `tiny` into out_dir: a fresh model with a fresh tokenizer, or continue the
    checkpoint `init_from` (its tokenizer, weights and config)."""
    from transformers import AutoTokenizer, Ministral3Model

    from packedss.models.nemotron import load_nemotron, save_nemotron

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    corpus = build_corpus(config.arith_n, config.seed, config.data_dir, config.code_bytes)
    tok_dir = out_dir.with_name(out_dir.name + ".tok")
    tok = AutoTokenizer.from_pretrained(init_from) if init_from else train_tokenizer(corpus, config.vocab, tok_dir)
    ids = special_ids(tok)
    examples = encode_examples(tok, corpus, config.max_len)
    print(describe_examples(tok, ids, examples), flush=True)
    seed_all(config.seed)
    previous = {}
    if init_from:
        init = load_nemotron(init_from)
        backbone, head = init.backbone, init.head
        for p in list(backbone.parameters()) + list(head.parameters()):
            p.requires_grad_(True)
        previous = json.loads((Path(init_from) / "config.json").read_text()).get("packedss_training", {})
    else:
        backbone = Ministral3Model(ministral_config(config, len(tok), ids))
        head = torch.nn.Linear(config.hidden, len(tok), bias=False)
        torch.nn.init.normal_(head.weight, std=0.02)
    params = sum(p.numel() for p in backbone.parameters()) + head.weight.numel()
    print(f"[model] Ministral3 backbone + head: {params / 1e6:.2f}M parameters", flush=True)
    extra = {
        "mask_token_id": ids["mask"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
        "block_size": BLOCK_SIZE,
        "trained_block_max": TRAINED_BLOCK_MAX,
        "packedss_training": {
            "script": "scripts/train_tiny.py",
            "seed": config.seed,
            "steps_planned": config.steps,
            "batch": config.batch,
            "lr": config.lr,
            "mix": config.mix,
            "arith_template": corpus.template,
        },
    }
    if previous:
        extra["packedss_training"]["continued_from"] = previous
    sampler = make_sampler(examples, config)
    layout_rng = random.Random(config.seed + 1)

    def losses():
        batch = collate(
            [
                nemotron_layout(ids_, start, layout_rng, ids["mask"], config.draft_ratio, config.mask_blocks)
                for ids_, start in sampler.draw(config.batch)
            ],
            ids["pad"],
        )
        hidden = backbone(
            input_ids=batch.tokens, position_ids=batch.positions, attention_mask=batch.mask, use_cache=False
        ).last_hidden_state
        is_ar = batch.ar_targets != IGNORE
        read = is_ar | (batch.draft_targets != IGNORE)  # the head runs on rows with a target only
        logits = head(hidden[read])
        target = torch.where(is_ar, batch.ar_targets, batch.draft_targets)[read]
        per_row = F.cross_entropy(logits, target, reduction="none")
        ar_rows = is_ar[read]
        ar_loss = per_row[ar_rows].mean()
        df_loss = per_row[~ar_rows].mean()
        return ar_loss + config.diff_weight * df_loss, (ar_loss, df_loss), batch.tokens.shape[1]

    train_and_save(config, started, backbone, head, tok, losses, ("ar", "diff"), extra, params, out_dir, save_nemotron)
    shutil.rmtree(tok_dir, ignore_errors=True)


def train_proposal_lora(config: TrainConfig, base_dir: Path, out_dir: Path, base_label: str,
                        clock: Callable[[], float] = time.time) -> None:  # fmt: skip
    """Train the proposal LoRA of the `tiny` checkpoint base_dir into out_dir (PEFT layout);
    `base_label` names the base in the training record; `clock` (seconds) is what the wall-clock
    cap and the record's minutes read."""
    from packedss.models.lora import ProposalLoRA, save_peft_adapter

    started = clock()
    seed_all(config.seed)
    adapter, tok = frozen_base(base_dir)
    examples = lora_examples(config, base_dir, tok)
    ids = {"eos": adapter.eos_token_ids[0], "mask": adapter.mask_token_id, "pad": tok.pad_token_id}
    lora = ProposalLoRA.create(
        adapter.backbone, rank=config.lora_rank, alpha=config.lora_alpha, targets=config.lora_targets, seed=config.seed
    )
    sampler = Sampler(examples, config.mix, config.seed + 7)
    layout_rng = random.Random(config.seed + 8)

    def draft_batch():
        return collate(
            [
                nemotron_layout(ids_, start, layout_rng, ids["mask"], config.lora_draft_ratio, config.mask_blocks)
                for ids_, start in sampler.draw(config.batch)
            ],
            ids["pad"],
        )

    steps_run = train_lora_steps(config, started, adapter, lora, draft_batch, clock)
    minutes = (clock() - started) / 60
    save_peft_adapter(lora, out_dir, extra={"packedss_training": lora_record(config, base_label, steps_run, minutes)})
    print(f"[done] saved {out_dir} after {steps_run} steps in {minutes:.1f} min", flush=True)


def frozen_base(base_dir: Path):
    """The base checkpoint's adapter with every weight frozen, and its tokenizer."""
    from transformers import AutoTokenizer

    from packedss.models.nemotron import load_nemotron

    adapter = load_nemotron(base_dir)
    for p in list(adapter.backbone.parameters()) + list(adapter.head.parameters()):
        p.requires_grad_(False)
    return adapter, AutoTokenizer.from_pretrained(str(base_dir))


def lora_examples(config: TrainConfig, base_dir: Path, tok) -> list:
    """The training examples, encoded; says so when the base was trained with another arith template."""
    from packedss.tasks.core import load_task_config

    base_config = json.loads((base_dir / "config.json").read_text())
    template = base_config.get("packedss_training", {}).get("arith_template") or load_task_config("arith").prompt_plain
    corpus = build_corpus(config.arith_n, config.seed, config.data_dir, config.code_bytes)
    if corpus.template != template:
        print(f"[lora] note: base trained with template {template!r}, task now {corpus.template!r}", flush=True)
    return encode_examples(tok, corpus, config.max_len)


def train_lora_steps(config: TrainConfig, started: float, adapter, lora, draft_batch,
                     clock: Callable[[], float] = time.time) -> int:  # fmt: skip
    """Up to config.lora_steps AdamW steps of the LoRA on `draft_batch()` batches (stopping at the
    wall-clock cap, read on `clock`); the steps run, as the training record counts them."""
    opt = torch.optim.AdamW(lora.parameters(), lr=config.lora_lr, weight_decay=0.0)
    adapter.backbone.train()
    ema = None
    t0 = clock()
    steps_run = 0
    for step in range(config.lora_steps):
        if config.max_minutes and clock() - started > config.max_minutes * 60:
            print(f"[lora] wall-clock cap reached after {step} steps", flush=True)
            break
        batch = draft_batch()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, config.lora_steps, config.lora_lr, 20)
        kl, ce = distillation_losses(adapter, lora, batch)
        loss = kl + config.lora_ce * ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps_run = step + 1
        values = torch.stack([kl.detach(), ce.detach()])
        ema = values if ema is None else 0.95 * ema + 0.05 * values
        if step % config.log_every == 0 or step == config.lora_steps - 1:
            rate = (clock() - t0) / (step + 1)
            print(f"[lora] step {step} kl {ema[0]:.3f} ce {ema[1]:.3f} {rate:.2f}s/step", flush=True)
    return steps_run


def distillation_losses(adapter, lora, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """KL(verifier || drafter) and the cross-entropy to the verifier's greedy token, on the draft
    rows of one forward pass with the LoRA on those rows only."""
    lora.select(batch.draft_rows)
    try:
        hidden = adapter.backbone(
            input_ids=batch.tokens, position_ids=batch.positions, attention_mask=batch.mask, use_cache=False
        ).last_hidden_state
        logits = adapter.head(hidden)
    finally:
        lora.select(None)
    # Teacher: the verifier (unadapted clean rows of the same pass) at the position each
    # mask row drafts: clean row i-1 predicts position i.
    positions = batch.positions
    with torch.no_grad():
        teacher_rows = (positions - 1).clamp(min=0, max=positions.shape[1] - 1)
        teacher = torch.softmax(logits.gather(1, teacher_rows[..., None].expand_as(logits)).detach(), dim=-1)
    valid = batch.draft_targets != IGNORE
    student = torch.log_softmax(logits[valid], dim=-1)
    kl = F.kl_div(student, teacher[valid], reduction="batchmean")
    ce = F.cross_entropy(logits[valid], teacher[valid].argmax(dim=-1))  # the verifier's greedy token
    return kl, ce


def lora_record(config: TrainConfig, base_label: str, steps_run: int, minutes: float) -> dict:
    """The adapter's training record (packedss_training.json)."""
    return {
        "script": "scripts/train_tiny.py --lora",
        "base": base_label,
        "seed": config.seed,
        "steps_run": steps_run,
        "batch": config.batch,
        "lr": config.lora_lr,
        "objective": "KL(verifier || drafter) + %.2f * CE(verifier argmax) on draft rows" % config.lora_ce,
        "train_minutes": round(minutes, 1),
    }
