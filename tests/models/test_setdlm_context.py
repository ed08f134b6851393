"""SetDLM's context length: once the cache plus a call would exceed config.json `length`, the
oldest cache entries are dropped from the left, as the released decoder does. Greedy decoding
with the harness equals a plain decoder (the backbone and a DynamicCache driven by hand) that
drops entries the same way."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from packedss.decoding import AnyOrderSettings, Sampling, decode_anyorder
from packedss.errors import PackedSSError
from packedss.models.setdlm import load_setdlm
from tests.anyorder_fixtures import SET_EOS, SET_MASK, write_random_setdlm

PROMPT = [4, 9, 13, 5, 6, 17, 7, 8, 10, 11]
NEW_TOKENS = 30


def _plain_ar_with_left_crop(model, prompt: list[int], new_tokens: int, context: int) -> list[int]:
    """SetDLM AR decoding written out: each call is [last token (clean), MASK at the next
    position]; the clean row is committed, the mask row predicts; the cache drops its oldest
    entries whenever cache + call rows would exceed `context`."""
    backbone, head = model.backbone, model.head
    cache = DynamicCache(config=backbone.config)
    minimum = torch.finfo(model.dtype).min

    def call(tokens, positions, attend):
        rows, cached = len(tokens), cache.get_seq_length()
        overflow = cached + rows - context
        if overflow > 0:
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys[:, :, overflow:], layer.values[:, :, overflow:]
            cached -= overflow
        mask = torch.zeros(rows, cached + rows, dtype=model.dtype)
        mask[:, cached:] = torch.zeros(rows, rows, dtype=model.dtype).masked_fill(~attend, minimum)
        hidden = backbone(input_ids=torch.tensor([tokens]), position_ids=torch.tensor([positions]),
                          attention_mask=mask[None, None], cache=cache, use_cache=True).last_hidden_state
        logits = head(hidden[0])
        logits[:, SET_MASK] = float("-inf")
        cache.crop(-1)  # the mask row is never committed
        return int(logits[-1].argmax())

    length = len(prompt)
    attend = torch.ones(length + 1, length + 1).tril().bool()
    attend[length, :length] = True
    token = call(prompt + [SET_MASK], list(range(length + 1)), attend)
    out = [token]
    with torch.inference_mode():
        while len(out) < new_tokens and token != SET_EOS:
            position = length + len(out)
            token = call([token, SET_MASK], [position - 1, position], torch.tensor([[1, 0], [1, 1]]).bool())
            out.append(token)
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_setdlm(tmp_path_factory.mktemp("setdlm-context"), seed=5)


def test_length_is_read_from_the_checkpoint(checkpoint):
    assert load_setdlm(checkpoint, dtype="float64").context == 1024


def test_left_crop_happens_and_matches_a_plain_decoder(checkpoint):
    model = load_setdlm(checkpoint, dtype="float64")
    model.context = 16  # far below prompt + output, so the cache is cropped again and again
    settings = AnyOrderSettings("ar", 1, NEW_TOKENS, (SET_EOS,), Sampling(0.0, "rejection", None))
    decoded = decode_anyorder(model, PROMPT, settings)
    assert sum(decoded.extra["cache_rows_dropped"]) > 0
    with torch.inference_mode():
        expected = _plain_ar_with_left_crop(model, PROMPT, NEW_TOKENS, context=16)
    assert decoded.tokens == expected
    model.context = 1024
    assert decode_anyorder(model, PROMPT, settings).tokens != expected  # the crop changed the output


def test_a_call_larger_than_the_context_is_refused(checkpoint):
    model = load_setdlm(checkpoint, dtype="float64")
    model.context = 8
    settings = AnyOrderSettings("ar", 1, 4, (SET_EOS,), Sampling(0.0, "rejection", None))
    with pytest.raises(PackedSSError, match="does not fit its context length 8"):
        decode_anyorder(model, PROMPT, settings)
