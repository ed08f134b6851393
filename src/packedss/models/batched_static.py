"""The static path at concurrency C > 1: C requests' decode calls in one compiled fixed-shape graph.

As packedss.models.static does for one request, with a batch dimension of C:

- every layer's KV cache is one (C, kv heads, capacity, head dim) tensor, slot i's rows in batch
  row i; each slot's committed length lives in a device tensor `starts` (C,), and a call writes
  each slot's rows after its own committed length (a scatter), so requests of different lengths
  share one graph;
- a batched decode call has the fixed shape (C, R): a request's call of fewer rows than R is
  padded with rows that see only themselves (never read, never committed), and a slot without a
  call in the round (empty, or its request in its prefill) gets R such rows. The rows of the
  forward pass, padding included, are the call's `call_batch_rows`;
- the graphs: one per row count R (and the proposal LoRA on or off) seen twice while the warm-up
  is open, at most `max_graphs`, each compiled for every attention window (attention_windows)
  that holds the longest committed cache plus R; a round's calls run on the graph of their
  largest row count, else on the smallest compiled graph with more rows, else eagerly through
  the same forward;
- a prefill runs eagerly on its own slot (its length varies with the prompt), after the round's
  batched decode call, so a round holding a prefill makes two forward passes (their time is one
  batched call's, shared by rows).
"""

from __future__ import annotations

import logging
import time

import torch

from packedss.decoding.calls import Call, Role
from packedss.decoding.engine import CallBatch
from packedss.errors import PackedSSError
from packedss.models.attention import mask_kernel
from packedss.models.graphs import WARM_RUNS, graph_events, timed_call_stats
from packedss.models.slots import SlotAdapters
from packedss.models.checkpoint import COMPILE_MODES
from packedss.models.static import MAX_GRAPHS, GraphAdmission, attention_windows, check_full_attention

log = logging.getLogger(__name__)


class _SlotCaches:
    """The cache object of one forward pass: a layer's update writes each slot's rows after its
    committed length and returns the first `window` columns of every slot."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], starts: torch.Tensor, window: int):
        self.keys, self.values, self.starts, self.window = keys, values, starts, window

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        rows = key_states.shape[2]
        index = self.starts[:, None] + torch.arange(rows, device=self.starts.device)[None, :]
        index = index[:, None, :, None].expand_as(key_states)
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.scatter_(2, index, key_states)
        values.scatter_(2, index, value_states)
        return keys[:, :, : self.window], values[:, :, : self.window]


class _SlotState:
    """What a slot's adapter (a twin of the job's) sees as its static path: its committed rows."""

    def __init__(self, batch: StaticBatch, slot: int):
        self.batch, self.slot = batch, slot

    @property
    def committed(self) -> int:
        return self.batch.committed[self.slot]

    def commit(self, rows: int) -> None:
        if rows:
            self.batch.committed[self.slot] += rows
            self.batch.starts[self.slot] = self.batch.committed[self.slot]

    def reset(self) -> None:
        self.batch.committed[self.slot] = 0
        self.batch.starts[self.slot] = 0


class StaticBatch(SlotAdapters, GraphAdmission):
    """A BatchExecutor (packedss.decoding.engine) of `slots` requests on static caches of
    `capacity` rows each, with compiled graphs of mode `mode` (see the module docstring)."""

    def __init__(self, adapter, slots: int, mode: str, capacity: int, max_graphs: int = MAX_GRAPHS):
        if mode not in COMPILE_MODES or mode == "none":
            raise PackedSSError(f"invalid compile mode {mode!r} for the static path; valid: {', '.join(COMPILE_MODES[1:])}")
        config = adapter.backbone.config.get_text_config(decoder=True)
        check_full_attention(config)
        self.adapter = adapter
        self.device, self.dtype = adapter.device, adapter.dtype
        self.mask_token_id = adapter.mask_token_id
        if mode == "reduce-overhead" and self.device.type != "cuda":
            log.warning("model.compile=reduce-overhead uses CUDA graphs, which need a GPU; on %s it runs as "
                        "model.compile=default", self.device.type)  # fmt: skip
            mode = "default"
        self.mode, self.capacity, self.max_graphs = mode, capacity, max_graphs
        self.kernel = mask_kernel(adapter.backbone)  # every call passes its (C, 1, R, window) mask
        self.slots = []
        for slot in range(slots):
            twin = adapter.twin()
            twin.static = _SlotState(self, slot)
            self.slots.append(twin)
        heads = config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (slots, heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(config.num_hidden_layers)]
        self.starts = torch.zeros(slots, dtype=torch.long, device=self.device)
        for tensor in (*self.keys, *self.values, self.starts):
            torch._dynamo.mark_static_address(tensor)
        self.committed = [0] * slots
        self.windows = attention_windows(capacity)
        self._caches = {window: _SlotCaches(self.keys, self.values, self.starts, window) for window in self.windows}
        self._buffers: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._graphs: dict[tuple[int, bool], list[int]] = {}  # (rows, lora) -> its compiled windows
        self._sightings: dict[tuple[int, bool], int] = {}
        self.compiling = True
        self.compile_s: dict[str, float] = {}
        self.calls = {"compiled": 0, "padded": 0, "eager": 0, "prefill": 0}
        self.charged_s: float | None = None
        torch._dynamo.config.recompile_limit += max_graphs * len(self.windows)
        options = torch._inductor.list_mode_options(mode)
        if self.device.type == "cpu":
            options["cpp_wrapper"] = True
        self._compiled = torch.compile(self._forward, options=options, dynamic=False, fullgraph=True)

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = self.adapter.backbone(input_ids=tokens, position_ids=positions, attention_mask=mask,
                                    cache=self._caches[mask.shape[-1]], use_cache=True)  # fmt: skip
        return self.adapter.head(out.last_hidden_state)

    @torch.inference_mode()
    def run(self, batch: CallBatch) -> torch.Tensor:
        """Every entry's call of `batch`: the decode calls in one (C, R) pass, then each prefill; the
        logits of their read rows, entry after entry."""
        items = [(entry.slot, batch.call(k)) for k, entry in enumerate(batch.entries)]
        for slot, call in items:
            self.slots[slot].before_call(call)
        decodes = [(slot, call) for slot, call in items if self.committed[slot]]
        logits: dict[int, torch.Tensor] = {}
        evaluated = 0
        lora = self.adapter.proposal_lora
        if decodes:
            before = graph_events().snapshot() if self.mode == "reduce-overhead" and not self.compiling else None
            out, rows = self._decode(decodes)
            evaluated += len(self.slots) * rows
            for index, (slot, call) in enumerate(decodes):
                logits[slot] = out[index]
            graph_stats = {} if before is None else timed_call_stats(before, len(self.slots) * rows)
        for slot, call in items:
            if not self.committed[slot]:
                logits[slot] = self._prefill(slot, call)
                evaluated += call.rows
        results = []
        for slot, call in items:
            own = self.slots[slot]
            stats = {"call_batch_rows": evaluated, "attention": self.kernel}
            if lora is not None:
                stats |= {"lora_rows_selected": call.draft_rows, "lora_rows_evaluated": call.rows if call.draft_rows else 0}
            if self.committed[slot] and decodes:
                stats |= graph_stats
            own.call_stats = stats
            results.append(own.after_call(call, logits[slot]))
        return torch.cat(results)

    def _decode(self, decodes: list[tuple[int, Call]]) -> tuple[list[torch.Tensor], int]:
        """The round's decode calls in one (C, R) forward pass; their logits and R."""
        rows = max(call.rows for _, call in decodes)
        lora = self.adapter.proposal_lora is not None and any(call.draft_rows for _, call in decodes)
        key = (rows, lora)
        longest = max(self.committed)
        if longest + rows > self.capacity:
            raise PackedSSError(
                f"the static cache holds {self.capacity} rows, but this call needs {longest + rows} ({longest} committed "
                f"+ {rows}); size it with static_capacity(longest prompt, max_new_tokens, the schedule's largest call)"
            )
        if key in self._graphs:
            self.calls["compiled"] += 1
            return self._run_graph(decodes, rows, lora, self._window(key, longest + rows)), rows
        if self._admit(key, longest + rows):
            self.adapter.synchronize()  # compile seconds are the compile's, not the queue's before it
            started = time.perf_counter()
            try:
                for window in reversed(self._graphs[key]):
                    for _ in range(WARM_RUNS if self.mode == "reduce-overhead" else 1):
                        logits = self._run_graph(decodes, rows, lora, window)
            except Exception as err:  # inductor and dynamo fail in many types
                raise PackedSSError(
                    f"model.compile={self.mode}: torch.compile failed on the batched {rows}-row call "
                    f"({type(err).__name__}); model.compile=none runs the eager path"
                ) from err
            self.adapter.synchronize()
            self.compile_s[f"{len(self.slots)}x{rows} rows" + (" lora" if lora else "")] = time.perf_counter() - started
            self.calls["compiled"] += 1
            return logits, rows
        larger = [r for r, with_lora in self._graphs if not with_lora and not lora and rows < r <= self.capacity - longest]
        if larger:
            self.calls["padded"] += 1
            padded = min(larger)
            return self._run_graph(decodes, padded, False, self._window((padded, False), longest + padded)), padded
        self.calls["eager"] += 1
        window = min(w for w in self.windows if w >= longest + rows)
        return self._run_graph(decodes, rows, lora, window, compiled=False), rows

    def _window(self, key: tuple[int, bool], needed: int) -> int:
        return min(w for w in self._graphs[key] if w >= needed)

    def shape_name(self, rows: int) -> str:
        return f"batched {len(self.slots)}x{rows}-row"

    def _run_graph(self, decodes, rows: int, lora: bool, window: int, compiled: bool = True) -> list[torch.Tensor]:
        tokens, positions, mask = self._fill(decodes, rows, window)
        proposal = self.adapter.proposal_lora
        if lora:
            drafts = torch.zeros(tokens.shape, dtype=torch.bool, device=self.device)
            for index, (slot, call) in enumerate(decodes):
                drafts[slot, : call.rows] = call.roles == int(Role.DRAFT)
            proposal.select(drafts, sum(call.draft_rows for _, call in decodes))
        try:
            if self.mode == "reduce-overhead" and compiled:
                torch.compiler.cudagraph_mark_step_begin()
            out = (self._compiled if compiled else self._forward)(tokens, positions, mask)
        finally:
            if lora:
                proposal.select(None)
        # A CUDA graph's outputs are overwritten by its next replay: hand out copies (run's cat).
        return [out[slot, call.read_from : call.rows] for slot, call in decodes]

    def _fill(self, decodes, rows: int, window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The (C, R) inputs of a decode round: each slot's call and its padding, whose rows see
        only themselves; slots without a call are all padding."""
        buffers = self._buffers.get((rows, window))
        if buffers is None:
            slots = len(self.slots)
            buffers = self._buffers[(rows, window)] = (
                torch.zeros((slots, rows), dtype=torch.long, device=self.device),
                torch.zeros((slots, rows), dtype=torch.long, device=self.device),
                torch.zeros((slots, 1, rows, window), dtype=self.dtype, device=self.device),
            )
            for tensor in buffers:
                torch._dynamo.mark_static_address(tensor)
        tokens, positions, mask = buffers
        minimum = torch.finfo(self.dtype).min
        tokens.fill_(self.mask_token_id)
        positions.zero_()
        mask.fill_(minimum)
        calls = dict(decodes)
        pad = torch.arange(rows, device=self.device)
        for slot in range(len(self.slots)):
            committed = self.committed[slot]
            call = calls.get(slot)
            own = 0 if call is None else call.rows
            if call is not None:
                tokens[slot, :own] = call.tokens
                positions[slot, :own] = call.positions
                positions[slot, own:] = call.positions[-1]
                mask[slot, 0, :own, :committed] = 0
                mask[slot, 0, :own, committed : committed + own] = self.slots[slot]._attend_bias(call.attend)
            mask[slot, 0, pad[own:], committed + pad[own:]] = 0
        return tokens, positions, mask

    def _prefill(self, slot: int, call: Call) -> torch.Tensor:
        """A request's first call, eagerly on its own slot's cache."""
        if call.rows > self.capacity:
            raise PackedSSError(
                f"the static cache holds {self.capacity} rows, but this prompt's call needs {call.rows}; size it with "
                "static_capacity(longest prompt, max_new_tokens, the schedule's largest call)"
            )
        self.calls["prefill"] += 1
        mask = torch.full((1, 1, call.rows, call.rows), torch.finfo(self.dtype).min, dtype=self.dtype, device=self.device)
        mask[0, 0] = self.slots[slot]._attend_bias(call.attend)
        cache = _SlotCaches([k[slot : slot + 1] for k in self.keys], [v[slot : slot + 1] for v in self.values],
                            self.starts[slot : slot + 1], call.rows)  # fmt: skip
        out = self.adapter.backbone(input_ids=call.tokens[None], position_ids=call.positions[None], attention_mask=mask,
                                    cache=cache, use_cache=True)  # fmt: skip
        return self.adapter.head(out.last_hidden_state[0, call.read_from :])

    def end_warmup(self) -> dict[str, float]:
        """Close compilation (see StaticCalls.end_warmup); the compile seconds per shape."""
        if self.compiling:
            self.compiling = False
            self._compiled = torch._dynamo.run(self._compiled)
        return dict(self.compile_s)
