"""Structured configs (Hydra ConfigStore): the schema every YAML under conf/ is merged into, so
unknown keys fail at start, and `validate` turns invalid values into one clear message that
lists the valid choices. What a family accepts comes from the family table (packedss.families)."""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from packedss.errors import PackedSSError, unknown_key_message
from packedss.models import resolve_path, select_checkpoint
from packedss.paths import CONF_DIR
from packedss.tasks import TaskConfig
from packedss.tasks.core import MULTI_TURN_TASKS

# This module imports neither torch nor transformers (the family table and the libraries'
# choices are imported where they are checked), so that run.py, sweeps and the plan check the
# values of a config before those load: bad input fails in about a second (docs/errors.md).

DEVICES = ("auto", "cpu", "cuda")
DEFAULT_WIDTH = 8  # the width of a model whose config names none (conf/config.yaml)


@dataclass
class ModelConfig:
    name: str = MISSING
    family: str = "nemotron"  # a name of packedss.families.FAMILIES
    # The width its checkpoint was released for (SDAR: 3, the block of 4): the run's width unless
    # width= is given. null: the global default (DEFAULT_WIDTH).
    width: Optional[int] = None
    hub_id: Optional[str] = None  # the released weights (used only when download=true or cached)
    path: Optional[str] = None  # a local checkpoint directory; relative paths resolve from the project root
    download: bool = False  # fetch hub_id when it is not cached locally (never in tests)
    chat: bool = False  # build prompts with the tokenizer's chat template (instruct models)
    # Chat user message per task, replacing the task's prompt_chat (the released evaluation's prompt).
    prompts: dict[str, str] = field(default_factory=dict)
    end_of_turn: list[str] = field(default_factory=list)  # tokens that end a response like EOS (chat)
    lora: bool = False  # apply the proposal-only LoRA to draft rows (paper Tables 4-5)
    lora_path: Optional[str] = None  # PEFT adapter directory; relative to the model directory when not absolute
    compile: str = "none"  # none | default | reduce-overhead | max-autotune: compiled fixed-shape decode calls
    # A cost twin (packedss.models.cost_twin): every call also runs on random weights of this shape (a
    # name of cost_twin.SHAPES or a directory with a config.json), whose time is the call's model time.
    cost_shape: Optional[str] = None  # null: no twin, the model's own time
    cost_layers: Optional[int] = None  # the twin's first N layers (null: all of the shape's)
    cost_dtype: Optional[str] = None  # null: the run's dtype
    cost_device: Optional[str] = None  # null: the run's device


@dataclass
class ScheduleConfig:
    name: str = MISSING
    pad_verify: bool = True  # packed: pad the verify segment to B rows (2B rows per call)
    paper_width: int = 8  # the width the paper's Nemotron runs use (B - 1); experiments read it
    max_ngram: Optional[int] = None  # pld: the longest n-gram of the context looked up; null: not read


@dataclass
class RunConfig:
    model: ModelConfig = MISSING
    task: TaskConfig = MISSING
    schedule: ScheduleConfig = MISSING
    width: int = DEFAULT_WIDTH  # conf/config.yaml: the model's width (model.width), else DEFAULT_WIDTH
    temperature: float = 0.0
    verify: str = "rejection"
    order: Optional[str] = None  # verification order (any-order families); null: the family's first
    seed: int = 0
    samples: int = 1  # independent samples per question (T > 0), each with its own seeded generator
    native_window: Optional[int] = None  # native decoder's window; null: half the checkpoint's smax
    repeats: int = 1  # timing repeats of each response
    concurrency: int = 1  # C: responses decoded together, every call carrying each one's rows
    limit: Optional[int] = 5
    max_new_tokens: Optional[int] = None  # None: the task's own cap
    data_dir: Optional[str] = None
    out_dir: str = "results/default/records"
    checkpoint_dirs: dict[str, str] = field(default_factory=dict)  # hub id -> local directory (conf/paths)
    device: str = "auto"
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    timing: str = "sync"  # CUDA model time: "sync" (synchronize per call) or "events" (CUDA events)
    threads: int = 0  # torch intra-op threads; 0 = auto (1 on CPU: see README, 'CPU threads')
    warmup: bool = True  # one untimed, unrecorded decode before the timed ones
    progress: bool = True  # a progress bar (tqdm hides itself in non-interactive logs)


def register_configs() -> None:
    store = ConfigStore.instance()
    store.store(name="run_schema", node=RunConfig)
    OmegaConf.register_new_resolver("serving_width", serving_width, replace=True)
    OmegaConf.register_new_resolver("model_width", model_width, replace=True)


def model_width(released, default) -> int:
    """`${model_width:${model.width},8}`, conf/config.yaml's width: the model's released width, or
    the global default when its config names none."""
    return default if released is None else released


WIDTH_SOURCES = ("explicit", "model", "default")


def width_source(cfg) -> str:
    """Where the job's width comes from: "model" (its model config's released width), "default"
    (the global default: the model names none), or "explicit" (`width=` on the command line or
    in a preset). A config that is not a DictConfig (already resolved) counts as explicit."""
    if not OmegaConf.is_config(cfg) or not OmegaConf.is_interpolation(cfg, "width"):
        return "explicit"
    raw = OmegaConf.to_container(cfg, resolve=False)["width"]
    if not str(raw).startswith("${model_width:"):
        return "explicit"
    return "default" if cfg.model.width is None else "model"


def serving_width(width, *trained: int) -> int:
    """`${serving_width:${width},8,16}`: of the widths that checkpoints were trained for (SetDLM's
    smax), the smallest that serves W, so a model config names the checkpoint of each width."""
    serving = sorted(int(w) for w in trained if int(w) >= int(width))
    if not serving:
        raise PackedSSError(f"invalid width={width}: the model's checkpoints serve widths up to {max(map(int, trained))}")
    return serving[0]


def _choice(value, valid, key: str) -> None:
    if value not in valid:
        raise PackedSSError(f"invalid {key}={value!r}; valid choices: {', '.join(map(str, valid))}")


def unknown_keys(cfg) -> None:
    """Keys added with `+` (`+widht=3`) that no schema field names: the schema lets them through."""
    nodes = ((cfg, RunConfig, ""), (cfg.model, ModelConfig, "model."), (cfg.task, TaskConfig, "task."),
             (cfg.schedule, ScheduleConfig, "schedule."))  # fmt: skip
    for node, schema, prefix in nodes:
        names = [f.name for f in dataclasses.fields(schema)]
        for key in node.keys():
            if key not in names:
                raise PackedSSError(unknown_key_message(f"{prefix}{key}", names))


def models_running(schedule: str) -> str:
    """' (schedule=X runs on model=a, b)': the model configs whose family has the schedule, '' for none."""
    from packedss.families import FAMILIES, family_named

    names = []
    for path in sorted((CONF_DIR / "model").glob("*.yaml")):
        family = OmegaConf.load(path).get("family", "nemotron")
        if family in FAMILIES and schedule in family_named(family).schedules:
            names.append(path.stem)
    return f" (schedule={schedule} runs on model={', '.join(names)})" if names else ""


def _finite(cfg, key: str) -> None:
    value = cfg[key]
    if value is not None and isinstance(value, float) and not math.isfinite(value):
        raise PackedSSError(f"invalid {key}={value}; {key} must be a finite number")


def validate(cfg) -> None:
    """Check every value that the schema's types cannot; raises PackedSSError with one message.
    The values first (`check_values`, no torch), then the choices that the family table and
    the libraries define (`check_choices`, which imports them)."""
    check_values(cfg)
    check_choices(cfg)


def check_values(cfg) -> None:
    """The checks that need neither torch nor the family table: keys, interpolations, and the
    ranges of the numbers."""
    if OmegaConf.is_config(cfg):
        unknown_keys(cfg)
        try:
            OmegaConf.to_container(cfg, resolve=True)
        except InterpolationResolutionError as err:
            cause = err.__cause__ or err.__context__  # a resolver's own error, e.g. serving_width's
            raise PackedSSError(str(cause) if isinstance(cause, PackedSSError) else str(err)) from None
    _finite(cfg, "temperature")
    _finite(cfg.task, "time_limit_s")
    if getattr(cfg.task, "per_category", 0) < 0:
        raise PackedSSError(f"invalid task.per_category={cfg.task.per_category}; it must be >= 0 (0: every question)")
    if getattr(cfg.task, "per_category", 0) and cfg.task.name != "specbench":
        raise PackedSSError(f"task.per_category={cfg.task.per_category} is read by task=specbench only, not "
                            f"task={cfg.task.name}; leave it out (limit= selects questions of every task)")
    if cfg.samples > 1 and cfg.task.name in MULTI_TURN_TASKS:
        raise PackedSSError(f"samples={cfg.samples}: task={cfg.task.name} has conversations of several turns, and a later "
                            "turn's prompt holds the first sample's answer to the turn before it; run it with samples=1")
    if cfg.model.width is not None and cfg.model.width < 1:
        raise PackedSSError(f"invalid model.width={cfg.model.width}; the model's width must be >= 1, or null for the default")
    if cfg.width < 1:
        raise PackedSSError(f"invalid width={cfg.width}; the speculative width must be >= 1")
    if cfg.temperature < 0:
        raise PackedSSError(f"invalid temperature={cfg.temperature}; use 0 for greedy or a positive value")
    _choice(cfg.device, DEVICES, "device")
    if cfg.samples < 1:
        raise PackedSSError(f"invalid samples={cfg.samples}; must be >= 1")
    if cfg.samples > 1 and cfg.temperature == 0:
        raise PackedSSError(
            f"samples={cfg.samples} at temperature=0 would decode {cfg.samples} identical responses; "
            "use samples=1 for greedy runs (repeats=N re-times a response)"
        )
    if cfg.schedule.max_ngram is not None and cfg.schedule.max_ngram < 1:
        raise PackedSSError(
            f"invalid schedule.max_ngram={cfg.schedule.max_ngram}; the n-gram pld looks up must be >= 1 (default 2)"
        )
    if cfg.native_window is not None and cfg.native_window < 1:
        raise PackedSSError(f"invalid native_window={cfg.native_window}; must be >= 1, or null for the default")
    if cfg.repeats < 1:
        raise PackedSSError(f"invalid repeats={cfg.repeats}; must be >= 1")
    if cfg.concurrency < 1:
        raise PackedSSError(f"invalid concurrency={cfg.concurrency}; must be >= 1 (1: one response at a time)")
    if cfg.limit is not None and cfg.limit < 1:
        raise PackedSSError(f"invalid limit={cfg.limit}; must be >= 1, or null for all questions")
    if cfg.max_new_tokens is not None and cfg.max_new_tokens < 1:
        raise PackedSSError(f"invalid max_new_tokens={cfg.max_new_tokens}; must be >= 1")
    if cfg.threads < 0:
        raise PackedSSError(f"invalid threads={cfg.threads}; must be >= 1, or 0 for the default (1 on CPU)")


def check_choices(cfg) -> None:
    """The family's schedules and orders, and the libraries' verification rules, dtypes, timings
    and compile modes (these imports load torch)."""
    from packedss.decoding.trace import TIMINGS
    from packedss.decoding.verify import VERIFY_RULES
    from packedss.families import FAMILIES, family_named
    from packedss.models.checkpoint import COMPILE_MODES, DTYPES

    _choice(cfg.model.family, tuple(FAMILIES), "model.family")
    family = family_named(cfg.model.family)
    if cfg.schedule.name not in family.schedules:
        raise PackedSSError(
            f"invalid schedule={cfg.schedule.name!r} for model {cfg.model.name} ({family.name} family); valid: "
            f"{', '.join(family.schedules)}{models_running(cfg.schedule.name)}"
        )
    _choice(cfg.verify, VERIFY_RULES, "verify")
    if family.orders:
        if cfg.order is not None:
            _choice(cfg.order, family.orders, f"order (for the {family.name} family)")
    elif cfg.order is not None:
        raise PackedSSError(
            f"order={cfg.order} needs an any-order model; the {cfg.model.name} model ({family.name} family) "
            "has no verification order: leave order unset"
        )
    _choice(cfg.dtype, ("auto", *DTYPES), "dtype")
    _choice(cfg.timing, TIMINGS, "timing")
    _choice(cfg.model.compile, COMPILE_MODES, "model.compile")
    _validate_cost(cfg, DTYPES)
    if cfg.model.compile != "none" and not cfg.warmup:
        raise PackedSSError(
            f"model.compile={cfg.model.compile} needs warmup=true: call shapes are compiled in the untimed warm-up"
        )


def check_before_loading(cfg) -> None:
    """What can be checked before the heavy libraries load (torch's compiler, transformers):
    the values, out_dir and the checkpoint's directory, so that bad input fails in seconds."""
    validate(cfg)
    check_out_dir(cfg.out_dir)
    resolve_path(cfg.model, select_checkpoint(cfg.model, cfg.checkpoint_dirs))


def check_out_dir(out_dir: str) -> None:
    """out_dir is, or can be made, a writable directory: checked before anything is loaded, so a
    job does not load a model only to fail at its first record. Creates nothing."""
    path = Path(os.path.expanduser(str(out_dir))).absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise PackedSSError(f"out_dir={out_dir}: {existing} is a file, not a directory; choose another out_dir")
    try:  # a real probe: permissions, read-only file systems and root's exceptions alike
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise PackedSSError(
            f"out_dir={out_dir}: cannot write in {existing} ({err.strerror}); choose a writable out_dir"
        ) from None


def _validate_cost(cfg, dtypes) -> None:
    """The cost twin's settings that need no device (cost_twin.cost_spec checks the rest)."""
    model = cfg.model
    if model.cost_shape is None:
        stray = [key for key in ("cost_layers", "cost_dtype", "cost_device") if getattr(model, key) is not None]
        if stray:
            raise PackedSSError(f"model.{stray[0]} is set but model.cost_shape is not; set model.cost_shape too")
        return
    if model.family == "setdlm":
        raise PackedSSError(
            "model.cost_shape needs a nemotron- or sdar-family model (the setdlm adapter crops its own cache, "
            "which a cost twin does not reproduce)"
        )
    if model.lora:
        raise PackedSSError("model.cost_shape with model.lora=true: the cost twin has no proposal LoRA; use model.lora=false")
    if model.cost_dtype is not None:
        _choice(model.cost_dtype, dtypes, "model.cost_dtype")
    if model.cost_device is not None:
        _choice(model.cost_device, DEVICES, "model.cost_device")


def resolved_order(cfg) -> Optional[str]:
    """The verification order a job runs: the configured one, else the family's first (None when
    the family has no order)."""
    from packedss.families import family_named

    orders = family_named(cfg.model.family).orders
    return (cfg.order or orders[0]) if orders else None


def validate_width(cfg, max_block: Optional[int]) -> None:
    """The drafter's block must hold the call's block (B from W by the family's rule)."""
    if max_block is None:
        return
    from packedss.families import family_named

    family = family_named(cfg.model.family)
    if family.block_of_width(cfg.width) > max_block:
        raise PackedSSError(
            f"invalid width={cfg.width}: model {cfg.model.name} holds blocks of at most {max_block} rows; "
            f"valid widths: 1..{family.largest_width(max_block)}"
        )
