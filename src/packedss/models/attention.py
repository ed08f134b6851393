"""The attention every adapter's backbone runs: one function registered with transformers'
AttentionInterface as ATTENTION (the loaders set it as the backbone config's
`_attn_implementation`), and the masks it takes.

The function runs one of these kernels (the names records carry, docs/records.md):

- `flex`: FlexAttention over a BlockMask (`block_mask`), grouped-query attention native;
- `sdpa`: SDPA with no mask (every row sees the cache and every row of its call);
- `sdpa-causal`: SDPA's causal flag (an empty cache), or torch's lower-right causal bias;
- `sdpa-mask`: SDPA with an additive (1, 1, R, C + R) mask, a view of a buffer whose rows are a
  multiple of 16 wide (`aligned_full`), so that SDPA's fused kernels take it without a padded copy.

SDPA runs with `enable_gqa` whenever there are fewer KV heads than query heads: K and V are
never repeated. Which kernel
a call gets is the adapter's choice (BackboneAdapter.attention_inputs); the rule for it is in
docs/models.md §2. Whatever the caller, a 4D tensor passed as `attention_mask` (the static path's
buffers, several requests batched in one forward) runs as `sdpa-mask`, and a BlockMask as `flex`.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
from transformers import AttentionInterface

from packedss.decoding.calls import Rule

ATTENTION = "packedss"
MASK_ALIGNMENT = 16  # elements: the row stride SDPA's memory-efficient kernel needs of a mask


def default_kernel(device: torch.device) -> str:
    """The kernel family of a device's eager calls: "flex" on CUDA, "sdpa" elsewhere (FlexAttention
    runs unfused, materializing every score, unless it is compiled, and compiling it on a CPU
    costs more than the tiny models' calls it would serve)."""
    return "flex" if torch.device(device).type == "cuda" else "sdpa"


def mask_kernel(backbone) -> str:
    """The kernel name of a call that passes a 4D additive mask to `backbone`."""
    implementation = backbone.config._attn_implementation
    return "sdpa-mask" if implementation == ATTENTION else f"transformers-{implementation}"


def aligned_full(rows: int, columns: int, value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A (1, 1, rows, columns) tensor filled with `value`: a view of a buffer whose rows are
    padded to a multiple of MASK_ALIGNMENT elements."""
    padded = -(-columns // MASK_ALIGNMENT) * MASK_ALIGNMENT
    return torch.full((1, 1, rows, padded), value, dtype=dtype, device=device)[..., :columns]


def block_mask(rule: Rule, attend: torch.Tensor, cached: int, device: torch.device) -> BlockMask:
    """The BlockMask of a call of rule `rule` and (R, R) `attend` on `device` over `cached` cache
    rows: every row sees the cache, and the call's rows as the rule says."""
    rows = attend.shape[0]
    if rule is Rule.FULL:
        def sees(batch, head, row, column):
            return column >= 0
    elif rule is Rule.CAUSAL:
        def sees(batch, head, row, column):
            return column <= row + cached
    else:
        def sees(batch, head, row, column):
            return (column < cached) | attend[row, (column - cached).clamp(min=0)]
    return create_block_mask(sees, None, None, rows, cached + rows, device=device)


@functools.cache
def _flex(device_type: str):
    # Compiled with dynamic shapes, so that a cache that grows each call reuses one kernel.
    return torch.compile(flex_attention, dynamic=True) if device_type == "cuda" else flex_attention


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | BlockMask | None, dropout: float = 0.0,
                      scaling: float | None = None, attention_rule: Rule | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:  # fmt: skip
    """transformers' attention-function contract: (batch, heads, rows, head_dim) query and
    (batch, kv_heads, columns, head_dim) key and value in, (batch, rows, heads, head_dim) out.
    Without a mask the call's rule (`attention_rule`, passed through the backbone's forward)
    says which rows see which: FULL, or CAUSAL aligned to the last column."""
    gqa = query.shape[1] != key.shape[1]
    if isinstance(attention_mask, BlockMask):
        out = _flex(query.device.type)(query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=gqa)
        return out.transpose(1, 2).contiguous(), None
    rows, columns = query.shape[2], key.shape[2]
    causal = False
    if attention_mask is None:
        if attention_rule is None:
            raise ValueError(f"attention {ATTENTION!r} needs a 4D attention_mask or an attention_rule")
        if attention_rule is Rule.CAUSAL and rows > 1:
            if rows == columns:
                causal = True
            else:
                attention_mask = causal_lower_right(rows, columns)
        elif attention_rule is Rule.CUSTOM:
            raise ValueError("a call of a custom rule needs its attention_mask")
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         is_causal=causal, scale=scaling, enable_gqa=gqa)  # fmt: skip
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, attention_forward)
