"""Packing changes nothing, and Packed-SS drafts one call ahead (float64, real adapter)."""

from __future__ import annotations

import torch

from packedss.decoding.calls import block_segment, causal_segment, draft_block, pack
from packedss.decoding.schedules import packed_call, quadratic_call

PROMPT = torch.tensor([5, 9, 11, 30, 7, 21, 8])
TOL = 1e-9


def _prefill(model, prompt=PROMPT):
    model.reset()
    model.run(pack([causal_segment(prompt, 0)]))
    model.commit(len(prompt))


def _alone(model, segment_call, commit=0):
    logits = model.run(segment_call)
    model.commit(commit)
    return logits


def test_packed_call_equals_separate_calls(tiny_model):
    width, n = 6, len(PROMPT)
    last = torch.tensor([17])
    drafts = torch.tensor([4, 25, 31])
    for pad_verify in (True, False):
        _prefill(tiny_model)
        packed = _alone(tiny_model, packed_call(last, drafts, n, width, tiny_model.mask_token_id, pad_verify))
        verify_alone = _alone(tiny_model, pack([causal_segment(torch.cat([last, drafts]), n)]))
        block_alone = _alone(tiny_model, pack([draft_block(last, n, width, tiny_model.mask_token_id)]))
        m = drafts.shape[0]
        assert (packed[: m + 1] - verify_alone).abs().max() < TOL
        assert (packed[-(width + 1) :] - block_alone).abs().max() < TOL


def test_quadratic_blocks_equal_separate_calls(tiny_model):
    width, n = 3, len(PROMPT)
    block = width + 1
    last = torch.tensor([17])
    drafts = torch.tensor([4, 25, 31])
    mask = tiny_model.mask_token_id
    _prefill(tiny_model)
    packed = _alone(tiny_model, quadratic_call(last, drafts, n, mask))
    verify_rows = torch.cat([last, drafts])
    for k in range(block):
        # Block k alone: commit verify rows 0..k, then run the B masks at n+k+1.. on that cache.
        _prefill(tiny_model)
        _alone(tiny_model, pack([causal_segment(verify_rows[: k + 1], n)]), commit=k + 1)
        masks = torch.full((block,), mask)
        alone = _alone(tiny_model, pack([block_segment(masks, n + k + 1)]))
        start = block + k * block
        assert (packed[start : start + block] - alone).abs().max() < TOL


def test_prefill_with_attached_draft_equals_separate_calls(tiny_model):
    width, length = 5, len(PROMPT)
    mask = tiny_model.mask_token_id
    sees = torch.ones(width + 1, length, dtype=torch.bool)
    sees[:, -1] = False
    tiny_model.reset()
    attached = _alone(
        tiny_model,
        pack([causal_segment(PROMPT, 0), draft_block(PROMPT[-1], length - 1, width, mask)], sees={(1, 0): sees}),
    )
    tiny_model.reset()
    prompt_alone = _alone(tiny_model, pack([causal_segment(PROMPT, 0)]))
    _prefill(tiny_model, PROMPT[:-1])
    block_alone = _alone(tiny_model, pack([draft_block(PROMPT[-1], length - 1, width, mask)]))
    assert (attached[:length] - prompt_alone).abs().max() < TOL
    assert (attached[length:] - block_alone).abs().max() < TOL


def test_packed_proposals_do_not_depend_on_the_draft_being_verified(tiny_model):
    width, n = 8, len(PROMPT)
    last = torch.tensor([17])
    generator = torch.Generator().manual_seed(0)
    proposals = []
    for _ in range(4):
        drafts = torch.randint(4, 40, (5,), generator=generator)
        _prefill(tiny_model)
        logits = _alone(tiny_model, packed_call(last, drafts, n, width, tiny_model.mask_token_id, True))
        proposals.append(logits[-width:])
    for other in proposals[1:]:
        assert torch.equal(other.argmax(-1), proposals[0].argmax(-1))
        assert (other - proposals[0]).abs().max() < 1e-12
