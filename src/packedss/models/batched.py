"""Several requests' calls in one forward pass: the model side of concurrency C > 1 (eager path).

Each request slot is a twin of the job's adapter (packedss.models.slots) whose cache is an
EagerSlot: per layer its own keys and values, exactly as long as its committed rows. A batched
call (packedss.decoding.engine.CallBatch) packs the requests' calls into one sequence, as
variable-length attention does: the token and position ids are concatenated, so every projection,
the MLPs and the head run once over all of the requests' rows. Attention does not mix them: each
layer hands the attention function every request's own keys and values (its cache and its rows)
and its own call's attention (mask, or none where its rule needs none), and each request's rows
attend over its own keys in an SDPA call of their own (packedss.models.attention,
`attention_requests`). So a batched call's attention work is the sum over its requests of rows x
(cache + rows), as a variable-length kernel's is, with no padding and no cross-request mask.
Each request's logits come back as from its own call; commits and resets stay per request and
only move its committed length.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from packedss.decoding.calls import Role
from packedss.decoding.engine import CallBatch, Entry
from packedss.decoding.rows import ranges
from packedss.models.adapter import BackboneAdapter
from packedss.models.attention import ATTENTION
from packedss.models.slots import EagerSlot, SlotAdapters


class _PackedCaches:
    """The cache object a packed forward sees: one layer's update appends each request's rows to
    its own cache and returns the requests' keys and values, one tensor each, for the attention
    function's `attention_requests`."""

    def __init__(self, caches: Sequence[EagerSlot], rows: Sequence[int]):
        self.caches = list(caches)
        self.rows = list(rows)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values, start = [], [], 0
        for cache, rows in zip(self.caches, self.rows):
            k, v = cache.append(layer_idx, key_states[:, :, start : start + rows], value_states[:, :, start : start + rows])
            keys.append(k)
            values.append(v)
            start += rows
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return sum(cache.committed for cache in self.caches)


class BatchedCalls(SlotAdapters):
    """`slots` request slots over one adapter's backbone and head (a BatchExecutor of
    packedss.decoding.engine). Every slot's call of one batch runs in one forward pass."""

    def __init__(self, adapter: BackboneAdapter, slots: int):
        if adapter.static is not None:
            raise ValueError("the batched path runs eagerly: build it before the static path is enabled")
        implementation = adapter.backbone.config._attn_implementation
        if implementation != ATTENTION:
            raise ValueError(f"the batched path attends per request with the {ATTENTION!r} attention, not {implementation!r}")
        self.adapter = adapter
        self.device = adapter.device
        self.mask_token_id = adapter.mask_token_id
        layers = adapter.backbone.config.get_text_config(decoder=True).num_hidden_layers
        self.slots = []
        for _ in range(slots):
            twin = adapter.twin()
            twin.static = EagerSlot(layers)
            self.slots.append(twin)
        self.charged_s: float | None = None  # the executor's own time is the model time

    def attention(self, entries: Sequence[Entry]) -> tuple[list[tuple], list[str]]:
        """Each entry's (rows, mask, rule) over its own slot's cache, as a lone call of its layout
        gets them (BackboneAdapter.own_attention), and its kernel's name."""
        requests, kernels = [], []
        for entry in entries:
            layout = entry.layout
            mask, rule, kernel = self.slots[entry.slot].own_attention(layout.rule, entry.rows, layout.attend)
            requests.append((entry.rows, mask, rule))
            kernels.append(kernel)
        return requests, kernels

    @torch.inference_mode()
    def run(self, batch: CallBatch) -> torch.Tensor:
        """Run every entry's call of `batch` in one forward pass; the logits of their read rows."""
        adapter, entries = self.adapter, batch.entries
        for entry in entries:
            self.slots[entry.slot].before_call(entry)  # the family's rules read the call's rows
        requests, kernels = self.attention(entries)
        lora = adapter.proposal_lora
        if lora is not None:
            drafts = sum(entry.layout.drafts for entry in entries)
            lora.select(torch.cat([entry.layout.roles for entry in entries]) == int(Role.DRAFT), drafts)
        try:
            out = adapter.backbone(
                input_ids=batch.tokens[None],
                position_ids=batch.positions[None],
                attention_requests=requests,
                attention_device=adapter.attention_device,
                cache=_PackedCaches([self.slots[entry.slot].static for entry in entries], [entry.rows for entry in entries]),
                use_cache=True,
            )
        finally:
            if lora is not None:
                lora.select(None)
        # One head product over every request's read rows: per request it would read the head's
        # weights (the vocabulary x hidden matrix, the largest one) once per request.
        hidden = out.last_hidden_state[0]
        if any(entry.read_from for entry in entries):
            reads = [entry.rows - entry.read_from for entry in entries]
            hidden = hidden.index_select(0, ranges([e.start + e.read_from for e in entries], reads, self.device))
        logits = adapter.head(hidden)
        if logits.dtype in (torch.bfloat16, torch.float16):
            logits = logits.float()
        start = 0
        for entry, kernel in zip(entries, kernels):
            own, end = self.slots[entry.slot], start + entry.rows - entry.read_from
            # As BackboneAdapter.run counts them: the LoRA is evaluated for every row of a call with drafts.
            own.call_stats = {"attention": kernel} if lora is None else {
                "lora_rows_selected": entry.layout.drafts, "lora_rows_evaluated": entry.rows if entry.layout.drafts else 0,
                "attention": kernel}  # fmt: skip
            own.after_call(entry, logits[start:end])  # in place: e.g. SetDLM's mask logit
            start = end
        return logits

    def end_warmup(self) -> dict[str, float]:
        """Nothing compiles on the eager path."""
        return {}
