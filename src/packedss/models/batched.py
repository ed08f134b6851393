"""Several requests' calls in one forward pass: the model side of concurrency C > 1 (eager path).

Each request slot has its own adapter, a `twin` of the job's (its own DynamicCache, its own family
rules such as SetDLM's context). A batched call packs the requests' calls into one sequence, as
variable-length attention does: the token and position ids are concatenated, and each layer's
keys and values are [request 1's cache + its rows, request 2's cache + its rows, ...]. A
block-diagonal additive mask lets each row see its own request's cache and, by its call's rule,
its own request's rows, and nothing of any other request. Each request's logits come back as
from its own call; commits and resets stay per request (a crop of its own cache).

Packing rather than a batch dimension keeps every request's cache exactly as long as it is (no
left padding, no holes from uncommitted rows), so commit and reset are the single-request ones.
The price is one concatenation of every request's keys and values per layer per call, which is
small next to reading the weights once the caches are short compared with the weights.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from packedss.decoding.calls import Call, Role
from packedss.models.adapter import BackboneAdapter
from packedss.models.attention import aligned_full, mask_kernel


class _PackedCaches:
    """The cache object a packed forward sees: one layer's update appends each request's rows to
    its own cache and returns the requests' keys and values side by side."""

    def __init__(self, caches: Sequence, rows: Sequence[int]):
        self.caches = list(caches)
        self.rows = list(rows)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values, start = [], [], 0
        for cache, rows in zip(self.caches, self.rows):
            k, v = cache.update(key_states[:, :, start : start + rows], value_states[:, :, start : start + rows], layer_idx)
            keys.append(k)
            values.append(v)
            start += rows
        return torch.cat(keys, dim=-2), torch.cat(values, dim=-2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return sum(cache.get_seq_length(layer_idx) for cache in self.caches)


class SlotAdapters:
    """Request slots, each an adapter of its own over one job's `adapter` (`slots`): their commits,
    resets and call statistics."""

    adapter: BackboneAdapter
    slots: list[BackboneAdapter]

    def commit(self, slot: int, rows: int) -> None:
        self.slots[slot].commit(rows)

    def reset(self, slot: int) -> None:
        self.slots[slot].reset()

    def call_stats(self, slot: int) -> dict[str, int]:
        return self.slots[slot].call_stats

    def synchronize(self) -> None:
        self.adapter.synchronize()


class BatchedCalls(SlotAdapters):
    """`slots` request slots over one adapter's backbone and head (packedss.decoding.batching's
    BatchExecutor). Every slot's call of one batch runs in one forward pass."""

    def __init__(self, adapter: BackboneAdapter, slots: int):
        if adapter.static is not None:
            raise ValueError("the batched path runs eagerly: build it before the static path is enabled")
        self.adapter = adapter
        self.device = adapter.device
        self.mask_token_id = adapter.mask_token_id
        self.slots = [adapter.twin() for _ in range(slots)]
        self.charged_s: float | None = None  # the executor's own time is the model time
        self.kernel = mask_kernel(adapter.backbone)  # every batched call passes its dense mask

    def mask(self, items: Sequence[tuple[int, Call]]) -> torch.Tensor:
        """(1, 1, R, K): the block-diagonal additive mask of a packed call, R the rows of every
        request's call, K every request's cache plus its rows."""
        adapter = self.adapter
        cached = [self.slots[slot].cached_rows for slot, _ in items]
        rows = [call.rows for _, call in items]
        mask = aligned_full(sum(rows), sum(cached) + sum(rows), torch.finfo(adapter.dtype).min, adapter.dtype,
                            self.device)[0, 0]  # fmt: skip
        row, column = 0, 0
        for (slot, call), cache_rows in zip(items, cached):
            mask[row : row + call.rows, column : column + cache_rows] = 0
            column += cache_rows
            mask[row : row + call.rows, column : column + call.rows] = self.slots[slot]._attend_bias(call.attend)
            column += call.rows
            row += call.rows
        return mask[None, None]

    @torch.inference_mode()
    def run(self, items: Sequence[tuple[int, Call]]) -> list[torch.Tensor]:
        """Run one call per (slot, call) of `items` in one forward pass; their logits, in order."""
        adapter = self.adapter
        for slot, call in items:
            self.slots[slot].before_call(call)
        calls = [call for _, call in items]
        tokens = torch.cat([call.tokens for call in calls])
        lora = adapter.proposal_lora
        if lora is not None:
            drafts = sum(call.draft_rows for call in calls)
            lora.select(torch.cat([call.roles for call in calls]) == int(Role.DRAFT), drafts)
        try:
            out = adapter.backbone(
                input_ids=tokens[None],
                position_ids=torch.cat([call.positions for call in calls])[None],
                attention_mask=self.mask(items),
                cache=_PackedCaches([self.slots[slot].cache for slot, _ in items], [call.rows for call in calls]),
                use_cache=True,
            )
        finally:
            if lora is not None:
                lora.select(None)
        # One head product over every request's read rows: per request it would read the head's
        # weights (the vocabulary x hidden matrix, the largest one) once per request.
        hidden, reads, start = out.last_hidden_state[0], [], 0
        for call in calls:
            reads.append(hidden[start + call.read_from : start + call.rows])
            start += call.rows
        read_logits = adapter.head(torch.cat(reads)).split([len(rows) for rows in reads])
        logits = []
        for (slot, call), own_logits in zip(items, read_logits):
            own = self.slots[slot]
            # As BackboneAdapter.run counts them: the LoRA is evaluated for every row of a call with drafts.
            own.call_stats = {"attention": self.kernel} if lora is None else {
                "lora_rows_selected": call.draft_rows, "lora_rows_evaluated": call.rows if call.draft_rows else 0,
                "attention": self.kernel}  # fmt: skip
            logits.append(own.after_call(call, own_logits))
        return logits

    def end_warmup(self) -> dict[str, float]:
        """Nothing compiles on the eager path."""
        return {}


class BatchedTwin:
    """The batched form of a cost twin (packedss.models.cost_twin.CostTwin): the decoding model's
    batched call (on executor `decide`) decides the tokens, the cost model's batched call of the
    same rows (on `cost`) is timed (`charged_s`)."""

    def __init__(self, twin, decide, cost):
        self.twin = twin
        self.decide, self.cost = decide, cost
        self.device = self.decide.device
        self.mask_token_id = self.decide.mask_token_id
        self.charged_s: float | None = 0.0

    def run(self, items: Sequence[tuple[int, Call]]) -> list[torch.Tensor]:
        logits = self.decide.run(items)
        self.decide.synchronize()
        cost_items = [(slot, self.twin.cost_call(call)) for slot, call in items]
        started = time.perf_counter()
        self.cost.run(cost_items)
        self.cost.synchronize()
        self.charged_s = time.perf_counter() - started
        return logits

    def commit(self, slot: int, rows: int) -> None:
        self.decide.commit(slot, rows)
        self.cost.commit(slot, rows)

    def reset(self, slot: int) -> None:
        self.decide.reset(slot)
        self.cost.reset(slot)

    def call_stats(self, slot: int) -> dict[str, int]:
        return self.decide.call_stats(slot)

    def synchronize(self) -> None:
        self.decide.synchronize()

    def end_warmup(self) -> dict[str, float]:
        """Close compilation on both; the cost model's compile seconds per shape."""
        self.decide.end_warmup()
        return self.cost.end_warmup()


def batched_executor(model, slots: int, compile_mode: str = "none", capacity: int = 0):
    """The batch executor of a job's model (an adapter, or a cost twin over two): eager, or on
    static caches of `capacity` rows with compiled graphs (packedss.models.batched_static)."""
    from packedss.models.cost_twin import CostTwin

    def executor(adapter):
        if compile_mode == "none":
            return BatchedCalls(adapter, slots)
        from packedss.models.batched_static import StaticBatch

        return StaticBatch(adapter, slots, compile_mode, capacity)

    if isinstance(model, CostTwin):
        return BatchedTwin(model, executor(model.model), executor(model.cost))
    return executor(model)
