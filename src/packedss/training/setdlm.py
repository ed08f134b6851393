"""`tiny-set`: the any-order model in the released SetDLM layout, trained with the set objective.

A transformers Qwen3Model backbone plus an untied LM head, saved with
`packedss.models.setdlm.save_setdlm`, trained on the same corpus, tokenizer (same function,
same seed: identical to tiny's), sampler and optimizer as `tiny`. One forward pass per sequence
(packedss.training.layouts, set layout); loss = cross-entropy of the mask rows predicting their
own position's token, with the mask token's logit at -inf (SetDLM._forward).
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from packedss.training.corpus import build_corpus, describe_examples, encode_examples, special_ids, train_tokenizer
from packedss.training.layouts import IGNORE, collate, set_layout
from packedss.training.loop import record_training, TrainConfig, backbone_config, make_sampler, seed_all, train_and_save

SET_BASE = "none: trained from scratch by scripts/train_tiny.py --family setdlm"


def qwen3_config(config: TrainConfig, vocab: int, ids: dict[str, int]):
    from transformers import Qwen3Config

    rope = {"rope_type": "default", "rope_theta": 10000.0}
    return backbone_config(Qwen3Config, config, vocab, ids, rope_parameters=rope, rms_norm_eps=1e-6)


def setdlm_writer(ids: dict[str, int], smax: int):
    """save_checkpoint's writer for the SetDLM layout; the training record goes into config.json
    next to the release's fields (the loader ignores it)."""
    from packedss.models.setdlm import save_setdlm

    def write(directory: Path, backbone, head, extra: dict) -> None:
        save_setdlm(directory, backbone, head, mask_token_id=ids["mask"], eos_token_id=ids["eos"], smax=smax, base=SET_BASE)
        record_training(directory, extra)

    return write


def train_setdlm(config: TrainConfig, out_dir: Path) -> None:
    from transformers import Qwen3Model

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    corpus = build_corpus(config.arith_n, config.seed, config.data_dir, config.code_bytes)
    with tempfile.TemporaryDirectory() as tok_tmp:  # the same tokenizer as tiny's (same function, corpus, seed)
        tok = train_tokenizer(corpus, config.vocab, Path(tok_tmp))
    ids = special_ids(tok)
    examples = encode_examples(tok, corpus, config.max_len)
    print(describe_examples(tok, ids, examples), flush=True)
    seed_all(config.seed)
    backbone = Qwen3Model(qwen3_config(config, len(tok), ids))
    head = torch.nn.Linear(config.hidden, len(tok), bias=False)
    torch.nn.init.normal_(head.weight, std=0.02)
    params = sum(p.numel() for p in backbone.parameters()) + head.weight.numel()
    print(f"[model] Qwen3 backbone + LM head: {params / 1e6:.2f}M parameters", flush=True)
    random_orders = round(1 - config.set_ltr - config.set_local, 4)
    extra = {
        "packedss_training": {
            "script": "scripts/train_tiny.py --family setdlm",
            "objective": "set: CE of mask rows (query + block-draft level per answer position), mask logit -inf",
            "seed": config.seed,
            "steps_planned": config.steps,
            "batch": config.batch,
            "lr": config.lr,
            "orders": {"ltr": config.set_ltr, "block_local": config.set_local, "random": random_orders},
            "eos_tail": config.set_eos_tail,
            "mix": config.mix,
            "arith_template": corpus.template,
        }
    }
    writer = setdlm_writer(ids, config.smax)
    sampler = make_sampler(examples, config)
    layout_rng = random.Random(config.seed + 1)

    def losses():
        sequences = [
            set_layout(ids_, start, layout_rng, ids["mask"], ids["eos"], config.set_eos_tail, config.set_ltr, config.set_local)
            for ids_, start in sampler.draw(config.batch)
        ]
        batch = collate(sequences, ids["pad"])
        hidden = backbone(
            input_ids=batch.tokens, position_ids=batch.positions, attention_mask=batch.mask, use_cache=False
        ).last_hidden_state
        targets = batch.draft_targets
        read = targets != IGNORE  # mask rows only: a set model predicts from nothing else
        logits = head(hidden[read])
        logits[:, ids["mask"]] = float("-inf")  # as SetDLM._forward and SetDLMAdapter.run
        per_row = F.cross_entropy(logits, targets[read], reduction="none")
        # rows alternate query, draft per answer position (sample_set_rows)
        kind = torch.cat([torch.arange(int(n)) % 2 for n in read.sum(dim=1)])
        return per_row.mean(), (per_row[kind == 0].mean(), per_row[kind == 1].mean()), batch.tokens.shape[1]

    train_and_save(config, started, backbone, head, tok, losses, ("query", "draft"), extra, params, out_dir, writer)
