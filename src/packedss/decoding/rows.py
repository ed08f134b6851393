"""Rows of a batched tensor, named without making a view, and their concatenation in a fixed number
of tensor operations: how the batch engine (packedss.decoding.engine) hands each request its part
of a round's results, and builds a round's calls, without a tensor operation per request."""

from __future__ import annotations

import array
from collections.abc import Sequence

import torch


class Rows:
    """Rows start..stop of `source` (a round's logits, tokens, or top-2 logits), standing for
    `source[start:stop]`. A decoder slices it as it would slice that tensor (`rows[1:]`, `len`).
    `values`: the rows as host integers, when the round read them back (a round's tokens), else
    None; a call whose token parts all have them is built on the host (packedss.decoding.calls)."""

    __slots__ = ("source", "start", "stop", "values")

    def __init__(self, source: torch.Tensor, start: int, stop: int, values: list[int] | None = None):
        self.source, self.start, self.stop, self.values = source, start, stop, values

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index: slice) -> Rows:
        start, stop, step = index.indices(self.stop - self.start)
        if step != 1:
            raise IndexError("Rows take contiguous slices only")
        stop = max(start, stop)
        values = None if self.values is None else self.values[start:stop]
        return Rows(self.source, self.start + start, self.start + stop, values)

    @property
    def dtype(self) -> torch.dtype:
        return self.source.dtype

    def tensor(self) -> torch.Tensor:
        return self.source[self.start : self.stop]


def materialized(value):
    """A Rows as the tensor it stands for; anything else as it is."""
    return value.tensor() if type(value) is Rows else value


def ranges(starts: Sequence[int], counts: Sequence[int], device: torch.device) -> torch.Tensor:
    """The indices [starts[0], .., starts[0] + counts[0]), [starts[1], ..), ... as one long tensor."""
    shifts, total = [], 0
    for start, count in zip(starts, counts):
        shifts.append(start - total)
        total += count
    return _gathered(shifts, counts, total, device)


def _gathered(shifts: list[int], counts: list[int], total: int, device: torch.device) -> torch.Tensor:
    """The indices of `ranges`, from each run's start less the rows before it (`shifts`)."""
    host = uploaded(shifts + counts, device).view(2, -1)
    return torch.repeat_interleave(host[0], host[1], output_size=total) + torch.arange(total, device=device)


def uploaded(values: list[int], device: torch.device) -> torch.Tensor:
    """Host integers as a long tensor on `device` (through an array: a third of what `torch.tensor`
    of a list costs). On CUDA the copy is from pinned memory and does not block: a pageable copy
    waits for the device, a host sync that scripts/check_decode.py would count in every response."""
    host = torch.frombuffer(array.array("q", values), dtype=torch.long) if values else torch.zeros(0, dtype=torch.long)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def concatenated(parts: Sequence, device: torch.device) -> torch.Tensor:
    """The rows of `parts` (Rows or tensors) in order: one `cat` of their distinct sources and one
    gather, however many parts there are (none when they are consecutive rows of the sources)."""
    where: dict[int, int] = {}
    pool: list[torch.Tensor] = []
    shifts, counts = [], []
    size = total = 0
    for part in parts:
        if type(part) is Rows:
            source, start, count = part.source, part.start, part.stop - part.start
        else:
            source, start, count = part, 0, part.shape[0]
        base = where.get(id(source))
        if base is None:
            base = where[id(source)] = size
            pool.append(source)
            size += source.shape[0]
        shifts.append(base + start - total)
        counts.append(count)
        total += count
    pooled = pool[0] if len(pool) == 1 else torch.cat(pool)
    first = shifts[0] if shifts else 0
    if shifts.count(first) == len(shifts):  # one run of the sources' rows, in order: a view
        return pooled if first == 0 and total == size else pooled[first : first + total]
    return pooled.index_select(0, _gathered(shifts, counts, total, device))


def shifted(positions: torch.Tensor, shifts: Sequence[int], counts: Sequence[int], device: torch.device) -> torch.Tensor:
    """`positions` (the parts' rows, in order) with shifts[k] added to the counts[k] rows of part k."""
    if not any(shifts):
        return positions
    host = uploaded([*shifts, *counts], device).view(2, -1)
    return positions + torch.repeat_interleave(host[0], host[1], output_size=positions.shape[0])
