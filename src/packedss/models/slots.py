"""Request slots: what the eager and the static batch executors (packedss.models.batched,
packedss.models.batched_static) share.

Each slot is a `twin` of the job's adapter (its own family rules, such as SetDLM's context, and its
own call statistics) whose cache state lives in the executor: the twin's `static` is the slot's
state, so the adapter's `commit`, `reset` and `cached_rows` are those of the slot. A commit or a
reset only moves the slot's committed length, on the host: the rows past it are overwritten or
cut by the slot's next call, inside that call.
"""

from __future__ import annotations

import torch

from packedss.models.adapter import BackboneAdapter


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


class EagerSlot:
    """A slot's cache on the eager path: per layer, its keys and values (committed rows first; a
    call's rows after them until the next call cuts what was not committed)."""

    def __init__(self, layers: int):
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.committed = 0

    def append(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's committed keys and values followed by a call's (which are kept, pending)."""
        if self.committed:
            keys = torch.cat([self.keys[layer][:, :, : self.committed], keys], dim=-2)
            values = torch.cat([self.values[layer][:, :, : self.committed], values], dim=-2)
        self.keys[layer], self.values[layer] = keys, values
        return keys, values

    def commit(self, rows: int) -> None:
        self.committed += rows

    def reset(self) -> None:
        self.committed = 0
        self.keys = [None] * len(self.keys)
        self.values = [None] * len(self.values)

    def drop_oldest(self, rows: int) -> None:
        """Drop the first `rows` committed rows of every layer (SetDLM past its context)."""
        for layer, keys in enumerate(self.keys):
            if keys is not None:
                self.keys[layer], self.values[layer] = keys[:, :, rows:], self.values[layer][:, :, rows:]
        self.committed -= rows
