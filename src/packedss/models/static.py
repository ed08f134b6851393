"""The static call path: fixed-shape decode calls on a static KV cache, compiled once per shape.

An eager call on a DynamicCache costs far more than its arithmetic on a small model (the cache
grows, the mask is rebuilt, every op is dispatched from Python). After prefill, every LTR
schedule makes calls of one row count (AR 1, Linear-SS B, Packed-SS 2B with pad_verify,
Quadratic-SS B(B+1)), so each can run one compiled graph:

- the KV cache is transformers' `StaticCache` of `capacity` rows; committing a call moves the
  committed length, and the rows of an uncommitted call are overwritten by the next call;
- a call attends a window of the cache, not all of it: the first w columns, for w in
  `attention_windows(capacity)` (the capacity, a half, a quarter and an eighth of it), the
  smallest compiled w that holds the committed rows and the call's; each window is a StaticCache
  over views of the full cache's first w rows, so all windows share one cache;
- the committed length lives in a device tensor that the graph copies into every cache layer
  before it writes the call's rows (so a commit is one host-side update, not one per layer);
- the attention mask is a fixed-width additive buffer per row count and window, (1, 1, R, w),
  its rows aligned (packedss.models.attention.aligned_full), run by masked SDPA, updated in place: columns below the committed length are 0, the call's own columns hold its
  (R, R) rule, every other column (cache slots past the committed length) holds the dtype's
  minimum; the call's token and position ids are copied into buffers of the shape as well;
- the backbone + head forward is compiled with `torch.compile` (static shapes) for a row count
  once it was seen twice while warm-up is open (`end_warmup` closes it), at most `max_graphs`
  row counts (a call with the proposal LoRA on is its own: the LoRA hooks compile with it), one
  graph for each window that holds the call then (the capacity always among them: every later
  call of the shape has a compiled window), so no compilation ever happens inside a timed
  decode. Any other call (a shape first seen later, or past the bound; the any-order schedules'
  row counts vary) runs on the smallest compiled graph with more rows, padded with rows nobody
  sees (`calls["padded"]`), or, when there is none or the proposal LoRA is on, eagerly on the
  same cache and masks (`calls["eager"]`);
- a compiled graph whose inputs are the same tensors on two calls through dynamo (every graph
  without the proposal LoRA: weights, cache and the shape's buffers) is then called directly,
  without dynamo's per-call guard checks (see StaticCalls._run_compiled);
- prefill (the call on an empty cache) always runs eagerly: its length varies with the prompt.

`reduce-overhead` (CUDA graphs) needs a GPU; on a CPU it runs as `default`, with a logged note.
On a CPU every mode also generates a C++ wrapper around the kernels (inductor's cpp_wrapper).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable

import torch
from torch import nn
from transformers import PreTrainedModel, StaticCache

from packedss.decoding.calls import Call
from packedss.errors import PackedSSError
from packedss.models.attention import aligned_full, mask_kernel
from packedss.models.checkpoint import COMPILE_MODES
from packedss.models.graphs import WARM_RUNS, graph_events, timed_call_stats

log = logging.getLogger(__name__)

MAX_GRAPHS = 8  # compiled call shapes per adapter by default; further shapes run eagerly
WINDOWS = 4  # attention windows per call shape: the capacity, and a half, a quarter, an eighth of it
SIGHTINGS_TO_COMPILE = 2  # a shape seen once (e.g. a rare any-order row count) is not worth a graph


def attention_windows(capacity: int, count: int = WINDOWS) -> list[int]:
    """The cache widths a call attends, ascending: capacity / 2^k for k < count, rounded up to a
    multiple of 16 (at most the capacity). A call on `committed` rows attends the smallest
    compiled window that holds committed + its rows: at most twice the columns it needs (the
    capacity when it needs more than half), not the whole capacity."""
    return sorted({min(capacity, -(-capacity // 2**k // 16) * 16) for k in range(count)} - {0})


def static_capacity(longest_prompt: int, max_new_tokens: int, largest_call_rows: int) -> int:
    """Cache rows the static path needs for a job: the longest prompt, the output cap and the
    schedule's largest call (`Decoder.largest_call_rows`; a call starts on at most
    prompt + max_new_tokens - 1 committed rows)."""
    return longest_prompt + max_new_tokens + largest_call_rows


def check_full_attention(config) -> None:
    """The static path's caches hold every row of every layer: it needs full-attention layers."""
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise PackedSSError(
            f"the static call path needs full-attention layers; this backbone has {sorted(kinds)} "
            "(run it with model.compile=none)"
        )


class _Inputs:
    """The inputs of the calls of one row count R, written in place: token ids and position ids
    (1, R), and the additive mask (1, 1, R, capacity). Persistent tensors keep every call of the
    shape on its one graph (CUDA graphs read them in place).

    Mask invariant between calls: columns < `zeros` are 0, columns in [zeros, dirty) may hold an
    old call's rule, columns >= dirty hold the minimum."""

    def __init__(self, rows: int, capacity: int, dtype: torch.dtype, device: torch.device):
        self.rows = rows
        self.minimum = torch.finfo(dtype).min
        self.tokens = torch.zeros((1, rows), dtype=torch.long, device=device)
        self.positions = torch.zeros((1, rows), dtype=torch.long, device=device)
        self.mask = aligned_full(rows, capacity, self.minimum, dtype, device)
        self.grid = self.mask[0, 0]
        self.zeros = 0
        self.dirty = 0
        for tensor in (self.tokens, self.positions, self.mask):
            torch._dynamo.mark_static_address(tensor)

    def fill(self, committed: int, tokens: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor) -> tuple:
        """The inputs of a call of these tokens and positions on `committed` cache rows, whose own
        rule is `bias` (R, R)."""
        self.tokens[0].copy_(tokens)
        self.positions[0].copy_(positions)
        if committed < self.zeros:  # the cache was reset or shrank: mask what is no longer committed
            self.grid[:, committed : self.dirty].fill_(self.minimum)
            self.zeros = self.dirty = committed
        elif committed > self.zeros:
            self.grid[:, self.zeros : committed].zero_()
        end = committed + self.rows
        self.grid[:, committed:end].copy_(bias)
        if self.dirty > end:
            self.grid[:, end : self.dirty].fill_(self.minimum)
        self.zeros, self.dirty = committed, end
        return self.tokens, self.positions, self.mask


class GraphAdmission:
    """Which call shapes get graphs, for a static path with `compiling`, `max_graphs`, `windows`,
    `_graphs` ((rows, lora) -> its compiled windows) and `_sightings` ((rows, lora) -> calls seen)."""

    def _admit(self, key: tuple[int, bool], needed: int) -> bool:
        """Whether to compile `key`'s graphs now, one per window of at least `needed` columns: the
        warm-up is open, the shape was seen before and the bound allows another shape."""
        if not self.compiling or len(self._graphs) >= self.max_graphs:
            return False
        self._sightings[key] = self._sightings.get(key, 0) + 1
        if self._sightings[key] < SIGHTINGS_TO_COMPILE:
            return False
        self._graphs[key] = [w for w in self.windows if w >= needed]
        log.info("compiling the %s call%s (mode=%s)", self.shape_name(key[0]), " with LoRA" if key[1] else "", self.mode)
        return True

    def shape_name(self, rows: int) -> str:
        return f"{rows}-row"


class StaticCalls(GraphAdmission):
    """Executes calls for a BackboneAdapter on a StaticCache (see the module docstring)."""

    def __init__(self, backbone: PreTrainedModel, head: nn.Module, mode: str, capacity: int,
                 max_graphs: int = MAX_GRAPHS):  # fmt: skip
        if mode not in COMPILE_MODES or mode == "none":
            raise PackedSSError(f"invalid compile mode {mode!r} for the static path; valid: {', '.join(COMPILE_MODES[1:])}")
        if capacity < 1:
            raise PackedSSError(f"invalid static cache capacity {capacity}; it must hold at least one row")
        config = backbone.config.get_text_config(decoder=True)
        check_full_attention(config)
        parameter = next(backbone.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        if mode == "reduce-overhead" and self.device.type != "cuda":
            log.warning("model.compile=reduce-overhead uses CUDA graphs, which need a GPU; on %s it runs as "
                        "model.compile=default", self.device.type)  # fmt: skip
            mode = "default"
        self.mode = mode
        self.backbone, self.head = backbone, head
        # Every call carries its window's mask: the cache slots past the committed rows are masked.
        self.kernel = mask_kernel(backbone)
        self.capacity = capacity
        self.max_graphs = max_graphs
        self.cache = StaticCache(config=config, max_cache_len=capacity)
        heads = config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.cache.early_initialization(1, heads, head_dim, self.dtype, self.device)
        self.windows = attention_windows(capacity)
        self._caches = {columns: self._window(config, columns) for columns in self.windows[:-1]}
        self._caches[capacity] = self.cache
        # The committed length as the graph reads it; copied into every cache layer by the forward.
        self._start = torch.zeros((), dtype=torch.long, device=self.device)
        torch._dynamo.mark_static_address(self._start)
        self.committed = 0
        self._shapes: dict[tuple[int, int], _Inputs] = {}  # (rows, window) -> its buffers
        self._sightings: dict[tuple[int, bool], int] = {}
        self._graphs: dict[tuple[int, bool], list[int]] = {}  # (rows, lora) -> its compiled windows, ascending
        self.compiling = True  # new shapes may be compiled (the untimed warm-up); see end_warmup
        self.compile_s: dict[str, float] = {}  # "R rows" (+ " lora") -> seconds compiling its windows
        self.calls = {"compiled": 0, "padded": 0, "eager": 0, "prefill": 0}
        self.window_calls = dict.fromkeys(self.windows, 0)  # compiled and padded calls per window
        # Every graph of every instance is a cache entry of the one `_forward` code object, which
        # dynamo bounds by recompile_limit (past it, it would silently run eagerly): make room.
        torch._dynamo.config.recompile_limit += max_graphs * len(self.windows)
        self._options = torch._inductor.list_mode_options(mode)
        if self.device.type == "cpu":
            # On a CPU the generated C++ wrapper launches the kernels without Python: about 0.08 ms
            # less per call on the tiny model (0.31 against 0.39 ms for one row, measured).
            self._options["cpp_wrapper"] = True
        self._compiled = torch.compile(self._forward, backend=self._inductor, dynamic=False, fullgraph=True)
        # (rows, lora, window) -> the compiled graph and the tensors it reads, called without dynamo
        # (see _run_compiled); _seen: the graph and tensors of a key's last call through dynamo.
        self._direct: dict[tuple[int, bool, int], tuple] = {}
        self._seen: dict[tuple[int, bool, int], tuple] = {}
        self._last_graph: tuple | None = None
        self.call_stats: dict[str, int] = {}  # the last timed call's, under CUDA graphs (see run)

    def _inductor(self, graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        """torch.compile's inductor backend with this path's options; every call of the compiled
        graph leaves the graph, its input tensors and its outputs in `_last_graph`."""
        # Imported here: inductor's compiler takes a second to import, which an eager job never needs.
        from torch._inductor.compile_fx import compile_fx

        compiled = compile_fx(graph, example_inputs, config_patches=self._options)

        def run(*args):
            outputs = compiled(*args)
            self._last_graph = (compiled, args, outputs)
            return outputs

        return run

    def _drain(self) -> None:
        """Waits for the device's queue, so that a host clock around a compile times the compile."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _window(self, config, columns: int) -> StaticCache:
        """A StaticCache over the first `columns` rows of every layer of the full cache (views: what
        a call writes through it is in the full cache) sharing its committed lengths."""
        window = StaticCache(config=config, max_cache_len=columns)
        for layer, full in zip(window.layers, self.cache.layers):
            layer.__dict__.update(full.__dict__)
            layer.max_cache_len = columns
            layer.keys, layer.values = full.keys[:, :, :columns], full.values[:, :, :columns]
            torch._dynamo.mark_static_address(layer.keys)
            torch._dynamo.mark_static_address(layer.values)
        return window

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                 read_from: int = 0) -> torch.Tensor:  # fmt: skip
        cache = self._caches[mask.shape[-1]]  # the mask's width is the window
        for layer in cache.layers:  # each layer writes the call's rows from the committed length
            layer.cumulative_length.copy_(self._start)
        out = self.backbone(input_ids=tokens, position_ids=positions, attention_mask=mask, cache=cache,
                            use_cache=True)  # fmt: skip
        return self.head(out.last_hidden_state[0, read_from:])

    def run(self, call: Call, bias: torch.Tensor, lora: bool) -> torch.Tensor:
        """Logits (R - call.read_from, V) of `call`, whose own rule as an additive (R, R) block is `bias`; `lora`:
        the proposal LoRA is switched on for some of its rows. The adapter checks the call order.
        A timed call under CUDA graphs leaves its graph replays and skips in `call_stats` (and
        fails when it compiled or recorded a graph: packedss.models.graphs)."""
        if self.mode != "reduce-overhead" or self.compiling:
            return self._run(call, bias, lora)
        before = graph_events().snapshot()
        logits = self._run(call, bias, lora)
        self.call_stats = timed_call_stats(before, call.rows)
        return logits

    def _run(self, call: Call, bias: torch.Tensor, lora: bool) -> torch.Tensor:
        rows = call.rows
        if call.read_from and self.committed:  # graphs return every row's logits: drop the context rows'
            return self.run(dataclasses.replace(call, read_from=0), bias, lora)[call.read_from :]
        if self.committed + rows > self.capacity:
            raise PackedSSError(
                f"the static cache holds {self.capacity} rows, but this call needs {self.committed + rows} "
                f"({self.committed} committed + {rows}); size it with static_capacity(longest prompt, "
                "max_new_tokens, the schedule's largest call), or use model.compile=none"
            )
        key = (rows, lora)
        needed = self.committed + rows
        if self.committed == 0:
            self.calls["prefill"] += 1
            mask = aligned_full(rows, self.capacity, torch.finfo(self.dtype).min, self.dtype, self.device)
            mask[0, 0, :, :rows] = bias
            return self._forward(call.tokens[None], call.positions[None], mask, call.read_from)
        if key in self._graphs:
            self.calls["compiled"] += 1
            window = self._compiled_window(key, needed)
            return self._run_compiled(key + (window,), self._inputs(call.tokens, call.positions, bias, window))
        if self._admit(key, needed):
            self._drain()
            started = time.perf_counter()
            try:
                # Every window compiled now gives the same logits (the columns it adds are masked);
                # the smallest one's are returned.
                for window in reversed(self._graphs[key]):
                    for _ in range(WARM_RUNS if self.mode == "reduce-overhead" else 1):
                        logits = self._run_compiled(key + (window,), self._inputs(call.tokens, call.positions, bias, window))
            except Exception as err:  # inductor and dynamo fail in many types
                raise PackedSSError(
                    f"model.compile={self.mode}: torch.compile failed on the {rows}-row call ({type(err).__name__}: "
                    f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}); on a CPU it needs a working C++ "
                    "compiler (e.g. apt-get install g++); model.compile=none runs the eager path"
                ) from err
            self._drain()
            self.compile_s[f"{rows} rows" + (" lora" if lora else "")] = time.perf_counter() - started
            self.calls["compiled"] += 1
            return logits
        padded = self._padded_rows(rows, lora)
        if padded is not None:
            self.calls["padded"] += 1
            return self._run_padded(call, bias, padded)
        self.calls["eager"] += 1
        window = min(w for w in self.windows if w >= needed)
        return self._forward(*self._inputs(call.tokens, call.positions, bias, window))

    def _compiled_window(self, key: tuple[int, bool], needed: int) -> int:
        """The smallest window compiled for `key` that holds `needed` columns (the capacity's is
        compiled for every key), counted in window_calls."""
        window = min(w for w in self._graphs[key] if w >= needed)
        self.window_calls[window] += 1
        return window

    def _inputs(self, tokens: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor, window: int) -> tuple:
        shape = (tokens.shape[0], window)
        inputs = self._shapes.get(shape)
        if inputs is None:
            inputs = self._shapes[shape] = _Inputs(shape[0], window, self.dtype, self.device)
        return inputs.fill(self.committed, tokens, positions, bias)

    def _padded_rows(self, rows: int, lora: bool) -> int | None:
        """The smallest compiled row count above `rows` that fits the cache (None: none does).
        Calls with the proposal LoRA on are not padded: its row selection has the call's rows."""
        if lora:
            return None
        larger = [r for r, with_lora in self._graphs if not with_lora and rows < r <= self.capacity - self.committed]
        return min(larger, default=None)

    def _run_padded(self, call: Call, bias: torch.Tensor, rows: int) -> torch.Tensor:
        """Run `call` on the graph of `rows` rows: the extra rows repeat its last token and position
        and see only themselves; no row of the call sees them, they are never committed, and their
        logits are dropped."""
        extra = rows - call.rows
        tokens = torch.cat([call.tokens, call.tokens[-1:].expand(extra)])
        positions = torch.cat([call.positions, call.positions[-1:].expand(extra)])
        rule = torch.full((rows, rows), torch.finfo(self.dtype).min, dtype=self.dtype, device=self.device)
        rule[: call.rows, : call.rows] = bias
        rule.diagonal()[call.rows :] = 0
        window = self._compiled_window((rows, False), self.committed + rows)
        return self._run_compiled((rows, False, window), self._inputs(tokens, positions, rule, window))[: call.rows]

    def _run_compiled(self, key: tuple[int, bool, int], inputs: tuple) -> torch.Tensor:
        """The logits of the graph of `key` (rows, lora, window) on `inputs` (its persistent buffers).

        Dynamo checks its guards on every call (about 0.1-0.2 ms on the tiny model on a CPU, as
        much as a third of a compiled call). Once two calls of a graph through dynamo passed it the
        very same tensors (the weights, the cache, the shape's buffers: every input of a graph
        without the proposal LoRA, whose row selection is a new tensor per call) and it returned
        only the logits, later calls of the graph skip dynamo and call it on those tensors."""
        if self.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        direct = self._direct.get(key)
        if direct is not None:
            graph, args = direct
            logits = graph(*args)[0]
        else:
            self._last_graph = None
            logits = self._compiled(*inputs)
            self._learn_direct(key, logits)
        # A CUDA graph's outputs are overwritten by its next replay: hand out a copy.
        return logits.clone() if self.mode == "reduce-overhead" else logits

    def _learn_direct(self, key: tuple[int, bool, int], logits: torch.Tensor) -> None:
        if self._last_graph is None:  # dynamo ran no compiled graph
            return
        graph, args, outputs = self._last_graph
        self._last_graph = None
        if len(outputs) != 1 or outputs[0] is not logits:
            return
        seen = self._seen.get(key)
        self._seen[key] = (graph, args)
        if seen is not None and seen[0] is graph and len(seen[1]) == len(args) and all(
            a is b for a, b in zip(seen[1], args)
        ):
            self._direct[key] = (graph, args)

    def commit(self, rows: int) -> None:
        """Keep the first `rows` rows of the last call: the next call writes after them."""
        if rows:
            self.committed += rows
            self._start.fill_(self.committed)

    def reset(self) -> None:
        self.committed = 0
        self._start.zero_()

    def end_warmup(self) -> dict[str, float]:
        """Close compilation: from now on the graphs compiled so far run, and a call that matches
        none of them (a new shape, or one that would fail their guards) runs eagerly instead of
        compiling. Returns the compile seconds per shape."""
        if self.compiling:
            self.compiling = False
            self._compiled = torch._dynamo.run(self._compiled)
        return dict(self.compile_s)


def enable_static(adapter, mode: str, capacity: int, max_graphs: int = MAX_GRAPHS):
    """Switch a BackboneAdapter (or subclass) to the static call path of `mode` with a cache of
    `capacity` rows (see static_capacity); mode "none" switches it back to eager DynamicCache
    calls. Returns the adapter. Compilation stays open until `end_warmup(adapter)`."""
    if mode not in COMPILE_MODES:
        raise PackedSSError(f"invalid model.compile={mode!r}; valid: {', '.join(COMPILE_MODES)}")
    adapter.static = None if mode == "none" else StaticCalls(adapter.backbone, adapter.head, mode, capacity, max_graphs)
    adapter.reset()
    return adapter


def static_twin(adapter, mode: str, capacity: int, max_graphs: int = MAX_GRAPHS):
    """A second adapter over the same weights with the static path on (`adapter` stays eager):
    eager and compiled calls side by side in one process."""
    return enable_static(adapter.twin(), mode, capacity, max_graphs)


def end_warmup(adapter) -> dict[str, float]:
    """Close compilation after the untimed warm-up: shapes first seen later run eagerly. Returns
    the seconds each compiled shape's first call took ({} on the eager path)."""
    static = getattr(adapter, "static", None)
    return {} if static is None else static.end_warmup()
