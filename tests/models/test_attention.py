"""Attention fitted to each call (packedss.models.attention): every call kind of every schedule, on
the shipped tiny models in float32, gives the logits of the dense-mask path the adapters took before
(an additive (1, 1, R, C + R) mask through transformers' own SDPA), under a CPU's kernel choices,
under CUDA's (run on the CPU: the lower-right causal bias, K and V repeated under a mask) and on the
static path; the kernels are the ones docs/models.md §2 states, and nothing is compiled."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters as dynamo_counters
from torch.nn.attention.bias import CausalBias

from packedss.decoding import AnyOrderSettings, LTRSettings, Sampling, decode_anyorder, decode_ltr
from packedss.decoding.calls import Rule, block_segment, causal_segment, draft_block, layout_of, pack, pad_segment
from packedss.models import attention
from packedss.models.cost_twin import SHAPES, CostTwin, random_adapter
from packedss.models.nemotron import load_nemotron
from packedss.models.setdlm import load_setdlm
from packedss.models.static import end_warmup, enable_static, static_capacity

MODELS = Path(__file__).resolve().parents[2] / "assets" / "models"
PROMPTS = [[70, 81, 92, 43, 54, 65, 30, 31], list(range(100, 123))]
LTR_SCHEDULES = ["ar", "linear", "quadratic", "packed"]
SET_CASES = [("ar", "ltr"), ("linear", "confidence"), ("packed", "ltr"), ("quadratic", "confidence"), ("native", "ltr")]
TOLERANCE = 1e-4  # float32 logits of the tiny models are O(10)


class Compared:
    """A CallModel that runs every call on `fitted` (the adapter under test) and on `dense` (the
    same weights through transformers' SDPA with the dense mask), asserts their logits agree
    within TOLERANCE (SetDLM's -inf mask logit included), keeps the call kinds and kernels, and
    decides with the dense path's logits (so the decode is the one the dense path makes)."""

    def __init__(self, fitted, dense):
        self.fitted, self.dense = fitted, dense
        self.device, self.mask_token_id = dense.device, dense.mask_token_id
        self.eos_token_ids, self.block_size = dense.eos_token_ids, dense.block_size
        self.calls: list[tuple[Rule, int, int, str]] = []  # (rule, rows, cached rows before, kernel)

    @property
    def call_stats(self):
        return self.fitted.call_stats

    def run(self, call):
        if call.rule is Rule.CAUSAL:
            assert torch.equal(call.attend, torch.ones_like(call.attend).tril_())
        if call.rule is Rule.FULL:
            assert bool(call.attend.all())
        cached = self.dense.cached_rows
        fitted, dense = self.fitted.run(call), self.dense.run(call)
        assert self.dense.call_stats["attention"] == "transformers-sdpa"
        torch.testing.assert_close(fitted, dense, rtol=0.0, atol=TOLERANCE)
        self.calls.append((call.rule, call.rows, cached, self.fitted.call_stats["attention"]))
        return dense

    def commit(self, rows):
        self.fitted.commit(rows)
        self.dense.commit(rows)

    def reset(self):
        self.fitted.reset()
        self.dense.reset()

    def synchronize(self):
        pass


def _dense(adapter):
    adapter.backbone.config._attn_implementation = "sdpa"
    return adapter


def _ltr(fitted, dense, schedule, width):
    model = Compared(fitted, dense)
    settings = LTRSettings(schedule, width, 20, dense.eos_token_ids, Sampling(0.0, "rejection", None))
    decoded = [decode_ltr(model, prompt, settings) for prompt in PROMPTS]
    return model, decoded


def _set(fitted, dense, schedule, order, width=4):
    model = Compared(fitted, dense)
    settings = AnyOrderSettings(schedule, width, 16, dense.eos_token_ids, Sampling(0.0, "rejection", None), order=order)
    decoded = [decode_anyorder(model, prompt, settings) for prompt in PROMPTS]
    return model, decoded


def _sdpa_kernel(rule, rows, cached):
    """The kernel docs/models.md §2 gives an eager call on a CPU."""
    if rule is Rule.FULL or (rule is Rule.CAUSAL and rows == 1):
        return "sdpa"
    return "sdpa-causal" if rule is Rule.CAUSAL and cached == 0 else "sdpa-mask"


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Every SDPA call's key heads, query heads, mask, causal flag and enable_gqa."""
    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        seen.append((query.shape[1], key.shape[1], attn_mask, is_causal, enable_gqa))
        if isinstance(attn_mask, CausalBias):  # its dispatch compares the function with SDPA's own
            with monkeypatch.context() as inner:
                inner.setattr(F, "scaled_dot_product_attention", sdpa)
                return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa)
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa)  # fmt: skip

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return seen


def test_builders_state_their_rule():
    tokens = torch.tensor([5, 6, 7])
    assert pack([causal_segment(tokens, 4)]).rule is Rule.CAUSAL
    assert pack([block_segment(tokens, 4)]).rule is Rule.FULL
    assert pack([draft_block(tokens[0], 4, 3, 1)]).rule is Rule.FULL
    assert pack([pad_segment(3, 1, 4, tokens.device)]).rule is Rule.CUSTOM
    assert pack([causal_segment(tokens, 0), draft_block(tokens[-1], 2, 2, 1)]).rule is Rule.CUSTOM
    # `sees` may rewrite even one segment's block: the rule is then custom.
    assert pack([causal_segment(tokens, 0)], sees={(0, 0): torch.ones(3, 3, dtype=torch.bool)}).rule is Rule.CUSTOM
    layout = layout_of(pack([draft_block(tokens[0], 4, 3, 1)]))
    assert layout.rule is Rule.FULL and layout.call(tokens.repeat(2)[:4], torch.arange(4)).rule is Rule.FULL


@pytest.mark.parametrize("width", [4, 8])
@pytest.mark.parametrize("schedule", LTR_SCHEDULES)
def test_ltr_calls_on_sdpa_equal_the_dense_mask_path(schedule, width, sdpa_calls):
    fitted = load_nemotron(MODELS / "tiny")
    model, decoded = _ltr(fitted, _dense(load_nemotron(MODELS / "tiny")), schedule, width)
    assert model.calls
    kernels = [kernel for *_, kernel in model.calls]
    assert kernels == [_sdpa_kernel(rule, rows, cached) for rule, rows, cached, _ in model.calls]
    expected = {"ar": {"sdpa-causal", "sdpa"}, "linear": {"sdpa-causal", "sdpa", "sdpa-mask"},
                "quadratic": {"sdpa-mask"}, "packed": {"sdpa-mask"}}[schedule]  # fmt: skip
    assert set(kernels) == expected
    # The record's per-call list, one entry per call.
    assert [k for d in decoded for k in d.extra["attention"]] == kernels
    assert all(len(d.extra["attention"]) == d.nfe_total for d in decoded)
    # The dense path never passes enable_gqa with a mask (it repeats K and V): these are the fitted path's.
    fitted_sdpa = [s for s in sdpa_calls if s[4]]
    assert len(fitted_sdpa) == 4 * len(kernels)  # one per layer per call
    assert all(s[:2] == (4, 2) for s in fitted_sdpa)  # 4 query heads on 2 KV heads, not repeated
    for (_, _, mask, causal, _), kernel in zip(fitted_sdpa, [k for k in kernels for _ in range(4)]):
        if kernel == "sdpa":
            assert mask is None and not causal
        elif kernel == "sdpa-causal":
            assert mask is None and causal
        else:
            assert mask.dtype == torch.float32 and not causal and mask.stride(-2) % attention.MASK_ALIGNMENT == 0


@pytest.mark.parametrize("schedule,order", SET_CASES)
def test_anyorder_calls_on_sdpa_equal_the_dense_mask_path(schedule, order):
    fitted = load_setdlm(MODELS / "tiny-set")
    model, decoded = _set(fitted, _dense(load_setdlm(MODELS / "tiny-set")), schedule, order)
    assert model.calls
    assert [kernel for *_, kernel in model.calls] == [_sdpa_kernel(r, n, c) for r, n, c, _ in model.calls]
    assert {kernel for *_, kernel in model.calls[1:]} <= {"sdpa", "sdpa-mask"}
    assert all(len(d.extra["attention"]) == d.nfe_total for d in decoded)


def _cuda_choices(adapter):
    """The adapter with CUDA's kernel choices (attention.eager_kernel, attention.repeats_kv), run on the CPU."""
    adapter.attention_device = "cuda"
    return adapter


def _compilations() -> int:
    return sum(dynamo_counters["stats"].values()) + sum(dynamo_counters["inductor"].values())


def _check_cuda_sdpa_calls(sdpa_calls, kernels, layers):
    """Every SDPA call of the fitted path under CUDA's choices: masked ones on repeated K/V without
    enable_gqa (the fused kernels' form), unmasked ones on the grouped heads with enable_gqa."""
    assert len(sdpa_calls) == 2 * layers * len(kernels)  # each call: the fitted path's layers, then the dense path's
    fitted = [s for i, s in enumerate(sdpa_calls) if i % (2 * layers) < layers]
    for (query_heads, key_heads, mask, causal, gqa), kernel in zip(fitted, [k for k in kernels for _ in range(layers)]):
        if kernel == "sdpa-mask":
            assert (key_heads, gqa, causal) == (query_heads, False, False) and mask.dtype == torch.float32
        else:
            assert key_heads < query_heads and gqa
            assert (mask is None) != isinstance(mask, CausalBias) if kernel == "sdpa-causal" else mask is None


@pytest.mark.filterwarnings("ignore::UserWarning")  # a CPU has no lower-right causal kernel: torch says so
@pytest.mark.parametrize("schedule", LTR_SCHEDULES)
def test_ltr_calls_under_cuda_choices_equal_the_dense_mask_path_and_compile_nothing(schedule, sdpa_calls):
    fitted = _cuda_choices(load_nemotron(MODELS / "tiny"))
    dense = _dense(load_nemotron(MODELS / "tiny"))
    _ltr(fitted, dense, schedule, 8)  # the warm-up: the layouts and biases of every call shape
    sdpa_calls.clear()
    before = _compilations()
    model, _ = _ltr(fitted, dense, schedule, 8)
    assert _compilations() == before  # nothing compiled or recompiled across a multi-prompt decode
    kernels = [kernel for *_, kernel in model.calls]
    assert kernels == [attention.eager_kernel(rule, rows, cached, "cuda") for rule, rows, cached, _ in model.calls]
    expected = {"ar": {"sdpa-causal", "sdpa"}, "linear": {"sdpa-causal", "sdpa"}, "quadratic": {"sdpa-mask"},
                "packed": {"sdpa-mask"}}[schedule]  # fmt: skip
    assert set(kernels) == expected  # Linear-SS's verify over the cache: the lower-right causal bias, no mask
    _check_cuda_sdpa_calls(sdpa_calls, kernels, layers=4)


@pytest.mark.parametrize("schedule,order", SET_CASES)
def test_anyorder_calls_under_cuda_choices_equal_the_dense_mask_path_and_compile_nothing(schedule, order, sdpa_calls):
    fitted = _cuda_choices(load_setdlm(MODELS / "tiny-set"))
    dense = _dense(load_setdlm(MODELS / "tiny-set"))
    _set(fitted, dense, schedule, order)
    sdpa_calls.clear()
    before = _compilations()
    model, _ = _set(fitted, dense, schedule, order)
    assert _compilations() == before
    kernels = [kernel for *_, kernel in model.calls]
    assert kernels == [attention.eager_kernel(r, n, c, "cuda") for r, n, c, _ in model.calls]
    assert "sdpa-mask" in kernels
    _check_cuda_sdpa_calls(sdpa_calls, kernels, layers=fitted.backbone.config.num_hidden_layers)


def test_masked_calls_repeat_kv_on_cuda_only():
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(1, 4, 5, 8, generator=generator)
    key, value = (torch.randn(1, 2, 12, 8, generator=generator) for _ in range(2))
    allowed = torch.rand(5, 12, generator=generator) > 0.4
    allowed[:, 0] = True
    mask = torch.zeros(1, 1, 5, 12).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    for device_type in ("cpu", "cuda"):
        out, _ = attention.attention_forward(None, query, key, value, mask, attention_device=device_type)
        torch.testing.assert_close(out, _reference(query, key, value, allowed))
    assert attention.repeats_kv("cuda") and not attention.repeats_kv("cpu")


@pytest.mark.parametrize("schedule", ["linear", "packed"])
def test_static_path_calls_equal_the_dense_mask_path(schedule, sdpa_calls):
    width = 4
    largest = {"linear": width + 1, "packed": 2 * (width + 1)}[schedule]
    fitted = enable_static(load_nemotron(MODELS / "tiny"), "default", static_capacity(max(map(len, PROMPTS)), 20, largest))
    end_warmup(fitted)  # nothing compiled: every call runs eagerly on the static buffers
    model, _ = _ltr(fitted, _dense(load_nemotron(MODELS / "tiny")), schedule, width)
    assert model.calls
    assert {kernel for *_, kernel in model.calls} == {"sdpa-mask"}
    grouped = [s for s in sdpa_calls if s[:2] == (4, 2)]
    assert grouped and all(s[4] and s[2].stride(-2) % attention.MASK_ALIGNMENT == 0 for s in grouped)


def _reference(query, key, value, allowed):
    groups = query.shape[1] // key.shape[1]
    scores = query @ key.repeat_interleave(groups, 1).transpose(-1, -2) / query.shape[-1] ** 0.5
    return (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ value.repeat_interleave(groups, 1)).transpose(1, 2)


@pytest.mark.filterwarnings("ignore::UserWarning")  # a CPU has no lower-right causal kernel: torch says so
@pytest.mark.parametrize("rows,cached", [(1, 6), (5, 0), (5, 7)])
@pytest.mark.parametrize("rule", [Rule.CAUSAL, Rule.FULL])
def test_maskless_rules_see_the_cache_and_their_rows(rule, rows, cached):
    generator = torch.Generator().manual_seed(rows + cached)
    query = torch.randn(1, 4, rows, 8, generator=generator)
    key, value = (torch.randn(1, 2, cached + rows, 8, generator=generator) for _ in range(2))
    own = torch.ones(rows, rows, dtype=torch.bool)
    allowed = torch.cat([torch.ones(rows, cached, dtype=torch.bool), own.tril() if rule is Rule.CAUSAL else own], 1)
    out, _ = attention.attention_forward(None, query, key, value, None, attention_rule=rule)
    torch.testing.assert_close(out, _reference(query, key, value, allowed))


def test_an_unmasked_call_without_a_maskless_rule_is_refused():
    query, key = torch.zeros(1, 4, 2, 8), torch.zeros(1, 2, 5, 8)
    with pytest.raises(ValueError, match="attention_rule"):
        attention.attention_forward(None, query, key, key, None)
    with pytest.raises(ValueError, match="custom rule"):
        attention.attention_forward(None, query, key, key, None, attention_rule=Rule.CUSTOM)


def test_an_explicit_4d_mask_runs_as_given():
    """What a caller that builds its own mask (several requests in one forward) relies on."""
    adapter = load_nemotron(MODELS / "tiny")
    dense = _dense(load_nemotron(MODELS / "tiny"))
    prompt = pack([causal_segment(torch.tensor(PROMPTS[1]), 0), block_segment(torch.tensor([1, 1, 1]), 23)])
    mask = dense.additive_mask(prompt).contiguous()  # unaligned on purpose
    outs = [a.backbone(input_ids=prompt.tokens[None], position_ids=prompt.positions[None], attention_mask=mask).last_hidden_state
            for a in (adapter, dense)]  # fmt: skip
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore::UserWarning")  # a CPU has no lower-right causal kernel: torch says so
def test_a_cost_twin_names_the_timed_models_kernel():
    model = load_nemotron(MODELS / "tiny")
    cost = _cuda_choices(random_adapter(SHAPES["test"], torch.device("cpu"), torch.float32, vocab_at_least=1024, mask_token_id=1))
    twin = CostTwin(model, cost, "test")
    twin.run(pack([causal_segment(torch.tensor(PROMPTS[0]), 0)]))
    twin.commit(len(PROMPTS[0]))
    twin.run(pack([causal_segment(torch.tensor(PROMPTS[1][:5]), len(PROMPTS[0]))]))
    assert (model.call_stats["attention"], twin.call_stats["attention"]) == ("sdpa-mask", "sdpa-causal")
