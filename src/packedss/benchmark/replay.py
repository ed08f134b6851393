"""The decoder's own time: the same decodes replayed against a model that returns recorded
logits at no cost, one response at a time (`Replay`, a CallModel) or C at a time (`BatchReplay`,
a batch executor of packedss.decoding.engine). With no forward pass between the host steps, what
is timed is the host work alone, on caches no forward pass has evicted."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from packedss.decoding.trace import RecordingModel


class Replay:
    """A zero-cost model: returns the recorded logits of each call in turn."""

    def __init__(self, log, device, mask_token_id):
        self.log, self.device, self.mask_token_id, self.index = log, device, mask_token_id, 0
        self.call_stats: dict[str, int] = {}

    def run(self, call):
        self.index += 1
        return self.log[self.index - 1]

    def commit(self, rows):
        pass

    def reset(self):
        pass

    def synchronize(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class BatchReplay:
    """A zero-cost batch executor (packedss.decoding.engine.BatchExecutor): returns the recorded
    logits of each batched call in turn; commits and resets move nothing. `log` holds each
    recorded call's (rows, logits) (`recording`); a batched call of other rows than the recorded
    one's is another decode: RuntimeError."""

    def __init__(self, log: list[tuple[int, torch.Tensor]], device: torch.device, mask_token_id: int):
        self.log, self.device, self.mask_token_id, self.index = log, device, mask_token_id, 0
        self.charged_s: float | None = None

    def run(self, batch) -> torch.Tensor:
        rows = batch.tokens.shape[0]
        if self.index >= len(self.log) or self.log[self.index][0] != rows:
            raise RuntimeError(f"batched call {self.index} of {rows} rows is not the recorded call: not the decode that "
                               "was recorded")  # fmt: skip
        self.index += 1
        return self.log[self.index - 1][1]

    def commit(self, slot: int, rows: int) -> None:
        pass

    def reset(self, slot: int) -> None:
        pass

    def call_stats(self, slot: int) -> dict[str, int]:
        return {}

    synchronize = Replay.synchronize


@contextmanager
def recording(executor) -> Iterator[list[tuple[int, torch.Tensor]]]:
    """`with recording(executor) as log:` the rows and logits of each batched call `executor`
    runs inside the block, in order (its `run` is wrapped on the instance until the block ends)."""
    log: list[tuple[int, torch.Tensor]] = []
    run = executor.run

    def recorded(batch):
        logits = run(batch)
        log.append((batch.tokens.shape[0], logits))
        return logits

    executor.run = recorded
    try:
        yield log
    finally:
        executor.run = run


def replay_overhead(decode, adapter, jobs, rounds: int = 5) -> float:
    """The decoder's own time per iteration, in microseconds: every call's logits are recorded
    with the real model, then the same decodes run again against a model that returns them at no
    cost (identical control flow), best of `rounds`. `jobs` = [(prompt, settings, stop_check)]."""
    logs, iterations = [], 0
    for prompt, settings, stop_check in jobs:
        recorder = RecordingModel(adapter)
        iterations += decode(recorder, prompt, settings, stop_check).iterations
        logs.append([logits for _, logits in recorder.calls])
    best = math.inf
    for _ in range(rounds):
        started = time.perf_counter()
        for (prompt, settings, stop_check), log in zip(jobs, logs, strict=True):
            decode(Replay(log, adapter.device, adapter.mask_token_id), prompt, settings, stop_check)
        best = min(best, time.perf_counter() - started)
    return 1e6 * best / max(iterations, 1)
