"""`tiny-sdar`: a block-diffusion model in the released SDAR layout that also runs as an AR model.

SDAR (github JetAstra/SDAR) is a Qwen3 network trained with a block-diffusion objective; a mask
row at position i predicts the token at i (no next-token shift). The model here is a
transformers Qwen3Model backbone plus an untied LM head, saved with
`packedss.models.sdar.save_sdar` and loaded by `packedss.models.sdar.load_sdar`, trained on the
same corpus, tokenizer (same function, same seed: identical to tiny's and tiny-set's), sampler
and optimizer loop as the other tiny models.

The objective is the release's (`block_diff_mask`, `forward_add_noise_packed`,
`SDARForCausalLM.forward`): each sequence x_0 is doubled into [x_t | x_0]
(packedss.training.layouts.sdar_layout), each answer token of x_t masked with probability
p = (1 - eps) t + eps, t ~ U(0, 1) per sequence; loss = the sum over masked x_t rows of
CE(logits, x_0 token) / p, divided by the batch's answer tokens. The mask token's logit is left
as the network gives it.

The one deviation from the release, which trains one block size: the block size is drawn per
batch, 1 with probability `sdar_ar` (0.4) and `sdar_block` (4) otherwise, because the harness
reads the same network in both modes: with block 1 a mask row at i sees the clean tokens < i and
itself, which is exactly the verifier row of the decoders (AR mode); with block 4 it is SDAR's
own block decoding.

`init_from` (a tiny-set checkpoint, SetDLM layout) gives the starting weights: its Qwen3
backbone and LM head have the same shapes, and its set objective already trains "the mask row at
i predicts the token at i".
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from packedss.errors import PackedSSError
from packedss.training.corpus import build_corpus, describe_examples, encode_examples, special_ids, train_tokenizer
from packedss.training.layouts import IGNORE, collate, sdar_layout
from packedss.training.loop import record_training, TrainConfig, make_sampler, seed_all, train_and_save
from packedss.training.setdlm import qwen3_config

EPS = 1e-3  # the release's minimum masking probability


def sdar_writer(ids: dict[str, int], block_size: int):
    """save_checkpoint's writer for the SDAR layout; the training record goes into config.json
    next to the release's fields (the loader ignores it)."""
    from packedss.models.sdar import save_sdar

    def write(directory: Path, backbone, head, extra: dict) -> None:
        save_sdar(directory, backbone, head, mask_token_id=ids["mask"], eos_token_ids=(ids["eos"],),
                  block_size=block_size)  # fmt: skip
        record_training(directory, extra)

    return write


def _label(path: Path) -> str:
    from packedss.paths import PROJECT_ROOT

    path = path.resolve()
    return str(path.relative_to(PROJECT_ROOT)) if path.is_relative_to(PROJECT_ROOT) else str(path)


def load_init(init_from: Path, backbone, head, tokenizer_json: bytes) -> dict:
    """Copy a tiny-set checkpoint's backbone and LM head into `backbone` and `head`; its
    tokenizer must be the one just trained, byte for byte. Returns its training record."""
    from packedss.models.setdlm import load_setdlm

    theirs = init_from / "tokenizer.json"
    if not theirs.is_file() or theirs.read_bytes() != tokenizer_json:
        raise PackedSSError(
            f"--init-from {init_from}: its tokenizer.json is not the tokenizer this run trains (same function, "
            "corpus and seed); train from scratch or from a checkpoint of the same corpus"
        )
    source = load_setdlm(init_from)
    try:
        backbone.load_state_dict(source.backbone.state_dict())
        head.load_state_dict(source.head.state_dict())
    except RuntimeError as err:
        raise PackedSSError(f"--init-from {init_from}: its weights do not fit this run's sizes ({err})") from None
    config = json.loads((init_from / "config.json").read_text())
    return config.get("packedss_training", {})


def sdar_batch_loss(backbone, head, sequences, pad_id: int, answer_tokens: int):
    """The release's loss of one batch of sdar_layout sequences: sum over masked rows of
    CE / p, divided by the batch's answer tokens. Returns (loss, mean CE of the masked rows,
    rows per sequence)."""
    batch = collate([s for s, _ in sequences], pad_id)
    rows = batch.tokens.shape[1]
    weights = torch.stack([torch.cat([w, w.new_zeros(rows - w.shape[0])]) for _, w in sequences])
    hidden = backbone(
        input_ids=batch.tokens, position_ids=batch.positions, attention_mask=batch.mask, use_cache=False
    ).last_hidden_state
    read = batch.draft_targets != IGNORE  # the masked x_t rows
    per_row = F.cross_entropy(head(hidden[read]), batch.draft_targets[read], reduction="none")
    return (per_row * weights[read]).sum() / answer_tokens, per_row.mean(), rows


def train_sdar(config: TrainConfig, out_dir: Path, init_from: str | Path | None = None) -> None:
    """Train `tiny-sdar` into out_dir: a fresh model, or the weights of the tiny-set checkpoint
    `init_from` continued under the SDAR objective."""
    from transformers import Qwen3Model

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    corpus = build_corpus(config.arith_n, config.seed, config.data_dir, config.code_bytes)
    with tempfile.TemporaryDirectory() as tok_tmp:  # the same tokenizer as tiny's (same function, corpus, seed)
        tok = train_tokenizer(corpus, config.vocab, Path(tok_tmp))
        tokenizer_json = (Path(tok_tmp) / "tokenizer.json").read_bytes()
    ids = special_ids(tok)
    examples = encode_examples(tok, corpus, config.max_len)
    print(describe_examples(tok, ids, examples), flush=True)
    seed_all(config.seed)
    backbone = Qwen3Model(qwen3_config(config, len(tok), ids))
    head = torch.nn.Linear(config.hidden, len(tok), bias=False)
    torch.nn.init.normal_(head.weight, std=0.02)
    previous = load_init(Path(init_from), backbone, head, tokenizer_json) if init_from else {}
    params = sum(p.numel() for p in backbone.parameters()) + head.weight.numel()
    print(f"[model] Qwen3 backbone + LM head: {params / 1e6:.2f}M parameters"
          + (f", from {init_from}" if init_from else ""), flush=True)  # fmt: skip
    block_shares = {"1": config.sdar_ar, str(config.sdar_block): round(1 - config.sdar_ar, 4)}
    extra = {
        "packedss_training": {
            "script": "scripts/train_tiny.py --family sdar",
            "objective": "SDAR block diffusion: [x_t | x_0] doubled sequence, answer tokens masked w.p. "
            "p = (1 - eps) t + eps, sum of masked-row CE / p over the batch's answer tokens",
            "eps": EPS,
            "block_sizes": block_shares,
            "seed": config.seed,
            "steps_planned": config.steps,
            "batch": config.batch,
            "lr": config.lr,
            "warmup": config.warmup,
            "mix": config.mix,
            "arith_template": corpus.template,
        }
    }
    if init_from:
        extra["packedss_training"]["init_from"] = _label(Path(init_from))
        extra["packedss_training"]["continued_from"] = previous
    writer = sdar_writer(ids, config.sdar_block)
    sampler = make_sampler(examples, config)
    layout_rng = random.Random(config.seed + 1)
    block_rng = random.Random(config.seed + 2)
    last = {}  # block size -> the masked rows' mean CE of its latest batch (logged per mode)

    def losses():
        block = 1 if block_rng.random() < config.sdar_ar else config.sdar_block
        drawn = sampler.draw(config.batch)
        sequences = [sdar_layout(ids_, start, layout_rng, ids["mask"], block, EPS) for ids_, start in drawn]
        answer_tokens = sum(len(ids_) - start for ids_, start in drawn)
        loss, ce, rows = sdar_batch_loss(backbone, head, sequences, ids["pad"], answer_tokens)
        last[block] = ce.detach()
        logged = tuple(last.get(b, last[block]) for b in (1, config.sdar_block))
        return loss, logged, rows

    train_and_save(config, started, backbone, head, tok, losses, ("ar", "block"), extra, params, out_dir, writer)
