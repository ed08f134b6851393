"""A cost twin: one model decides every token, a second model of another shape pays for the calls.

The tiny trained models accept drafts like a trained model does, but their calls cost what a
2M-parameter network costs (per-op overhead, weights in cache). A multi-GB model's calls cost
what reading its weights costs. `CostTwin` joins the two: every call the decoder makes (the
prefill, each run, commit and reset, with the same rows, positions and attention rule) runs on
the decoding model, whose logits are returned, and again on the cost model, whose time is the
call's model time (`charged_s`, read by packedss.decoding.trace.Meter, which also leaves the
decoding model's time out of the wall time). Outputs, NFE and acceptance are the decoding
model's; model time and wall time are those of a decoder driving the cost model.

The cost model has random weights (a call's time does not depend on their values) of a named
shape (SHAPES: the Ministral-3 text backbones of Nemotron-Labs-Diffusion, our reading, and the
Qwen3 shape of SDAR-8B) or of a config.json, optionally cut to its first `layers` layers, in any
dtype and on any device. It is always a Ministral3 backbone of that shape.
`cost_spec` checks all of this before anything is loaded.

Whether a cost twin shows the memory-bound regime depends on the machine: on a core whose
arithmetic cannot hide under the weight stream (AVX2 without AVX-512, say), a call of more rows
costs more. `row_scaling` measures it before the timed decodes: the cost model's call of 2B rows
against its call of B rows (B = W + 1: Packed-SS's call against Linear-SS's), and the job warns
in one line, and its records say (`cost_row_scaling`), when 2B rows cost more than
MEMORY_BOUND_RATIO times B rows (docs/models.md §10).
"""

from __future__ import annotations

import inspect
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import Ministral3Config

from packedss.decoding.calls import Call, causal_segment, pack
from packedss.errors import PackedSSError
from packedss.models.adapter import BackboneAdapter
from packedss.models.attention import ATTENTION
from packedss.models.checkpoint import DTYPES, default_dtype, read_config, resolve_dtype

# The named shapes' RoPE unless a shape names its own: the YaRN of the Ministral-3 3B and 8B checkpoints.
_ROPE = {"rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 16.0, "original_max_position_embeddings": 16384,
         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}  # fmt: skip
SHAPES = {
    # The shipped tiny model (scripts/train_tiny.py defaults).
    "tiny": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=48, vocab_size=1024),
    # Ministral-3 3B / 8B text backbones (Nemotron-Labs-Diffusion-3B / -8B).
    "nemotron3b": dict(hidden_size=3072, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=128, vocab_size=131072),
    "nemotron8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=34, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=128, vocab_size=131072),
    # SDAR-8B (JetLM/SDAR-8B-Chat: Qwen3-8B's shape, default RoPE at theta 1e6) as a Ministral3 backbone.
    # Qwen3's per-head RMSNorm of q and k (q_norm, k_norm: 2 x 128 weights per layer) has no
    # counterpart there, so the twin leaves it out: elementwise work on the heads, a few percent of
    # a call at most next to its products (our reading). llama_4_scaling_beta 0: Ministral3's
    # position scaling of the queries is 1 (Qwen3 has none).
    "sdar8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=128, vocab_size=151936,
                   rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                                    "original_max_position_embeddings": 16384, "llama_4_scaling_beta": 0.0}),
    # A toy shape for the benchmarks' own tests.
    "test": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, vocab_size=64),
}  # fmt: skip
SHAPE_CONTEXT = 16384  # max_position_embeddings of a named shape


def shape_config(shape: str | None, config: str | None = None, layers: int | None = None) -> dict:
    """config.json-style dict of a backbone: a named shape, or a checkpoint's config.json
    (a directory or the file), cut to its first `layers` layers when given."""
    if config:
        out = dict(read_config(config, f"config {config}"))
        out = dict(out.get("text_config", out), mask_token_id=out.get("mask_token_id", 3))
    elif shape in SHAPES:
        fields = dict(SHAPES[shape])
        rope = dict(fields.pop("rope_parameters", _ROPE))
        out = dict(fields, max_position_embeddings=SHAPE_CONTEXT, rope_parameters=rope,
                   rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                   mask_token_id=3)  # fmt: skip
    else:
        raise PackedSSError(f"unknown shape {shape!r}; valid: {', '.join(SHAPES)}, or a directory holding a config.json")
    total = int(out["num_hidden_layers"])
    if layers is not None:
        if not 1 <= layers <= total:
            raise PackedSSError(f"invalid layer count {layers} for shape {config or shape}; valid: 1..{total}")
        out["num_hidden_layers"] = layers
    return out


@strict  # transformers' configs validate (RoPE included) through huggingface_hub's strict dataclasses
class ShapeConfig(Ministral3Config):
    """Ministral3Config of a cost model. Ministral3's attention scaling reads
    `original_max_position_embeddings` from `rope_parameters` under every RoPE type, and the
    Ministral-3 checkpoints (the tiny ones too) carry it under the default type, where
    transformers 5.24 does not list it and warns "Unrecognized keys in `rope_parameters`". Here
    the default type expects it; any other stray key is still reported."""

    def _validate_default_rope_parameters(self, rope_parameters, ignore_keys=None) -> None:
        read_by_attention = set(ignore_keys or ()) | {"original_max_position_embeddings"}
        super()._validate_default_rope_parameters(rope_parameters, ignore_keys=read_by_attention)


_SHAPE_FIELDS = set(inspect.signature(Ministral3Config.__init__).parameters) - {"self", "kwargs"}


def random_adapter(config: dict, device: torch.device, dtype: torch.dtype, attn: str = ATTENTION,
                   vocab_at_least: int = 0, mask_token_id: int | None = None,
                   eos_token_ids: tuple[int, ...] = (), seed: int = 0, name: str = "random") -> BackboneAdapter:  # fmt: skip
    """A BackboneAdapter over a randomly initialised Ministral3 backbone + head of this shape."""
    from transformers import Ministral3Model

    text = dict(config.get("text_config", config))
    text["vocab_size"] = max(int(text.get("vocab_size", 0)), vocab_at_least)
    cfg = ShapeConfig(**{key: value for key, value in text.items() if key in _SHAPE_FIELDS})
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    with torch.device(device), default_dtype(dtype), torch.no_grad():
        backbone = Ministral3Model(cfg)
        head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    mask = mask_token_id if mask_token_id is not None else int(config.get("mask_token_id", text.get("mask_token_id", 3)))
    return BackboneAdapter(backbone, head, mask_token_id=mask, eos_token_ids=eos_token_ids, block_size=None, name=name)


def parameter_count(config: dict, vocab_at_least: int = 0) -> int:
    """Parameters of the backbone + head that `random_adapter` builds for `config` (no bias terms,
    untied head)."""
    c = config.get("text_config", config)
    hidden, inner, layers = int(c["hidden_size"]), int(c["intermediate_size"]), int(c["num_hidden_layers"])
    heads, kv_heads = int(c["num_attention_heads"]), int(c.get("num_key_value_heads") or c["num_attention_heads"])
    head_dim = int(c.get("head_dim") or hidden // heads)
    vocab = max(int(c["vocab_size"]), vocab_at_least)
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    per_layer = attention + 3 * hidden * inner + 2 * hidden
    return layers * per_layer + hidden + 2 * vocab * hidden


def available_bytes(device: torch.device) -> int:
    """Memory a new model may take on `device`: free device memory on CUDA; on the host the
    smaller of MemAvailable and what the cgroup limit leaves."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except OSError:
        pass
    if free is None:
        import os

        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            free = min(free, int(limit) - used)
    except (OSError, ValueError):
        pass
    return free


@dataclass(frozen=True)
class CostSpec:
    """A checked cost model: its shape (a name or a config directory), layers, dtype and device."""

    shape: str
    layers: int | None
    dtype: str
    device: str
    config: dict
    params: int

    @property
    def label(self) -> str:
        """E.g. `nemotron3b:6L:bfloat16:cpu` (a config directory is named by its path)."""
        layers = int(self.config["num_hidden_layers"])
        return f"{self.shape}:{layers}L:{self.dtype}:{self.device}"

    @property
    def context(self) -> int:
        return int(self.config.get("max_position_embeddings") or 0)

    @property
    def size(self) -> str:
        """The parameter count as people write it: 2.02B, 0.41M."""
        return f"{self.params / 1e9:.2f}B" if self.params >= 10**8 else f"{self.params / 1e6:.2f}M"

    @property
    def bytes(self) -> int:
        return self.params * torch.empty((), dtype=resolve_dtype(self.dtype)).element_size()

    def check_context(self, needed: int) -> None:
        if self.context and self.context < needed:
            raise PackedSSError(
                f"cost model {self.label} holds {self.context} positions, but this run needs {needed} "
                "(longest prompt + max_new_tokens + the largest call); lower max_new_tokens or pick a longer shape"
            )


def cost_spec(shape: str, layers: int | None, dtype: str, device: torch.device, vocab_at_least: int = 0) -> CostSpec:
    """Check a cost model before anything is loaded: a known shape (or a directory with a
    config.json), a layer count in range, a dtype, and weights that fit the device's free memory
    (estimated: parameters x bytes per element). Raises PackedSSError."""
    directory = Path(shape).expanduser()
    is_dir = shape not in SHAPES and directory.is_dir()
    config = shape_config(None if is_dir else shape, str(directory) if is_dir else None, layers)
    if dtype not in DTYPES:
        raise PackedSSError(f"invalid cost dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    params = parameter_count(config, vocab_at_least)
    spec = CostSpec(shape=str(directory) if is_dir else shape, layers=layers, dtype=dtype, device=device.type,
                    config=config, params=params)  # fmt: skip
    free = available_bytes(device)
    if spec.bytes > free:
        raise PackedSSError(
            f"cost model {spec.label} needs about {spec.bytes / 2**30:.1f} GiB ({spec.size} parameters), "
            f"but {device.type} has {max(free, 0) / 2**30:.1f} GiB free; cut it with fewer layers or a smaller dtype"
        )
    return spec


def build_cost_model(spec: CostSpec, model) -> BackboneAdapter:
    """The random-weight cost model of `spec` for decoding model `model` (its vocabulary at least
    the decoding model's, so that every token id of a call exists)."""
    vocab = int(model.head.out_features) if hasattr(model, "head") else 0
    return random_adapter(spec.config, torch.device(spec.device), resolve_dtype(spec.dtype), vocab_at_least=vocab,
                          mask_token_id=model.mask_token_id, name=f"cost-{spec.label}")  # fmt: skip


def charged_seconds(cost, call) -> float:
    """The seconds the cost model takes to run `call`, to its synchronize: what a cost twin charges
    (the call's move to the cost device and the deciding model's run are left out)."""
    started = time.perf_counter()
    cost.run(call)
    cost.synchronize()
    return time.perf_counter() - started


class CostTwin:
    """A CallModel over two models: `model` decides (its logits are returned), `cost` is timed.
    Every run, commit and reset goes to both, in that order; `charged_s` is the last call's time
    on `cost` (host clock around its run and a synchronize). A call for a cost model on another
    device is copied there, its roles and rule once per layout."""

    def __init__(self, model, cost, label: str):
        self.model, self.cost, self.label = model, cost, label
        self.device = model.device
        self.mask_token_id = model.mask_token_id
        self.eos_token_ids = getattr(model, "eos_token_ids", ())
        self.block_size = getattr(model, "block_size", None)
        self.name = getattr(model, "name", "model")
        self.charged_s = 0.0
        self._layouts: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def call_stats(self) -> dict:
        """The decoding model's statistics, with the attention kernel of the timed (cost) model."""
        timed = getattr(self.cost, "call_stats", {})
        return self.model.call_stats | ({"attention": timed["attention"]} if "attention" in timed else {})

    @property
    def static(self):
        """The cost model's static path (its call counts are the timed ones), or None."""
        return getattr(self.cost, "static", None)

    def cost_call(self, call: Call) -> Call:
        """The call as the cost model runs it (on its device)."""
        device = self.cost.device
        if call.tokens.device == device:
            return call
        key = id(call.attend)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = (call.roles.to(device), call.attend.to(device))
            weakref.finalize(call.attend, self._layouts.pop, key, None)
        return Call(tokens=call.tokens.to(device), positions=call.positions.to(device), roles=layout[0],
                    attend=layout[1], useful=call.useful, rule=call.rule)  # fmt: skip

    def run(self, call: Call) -> torch.Tensor:
        logits = self.model.run(call)
        self.model.synchronize()
        self.charged_s = charged_seconds(self.cost, self.cost_call(call))
        return logits

    def commit(self, rows: int) -> None:
        self.model.commit(rows)
        self.cost.commit(rows)

    def reset(self) -> None:
        self.model.reset()
        self.cost.reset()

    def synchronize(self) -> None:
        self.model.synchronize()

    def enable_static(self, mode: str, capacity: int) -> CostTwin:
        """Both models on the static call path of `mode` with caches of `capacity` rows."""
        from packedss.models.static import enable_static

        enable_static(self.model, mode, capacity)
        enable_static(self.cost, mode, capacity)
        return self

    def end_warmup(self) -> dict[str, float]:
        """Close compilation on both models; the cost model's compile seconds per shape."""
        from packedss.models.static import end_warmup

        end_warmup(self.model)
        return end_warmup(self.cost)


# The memory-bound regime: a call of 2B rows costs at most this many times a call of B rows (on a
# GPU about 1.0; the arithmetic of a few rows hides under the weight stream).
MEMORY_BOUND_RATIO = 1.25
ROW_SCALING_ROUNDS = 2  # calls of each size, alternated; the fastest of each counts


@dataclass(frozen=True)
class RowScaling:
    """The cost model's time for a call of `rows` (B) rows and for one of 2B rows, on this machine."""

    rows: int
    seconds: float
    double_seconds: float

    @property
    def ratio(self) -> float:
        return self.double_seconds / self.seconds

    @property
    def memory_bound(self) -> bool:
        return self.ratio <= MEMORY_BOUND_RATIO

    def record_fields(self) -> dict:
        return {"cost_row_scaling": {"rows": self.rows, "ratio": round(self.ratio, 3), "seconds": round(self.seconds, 6),
                                     "double_seconds": round(self.double_seconds, 6),
                                     "memory_bound_at_most": MEMORY_BOUND_RATIO, "memory_bound": self.memory_bound}}  # fmt: skip

    def warning(self, label: str) -> str | None:
        """One line when 2B rows cost more than MEMORY_BOUND_RATIO x B rows; None when they do not."""
        if self.memory_bound:
            return None
        return (f"warning: cost twin {label}: a call of {2 * self.rows} rows took {self.ratio:.2f}x a call of {self.rows} "
                f"rows on this machine (the memory-bound regime: at most {MEMORY_BOUND_RATIO:g}x), so its times are not "
                "that regime's and schedules with larger calls come out slower than there (docs/models.md §10)")  # fmt: skip


def row_scaling(cost, rows: int, timer: Callable | None = None, rounds: int = ROW_SCALING_ROUNDS) -> RowScaling:
    """Time causal calls of `rows` and 2 x `rows` rows on an eager twin of the cost model (its own
    empty cache, the same weights), alternated `rounds` times; the fastest of each size. `timer`
    (default charged_seconds) times one call."""
    timer = timer or charged_seconds
    probe = cost.twin()
    calls = {size: pack([causal_segment(torch.arange(size, device=probe.device) % int(probe.head.out_features), 0)])
             for size in (rows, 2 * rows)}  # fmt: skip
    fastest = {size: float("inf") for size in calls}
    for _ in range(rounds):
        for size, call in calls.items():
            probe.reset()
            fastest[size] = min(fastest[size], timer(probe, call))
    probe.reset()
    return RowScaling(rows, fastest[rows], fastest[2 * rows])


def warned(scaling: RowScaling, label: str) -> RowScaling:
    """`scaling`, after its one warning line (RowScaling.warning) on stderr, if any."""
    if warning := scaling.warning(label):
        print(warning, file=sys.stderr, flush=True)
    return scaling


# (cost model label, B rows, intra-op threads) -> its row scaling, measured once in a process:
# a sweep's later jobs of the same twin and width reuse the first one's.
MEASURED_ROW_SCALING: dict[tuple[str, int, int], RowScaling] = {}


def row_scaling_fields(model, rows: int, timer: Callable | None = None) -> dict:
    """For a cost twin: its cost model's row scaling (`row_scaling`, measured once per label, rows
    and threads in this process) as the records' field, with its one warning line on stderr when
    it is not the memory-bound regime; {} for any other model."""
    if not isinstance(model, CostTwin):
        return {}
    key = (model.label, rows, torch.get_num_threads())
    if key not in MEASURED_ROW_SCALING:
        MEASURED_ROW_SCALING[key] = row_scaling(model.cost, rows, timer)
    return warned(MEASURED_ROW_SCALING[key], model.label).record_fields()


def row_scaling_summary(cost, label: str, widths: list[int], timer: Callable | None = None) -> str:
    """' 2B/B-row calls: W=8 1.11x, ...' of a cost model at each width (B = W + 1), each warning line
    (RowScaling.warning) printed on stderr: what a benchmark's header says of its twin."""
    parts = []
    for width in widths:
        scaling = warned(row_scaling(cost, width + 1, timer), label)
        parts.append(f"W={width} {scaling.ratio:.2f}x")
    return f" 2B/B-row calls: {', '.join(parts)} (memory-bound: at most {MEMORY_BOUND_RATIO:g}x)"
