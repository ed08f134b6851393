"""The batch executor of a job's model at concurrency C > 1 (packedss.decoding.engine's
BatchExecutor): eager (packedss.models.batched) or on static caches with compiled graphs
(packedss.models.batched_static), over an adapter or, for a cost twin, over both of its models."""

from __future__ import annotations

import torch

from packedss.decoding.calls import Layout
from packedss.decoding.engine import CallBatch
from packedss.models.batched import BatchedCalls
from packedss.models.batched_static import StaticBatch
from packedss.models.cost_twin import CostTwin, charged_seconds


class BatchedTwin:
    """The batched form of a cost twin (packedss.models.cost_twin.CostTwin): the decoding model's
    batched call (on executor `decide`) decides the tokens, the cost model's batched call of the
    same rows (on `cost`) is timed (`charged_s`)."""

    def __init__(self, twin: CostTwin, decide, cost):
        self.twin = twin
        self.decide, self.cost = decide, cost
        self.device = self.decide.device
        self.mask_token_id = self.decide.mask_token_id
        self.charged_s: float | None = 0.0

    def cost_batch(self, batch: CallBatch) -> CallBatch:
        """The batch as the cost model runs it (on its device)."""
        if self.cost.device == batch.tokens.device:
            return batch
        entries = []
        for k, entry in enumerate(batch.entries):
            call = self.twin.cost_call(batch.call(k))
            layout = Layout(call.roles, call.attend, entry.layout.useful, entry.layout.drafts, entry.layout.rule)
            entries.append(entry._replace(layout=layout))
        return CallBatch(entries, batch.tokens.to(self.cost.device), batch.positions.to(self.cost.device))

    def run(self, batch: CallBatch) -> torch.Tensor:
        logits = self.decide.run(batch)
        self.decide.synchronize()
        self.charged_s = charged_seconds(self.cost, self.cost_batch(batch))
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
    static caches of `capacity` rows with compiled graphs."""

    def executor(adapter):
        if compile_mode == "none":
            return BatchedCalls(adapter, slots)
        return StaticBatch(adapter, slots, compile_mode, capacity)

    if isinstance(model, CostTwin):
        return BatchedTwin(model, executor(model.model), executor(model.cost))
    return executor(model)
