"""Proposal-only LoRA: PEFT format, draft rows only, verify rows untouched, row counts."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from packedss.decoding import LTRSettings, Sampling, decode_ltr
from packedss.decoding.calls import Role, causal_segment, pack
from packedss.decoding.schedules import packed_call, quadratic_call
from packedss.errors import PackedSSError
from packedss.models.lora import (
    ProposalLoRA,
    attach_proposal_lora,
    detach_proposal_lora,
    save_peft_adapter,
)
from packedss.models.nemotron import load_nemotron
from tests.conftest import EOS_ID, MASK_ID, write_random_nemotron


@pytest.fixture()
def checkpoint(tmp_path):
    return write_random_nemotron(tmp_path / "ckpt", seed=11)


def _random_lora(backbone, seed=5, rank=4, targets=("q_proj", "k_proj", "v_proj", "o_proj")):
    lora = ProposalLoRA.create(backbone, rank=rank, alpha=8.0, targets=targets, seed=seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for b in lora.lora_B.values():  # a trained adapter: B != 0
            b.copy_(torch.randn(b.shape, generator=generator, dtype=torch.float64).to(b.dtype) * 0.5)
    return lora


@pytest.fixture()
def adapter_dir(checkpoint, tmp_path):
    base = load_nemotron(checkpoint, dtype="float32")
    lora = _random_lora(base.backbone)
    save_peft_adapter(lora, tmp_path / "lora", base_model=str(checkpoint))
    lora.detach()
    return tmp_path / "lora"


def _packed(width=4):
    last = torch.tensor(7)
    drafts = torch.tensor([8, 9, 10])
    return packed_call(last, drafts, position=6, width=width, mask_token_id=MASK_ID, pad_verify=True)


def _run(model, call, prefix=(4, 5, 6, 11, 12, 13)):
    model.reset()
    model.run(pack([causal_segment(torch.tensor(prefix), 0)]))
    model.commit(len(prefix))
    out = model.run(call)
    model.commit(0)
    return out


def test_peft_files_written(adapter_dir):
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA"
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    assert sorted(config["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    keys = load_file(str(adapter_dir / "adapter_model.safetensors"))
    assert "base_model.model.encoder.layers.0.self_attn.q_proj.lora_A.weight" in keys
    assert len(keys) == 2 * 4 * 2  # A and B, 4 modules, 2 layers


def test_verify_rows_identical_draft_rows_differ(checkpoint, adapter_dir):
    model = load_nemotron(checkpoint, dtype="float64")
    call = _packed()
    plain = _run(model, call)
    attach_proposal_lora(model, adapter_dir)
    adapted = _run(model, call)
    verify = call.roles != int(Role.DRAFT)
    assert torch.equal(plain[verify], adapted[verify])  # bit-identical, not just close
    draft = call.roles == int(Role.DRAFT)
    assert not torch.allclose(plain[draft], adapted[draft])
    assert model.call_stats == {"lora_rows_selected": int(draft.sum()), "lora_rows_evaluated": call.rows,
                                "attention": "sdpa-mask"}
    _run(model, pack([causal_segment(torch.tensor([4, 9, 13]), 0)]))  # no draft row: nothing computed
    assert model.call_stats == {"lora_rows_selected": 0, "lora_rows_evaluated": 0, "attention": "sdpa-mask"}
    detach_proposal_lora(model)
    assert model.proposal_lora is None
    assert torch.equal(_run(model, call), plain)


def test_row_counts_match_paper_table5_shapes(checkpoint, adapter_dir):
    """Linear: draft call all selected (B/B), verify call none; quadratic B*B of B(B+1);
    packed B of 2B."""
    model = load_nemotron(checkpoint, dtype="float64")
    attach_proposal_lora(model, adapter_dir)
    width, block = 4, 5
    _run(model, _packed(width))
    assert model.call_stats == {"lora_rows_selected": block, "lora_rows_evaluated": 2 * block, "attention": "sdpa-mask"}
    _run(model, quadratic_call(torch.tensor(7), torch.tensor([8, 9, 10, 11]), 6, MASK_ID))
    assert model.call_stats == {"lora_rows_selected": block * block, "lora_rows_evaluated": block * (block + 1),
                                "attention": "sdpa-mask"}


def test_ar_logits_unchanged_by_lora(checkpoint, adapter_dir):
    model = load_nemotron(checkpoint, dtype="float32")
    tokens = torch.tensor([4, 9, 13, 22, 5, 6, 30])
    call = pack([causal_segment(tokens, 0)])
    model.reset()
    plain = model.run(call)
    model.commit(0)
    attach_proposal_lora(model, adapter_dir)
    adapted = model.run(call)
    model.commit(0)
    assert torch.equal(plain, adapted)


def _peft_model(peft, model, adapter_dir):
    """PEFT's own LoRA on the same backbone, under the `encoder.` prefix of the adapter's keys."""

    class Wrapper(torch.nn.Module):
        def __init__(self, encoder):
            super().__init__()
            self.encoder = encoder

    return peft.PeftModel.from_pretrained(Wrapper(model.backbone), str(adapter_dir))


def test_matches_peft_when_every_row_is_selected(checkpoint, adapter_dir):
    """The row-selective implementation equals peft's own LoRA on the selected rows."""
    peft = pytest.importorskip("peft")
    model = load_nemotron(checkpoint, dtype="float32")
    call = _packed()
    attach_proposal_lora(model, adapter_dir)
    model.reset()
    lora = model.proposal_lora
    lora.select(torch.ones(call.rows, dtype=torch.bool))
    mine = model.backbone(
        input_ids=call.tokens[None], position_ids=call.positions[None], attention_mask=model.additive_mask(call)
    ).last_hidden_state
    lora.select(None)
    detach_proposal_lora(model)

    wrapped = _peft_model(peft, model, adapter_dir)
    theirs = wrapped.base_model.model.encoder(
        input_ids=call.tokens[None], position_ids=call.positions[None], attention_mask=model.additive_mask(call)
    ).last_hidden_state
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("schedule", ["linear", "quadratic", "packed"])
def test_lossless_schedules_stay_lossless(checkpoint, adapter_dir, schedule):
    model = load_nemotron(checkpoint, dtype="float64")
    settings = lambda s: LTRSettings(s, 4, 24, (EOS_ID,), Sampling(0.0, "rejection", None))  # noqa: E731
    prompt = [4, 5, 6, 7, 8]
    reference = decode_ltr(model, prompt, settings("ar")).tokens
    without = decode_ltr(model, prompt, settings(schedule))
    attach_proposal_lora(model, adapter_dir)
    with_lora = decode_ltr(model, prompt, settings(schedule))
    assert without.tokens == reference
    assert with_lora.tokens == reference
    selected, evaluated = with_lora.extra["lora_rows_selected"], with_lora.extra["lora_rows_evaluated"]
    assert len(selected) == len(evaluated) == with_lora.nfe_total
    assert all(s <= e for s, e in zip(selected, evaluated))


def test_rank_and_alpha_from_config_scale_the_delta(checkpoint, adapter_dir, tmp_path):
    model = load_nemotron(checkpoint, dtype="float64")
    call = _packed()
    plain = _run(model, call)
    attach_proposal_lora(model, adapter_dir)
    once = _run(model, call) - plain
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    config["lora_alpha"] = 0.0  # alpha 0: no delta at all
    (adapter_dir / "adapter_config.json").write_text(json.dumps(config))
    attach_proposal_lora(model, adapter_dir)
    assert torch.equal(_run(model, call), plain)
    assert once.abs().max() > 0


def test_errors(checkpoint, adapter_dir, tmp_path):
    model = load_nemotron(checkpoint, dtype="float32")
    with pytest.raises(PackedSSError, match="adapter_config.json"):
        attach_proposal_lora(model, tmp_path / "nowhere")
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    config["use_dora"] = True
    (adapter_dir / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(PackedSSError, match="use_dora"):
        attach_proposal_lora(model, adapter_dir)
    config["use_dora"] = False
    (adapter_dir / "adapter_config.json").write_text(json.dumps(config))
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    tensors["base_model.model.diffusion_head.lora_A.weight"] = torch.zeros(4, 32)
    save_file(tensors, str(adapter_dir / "adapter_model.safetensors"))
    with pytest.raises(PackedSSError, match="diffusion_head"):
        attach_proposal_lora(model, adapter_dir)
    del tensors["base_model.model.diffusion_head.lora_A.weight"]
    tensors["base_model.model.encoder.layers.0.self_attn.q_proj.lora_A.weight"] = torch.zeros(3, 32)
    save_file(tensors, str(adapter_dir / "adapter_model.safetensors"))
    with pytest.raises(PackedSSError, match="rank 3"):
        attach_proposal_lora(model, adapter_dir)
    assert model.proposal_lora is None


def test_bf16_base_keeps_float32_adapter_weights_as_peft(checkpoint, adapter_dir):
    """PEFT keeps LoRA weights in float32 on a bf16 base and adds the delta in float32; the
    draft rows then equal PEFT's own forward on the same bf16 base, verify rows are untouched."""
    peft = pytest.importorskip("peft")
    model = load_nemotron(checkpoint, dtype="bfloat16")
    call = _packed()
    plain = _run(model, call)
    lora = attach_proposal_lora(model, adapter_dir)
    assert {p.dtype for p in lora.parameters()} == {torch.float32}
    model.reset()
    mask = model.additive_mask(call)
    lora.select(torch.ones(call.rows, dtype=torch.bool))
    mine = model.backbone(input_ids=call.tokens[None], position_ids=call.positions[None], attention_mask=mask).last_hidden_state
    lora.select(None)
    adapted = _run(model, call)
    detach_proposal_lora(model)

    wrapped = _peft_model(peft, model, adapter_dir)
    assert {p.dtype for n, p in wrapped.named_parameters() if "lora_" in n} == {torch.float32}
    theirs = wrapped.base_model.model.encoder(
        input_ids=call.tokens[None], position_ids=call.positions[None], attention_mask=mask
    ).last_hidden_state
    assert torch.equal(mine, theirs)
    verify = call.roles != int(Role.DRAFT)
    assert torch.equal(plain[verify], adapted[verify])
