"""Three-step training runs of each family on a tiny configuration: they run, save a checkpoint
the harness loads, and are deterministic from the seed (two runs give byte-identical weights)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from packedss.training import TrainConfig, train_nemotron, train_proposal_lora, train_setdlm

TINY = TrainConfig(
    arith_n=200, code_bytes=20_000, vocab=300, hidden=32, intermediate=64, layers=1, heads=2, kv_heads=1,
    steps=3, batch=2, max_minutes=0, save_every=2, log_every=1, lora_steps=3, lora_rank=2,
)  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def record(directory: Path, name: str = "config.json") -> dict:
    return json.loads((directory / name).read_text())["packedss_training"]


def test_nemotron_runs_are_deterministic(tmp_path):
    from packedss.models.lora import attach_proposal_lora
    from packedss.models.nemotron import load_nemotron

    for run in ("a", "b"):
        train_nemotron(TINY, tmp_path / run / "tiny")
        train_proposal_lora(TINY, tmp_path / run / "tiny", tmp_path / run / "lora", "tiny")
    a, b = tmp_path / "a", tmp_path / "b"
    assert (a / "tiny/model.safetensors").read_bytes() == (b / "tiny/model.safetensors").read_bytes()
    assert (a / "tiny/tokenizer.json").read_bytes() == (b / "tiny/tokenizer.json").read_bytes()
    assert (a / "lora/adapter_model.safetensors").read_bytes() == (b / "lora/adapter_model.safetensors").read_bytes()
    base = record(a / "tiny")
    assert base["steps_run"] == 3 and math.isfinite(base["final_ar_loss"]) and math.isfinite(base["final_diff_loss"])
    assert record(a / "lora", "packedss_training.json")["steps_run"] == 3
    model = load_nemotron(a / "tiny")
    attach_proposal_lora(model, a / "lora")
    config = json.loads((a / "tiny/config.json").read_text())
    assert model.mask_token_id == config["mask_token_id"] and model.eos_token_ids == (config["eos_token_id"],)
    assert not (tmp_path / "a" / "tiny.tok").exists()  # the tokenizer's working directory is removed

    train_nemotron(TINY, tmp_path / "continued", init_from=str(a / "tiny"))
    continued = record(tmp_path / "continued")
    assert continued["continued_from"] == base
    assert (tmp_path / "continued/model.safetensors").read_bytes() != (a / "tiny/model.safetensors").read_bytes()


def test_setdlm_runs_are_deterministic(tmp_path):
    from packedss.models.setdlm import load_setdlm

    for run in ("a", "b"):
        train_setdlm(TINY, tmp_path / run)
    a, b = tmp_path / "a", tmp_path / "b"
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    trained = record(a)
    assert trained["steps_run"] == 3 and math.isfinite(trained["final_query_loss"])
    model = load_setdlm(a)
    assert model.block_size == TINY.smax

