"""Several requests' calls in one forward pass: the model side of concurrency C > 1 (eager path).

Each request slot is a twin of the job's adapter (packedss.models.slots) whose cache is an
EagerSlot: per layer its own keys and values, exactly as long as its committed rows. A batched
call (packedss.decoding.engine.CallBatch) packs the requests' calls into one sequence, as
variable-length attention does: the token and position ids are concatenated, and each layer's
keys and values are [request 1's cache + its rows, request 2's cache + its rows, ...]. A
block-diagonal additive mask lets each row see its own request's cache and, by its call's rule,
its own request's rows, and nothing of any other request. Each request's logits come back as
from its own call; commits and resets stay per request and only move its committed length.

Packing rather than a batch dimension keeps every request's cache exactly as long as it is (no
left padding, no holes from uncommitted rows). The price is one concatenation of every request's
keys and values per layer per call, and a dense mask of (all rows) x (all caches + rows), whose
size grows as C squared (docs/concurrency.md §5).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from packedss.decoding.calls import Role
from packedss.decoding.engine import CallBatch, Entry
from packedss.decoding.rows import ranges
from packedss.models.adapter import BackboneAdapter
from packedss.models.attention import aligned_full, mask_kernel
from packedss.models.slots import EagerSlot, SlotAdapters


class _PackedCaches:
    """The cache object a packed forward sees: one layer's update appends each request's rows to
    its own cache and returns the requests' keys and values side by side."""

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
        return torch.cat(keys, dim=-2), torch.cat(values, dim=-2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return sum(cache.committed for cache in self.caches)


class BatchedCalls(SlotAdapters):
    """`slots` request slots over one adapter's backbone and head (a BatchExecutor of
    packedss.decoding.engine). Every slot's call of one batch runs in one forward pass."""

    def __init__(self, adapter: BackboneAdapter, slots: int):
        if adapter.static is not None:
            raise ValueError("the batched path runs eagerly: build it before the static path is enabled")
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
        self.kernel = mask_kernel(adapter.backbone)  # every batched call passes its dense mask

    def mask(self, entries: Sequence[Entry]) -> torch.Tensor:
        """(1, 1, R, K): the block-diagonal additive mask of a packed call, R the rows of every
        request's call, K every request's cache plus its rows."""
        adapter = self.adapter
        cached = [self.slots[entry.slot].cached_rows for entry in entries]
        rows = sum(entry.rows for entry in entries)
        mask = aligned_full(rows, sum(cached) + rows, torch.finfo(adapter.dtype).min, adapter.dtype, self.device)[0, 0]
        row, column = 0, 0
        for entry, cache_rows in zip(entries, cached):
            mask[row : row + entry.rows, column : column + cache_rows] = 0
            column += cache_rows
            own = self.slots[entry.slot]._attend_bias(entry.layout.attend)
            mask[row : row + entry.rows, column : column + entry.rows] = own
            column += entry.rows
            row += entry.rows
        return mask[None, None]

    @torch.inference_mode()
    def run(self, batch: CallBatch) -> torch.Tensor:
        """Run every entry's call of `batch` in one forward pass; the logits of their read rows."""
        adapter, entries = self.adapter, batch.entries
        for entry in entries:
            self.slots[entry.slot].before_call(entry)  # the family's rules read the call's rows
        lora = adapter.proposal_lora
        if lora is not None:
            drafts = sum(entry.layout.drafts for entry in entries)
            lora.select(torch.cat([entry.layout.roles for entry in entries]) == int(Role.DRAFT), drafts)
        try:
            out = adapter.backbone(
                input_ids=batch.tokens[None],
                position_ids=batch.positions[None],
                attention_mask=self.mask(entries),
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
        for entry in entries:
            own, end = self.slots[entry.slot], start + entry.rows - entry.read_from
            # As BackboneAdapter.run counts them: the LoRA is evaluated for every row of a call with drafts.
            own.call_stats = {"attention": self.kernel} if lora is None else {
                "lora_rows_selected": entry.layout.drafts, "lora_rows_evaluated": entry.rows if entry.layout.drafts else 0,
                "attention": self.kernel}  # fmt: skip
            own.after_call(entry, logits[start:end])  # in place: e.g. SetDLM's mask logit
            start = end
        return logits

    def end_warmup(self) -> dict[str, float]:
        """Nothing compiles on the eager path."""
        return {}
