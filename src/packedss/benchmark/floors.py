"""What a call's time is measured with and against: the call timer, the round robin that times
calls against each other, and the floors beside them (the matrix products of a call alone, the
weight-streaming floor, the raw read and the device-to-device copy behind the HBM floor).

On CUDA every timed piece of work starts on a drained device: `drain` synchronizes before its
start event is recorded. Without it a host-bound call (an eager 8B call dispatches about 2,450
kernels) would be enqueued behind the backlog of the compiled calls before it, and its events
would time the backlog's tail instead of the call.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from torch import nn

from packedss.models.adapter import BackboneAdapter


def drain(device: torch.device) -> None:
    """Wait until `device` has run everything queued on it (nothing to wait for off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Times `adapter.run` calls: on a GPU CUDA events, the start event recorded on a drained
    device and every event read after one synchronize; else the host clock around run +
    synchronize. Every call is cropped back after it (commit(0)). Under CUDA
    graphs (a static twin in `reduce-overhead` mode, after its warm-up) each call's CUDA-graph
    replays and cudagraph skips (packedss.models.graphs) are kept in `replays` and `skips`; they
    stay empty on any other path (eager, or no CUDA: nothing replays a graph there)."""

    def __init__(self, adapter: BackboneAdapter):
        self.adapter = adapter
        self.cuda = adapter.device.type == "cuda"
        self.replays: list[int] = []
        self.skips: list[int] = []

    def one(self, call):
        """The seconds of one call (on CUDA: its pair of events, read by `seconds`)."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            drain(self.adapter.device)
            start.record()
            self.adapter.run(call)
            end.record()
            self._graph_stats()
            self.adapter.commit(0)
            return start, end
        t0 = time.perf_counter()
        self.adapter.run(call)
        self.adapter.synchronize()
        elapsed = time.perf_counter() - t0
        self._graph_stats()
        self.adapter.commit(0)
        return elapsed

    def _graph_stats(self) -> None:
        stats = self.adapter.call_stats
        if "graph_replays" in stats:
            self.replays.append(int(stats["graph_replays"]))
            self.skips.append(int(stats.get("cudagraph_skips", 0)))

    def seconds(self, measured: list) -> list[float]:
        if not self.cuda:
            return measured
        torch.cuda.synchronize(self.adapter.device)
        return [start.elapsed_time(end) / 1000.0 for start, end in measured]


class TimedWork:
    """A piece of work timed beside the calls in their round robin: `_run` on the adapter's
    device, timed like the calls (CUDA events from a drained device, or a synchronized host clock)."""

    timer: Timer

    def one(self, call):
        with torch.inference_mode():
            if self.timer.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                drain(self.timer.adapter.device)
                start.record()
                self._run()
                end.record()
                return start, end
            t0 = time.perf_counter()
            self._run()
            self.timer.adapter.synchronize()
            return time.perf_counter() - t0

    def seconds(self, measured: list) -> list[float]:
        return self.timer.seconds(measured)


class Products(TimedWork):
    """Times the matrix products of a call of R rows alone: every linear layer of the backbone and
    the head applied to an (R, in_features) input, with the model's own weights and BLAS, one
    dispatch each (about a microsecond apiece on a CPU). The arithmetic a call cannot shed however
    lean the rest of it is; `seconds` reads its measurements like Timer's."""

    def __init__(self, adapter: BackboneAdapter, rows: int):
        self.weights = linear_weights(adapter)
        gen = torch.Generator().manual_seed(rows)
        self.inputs = [torch.randn((rows, w.shape[1]), generator=gen).to(w.device, w.dtype) for w in self.weights]
        self.timer = Timer(adapter)

    def _run(self) -> None:
        for x, weight in zip(self.inputs, self.weights):
            torch.nn.functional.linear(x, weight)


def linear_weights(adapter: BackboneAdapter) -> list[torch.Tensor]:
    """The weights a call streams: every linear layer of the backbone and the head (the embedding
    is a gather of R rows, the norms are vectors)."""
    return [m.weight for m in adapter.backbone.modules() if isinstance(m, nn.Linear)] + [adapter.head.weight]


def last_level_cache_bytes() -> int:
    """The largest CPU cache sysfs reports (0 when it reports none)."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG") or 0) * scale)
    return max(sizes, default=0)


def stream_min_bytes() -> int:
    """What the floor's products cover by default: 4x the last-level cache, at least 1 GiB."""
    return max(2**30, 4 * last_level_cache_bytes())


class Stream(TimedWork):
    """The weight-streaming floor: one-row products (`F.linear` of a (1, in) input) over weight
    matrices of the model's own shapes and dtype, more of them in total than any cache holds (the
    model's own weights, cycled through copies while they sum to less than `min_bytes`), one pass
    per timed call. `gbs(seconds)` is the bandwidth of a pass; a call that streams `weight_bytes`
    at that bandwidth takes `weight_bytes / gbs` (its floor): what it spends beyond is its own."""

    def __init__(self, adapter: BackboneAdapter, min_bytes: int):
        own = linear_weights(adapter)
        self.weight_bytes = sum(w.numel() * w.element_size() for w in own)
        self.weights, total, k = list(own), self.weight_bytes, 0
        while total < min_bytes:
            copy = own[k % len(own)].clone()
            self.weights.append(copy)
            total += copy.numel() * copy.element_size()
            k += 1
        self.bytes = total
        self.inputs = {w.shape[1]: torch.randn((1, w.shape[1])).to(w.device, w.dtype) for w in self.weights}
        self.timer = Timer(adapter)

    def _run(self) -> None:
        for weight in self.weights:
            torch.nn.functional.linear(self.inputs[weight.shape[1]], weight)

    def gbs(self, seconds: float) -> float:
        return self.bytes / seconds / 1e9


class RawRead(TimedWork):
    """The raw read bandwidth: one float32 sum over a buffer of `nbytes` (beside the floor)."""

    def __init__(self, adapter: BackboneAdapter, nbytes: int):
        self.buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=adapter.device)
        self.bytes = self.buffer.numel() * 4
        self.timer = Timer(adapter)

    def _run(self) -> None:
        self.buffer.sum()

    def gbs(self, seconds: float) -> float:
        return self.bytes / seconds / 1e9


class DeviceCopy(TimedWork):
    """The device's copy bandwidth: one device-to-device copy of (the first GiB of) RawRead's buffer
    into a buffer of its size. A copy reads and writes every byte, so `gbs` counts twice the buffer's bytes (the
    convention of CUDA's bandwidthTest). The HBM floor of a call is its weight bytes at this
    bandwidth: no kernel streams the weights faster than the device copies memory."""

    def __init__(self, raw: RawRead, max_bytes: int = 2**30):
        self.source = raw.buffer[: min(raw.bytes, max_bytes) // 4]  # 1 GiB is far past any device cache
        self.target = torch.empty_like(self.source)
        self.bytes = self.source.numel() * 4
        self.timer = raw.timer

    def _run(self) -> None:
        self.target.copy_(self.source)

    def gbs(self, seconds: float) -> float:
        return 2 * self.bytes / seconds / 1e9


def floor_entries(adapter: BackboneAdapter, min_bytes: int) -> dict:
    """The round-robin entries of the floor, the raw read and the device copy, measured beside the calls."""
    stream = Stream(adapter, min_bytes)
    raw = RawRead(adapter, stream.bytes)
    return {("floor",): (stream, None), ("raw",): (raw, None), ("copy",): (DeviceCopy(raw), None)}


def floor_fields(entries: dict, times: dict) -> dict:
    """The floors of a call (ms: the products floor of one-row products, the HBM floor of the
    device copy) and the three bandwidths (GB/s) from one round robin's times."""
    stream, raw, copy = (entries[(key,)][0] for key in ("floor", "raw", "copy"))
    stream_gbs = stream.gbs(statistics.median(times[("floor",)]))
    copy_gbs = copy.gbs(statistics.median(times[("copy",)]))
    return {"floor_ms": 1000 * stream.weight_bytes / (stream_gbs * 1e9), "stream_gbs": stream_gbs,
            "raw_gbs": raw.gbs(statistics.median(times[("raw",)])), "copy_gbs": copy_gbs,
            "hbm_weights_ms": 1000 * stream.weight_bytes / (copy_gbs * 1e9), "weight_bytes": stream.weight_bytes,
            "stream_bytes": stream.bytes}  # fmt: skip


def call_traffic(adapter: BackboneAdapter, weight_bytes: int, columns: int, repeats: bool) -> dict[str, int]:
    """The bytes one call moves at the least: every weight once, the K and V of the `columns` it
    attends (cache and its own rows) once, and, where its masked SDPA repeats K and V to the query
    heads (`repeats`: packedss.models.attention.repeats_kv), the repeated copy written and read
    back. On the 8B shape at C + R = 1,088 columns: 15.90 GB, 0.15 GB and 1.21 GB."""
    config = adapter.backbone.config
    element = next(adapter.backbone.parameters()).element_size()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = config.num_key_value_heads or config.num_attention_heads
    per_head = config.num_hidden_layers * 2 * head_dim * element * columns  # K and V of every layer
    repeated = repeats and kv_heads != config.num_attention_heads
    traffic = {"weights": weight_bytes, "kv_read": kv_heads * per_head,
               "kv_repeat": 2 * config.num_attention_heads * per_head if repeated else 0}  # fmt: skip
    return traffic | {"total": sum(traffic.values())}


def hbm_fields(prefix: str, traffic: dict[str, int], copy_gbs: float, ms: float) -> dict:
    """A call's HBM floor (its traffic at the device copy's bandwidth), its time over that floor
    and the bandwidth it achieves on that traffic, each key prefixed with `prefix`."""
    floor_ms = 1000 * traffic["total"] / (copy_gbs * 1e9)
    return {f"{prefix}hbm_floor_ms": floor_ms, f"{prefix}hbm": ms / floor_ms,
            f"{prefix}gbs": achieved_gbs(traffic["total"], ms)}  # fmt: skip


def achieved_gbs(weight_bytes: int, ms: float) -> float:
    """The bandwidth a call achieves: the weight bytes it streams over its time (GB/s)."""
    return weight_bytes / (ms / 1000) / 1e9


def round_robin(entries: dict, warmup: int, iters: int) -> dict:
    """key -> seconds of `iters` calls, for `entries` = {key: (timer, call)} timed A B C D A B C D
    ... after `warmup` untimed rounds, so that a drift of the machine hits every entry alike."""
    measured = {key: [] for key in entries}
    for i in range(warmup + iters):
        for key, (timer, call) in entries.items():
            value = timer.one(call)
            if i >= warmup:
                measured[key].append(value)
    return {key: entries[key][0].seconds(values) for key, values in measured.items()}
