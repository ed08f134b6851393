"""The proposal LoRA's wall-clock cap: the training record counts the steps that ran, and a run
the cap stops after N steps leaves the weights of a run planned for N steps. The clock is a
fake that moves one minute per step, so the step the cap fires at is known on any machine."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from packedss.training import TrainConfig, nemotron, train_nemotron, train_proposal_lora

TINY = TrainConfig(
    arith_n=200, code_bytes=20_000, vocab=300, hidden=32, intermediate=64, layers=1, heads=2, kv_heads=1,
    steps=1, batch=2, max_minutes=0, save_every=0, log_every=1, lora_steps=10, lora_rank=2,
)  # fmt: skip


class StepClock:
    """Seconds that pass only when a LoRA step computes its losses: one minute a step."""

    def __init__(self) -> None:
        self.now = 0.0
        self.steps = 0

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.steps += 1
        self.now += 60.0


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    directory = tmp_path_factory.mktemp("lora-base") / "tiny"
    train_nemotron(TINY, directory)
    yield directory
    torch.set_num_threads(threads)


def train(base, out, config: TrainConfig, monkeypatch) -> tuple[dict, StepClock]:
    clock = StepClock()
    losses = nemotron.distillation_losses

    def counted(*args):
        clock.step()  # the step's minute passes while it computes
        return losses(*args)

    monkeypatch.setattr(nemotron, "distillation_losses", counted)
    train_proposal_lora(config, base, out, "tiny", clock=clock)
    return json.loads((out / "packedss_training.json").read_text())["packedss_training"], clock


def test_a_run_the_wall_clock_cap_stops_records_the_steps_it_ran(base, tmp_path, monkeypatch):
    # Cap 2.5 min: the checks before steps 0, 1 and 2 read 0, 1 and 2 min; the one before step 3 reads 3 min.
    capped, clock = train(base, tmp_path / "capped", replace(TINY, max_minutes=2.5), monkeypatch)
    assert clock.steps == 3
    assert capped["steps_run"] == 3 and capped["train_minutes"] == 3.0
    # Within the LR warm-up (20 steps) the schedule does not depend on the steps planned, so a
    # run planned for 3 steps takes the same 3 steps on the same batches.
    planned, clock = train(base, tmp_path / "planned", replace(TINY, lora_steps=3), monkeypatch)
    assert clock.steps == 3 and planned["steps_run"] == 3
    weights = "adapter_model.safetensors"
    assert (tmp_path / "capped" / weights).read_bytes() == (tmp_path / "planned" / weights).read_bytes()


def test_a_run_of_no_steps_records_none(base, tmp_path, monkeypatch):
    record, clock = train(base, tmp_path / "none", replace(TINY, lora_steps=0), monkeypatch)
    assert clock.steps == 0 and record["steps_run"] == 0
