"""A random checkpoint in the SDAR layout for the SDAR family's tests."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import Qwen3Config, Qwen3Model

from packedss.models.sdar import save_sdar

SDAR_MASK, SDAR_EOS, SDAR_VOCAB = 63, 2, 64


def write_random_sdar(path: Path, seed: int = 0) -> Path:
    """Weights this large make outputs that vary (at the usual 0.02 greedy repeats one token), so
    drafts are accepted sometimes, not always; the scaled head makes S2D2's score route both ways."""
    torch.manual_seed(seed)
    config = Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, vocab_size=SDAR_VOCAB, max_position_embeddings=512,
                         tie_word_embeddings=False, initializer_range=0.5)  # fmt: skip
    backbone, head = Qwen3Model(config), nn.Linear(32, SDAR_VOCAB, bias=False)
    with torch.no_grad():
        head.weight.mul_(6)
    save_sdar(path, backbone, head, mask_token_id=SDAR_MASK, eos_token_ids=(SDAR_EOS,), block_size=4)
    return Path(path)
