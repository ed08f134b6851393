"""Execute a call (packedss.decoding.calls.Call) on a transformers backbone plus a linear head.

One forward pass per call: attention fitted to the call's rule (packedss.models.attention: no mask
where the rule allows it, else an additive 4D mask over [KV cache + rows], which transformers
passes through unchanged), per-row position ids, and a DynamicCache that
holds the call's KV tentatively until the schedule commits a prefix of its rows (a crop). With the
static path on (packedss.models.static.enable_static), the same calls run on a StaticCache
through compiled fixed-shape graphs instead.
"""

from __future__ import annotations

import copy
import inspect
import weakref

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from packedss.decoding.calls import Call, Role, Rule
from packedss.errors import PackedSSError
from packedss.models.attention import ATTENTION, aligned_full, eager_kernel


CACHE_KEYWORD = "cache"  # the backbone forward's KV-cache keyword that every call path passes
SUPPORTED_TRANSFORMERS = "5.24"  # the release series whose backbones take CACHE_KEYWORD (pyproject.toml)


def check_backbone(backbone_class: type) -> None:
    """Refuses a backbone whose forward does not name CACHE_KEYWORD. Older transformers call it
    `past_key_values`; their forwards take `**kwargs`, so the cache would be swallowed without an
    error and every call would run on a fresh, empty cache: wrong outputs, silently."""
    parameters = inspect.signature(backbone_class.forward).parameters
    if CACHE_KEYWORD not in parameters:
        import transformers

        raise PackedSSError(
            f"transformers {transformers.__version__}: {backbone_class.__name__}.forward takes no "
            f"{CACHE_KEYWORD!r} keyword (its cache keyword: {'past_key_values' if 'past_key_values' in parameters else 'none'}), "
            f"so the KV cache would be ignored; install transformers~={SUPPORTED_TRANSFORMERS}.0 (pip install -e .)"
        )


class BackboneAdapter:
    """A dual-mode model seen through calls. The same network serves AR rows and draft rows;
    which rows are read as what is the schedule's business, not the adapter's.

    The adapter contract: the decoding core uses the CallModel members (`device`,
    `mask_token_id`, `call_stats`, `run`, `commit`, `reset`, `synchronize`); the runner uses
    `eos_token_ids`, `block_size` and `prompt_budget`; the static path
    (packedss.models.static) uses `backbone`, `head`, `static`, `proposal_lora`, `dtype`,
    `cached_rows` and `twin`. A family's adapter subclasses this class and overrides what its
    model does differently (SetDLM: `run` drops the oldest cache rows, `prompt_budget` its
    context). Nothing outside packedss.models reaches into `backbone`."""

    def __init__(
        self,
        backbone: PreTrainedModel,
        head: nn.Linear,
        mask_token_id: int,
        eos_token_ids: tuple[int, ...],
        block_size: int | None = None,
        name: str = "model",
    ):
        check_backbone(type(backbone))
        self.backbone = backbone.eval()
        self.head = head.eval()
        self.mask_token_id = int(mask_token_id)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.block_size = block_size  # the largest block the drafter was trained on (None: unknown)
        self.name = name
        self.device = next(backbone.parameters()).device
        self.dtype = next(backbone.parameters()).dtype
        self.cache = DynamicCache(config=backbone.config)
        self.static = None  # a packedss.models.static.StaticCalls when the static path is on
        self.proposal_lora = None  # set by packedss.models.lora.attach_proposal_lora
        self._pending_rows: int | None = None
        # Per-call statistics of the last call, read by the decoder's call meter (empty: none).
        self.call_stats: dict[str, int | str] = {}
        # The device type whose kernel choices the eager calls make (attention.eager_kernel); the
        # tests set "cuda" on a CPU to run CUDA's choices there.
        self.attention_device = self.device.type
        # id(attend) -> its additive (R, R) form; an entry lives exactly as long as its attend
        # tensor (the decoder's per-shape layouts live for the process, a prefill's for one call).
        self._biases: dict[int, torch.Tensor] = {}

    def twin(self) -> BackboneAdapter:
        """A second adapter of the same class over the same backbone, head and proposal LoRA, with
        its own (eager, empty) cache: two call paths side by side on one set of weights."""
        other = copy.copy(self)
        other.cache = DynamicCache(config=self.backbone.config)
        other.static = None
        other.call_stats = {}
        other._pending_rows = None
        other._biases = {}
        return other

    def prompt_budget(self, max_new_tokens: int, call_rows: int) -> int | None:
        """The most prompt tokens a response can take within the positions the model was trained
        on: prompt + max_new_tokens must fit `max_position_embeddings`, whatever the schedule
        (`call_rows`, the model's reserve for a call, is for a model with a hard context). A call
        reaching past them holds only rows of tokens past the output cap, which are never emitted
        (rotary positions extend past the trained ones). None: the backbone states no limit."""
        positions = getattr(self.backbone.config, "max_position_embeddings", None)
        return None if positions is None else positions - max_new_tokens

    @property
    def cached_rows(self) -> int:
        return self.cache.get_seq_length() if self.static is None else self.static.committed

    def _attend_bias(self, attend: torch.Tensor) -> torch.Tensor:
        """The call's own rule as an additive (R, R) block, cached per attend tensor (which
        must not be written to after it was run; the decoder's layouts never are)."""
        key = id(attend)
        bias = self._biases.get(key)
        if bias is None:
            bias = torch.zeros(attend.shape, dtype=self.dtype, device=self.device)
            bias.masked_fill_(~attend.to(self.device), torch.finfo(self.dtype).min)
            self._biases[key] = bias
            weakref.finalize(attend, self._biases.pop, key, None)
        return bias

    def additive_mask(self, call: Call) -> torch.Tensor:
        """(1, 1, R, C + R): 0 where a row may attend, the dtype's minimum elsewhere. Every row
        sees the whole cache, so only the last R columns depend on the call. Its rows are aligned
        (packedss.models.attention.aligned_full)."""
        return self._additive_mask(call.rows, call.attend)

    def _additive_mask(self, rows: int, attend: torch.Tensor) -> torch.Tensor:
        cached = self.cached_rows
        mask = aligned_full(rows, cached + rows, 0.0, self.dtype, self.device)
        mask[0, 0, :, cached:] = self._attend_bias(attend)
        return mask

    def attention_inputs(self, call: Call) -> tuple[torch.Tensor | None, Rule | None, str]:
        """(attention_mask, attention_rule, kernel name) of an eager call (docs/models.md §2): no
        mask where the call's kernel needs none, else the additive mask. A backbone that runs
        another attention implementation gets the additive mask."""
        implementation = self.backbone.config._attn_implementation
        if implementation != ATTENTION:
            return self.additive_mask(call), None, f"transformers-{implementation}"
        return self.own_attention(call.rule, call.rows, call.attend)

    def own_attention(self, rule: Rule, rows: int, attend: torch.Tensor) -> tuple[torch.Tensor | None, Rule | None, str]:
        """attention_inputs of a call of `rule`, `rows` and `attend` over this adapter's cache, on
        the packedss attention: also each request's own attention in a batched call
        (packedss.models.batched)."""
        kernel = eager_kernel(rule, rows, self.cached_rows, self.attention_device)
        if kernel == "sdpa-mask":
            return self._additive_mask(rows, attend), None, kernel
        return None, Rule.FULL if kernel == "sdpa" else Rule.CAUSAL, kernel

    def before_call(self, call: Call) -> None:
        """What the family's model does to its cache before a call (SetDLM: drop the oldest rows);
        also run per request by the batched path (packedss.models.batched)."""
        if self._pending_rows is not None:
            raise RuntimeError("commit() the previous call before running the next one")

    def after_call(self, call: Call, logits: torch.Tensor) -> torch.Tensor:
        """The call's logits as the family's model returns them (SetDLM: the mask token is never
        predicted); marks the call's rows pending until `commit`."""
        self._pending_rows = call.rows
        # Verification and proposals read probabilities: never in a half-precision dtype.
        return logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits

    @torch.inference_mode()
    def run(self, call: Call) -> torch.Tensor:
        self.before_call(call)
        lora_rows = None
        selected = 0
        stats = {}
        if self.proposal_lora is not None:
            lora_rows = call.roles == int(Role.DRAFT)
            selected, evaluated = self.proposal_lora.select(lora_rows, call.draft_rows)
            stats = {"lora_rows_selected": selected, "lora_rows_evaluated": evaluated}
        try:
            if self.static is not None:
                logits = self.static.run(call, self._attend_bias(call.attend), lora=selected > 0)
                stats |= self.static.call_stats | {"attention": self.static.kernel}
            else:
                mask, rule, kernel = self.attention_inputs(call)
                out = self.backbone(
                    input_ids=call.tokens[None],
                    position_ids=call.positions[None],
                    attention_mask=mask,
                    attention_rule=rule,
                    attention_device=self.attention_device,
                    cache=self.cache,
                    use_cache=True,
                )
                logits = self.head(out.last_hidden_state[0, call.read_from :])
                stats["attention"] = kernel
            self.call_stats = stats
        finally:
            if lora_rows is not None:
                self.proposal_lora.select(None)
        return self.after_call(call, logits)

    def commit(self, rows: int) -> None:
        if self._pending_rows is None:
            raise RuntimeError("commit() without a call to commit")
        if not 0 <= rows <= self._pending_rows:
            raise ValueError(f"cannot commit {rows} rows of a call of {self._pending_rows}")
        dropped = self._pending_rows - rows
        if self.static is not None:
            self.static.commit(rows)
        elif dropped:
            self.cache.crop(-dropped)
        self._pending_rows = None

    def reset(self) -> None:
        if self.static is not None:
            self.static.reset()
        else:
            self.cache = DynamicCache(config=self.backbone.config)
        self._pending_rows = None

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
