"""The decoder's own time: the same decodes replayed against a model that returns recorded
logits at no cost."""

from __future__ import annotations

import math
import time

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
