"""The block-diffusion model `tiny-sdar` (SDAR layout): training rows are inference calls, and the
shipped checkpoint loads offline with its special tokens, EOS list, block size and size, and
decodes arith prompts in AR mode (block 1) and in SDAR's block mode (block 4).

A training mask row (packedss.training.layouts.sdar_layout, one forward pass with a dense 4D
mask) must have the logits the loaded checkpoint gives through calls of the decoding core's
builders for the same history: block 1, a causal prefix of the clean tokens < i, then a mask at
i; block 4, the clean blocks before i's block committed one by one (each a full block seeing the
earlier ones), then i's noisy block as one full block."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from packedss.decoding.calls import block_segment, causal_segment, pack
from packedss.models.sdar import load_sdar, save_sdar
from packedss.training.layouts import collate, sdar_layout

TINY_SDAR = Path(__file__).resolve().parents[2] / "assets" / "models" / "tiny-sdar"
TINY_SET = TINY_SDAR.parent / "tiny-set"
MAX_BYTES = 15 * 1024 * 1024
PARAMETERS = 2_017_344  # tiny-set's: the same Qwen3 backbone and untied head
MAX_NEW = 96
MASK, EOS, PAD = 1, 0, 2


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def write_random_sdar(directory: Path, vocab: int = 40) -> Path:
    from transformers import Qwen3Model

    from packedss.training.loop import TrainConfig
    from packedss.training.setdlm import qwen3_config

    torch.manual_seed(0)
    sizes = TrainConfig(hidden=32, intermediate=64, layers=2, heads=2, kv_heads=1)
    backbone = Qwen3Model(qwen3_config(sizes, vocab, {"eos": EOS, "mask": MASK, "pad": PAD}))
    head = torch.nn.Linear(32, vocab, bias=False)
    torch.nn.init.normal_(head.weight, std=0.5)
    save_sdar(directory, backbone, head, mask_token_id=MASK, eos_token_ids=(EOS,), block_size=4)
    return directory


def run(model, segment, commit: int) -> torch.Tensor:
    logits = model.run(pack([segment]))
    model.commit(commit)
    return logits


def inference_logits(model, clean: list[int], noisy: list[int], row: int, block: int) -> torch.Tensor:
    """The logits of the mask at position `row` from calls on an empty cache: the clean blocks
    before its block, committed, then its own block of x_t."""
    model.reset()
    first = row // block * block
    if block == 1:
        if first:
            run(model, causal_segment(torch.tensor(clean[:first]), 0), first)
    else:
        for start in range(0, first, block):
            run(model, block_segment(torch.tensor(clean[start : start + block]), start), block)
    own = torch.tensor(noisy[first : first + block])
    return run(model, block_segment(own, first), 0)[row - first]


@pytest.mark.parametrize("block", [1, 4])
def test_training_mask_rows_are_inference_calls(tmp_path, block):
    model = load_sdar(write_random_sdar(tmp_path / "sdar"), dtype="float32")
    rng = random.Random(block)
    checked = 0
    for start, length in ((5, 14), (3, 11), (6, 17)):
        ids = [rng.randrange(3, 40) for _ in range(length)]
        sequence, _ = sdar_layout(ids, start, rng, MASK, block)
        batch = collate([(sequence)], PAD)
        with torch.no_grad():
            hidden = model.backbone(
                input_ids=batch.tokens, position_ids=batch.positions, attention_mask=batch.mask, use_cache=False
            ).last_hidden_state[0]
            logits = model.head(hidden)
        noisy = sequence.call.tokens[:length].tolist()
        for row in (i for i in range(length) if noisy[i] == MASK):
            expected = inference_logits(model, ids, noisy, row, block)
            assert torch.allclose(logits[row], expected, atol=1e-4), (block, start, row)
            checked += 1
    assert checked >= 5


# --------------------------------------------------------------------------- the shipped checkpoint

shipped = pytest.mark.skipif(not (TINY_SDAR / "config.json").is_file(), reason="assets/models/tiny-sdar is absent")


@pytest.fixture(scope="module")
def tokenizer():
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY_SDAR), local_files_only=True)


@pytest.fixture(scope="module")
def model():
    return load_sdar(TINY_SDAR, dtype="float32")


@shipped
def test_files_config_and_size(tokenizer, model):
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "README.md"):  # fmt: skip
        assert (TINY_SDAR / name).is_file(), name
    size = sum(f.stat().st_size for f in TINY_SDAR.iterdir() if f.is_file())
    assert size <= MAX_BYTES, f"{TINY_SDAR} is {size} bytes"
    config = json.loads((TINY_SDAR / "config.json").read_text())
    assert config["model_type"] == "sdar" and config["architectures"] == ["SDARForCausalLM"]
    assert "auto_map" not in config  # no custom code: AutoTokenizer must not ask to trust any
    assert config["block_size"] == 4 == model.block_size
    assert config["mask_token_id"] == tokenizer.mask_token_id == model.mask_token_id
    assert config["eos_token_id"] == tokenizer.eos_token_id
    generation = json.loads((TINY_SDAR / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [tokenizer.eos_token_id] == list(model.eos_token_ids)
    assert len({tokenizer.mask_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}) == 3
    assert tokenizer.encode("<|mask|>", add_special_tokens=False) == [tokenizer.mask_token_id]
    parameters = sum(p.numel() for p in model.backbone.parameters()) + model.head.weight.numel()
    assert parameters == PARAMETERS == config["packedss_training"]["parameters"]


@shipped
def test_same_tokenizer_as_tiny_set():
    if not (TINY_SET / "tokenizer.json").is_file():
        pytest.skip("assets/models/tiny-set is absent")
    assert (TINY_SDAR / "tokenizer.json").read_bytes() == (TINY_SET / "tokenizer.json").read_bytes()


def greedy_ar(model, prompt: list[int]) -> list[int]:
    """Block 1: each call [last token @ i-1, MASK @ i] (causal) commits the token and reads the mask."""
    model.reset()
    run(model, causal_segment(torch.tensor(prompt[:-1]), 0), len(prompt) - 1)
    out, last = [], prompt[-1]
    for i in range(len(prompt), len(prompt) + MAX_NEW):
        logits = run(model, causal_segment(torch.tensor([last, MASK]), i - 1), 1)
        last = int(logits[1].argmax())
        out.append(last)
        if last in model.eos_token_ids:
            break
    return out


def greedy_blocks(model, prompt: list[int], block: int = 4) -> list[int]:
    """SDAR's block decoding, one token per call: the clean blocks committed; the current block
    (the prompt's tail, then masks) filled most confident mask first, then committed."""
    model.reset()
    tokens = list(prompt)
    first = len(prompt) // block * block
    for start in range(0, first, block):
        run(model, block_segment(torch.tensor(tokens[start : start + block]), start), block)
    while len(tokens) < len(prompt) + MAX_NEW:
        current = tokens[first:] + [MASK] * (first + block - len(tokens))
        while MASK in current:
            probs = run(model, block_segment(torch.tensor(current), first), 0).softmax(-1)
            confidence, best = probs.max(-1)
            masked = [k for k, t in enumerate(current) if t == MASK]
            k = max(masked, key=lambda m: float(confidence[m]))
            current[k] = int(best[k])
        run(model, block_segment(torch.tensor(current), first), block)
        tokens = tokens[:first] + current
        ends = [k for k in range(len(prompt), len(tokens)) if tokens[k] in model.eos_token_ids]
        if ends:
            return tokens[len(prompt) : ends[0] + 1]
        first += block
    return tokens[len(prompt) :]


@shipped
def test_decodes_arith_in_both_modes(model, tokenizer):
    from packedss.tasks import load_task, load_task_config

    task = load_task(load_task_config("arith", split="test", n=3, seed=0))
    for question in task.questions():
        prompt = tokenizer.encode(task.build_prompt(question), add_special_tokens=False)
        for decode in (greedy_ar, greedy_blocks):
            out = decode(model, prompt)
            text = tokenizer.decode(out, skip_special_tokens=True)
            assert out[-1] in model.eos_token_ids, (decode.__name__, text)
            assert "####" in text, (decode.__name__, text)  # the arith answer format
