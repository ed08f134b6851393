"""Structured configs (Hydra ConfigStore): the schema every YAML under conf/ is merged into, so
unknown keys fail at start, and `validate` turns invalid values into one clear message that
lists the valid choices (SPEC §1)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from packedss.decoding.trace import TIMINGS
from packedss.errors import PackedSSError
from packedss.models.checkpoint import DTYPES
from packedss.tasks import TaskConfig

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = PROJECT_ROOT / "conf"

FAMILIES = ("nemotron", "setdlm")
SCHEDULES = {
    "nemotron": ("ar", "linear", "quadratic", "packed"),
    "setdlm": ("ar", "linear", "quadratic", "packed", "native"),
}
VERIFY_RULES = ("rejection", "match")
ORDERS = ("ltr", "confidence")
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class ModelConfig:
    name: str = MISSING
    family: str = "nemotron"  # nemotron | setdlm
    hub_id: Optional[str] = None  # the released weights (used only when download=true or cached)
    path: Optional[str] = None  # a local checkpoint directory; relative paths resolve from the project root
    download: bool = False  # fetch hub_id when it is not cached locally (never in tests)
    chat: bool = False  # build prompts with the tokenizer's chat template (instruct models)
    lora: bool = False  # apply the proposal-only LoRA to draft rows (paper Tables 4-5)
    lora_path: Optional[str] = None  # PEFT adapter directory; relative to the model directory when not absolute


@dataclass
class ScheduleConfig:
    name: str = MISSING
    pad_verify: bool = True  # packed: pad the verify segment to B rows (2B rows per call)
    paper_width: int = 8  # the width the paper's Nemotron runs use (B - 1); experiments read it


@dataclass
class RunConfig:
    model: ModelConfig = MISSING
    task: TaskConfig = MISSING
    schedule: ScheduleConfig = MISSING
    width: int = 8
    temperature: float = 0.0
    verify: str = "rejection"
    order: str = "ltr"
    seed: int = 0
    repeats: int = 1
    limit: Optional[int] = 5
    max_new_tokens: Optional[int] = None  # None: the task's own cap
    data_dir: Optional[str] = None
    out_dir: str = "results/default/records"
    device: str = "auto"
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    timing: str = "sync"  # CUDA model time: "sync" (synchronize per call) or "events" (CUDA events)
    threads: int = 0  # torch intra-op threads; 0 = auto (1 on CPU: see README, 'CPU threads')
    warmup: bool = True  # one untimed, unrecorded decode before the timed ones
    progress: bool = True  # a progress bar (tqdm hides itself in non-interactive logs)


def register_configs() -> None:
    store = ConfigStore.instance()
    store.store(name="run_schema", node=RunConfig)


def _choice(value, valid, key: str) -> None:
    if value not in valid:
        raise PackedSSError(f"invalid {key}={value!r}; valid choices: {', '.join(map(str, valid))}")


def validate(cfg) -> None:
    """Check every value that the schema's types cannot; raises PackedSSError with one message."""
    _choice(cfg.model.family, FAMILIES, "model.family")
    _choice(cfg.schedule.name, SCHEDULES[cfg.model.family], f"schedule (for the {cfg.model.family} family)")
    if cfg.width < 1:
        raise PackedSSError(f"invalid width={cfg.width}; the speculative width must be >= 1")
    if cfg.temperature < 0:
        raise PackedSSError(f"invalid temperature={cfg.temperature}; use 0 for greedy or a positive value")
    _choice(cfg.verify, VERIFY_RULES, "verify")
    _choice(cfg.order, ORDERS, "order")
    _choice(cfg.device, DEVICES, "device")
    _choice(cfg.dtype, ("auto", *DTYPES), "dtype")
    _choice(cfg.timing, TIMINGS, "timing")
    if cfg.repeats < 1:
        raise PackedSSError(f"invalid repeats={cfg.repeats}; must be >= 1")
    if cfg.limit is not None and cfg.limit < 1:
        raise PackedSSError(f"invalid limit={cfg.limit}; must be >= 1, or null for all questions")
    if cfg.max_new_tokens is not None and cfg.max_new_tokens < 1:
        raise PackedSSError(f"invalid max_new_tokens={cfg.max_new_tokens}; must be >= 1")
    if cfg.model.family == "nemotron" and cfg.order != "ltr":
        raise PackedSSError(f"order={cfg.order} needs an any-order model; the {cfg.model.name} model decodes left to right (order=ltr)")


def validate_width(cfg, block_size: Optional[int]) -> None:
    """The drafter's block must hold the call's block: B = W+1 (LTR) or W (any-order)."""
    if block_size is None:
        return
    block = cfg.width + 1 if cfg.model.family == "nemotron" else cfg.width
    if block > block_size:
        largest = block_size - 1 if cfg.model.family == "nemotron" else block_size
        raise PackedSSError(
            f"invalid width={cfg.width}: model {cfg.model.name} holds blocks of at most {block_size} rows; "
            f"valid widths: 1..{largest}"
        )
