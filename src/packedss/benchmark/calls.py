"""Latency of ONE model call against its number of rows and the cached prefix length.

For every block size B (= W + 1) and cached prefix length C, the calls each LTR schedule makes
per iteration are built with the schedules' own call builders (so the masks and positions are
the real ones) on a model of any shape (random weights are fine: the latency of a call does not
depend on the values of the weights):

    ar             1 row         one AR step (compared with --compile only)
    linear-draft   B rows        the diffusion block [last, MASK x W]
    linear-verify  B rows        the causal verify rows [last, d_1..d_W]
    packed         2B rows       verify rows + the one-call-ahead draft block
    quadratic      B(B+1) rows   verify rows + B draft blocks

Each call runs on a cache of exactly C rows and is cropped back after it (commit(0)), as in
decoding. The calls of one (C, B) are timed round-robin, median over `iters` timed calls each,
after `warmup` untimed rounds. Shapes (packedss.models.cost_twin.SHAPES) are the backbone sizes of
the public Ministral-3 text configs the Nemotron-Labs-Diffusion models are built on (our reading).
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable, Collection

import torch

from packedss.benchmark.floors import (
    Products,
    Timer,
    call_traffic,
    floor_entries,
    floor_fields,
    hbm_fields,
    round_robin,
)
from packedss.decoding.calls import causal_segment, draft_block, pack
from packedss.decoding.schedules import packed_call, quadratic_call
from packedss.benchmark.graph_check import graph_difference, graph_vs_eager, logit_tolerance
from packedss.errors import PackedSSError
from packedss.models.adapter import BackboneAdapter
from packedss.models.attention import eager_kernel, repeats_kv
from packedss.models.cost_twin import SHAPES, random_adapter, shape_config  # noqa: F401 (the benchmarks' shapes)
from packedss.models.static import end_warmup, static_twin

PAPER_TABLE5_MS = {"linear": 54.41, "packed": 28.58, "quadratic": 28.90}  # Nemotron 8B GSM8K
KINDS = ("linear-draft", "linear-verify", "packed", "quadratic")
COMPILE_KINDS = ("ar", *KINDS)
CHECK_SEED = 7919  # the graph-vs-eager check's inputs: tokens other than the warm-up's


def iteration_calls(adapter: BackboneAdapter, block: int, position: int, kinds=KINDS, seed: int | None = None) -> dict:
    """The calls of one iteration of each schedule at block size B, for a cache of `position` rows
    (their tokens drawn with `seed`, default B)."""
    device, width, mask = adapter.device, block - 1, adapter.mask_token_id
    gen = torch.Generator().manual_seed(block if seed is None else seed)
    vocab = min(adapter.head.out_features, 1000)
    last = torch.randint(4, vocab, (1,), generator=gen).to(device)
    drafts = torch.randint(4, vocab, (width,), generator=gen).to(device)
    builders = {
        "ar": lambda: pack([causal_segment(last, position)]),
        "linear-draft": lambda: pack([draft_block(last, position, width, mask)]),
        "linear-verify": lambda: pack([causal_segment(torch.cat([last, drafts]), position)]),
        "packed": lambda: packed_call(last, drafts, position, width, mask, pad_verify=True),
        "quadratic": lambda: quadratic_call(last, drafts, position, mask),
    }
    return {kind: builders[kind]() for kind in kinds}


def prefill(adapter: BackboneAdapter, rows: int, chunk: int = 1024) -> None:
    """A cache of exactly `rows` rows (random tokens, causal), written in chunks."""
    adapter.reset()
    gen = torch.Generator().manual_seed(rows)
    tokens = torch.randint(4, min(adapter.head.out_features, 1000), (rows,), generator=gen).to(adapter.device)
    with torch.inference_mode():
        for start in range(0, rows, chunk):
            piece = tokens[start : start + chunk]
            adapter.run(pack([causal_segment(piece, start)]))
            adapter.commit(piece.shape[0])


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def bench(adapter: BackboneAdapter, blocks: list[int], prefixes: list[int], warmup: int, iters: int,
          stream_bytes: int) -> list[dict]:  # fmt: skip
    """Median per-call times of the KINDS at every (C, B), each beside the weight-streaming floor
    and the raw read bandwidth measured in the same round robin."""
    timer, results = Timer(adapter), []
    floor = floor_entries(adapter, stream_bytes)
    for prefix in prefixes:
        prefill(adapter, prefix)
        for block in blocks:
            calls = iteration_calls(adapter, block, prefix)
            entries = {kind: (timer, call) for kind, call in calls.items()} | floor
            times = round_robin(entries, warmup, iters)
            fields = floor_fields(floor, times)
            for kind, call in calls.items():
                median = 1000 * statistics.median(times[kind])
                results.append({
                    "prefix": prefix, "block": block, "kind": kind, "rows": call.rows,
                    "median_ms": median, "min_ms": 1000 * min(times[kind]), "iters": iters,
                    **fields, "floor_ratio": median / fields["floor_ms"],
                    **hbm_fields("eager_", traffics(adapter, fields, call, prefix)[1], fields["copy_gbs"], median),
                })  # fmt: skip
                _progress(f"  C={prefix:5d} B={block:3d} {kind:14s} rows={call.rows:5d} "
                          f"median {median:8.3f} ms floor {fields['floor_ms']:8.3f} ms")  # fmt: skip
        adapter.reset()
    return results


def call_rows(kind: str, block: int) -> int:
    """The rows of a call of `kind` at block size B (Packed-SS with its verify rows padded)."""
    return {"ar": 1, "linear-draft": block, "linear-verify": block, "packed": 2 * block,
            "quadratic": block * (block + 1)}[kind]  # fmt: skip


def compiled_kinds(block: int, rows: Collection[int] | None) -> tuple[str, ...]:
    """The call kinds timed at block size B: those of COMPILE_KINDS whose row count is among
    `rows` (None: all of them). Each row count is one compilation."""
    return tuple(kind for kind in COMPILE_KINDS if rows is None or call_rows(kind, block) in rows)


def bench_compiled(adapter: BackboneAdapter, mode: str, blocks: list[int], prefixes: list[int], warmup: int,
                   iters: int, stream_bytes: int, rows: Collection[int] | None = None,
                   on_result: Callable[[list[dict], dict[str, float]], None] | None = None,
                   comparisons: list[dict] | None = None) -> tuple[list[dict], dict[str, float]]:  # fmt: skip
    """Eager calls of `adapter` against the same calls on the static path compiled with `mode`,
    against the matrix products of their row count alone (Products), against the
    weight-streaming floor (Stream; and the raw read bandwidth, RawRead) and against the HBM floor
    (the bytes the call moves, `call_traffic`, at the device-to-device copy bandwidth,
    DeviceCopy), timed round-robin in this process. Each (C, R) gets a static twin of C + R rows,
    so that the compiled call attends the same C + R columns as the eager one; its shape is
    compiled (two untimed calls, then compilation is closed) when the first block that needs it
    comes, so the blocks are measured in the order given and a block's results never wait for a
    later block's compilation. Only the calls whose row count is among `rows` are timed (None:
    every call of COMPILE_KINDS): each row count is one compilation. Before a block is timed,
    each of its compiled calls is compared with the eager call of the same new input
    (`graph_vs_eager`); a call whose graph differs is not timed, and its comparison goes to
    `comparisons` with the others (None: a difference raises PackedSSError). Under CUDA graphs
    every compiled call's graph replays and cudagraph skips are counted (`graph_replays_min`,
    `cudagraph_skips`; None where no graph can replay). `on_result(results, compile_s)` is called
    with everything measured so far after each (C, B). Returns the per-call results and the
    compile seconds per shape."""
    results, compile_s, eager = [], {}, Timer(adapter)
    compared = [] if comparisons is None else comparisons
    floor = floor_entries(adapter, stream_bytes)
    for prefix in prefixes:
        timers = {}
        prefill(adapter, prefix)
        for block in blocks:
            by_kind = iteration_calls(adapter, block, prefix, compiled_kinds(block, rows))
            for call in by_kind.values():
                if call.rows not in timers:
                    timers[call.rows] = Timer(compiled_twin(adapter, mode, prefix, call, compile_s))
            checked = check_block(adapter, timers, block, prefix, tuple(by_kind))
            compared.extend(checked)
            if comparisons is None and not all(c["pass"] for c in checked):
                raise PackedSSError(graph_difference(checked))
            by_kind = {c["kind"]: by_kind[c["kind"]] for c in checked if c["pass"]}
            if by_kind:
                results += time_block(adapter, eager, timers, by_kind, floor, (prefix, block), warmup, iters)
            if on_result is not None:
                on_result(results, compile_s)
        adapter.reset()
    return results, compile_s


def time_block(adapter: BackboneAdapter, eager: Timer, timers: dict, by_kind: dict, floor: dict, where: tuple[int, int],
               warmup: int, iters: int) -> list[dict]:  # fmt: skip
    """One (C, B)'s calls eager, compiled and as their products alone, round-robin with the floors."""
    entries = {}
    for kind, call in by_kind.items():
        entries[("eager", kind)] = (eager, call)
        entries[("compiled", kind)] = (timers[call.rows], call)
    for count in sorted({call.rows for call in by_kind.values()}):
        entries[("products", count)] = (Products(adapter, count), None)
    times = round_robin(entries | floor, warmup, iters)
    fields = floor_fields(floor, times)
    median = lambda key: 1000 * statistics.median(times[key])  # noqa: E731
    out = []
    for kind, call in by_kind.items():
        eager_ms, compiled_ms, products_ms = median(("eager", kind)), median(("compiled", kind)), median(("products", call.rows))
        out.append({"prefix": where[0], "block": where[1], "kind": kind, "rows": call.rows, "eager_ms": eager_ms,
                    "compiled_ms": compiled_ms, "ratio": compiled_ms / eager_ms, "products_ms": products_ms,
                    "products_ratio": products_ms / eager_ms, "iters": iters, **fields,
                    "compiled_floor": compiled_ms / fields["floor_ms"], "eager_floor": eager_ms / fields["floor_ms"],
                    **traffic_fields(adapter, fields, call, where[0], compiled_ms, eager_ms),
                    "graph_replays_min": min(timers[call.rows].replays) if timers[call.rows].replays else None,
                    "cudagraph_skips": max(timers[call.rows].skips) if timers[call.rows].skips else None})  # fmt: skip
        _progress(f"  C={where[0]:5d} B={where[1]:3d} {kind:14s} rows={call.rows:5d} eager {eager_ms:8.3f} ms "
                  f"compiled {compiled_ms:8.3f} ms products {products_ms:8.3f} ms floor {fields['floor_ms']:8.3f} ms")  # fmt: skip
    return out


def traffics(adapter: BackboneAdapter, fields: dict, call, prefix: int) -> tuple[dict, dict]:
    """The bytes a call moves (call_traffic) compiled and eager: the static path masks every call,
    so its compiled call repeats K and V where the device does; the eager call repeats them only
    where its kernel is the mask's."""
    device, columns = adapter.device.type, prefix + call.rows
    masked_eager = eager_kernel(call.rule, call.rows, prefix, device) == "sdpa-mask"
    return (call_traffic(adapter, fields["weight_bytes"], columns, repeats_kv(device)),
            call_traffic(adapter, fields["weight_bytes"], columns, masked_eager and repeats_kv(device)))  # fmt: skip


def traffic_fields(adapter: BackboneAdapter, fields: dict, call, prefix: int, compiled_ms: float, eager_ms: float) -> dict:
    """A timed call's traffic and HBM floors, compiled (`compiled_hbm_floor_ms`, `compiled_hbm`,
    `compiled_gbs`) and eager (`eager_...`: its own traffic, which repeats K/V only where its kernel does)."""
    compiled, eager = traffics(adapter, fields, call, prefix)
    return {"traffic": compiled, "eager_traffic": eager, **hbm_fields("compiled_", compiled, fields["copy_gbs"], compiled_ms),
            **hbm_fields("eager_", eager, fields["copy_gbs"], eager_ms)}  # fmt: skip


def check_block(adapter: BackboneAdapter, timers: dict, block: int, prefix: int, kinds: tuple[str, ...]) -> list[dict]:
    """Each compiled call of a block against the eager call of the same input, on a new input (not
    the one its graph was compiled and warmed with: a graph that replays stale inputs differs)."""
    fresh = iteration_calls(adapter, block, prefix, kinds, seed=CHECK_SEED + block)
    layers = adapter.backbone.config.num_hidden_layers
    dtype = next(adapter.backbone.parameters()).dtype
    return [{"prefix": prefix, "block": block, "kind": kind,
             **graph_vs_eager(adapter, timers[call.rows].adapter, call, logit_tolerance(layers, dtype))}
            for kind, call in fresh.items()]  # fmt: skip


def compiled_twin(adapter: BackboneAdapter, mode: str, prefix: int, call, compile_s: dict[str, float]):
    """A static twin of C + R rows for `call` (R rows on a cache of C), its shape compiled in an
    untimed warm-up; the compile seconds go to `compile_s`."""
    twin = static_twin(adapter, mode, prefix + call.rows, max_graphs=1)
    prefill(twin, prefix)
    for _ in range(2):  # the second sighting of a shape compiles it
        twin.run(call)
        twin.commit(0)
    compile_s[f"C={prefix}: {call.rows} rows"] = end_warmup(twin)[f"{call.rows} rows"]
    _progress(f"  C={prefix:5d} compiled the {call.rows}-row call in {compile_s[f'C={prefix}: {call.rows} rows']:.1f} s")
    return twin


class Prefill:
    """A prefill of `tokens` on an empty cache, with logits of rows `read_from`.. only (the prompt's
    last row: read_from = len - 1; every row, as before logits were cut to the rows read: 0)."""

    def __init__(self, adapter: BackboneAdapter, tokens: torch.Tensor, read_from: int):
        self.adapter, self.timer = adapter, Timer(adapter)
        self.call = pack([causal_segment(tokens, 0)], read_from=read_from)

    def one(self, call):
        self.adapter.reset()
        return self.timer.one(self.call)

    def seconds(self, measured: list) -> list[float]:
        return self.timer.seconds(measured)


def bench_prefill(adapter: BackboneAdapter, length: int, warmup: int, iters: int) -> dict:
    """Median ms of a `length`-token prefill with logits of its last row only against logits of
    every row, round-robin."""
    gen = torch.Generator().manual_seed(length)
    tokens = torch.randint(4, min(adapter.head.out_features, 1000), (length,), generator=gen).to(adapter.device)
    entries = {"last row": (Prefill(adapter, tokens, length - 1), None), "every row": (Prefill(adapter, tokens, 0), None)}
    times = round_robin(entries, warmup, iters)
    adapter.reset()
    out = {key: 1000 * statistics.median(values) for key, values in times.items()}
    return {"prefill": length, "last_row_ms": out["last row"], "every_row_ms": out["every row"],
            "ratio": out["last row"] / out["every row"], "iters": iters}  # fmt: skip


def render_prefill(result: dict) -> str:
    return (f"prefill of {result['prefill']} tokens (median of {result['iters']}, round-robin): logits of the last row "
            f"{result['last_row_ms']:.1f} ms, of every row {result['every_row_ms']:.1f} ms (last / every: "
            f"{result['ratio']:.2f})")  # fmt: skip


def per_iteration(results: list[dict]) -> dict:
    """(prefix, block) -> per-iteration model ms of each schedule, and the 2B/B call ratio."""
    by = {(r["prefix"], r["block"], r["kind"]): r["median_ms"] for r in results}
    out = {}
    for prefix, block in sorted({(r["prefix"], r["block"]) for r in results}):
        get = lambda kind: by[(prefix, block, kind)]  # noqa: E731
        out[(prefix, block)] = {
            "linear": get("linear-draft") + get("linear-verify"),
            "packed": get("packed"),
            "quadratic": get("quadratic"),
            "ratio_2B_B": get("packed") / get("linear-verify"),
        }
    return out


FLOOR_KINDS = ("ar", "linear-draft", "linear-verify", "packed")  # R = 1, B and 2B rows: the floor's targets


def median_ratio(results: list[dict], key: str = "ratio", kinds=None) -> float:
    """The median over call shapes (of `kinds`, default all) of a per-call ratio (default
    compiled/eager); nan when no call of those kinds was timed."""
    values = [r[key] for r in results if kinds is None or r["kind"] in kinds]
    return statistics.median(values) if values else math.nan


def render_floor(results: list[dict]) -> list[str]:
    """The bandwidth lines: the floor's (one-row products over the model's shapes), the raw read
    and the device copy (the HBM floor's); none when no call was timed."""
    if not results:
        return []
    first = results[0]
    stream = statistics.median(r["stream_gbs"] for r in results)
    raw = statistics.median(r["raw_gbs"] for r in results)
    copy = statistics.median(r["copy_gbs"] for r in results)
    return [f"weights a call streams: {first['weight_bytes'] / 2**30:.2f} GiB (every linear layer and the head); "
            f"floor = those bytes / the streaming bandwidth of one-row products over the model's weight shapes and "
            f"dtype ({first['stream_bytes'] / 2**30:.2f} GiB in total, larger than the cache): median "
            f"{stream:.2f} GB/s; raw read (float32 sum over the same bytes): median {raw:.2f} GB/s "
            f"(floor bandwidth / raw: {stream / raw:.2f})",
            f"device-to-device copy (read + write bytes): median {copy:.2f} GB/s; HBM floor of a call = what it moves "
            f"(the weights, {1000 * first['weight_bytes'] / (copy * 1e9):.3f} ms of it at that bandwidth, + its K/V "
            f"read + the K/V a masked call repeats to the query heads) at that bandwidth"]  # fmt: skip


def ratios_2b_b(results: list[dict]) -> list[dict]:
    """Per (C, B) of bench_compiled's results: the 2B-row call (packed) over the B-row call
    (linear-verify), eager and compiled. Near 1 when a call's time is its weight reads; near 2
    when it is its arithmetic; near 1 as well when it is the host's dispatch (eager, small rows).
    A (C, B) that timed only one of the two calls has no ratio."""
    by = {(r["prefix"], r["block"], r["kind"]): r for r in results}
    out = []
    for prefix, block in sorted({(r["prefix"], r["block"]) for r in results}):
        packed, verify = by.get((prefix, block, "packed")), by.get((prefix, block, "linear-verify"))
        if packed is None or verify is None:
            continue
        out.append({"prefix": prefix, "block": block, "eager": packed["eager_ms"] / verify["eager_ms"],
                    "compiled": packed["compiled_ms"] / verify["compiled_ms"]})  # fmt: skip
    return out


def render(results: list[dict], header: str) -> str:
    lines = [header, "", "Per-call model time (median ms) by rows:", ""]
    lines.append("| C | B | B rows: draft | B rows: verify | 2B rows: packed | B(B+1) rows: quadratic | 2B / B |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|")
    by = {(r["prefix"], r["block"], r["kind"]): r for r in results}
    iters = per_iteration(results)
    for prefix, block in iters:
        cell = lambda kind: f"{by[(prefix, block, kind)]['median_ms']:.3f}"  # noqa: E731
        lines.append(f"| {prefix} | {block} | {cell('linear-draft')} | {cell('linear-verify')} | {cell('packed')} "
                     f"({2 * block}) | {cell('quadratic')} ({block * (block + 1)}) | "
                     f"{iters[(prefix, block)]['ratio_2B_B']:.2f}x |")  # fmt: skip
    lines += ["", "Per-iteration model time (ms): Linear-SS = draft + verify call; Packed-SS, Quadratic-SS = one call", ""]
    lines.append("| C | B | Linear-SS | Packed-SS | Quadratic-SS | Packed / Linear |")
    lines.append("|---:|---:|---:|---:|---:|---:|")
    for (prefix, block), it in iters.items():
        lines.append(f"| {prefix} | {block} | {it['linear']:.3f} | {it['packed']:.3f} | {it['quadratic']:.3f} | "
                     f"{it['packed'] / it['linear']:.2f} |")  # fmt: skip
    blocks = {b for _, b in iters}
    if {8, 32} <= blocks:
        lines += ["", "Table 5 pairing (Linear, Packed at B = 32; Quadratic at B = 8), ms per iteration:", ""]
        lines.append("| C | Linear-SS (32+32 rows) | Packed-SS (64 rows) | Quadratic-SS (72 rows) | paper (8B) |")
        lines.append("|---:|---:|---:|---:|---|")
        paper = " / ".join(f"{v:.2f}" for v in PAPER_TABLE5_MS.values())
        for prefix in sorted({p for p, _ in iters}):
            lines.append(f"| {prefix} | {iters[(prefix, 32)]['linear']:.3f} | {iters[(prefix, 32)]['packed']:.3f} | "
                         f"{iters[(prefix, 8)]['quadratic']:.3f} | {paper} |")  # fmt: skip
    lines += ["", "Each call against the weight-streaming floor measured in the same round robin:", ""]
    lines.append("| C | B | call | rows | ms | floor ms | call / floor | achieved (floor / call) |")
    lines.append("|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in results:
        lines.append(f"| {r['prefix']} | {r['block']} | {r['kind']} | {r['rows']} | {r['median_ms']:.3f} | "
                     f"{r['floor_ms']:.3f} | {r['floor_ratio']:.2f} | {100 / r['floor_ratio']:.0f}% |")  # fmt: skip
    lines += ["", *render_floor(results),
              f"eager/floor median per-call ratio (R = B, 2B): {median_ratio(results, 'floor_ratio', FLOOR_KINDS):.2f}"]  # fmt: skip
    return "\n".join(lines)


def render_compiled(results: list[dict], compile_s: dict[str, float], header: str) -> str:
    lines = [header, "", "Compiled against eager calls of the same shapes, the matrix products of the call's rows "
             "alone and the weight-streaming floor (median ms, round-robin):", ""]  # fmt: skip
    lines.append("| C | W | call | rows | eager ms | compiled ms | products ms | floor ms | compiled / eager | "
                 "products / eager | eager / floor | compiled / floor |")  # fmt: skip
    lines.append("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        lines.append(f"| {r['prefix']} | {r['block'] - 1} | {r['kind']} | {r['rows']} | {r['eager_ms']:.3f} | "
                     f"{r['compiled_ms']:.3f} | {r['products_ms']:.3f} | {r['floor_ms']:.3f} | {r['ratio']:.2f} | "
                     f"{r['products_ratio']:.2f} | {r['eager_floor']:.2f} | {r['compiled_floor']:.2f} |")  # fmt: skip
    lines += ["", "Against the HBM floor (the weight bytes at the device-to-device copy bandwidth), with the "
              "bandwidth each call achieves (weight bytes / its time) and its CUDA-graph replays:", ""]  # fmt: skip
    lines.append("| C | W | call | rows | HBM floor ms | compiled / HBM | compiled GB/s | eager GB/s | graph replays "
                 "(min per call) | cudagraph skips |")  # fmt: skip
    lines.append("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        replays = "n/a" if r["graph_replays_min"] is None else r["graph_replays_min"]
        skips = "n/a" if r["cudagraph_skips"] is None else r["cudagraph_skips"]
        lines.append(f"| {r['prefix']} | {r['block'] - 1} | {r['kind']} | {r['rows']} | {r['compiled_hbm_floor_ms']:.3f} | "
                     f"{r['compiled_hbm']:.2f} | {r['compiled_gbs']:.1f} | {r['eager_gbs']:.1f} | {replays} | "
                     f"{skips} |")  # fmt: skip
    lines += ["", "A call of 2B rows (packed) over a call of B rows (linear-verify):", "",
              "| C | B | eager 2B / B | compiled 2B / B |", "|---:|---:|---:|---:|"]  # fmt: skip
    for ratio in ratios_2b_b(results):
        lines.append(f"| {ratio['prefix']} | {ratio['block']} | {ratio['eager']:.2f} | {ratio['compiled']:.2f} |")
    shapes = ", ".join(f"{label} {seconds:.1f} s" for label, seconds in compile_s.items())
    lines += ["", f"compile time per shape (untimed warm-up): {shapes}", *render_floor(results),
              f"compiled/eager median per-call ratio: {median_ratio(results):.2f}",
              f"eager/floor median per-call ratio (R = 1, B, 2B): "
              f"{median_ratio(results, 'eager_floor', FLOOR_KINDS):.2f}",
              f"compiled/floor median per-call ratio: {median_ratio(results, 'compiled_floor', FLOOR_KINDS):.2f}"]  # fmt: skip
    return "\n".join(lines)
