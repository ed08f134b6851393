"""Fixtures of the any-order family: tiny random SetDLM checkpoints in the released layout, a plain
(no cache, one dense forward per prediction) reading of the set-causal rule on the real network,
and a fast pure-torch toy set model with the same call protocol for the statistical tests."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import Qwen3Config, Qwen3Model

from packedss.decoding.calls import Call
from packedss.models.setdlm import SetDLMAdapter, save_setdlm

SET_VOCAB = 24
SET_MASK = 3
SET_EOS = 2
SET_SMAX = 16


def write_random_setdlm(path: Path, seed: int = 0, vocab: int = SET_VOCAB, layers: int = 2) -> Path:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    backbone = Qwen3Model(config)
    head = nn.Linear(config.hidden_size, vocab, bias=False)
    with torch.no_grad():
        # Peaky outputs that depend on the context (a faint mask embedding, strong attention):
        # drafts then match sometimes and miss sometimes.
        head.weight.mul_(8.0)
        backbone.embed_tokens.weight.normal_(0.0, 1.0)
        backbone.embed_tokens.weight[SET_MASK].mul_(0.05)
        for layer in backbone.layers:
            for proj in (layer.self_attn.v_proj, layer.self_attn.o_proj):
                proj.weight.mul_(10.0)
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                proj.weight.mul_(5.0)
    save_setdlm(path, backbone, head, mask_token_id=SET_MASK, eos_token_id=SET_EOS, smax=SET_SMAX)
    return path


@torch.inference_mode()
def plain_predict(model: SetDLMAdapter, history: list[tuple[int, int]], queries: list[int]) -> torch.Tensor:
    """Logits of mask rows at `queries`, each seeing every clean (position, token) of `history`
    and itself; the clean rows see the clean rows before them in `history` (the decoding order).
    One dense forward from scratch: no cache, no Call."""
    h, q = len(history), len(queries)
    tokens = torch.tensor([t for _, t in history] + [model.mask_token_id] * q)
    positions = torch.tensor([i for i, _ in history] + list(queries))
    allowed = torch.zeros(h + q, h + q, dtype=torch.bool)
    allowed[:h, :h] = torch.ones(h, h, dtype=torch.bool).tril()
    allowed[h:, :h] = True
    allowed[h:, h:] = torch.eye(q, dtype=torch.bool)
    mask = torch.zeros(allowed.shape, dtype=model.dtype).masked_fill(~allowed, torch.finfo(model.dtype).min)
    out = model.backbone(input_ids=tokens[None], position_ids=positions[None], attention_mask=mask[None, None])
    logits = model.head(out.last_hidden_state[0, h:]).clone()
    logits[:, model.mask_token_id] = float("-inf")
    return logits


def plain_ar(model: SetDLMAdapter, prompt: list[int], n: int) -> list[int]:
    """Greedy left-to-right decoding of the set model: one mask query per token."""
    history = list(enumerate(prompt))
    for position in range(len(prompt), len(prompt) + n):
        history.append((position, int(plain_predict(model, history, [position])[0].argmax())))
    return [t for _, t in history[len(prompt) :]]


def plain_confidence(model: SetDLMAdapter, prompt: list[int], n: int, width: int) -> list[int]:
    """Greedy any-order decoding with the confidence rule: the next W positions form a block; the
    mask rows of the block seeing everything resolved give each position's confidence (its
    largest probability); the block is decoded one position at a time, most confident first (ties:
    lower position), each token the argmax of a mask query that sees everything resolved before."""
    length = len(prompt)
    history = list(enumerate(prompt))
    start = length
    while start < length + n:
        block = list(range(start, start + width))
        confidence = torch.softmax(plain_predict(model, history, block), -1).max(-1).values.tolist()
        order = sorted(range(width), key=lambda k: (-confidence[k], block[k]))
        for k in order:
            position = block[k]
            history.append((position, int(plain_predict(model, history, [position])[0].argmax())))
        start += width
    resolved = dict(history)
    return [resolved[i] for i in range(length, length + n)]


class ToySetModel:
    """A fast set model with the call protocol (run/commit/reset/synchronize). The cache is the
    list of committed (token, position) rows; a mask row at position i that sees clean rows
    {(t_j, i_j)} has logits bias[i mod 3] + sum_j M[t_j] / (1 + |i - i_j|) (mask logit -inf)."""

    def __init__(self, vocab: int = 8, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.mask_token_id = vocab  # outside the emitted vocabulary
        self.device = torch.device("cpu")
        self.call_stats: dict[str, int] = {}
        self.bias = torch.randn(3, vocab + 1, generator=g, dtype=torch.float64)
        self.table = 2.5 * torch.randn(vocab + 1, vocab + 1, generator=g, dtype=torch.float64)
        self.bias[:, vocab] = float("-inf")
        self.cache_tokens = torch.zeros(0, dtype=torch.long)
        self.cache_positions = torch.zeros(0, dtype=torch.long)
        self._pending: Call | None = None

    def logits_for(self, position: int, seen: list[tuple[int, int]]) -> torch.Tensor:
        """The same rule for one mask row, written plainly (for exact enumeration)."""
        out = self.bias[position % 3].clone()
        for token, pos in seen:
            out += self.table[token] / (1 + abs(position - pos))
        return out

    def run(self, call: Call) -> torch.Tensor:
        if self._pending is not None:
            raise RuntimeError("commit() the previous call first")
        tokens = torch.cat([self.cache_tokens, call.tokens])
        positions = torch.cat([self.cache_positions, call.positions])
        c = self.cache_tokens.shape[0]
        sees = torch.cat([torch.ones(call.rows, c, dtype=torch.bool), call.attend], dim=1)
        sees &= (tokens != self.mask_token_id)[None, :]  # masks carry no content
        weight = sees.to(torch.float64) / (1 + (call.positions[:, None] - positions[None, :]).abs())
        logits = self.bias[call.positions % 3] + weight @ self.table[tokens]
        self._pending = call
        return logits[call.read_from :]

    def commit(self, rows: int) -> None:
        call = self._pending
        self.cache_tokens = torch.cat([self.cache_tokens, call.tokens[:rows]])
        self.cache_positions = torch.cat([self.cache_positions, call.positions[:rows]])
        self._pending = None

    def reset(self) -> None:
        self.cache_tokens = torch.zeros(0, dtype=torch.long)
        self.cache_positions = torch.zeros(0, dtype=torch.long)
        self._pending = None

    def synchronize(self) -> None:
        pass
