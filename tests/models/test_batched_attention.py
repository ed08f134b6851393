"""The eager batched path's attention (packedss.models.batched): each request's rows attend over
its own cache and rows only, so a batched call's attention work is the sum over its requests of
rows x (cache + rows), whatever C is, and each request gets the kernel its call gets alone."""

from __future__ import annotations

import pytest
import torch

from packedss.decoding.calls import block_segment, causal_segment, pack
from packedss.models import attention
from packedss.models.batched import BatchedCalls
from tests.decoding.test_batching import _batch


def _scores(monkeypatch) -> list[tuple[int, int]]:
    """(rows, columns) of every SDPA call the attention function makes."""
    seen = []
    sdpa = attention.F.scaled_dot_product_attention

    def counted(query, key, value, **kwargs):
        seen.append((query.shape[2], key.shape[2]))
        return sdpa(query, key, value, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", counted)
    return seen


@pytest.mark.parametrize("requests", [2, 5])
def test_a_batched_calls_attention_work_is_each_requests_rows_times_its_own_keys(tiny, requests, monkeypatch):
    batch = BatchedCalls(tiny, requests)
    prompts = [torch.arange(3, 3 + 4 + 7 * k) for k in range(requests)]  # caches of 4, 11, 18, ... rows
    batch.run(_batch([(k, pack([causal_segment(prompt, 0)])) for k, prompt in enumerate(prompts)]))
    for k, prompt in enumerate(prompts):
        batch.commit(k, len(prompt))
    mask = tiny.mask_token_id
    calls = [(k, pack([block_segment(torch.tensor([12] + [mask] * (2 + k)), len(prompts[k]))])) for k in range(requests)]
    seen = _scores(monkeypatch)
    batch.run(_batch(calls))
    layers = tiny.backbone.config.num_hidden_layers
    own = [(call.rows, len(prompts[k]) + call.rows) for k, call in calls]
    assert seen == own * layers  # one SDPA call per request and layer, over its own keys only
    assert sum(r * c for r, c in seen) == layers * sum(r * c for r, c in own)
    # Each request's kernel is the one its call gets alone: a full block needs no mask.
    assert [batch.call_stats(k)["attention"] for k in range(requests)] == ["sdpa"] * requests


def test_a_batched_call_gets_each_requests_own_kernel(tiny):
    """A causal call over a cache is masked on a CPU, a full block is not, as alone
    (attention.eager_kernel)."""
    batch = BatchedCalls(tiny, 2)
    batch.run(_batch([(0, pack([causal_segment(torch.tensor([5, 6, 7]), 0)])), (1, pack([causal_segment(torch.tensor([9, 4]), 0)]))]))
    assert [batch.call_stats(k)["attention"] for k in range(2)] == ["sdpa-causal", "sdpa-causal"]
    batch.commit(0, 3)
    batch.commit(1, 2)
    mask = tiny.mask_token_id
    batch.run(_batch([(0, pack([causal_segment(torch.tensor([8, 9]), 3)])), (1, pack([block_segment(torch.tensor([4, mask]), 2)]))]))
    assert [batch.call_stats(k)["attention"] for k in range(2)] == ["sdpa-mask", "sdpa"]


def test_the_batched_path_refuses_another_attention_implementation(tiny):
    other = tiny.twin()
    other.backbone = type("Backbone", (), {"config": type("Config", (), {"_attn_implementation": "sdpa"})()})()
    with pytest.raises(ValueError, match="attends per request"):
        BatchedCalls(other, 2)
