"""The SDAR training layout (packedss.training.layouts.sdar_layout) and the tiny-sdar training
run (packedss.training.sdar): the doubled sequence [x_t | x_0] and its attention, checked against
SDAR's block-diffusion mask (M_BD | M_OBC | M_BC) computed here entry by entry; the masking (answer
tokens only, at least one) and the loss weights 1/p; the release's loss; and short training runs
from a tiny-set checkpoint (deterministic, the starting weights copied, the tokenizer checked)."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch
import torch.nn.functional as F

from packedss.decoding.calls import Role
from packedss.training.layouts import IGNORE, additive_mask, sdar_layout

MASK = 1
EPS = 1e-3


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def block_diffusion_mask(length: int, block: int) -> torch.Tensor:
    """SDAR's training mask over [x_t | x_0], entry by entry: True = the query row may attend."""
    expected = torch.zeros(2 * length, 2 * length, dtype=torch.bool)
    for q in range(2 * length):
        for kv in range(2 * length):
            q_clean, kv_clean = q >= length, kv >= length
            q_block, kv_block = (q - length * q_clean) // block, (kv - length * kv_clean) // block
            m_bd = q_clean == kv_clean and q_block == kv_block
            m_obc = not q_clean and kv_clean and q_block > kv_block
            m_bc = q_clean and kv_clean and q_block >= kv_block
            expected[q, kv] = m_bd or m_obc or m_bc
    return expected


def toy_ids(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(3, 40) for _ in range(length)]


@pytest.mark.parametrize("block", [1, 4])
def test_attention_positions_and_masking(block):
    rng = random.Random(block)
    expected = {length: block_diffusion_mask(length, block) for length in (9, 13)}
    for draw in range(60):
        length = 9 if draw % 2 else 13
        start = draw % 6  # 0: a code chunk, all answer
        ids = toy_ids(rng, length)
        sequence, weights = sdar_layout(ids, start, rng, MASK, block, EPS)
        call = sequence.call
        assert torch.equal(call.attend, expected[length])
        assert call.positions.tolist() == list(range(length)) * 2
        assert call.roles.tolist() == [int(Role.DRAFT)] * length + [int(Role.VERIFY)] * length
        noisy, clean = call.tokens[:length].tolist(), call.tokens[length:].tolist()
        assert clean == ids
        assert noisy[:start] == ids[:start]  # the prompt is never masked
        masked = [i for i in range(length) if noisy[i] == MASK]
        assert masked and all(noisy[i] == ids[i] for i in range(length) if i not in masked)
        targets = sequence.draft_targets.tolist()
        assert targets == [ids[i] if i in masked else IGNORE for i in range(length)] + [IGNORE] * length
        assert sequence.ar_targets.tolist() == [IGNORE] * (2 * length)
        read = weights[masked]
        assert torch.all(read == read[0]) and read[0] >= 1.0  # one 1/p per sequence, p <= 1
        off = torch.ones(2 * length, dtype=torch.bool)
        off[masked] = False
        assert torch.all(weights[off] == 0)  # no weight off the masked rows


def test_block_one_is_the_ar_mode():
    """With block 1, the mask row at i sees itself and the clean tokens < i, nothing else."""
    length = 12
    sequence, _ = sdar_layout(list(range(3, 3 + length)), 4, random.Random(0), MASK, 1, EPS)
    attend = sequence.call.attend
    for i in range(length):
        assert attend[i].nonzero().flatten().tolist() == [i] + [length + k for k in range(i)]
        assert attend[length + i].nonzero().flatten().tolist() == [length + k for k in range(i + 1)]


def test_weights_are_the_inverse_masking_rate():
    """p = (1 - eps) t + eps with t ~ U(0, 1): 1/p weights make the masked-row sum an unbiased
    estimate of the answer's sum (E[sum of weights] = answer tokens), and each sequence masks
    about a share p = 1/weight of its answer."""
    rng = random.Random(0)
    answer = 200
    ids = toy_ids(rng, 8 + answer)
    ratios, gaps = [], []
    for _ in range(1500):
        sequence, weights = sdar_layout(ids, 8, rng, MASK, 4, EPS)
        masked = int((sequence.call.tokens[: len(ids)] == MASK).sum())
        weight = float(weights.max())
        ratios.append(float(weights.sum()) / answer)
        gaps.append(abs(masked / answer - 1 / weight))
    assert abs(sum(ratios) / len(ratios) - 1.0) < 0.1
    assert sorted(gaps)[len(gaps) // 2] < 0.03  # the median sequence masks its p


def tiny_backbone(vocab: int = 40):
    from packedss.training.loop import TrainConfig
    from packedss.training.setdlm import qwen3_config
    from transformers import Qwen3Model

    torch.manual_seed(0)
    config = TrainConfig(hidden=32, intermediate=64, layers=2, heads=2, kv_heads=1)
    backbone = Qwen3Model(qwen3_config(config, vocab, {"eos": 0, "mask": MASK, "pad": 2})).eval()
    head = torch.nn.Linear(32, vocab, bias=False)
    torch.nn.init.normal_(head.weight, std=0.5)
    return backbone, head


def test_batch_loss_is_the_release_loss():
    """sdar_batch_loss (padded batch) = sum over the masked rows of CE / p, over the batch's
    answer tokens, each sequence run alone."""
    from packedss.training.sdar import sdar_batch_loss

    backbone, head = tiny_backbone()
    rng = random.Random(3)
    drawn = [(toy_ids(rng, n), start) for n, start in ((14, 5), (9, 2), (11, 0))]
    sequences = [sdar_layout(ids, start, rng, MASK, 4, EPS) for ids, start in drawn]
    answer_tokens = sum(len(ids) - start for ids, start in drawn)
    with torch.no_grad():
        loss, _, rows = sdar_batch_loss(backbone, head, sequences, 2, answer_tokens)
        total = 0.0
        for sequence, weights in sequences:
            call = sequence.call
            hidden = backbone(
                input_ids=call.tokens[None], position_ids=call.positions[None],
                attention_mask=additive_mask(call.attend[None, None], torch.float32), use_cache=False,
            ).last_hidden_state[0]  # fmt: skip
            logits = head(hidden)
            for row in range(call.rows):
                if call.tokens[row] == MASK:
                    total += float(F.cross_entropy(logits[row], sequence.draft_targets[row]) * weights[row])
    assert rows == 2 * 14
    assert abs(float(loss) - total / answer_tokens) < 1e-4


# --------------------------------------------------------------------------- training runs


def test_training_runs_from_tiny_set(tmp_path):
    from packedss.errors import PackedSSError
    from packedss.models.sdar import load_sdar
    from packedss.models.setdlm import load_setdlm
    from packedss.training import TrainConfig, train_sdar, train_setdlm
    from safetensors.torch import load_file

    tiny = TrainConfig(
        arith_n=200, code_bytes=20_000, vocab=300, hidden=32, intermediate=64, layers=1, heads=2, kv_heads=1,
        steps=3, batch=2, max_minutes=0, save_every=2, log_every=1,
    )  # fmt: skip
    train_setdlm(tiny, tmp_path / "set")
    start = load_setdlm(tmp_path / "set")
    # no steps: the saved weights are the tiny-set backbone and head, renamed to SDAR's layout
    train_sdar(TrainConfig(**{**tiny.__dict__, "steps": 0}), tmp_path / "copy", init_from=tmp_path / "set")
    copied = load_file(tmp_path / "copy" / "model.safetensors")
    for name, value in start.backbone.state_dict().items():
        assert torch.equal(copied[f"model.{name}"], value), name
    assert torch.equal(copied["lm_head.weight"], start.head.weight)

    for run in ("a", "b"):
        train_sdar(tiny, tmp_path / run, init_from=tmp_path / "set")
    a, b = tmp_path / "a", tmp_path / "b"
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (tmp_path / "set" / "tokenizer.json").read_bytes()
    config = json.loads((a / "config.json").read_text())
    assert config["model_type"] == "sdar" and config["block_size"] == 4 and "auto_map" not in config
    trained = config["packedss_training"]
    assert trained["steps_run"] == 3 and trained["block_sizes"] == {"1": 0.4, "4": 0.6}
    assert trained["continued_from"] == json.loads((tmp_path / "set" / "config.json").read_text())["packedss_training"]
    model = load_sdar(a)
    assert model.block_size == 4 and model.mask_token_id == config["mask_token_id"]
    assert (a / "model.safetensors").read_bytes() != (tmp_path / "copy" / "model.safetensors").read_bytes()

    other = tmp_path / "other-tokenizer"
    shutil.copytree(tmp_path / "set", other)
    text = (other / "tokenizer.json").read_text()
    assert "<|pad|>" in text
    (other / "tokenizer.json").write_text(text.replace("<|pad|>", "<|pdd|>"))
    with pytest.raises(PackedSSError, match="tokenizer"):
        train_sdar(tiny, tmp_path / "refused", init_from=other)
