"""Packing changes nothing, and Packed-SS drafts one call ahead (float64, real adapter)."""

from __future__ import annotations

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling, decode_ltr
from packedss.decoding import driver
from packedss.decoding import schedules as schedules_module
from packedss.decoding.calls import block_segment, causal_segment, draft_block, pack
from packedss.decoding.trace import RecordingModel
from packedss.decoding.schedules import packed_call, quadratic_call
from packedss.decoding.verify import verify

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


def _separate_draft(model, sequence, anchor_position, width):
    """A Linear-SS draft call on its own: commit sequence[:n], then run [x_n@n, MASK@n+1..n+W]."""
    _prefill(model, torch.tensor(sequence[:anchor_position]))
    anchor = torch.tensor(sequence[anchor_position])
    return _alone(model, pack([draft_block(anchor, anchor_position, width, model.mask_token_id)]))[1:]


@pytest.mark.parametrize("pad_verify", [True, False])
@pytest.mark.parametrize("width", [3, 8])
def test_next_packed_draft_equals_a_separate_draft_call_on_the_same_prefix(tiny_model, width, pad_verify, monkeypatch):
    # Sampled at T = 1, so that each verification receives the drafter's distribution q of every
    # draft: this tiny drafter proposes the same argmax at most positions, q tells its rows apart.
    verified = []

    def recording_verify(verifier_logits, drafts, draft_probs, sampling):
        verified.append((drafts, draft_probs))
        return verify(verifier_logits, drafts, draft_probs, sampling)

    monkeypatch.setattr(schedules_module, "verify", recording_verify)
    monkeypatch.setattr(driver, "verify", recording_verify)  # Packed-SS's, through verify_ahead
    accepted_counts = []
    for seed, prompt in enumerate(([5, 9, 11, 30], [12, 13, 14, 15, 16, 17, 18, 19, 20])):
        verified.clear()
        recording = RecordingModel(tiny_model)
        sampling = Sampling(1.0, "rejection", torch.Generator().manual_seed(seed))
        out = decode_ltr(recording, prompt, LTRSettings("packed", width, 24, (), sampling, pad_verify=pad_verify))
        sequence = prompt + out.tokens
        accepted_counts += out.accepted
        # Call t's draft block is anchored at n (the prefill's at L-1); call t emitted A tokens at
        # n+1..n+A; call t+1 verifies the proposals for n+A+1..n+W.
        anchors = [len(prompt) - 1] + [int(call.positions[0]) for call, _ in recording.calls[1:]]
        emitted = [1] + out.accepted
        assert len(verified) == len(recording.calls) - 1
        for t, (drafts, draft_probs) in enumerate(verified):
            separate = _separate_draft(tiny_model, sequence, anchors[t], width)
            assert (recording.calls[t][1][-width:] - separate).abs().max() < TOL, (prompt, t)
            expected = torch.softmax(separate, -1)[emitted[t] :]
            torch.testing.assert_close(draft_probs, expected, rtol=0.0, atol=TOL, msg=f"{prompt} call {t}")
            following = recording.calls[t + 1][0]
            assert torch.equal(following.tokens[1 : 1 + drafts.shape[0]], drafts)
    # Both a correction right after the anchor and accepted drafts occur, so the dropped prefix
    # of the proposals varies.
    assert 1 in accepted_counts and max(accepted_counts) > 1


def _same_call(fast, slow):
    assert torch.equal(fast.tokens, slow.tokens) and torch.equal(fast.positions, slow.positions)
    assert torch.equal(fast.roles, slow.roles) and torch.equal(fast.attend, slow.attend)
    assert (fast.useful, fast.drafts, fast.read_from, fast.rule) == (slow.useful, slow.drafts, slow.read_from, slow.rule)


@pytest.mark.parametrize("width", [1, 4])
def test_the_prefill_calls_are_the_calls_pack_makes_of_their_segments(width):
    """The schedules build a prefill in a fixed number of tensor operations (its shape is the
    prompt's); it must be the call that packing its segments gives."""
    length, mask = len(PROMPT), 99
    masks = torch.full((width,), mask, dtype=torch.long)
    prompt_only = pack([causal_segment(PROMPT, 0)], read_from=length - 1)
    _same_call(schedules_module._prefill_call(PROMPT), prompt_only)
    # Quadratic-SS: W masks at L..L+W-1 that see the whole prompt
    quadratic = pack([causal_segment(PROMPT, 0), block_segment(masks, length)],
                     sees={(1, 0): torch.ones(width, length, dtype=torch.bool)}, read_from=length - 1)  # fmt: skip
    _same_call(schedules_module._prefill_call(PROMPT, [masks], at=length, sees=length), quadratic)
    # Packed-SS: the block [x_{L-1}@L-1, MASK@L..] sees the prompt before its anchor
    sees_prompt = torch.ones(width + 1, length, dtype=torch.bool)
    sees_prompt[:, -1] = False
    packed = pack([causal_segment(PROMPT, 0), draft_block(PROMPT[-1], length - 1, width, mask)],
                  sees={(1, 0): sees_prompt}, read_from=length - 1)  # fmt: skip
    fast = schedules_module._prefill_call(PROMPT, [PROMPT[-1:], masks], at=length - 1, sees=length - 1)
    _same_call(fast, packed)
