"""The attention every adapter's backbone runs: one function registered with transformers'
AttentionInterface as ATTENTION (the loaders set it as the backbone config's
`_attn_implementation`), and the masks it takes.

Every call is one SDPA call (per request, when several share one forward pass), fused on every device, and nothing is compiled (so nothing can
recompile inside a timed decode). Its kernel, the name records carry (docs/records.md):

- `sdpa`: no mask (every row sees the cache and every row of its call);
- `sdpa-causal`: SDPA's causal flag (an empty cache), or torch's lower-right causal bias over a
  cache on CUDA, which the flash kernel runs without a mask;
- `sdpa-mask`: an additive (1, 1, R, C + R) mask, a view of a buffer whose rows are a multiple of
  16 wide (`aligned_full`), so that SDPA's fused kernels take it without a padded copy.

Grouped-query heads: without a mask SDPA runs with `enable_gqa` (K and V are never repeated). With
a mask on CUDA, K and V are repeated to the query heads first (`repeats_kv`): SDPA's fused CUDA
kernels take no mask together with `enable_gqa`, and the math kernel it would fall back to
materializes every score in float32. Which kernel an adapter's call gets is `eager_kernel`
(docs/models.md §2). Whatever the caller, a 4D tensor passed as `attention_mask` (the static
path's buffers) runs as `sdpa-mask`. Several requests batched in one forward pass on the eager
path (`attention_requests`) each get their own call's kernel over their own cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from transformers import AttentionInterface

from packedss.decoding.calls import Rule

ATTENTION = "packedss"
MASK_ALIGNMENT = 16  # elements: the row stride SDPA's memory-efficient kernel needs of a mask


def eager_kernel(rule: Rule, rows: int, cached: int, device_type: str) -> str:
    """The kernel of an eager call of `rule` and `rows` rows over `cached` cache rows on a device
    of `device_type`: no mask where the rule needs none (FULL, one row, CAUSAL on an empty cache
    or, on CUDA, over one), else the additive mask. SDPA's own causal flag is aligned to the first
    column, and a CPU has no kernel for the lower-right alignment (torch would build the same mask
    inside every layer), so a CAUSAL call over a cache is masked there."""
    if rule is Rule.FULL or (rule is Rule.CAUSAL and rows == 1):
        return "sdpa"
    if rule is Rule.CAUSAL and (cached == 0 or device_type == "cuda"):
        return "sdpa-causal"
    return "sdpa-mask"


def repeats_kv(device_type: str) -> bool:
    """Whether a masked call of a grouped-query model repeats K and V to the query heads on a
    device of `device_type`: on CUDA, where SDPA's flash kernel takes no mask and its
    memory-efficient kernel no `enable_gqa`; not on a CPU, whose flash kernel takes both."""
    return device_type == "cuda"


def mask_kernel(backbone) -> str:
    """The kernel name of a call that passes a 4D additive mask to `backbone`."""
    implementation = backbone.config._attn_implementation
    return "sdpa-mask" if implementation == ATTENTION else f"transformers-{implementation}"


def aligned_full(rows: int, columns: int, value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A (1, 1, rows, columns) tensor filled with `value`: a view of a buffer whose rows are
    padded to a multiple of MASK_ALIGNMENT elements."""
    padded = -(-columns // MASK_ALIGNMENT) * MASK_ALIGNMENT
    return torch.full((1, 1, rows, padded), value, dtype=dtype, device=device)[..., :columns]


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key, value, attention_mask: torch.Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None, attention_rule: Rule | None = None,
                      attention_device: str | None = None, attention_requests: list | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:  # fmt: skip
    """transformers' attention-function contract: (batch, heads, rows, head_dim) query and
    (batch, kv_heads, columns, head_dim) key and value in, (batch, rows, heads, head_dim) out.
    Without a mask the call's rule (`attention_rule`, passed through the backbone's forward)
    says which rows see which: FULL, or CAUSAL aligned to the last column. `attention_device`
    (default: the query's) is the device type whose kernel choices the call makes.

    Several requests packed in one sequence (`attention_requests`, packedss.models.batched): key
    and value are lists, each request's own cache and rows, and request k's `(rows, mask, rule)`
    are its rows of the query and its own call's attention. Each request's rows attend over its
    own keys only, one SDPA call per request: the work is each request's rows x (its cache + its
    rows), never another request's."""
    device_type = attention_device or query.device.type
    if attention_requests is None:
        out = _attend(query, key, value, attention_mask, attention_rule, dropout, scaling, device_type)
    else:
        outs, start = [], 0
        for own_key, own_value, (rows, mask, rule) in zip(key, value, attention_requests):
            own = query[:, :, start : start + rows]
            outs.append(_attend(own, own_key, own_value, mask, rule, dropout, scaling, device_type))
            start += rows
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous(), None


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
            attention_rule: Rule | None, dropout: float, scaling: float | None, device_type: str) -> torch.Tensor:  # fmt: skip
    """One SDPA call: (batch, heads, rows, head_dim) out."""
    gqa = query.shape[1] != key.shape[1]
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
    elif gqa and repeats_kv(device_type):
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        gqa = False
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                          is_causal=causal, scale=scaling, enable_gqa=gqa)  # fmt: skip


AttentionInterface.register(ATTENTION, attention_forward)
