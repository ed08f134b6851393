"""A job, resolved once from the composed config (`job_spec`): its identity (JobSpec) and what
else it needs (ResolvedJob). Nothing after `job_spec` reads the config.

The identity is every setting that can change a record's content or its timing. It alone gives
the config hash, the record fields, the record file path, the sweep's job key and the analysis's
run key (docs/records.md).

What only selects which responses are made (limit, samples, repeats) is not identity: a rerun
with a larger limit or more samples resumes the same file. A setting that a schedule does not
read is normalised away, so that jobs which decode the same responses have one identity: the LTR
AR target reads no W (its width is 0, whatever `width=` says), only Packed-SS of a family
whose settings carry `pad_verify` reads it, and only pld reads `schedule.max_ngram`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from packedss.config import ModelConfig, check_out_dir, resolved_order, validate, validate_width, width_source
from packedss.decoding import GREEDY
from packedss.decoding.pld import DEFAULT_MAX_NGRAM
from packedss.decoding.verify import SAMPLER
from packedss.errors import PackedSSError
from packedss.families import Family, family_named


@dataclass(frozen=True)
class JobSpec:
    # the model
    model: str  # the model config's name
    family: str
    checkpoint: str  # the hub id when the model config names one, else the local directory
    checkpoint_dir: Optional[str]  # the local directory given (model.path or a paths file); None: the hub cache
    chat: bool
    end_of_turn: tuple[str, ...]
    lora: bool
    lora_path: Optional[str]
    # where and how it runs
    device: str  # "cpu", "cuda" (or the CUDA device's name once resolved), "auto" before
    dtype: str
    threads: int  # torch intra-op threads (0: not resolved yet)
    compile: str
    timing: str
    cost_model: Optional[str]  # whose time the records carry: the cost twin's label, None: the model's own
    warmup_decode: bool  # an untimed decode ran before the timed ones (warmup=true)
    # the task
    task: str
    task_config: dict  # every field of the TaskConfig the job ran with
    data_dir: Optional[str]  # the local data directory (absolute), None: the hub or the packaged data
    # the decoding
    schedule: str
    width: int  # W; 0 for a schedule that reads none
    block: int  # B of the family's rule for that width
    pad_verify: Optional[bool]  # None where the schedule does not read it
    native_window: Optional[int]  # the native decoder's window (native only)
    temperature: float
    verify: str  # "greedy" at T = 0
    order: Optional[str]  # the verification order (an unset one is the family's first); None without orders
    seed: int
    max_new_tokens: int
    lossy: bool  # the schedule is not meant to equal the AR output
    concurrency: int  # C: responses decoded together, each call carrying every active one's rows
    # how sampled tokens are drawn, where the job's draws are by the inverse CDF (T > 0, every
    # schedule but SDAR's native and S2D2); None (left out: OPTIONAL_IDENTITY_FIELDS) elsewhere
    sampler: Optional[str] = None
    # pld's longest n-gram looked up (schedule.max_ngram); None (left out) for every other schedule
    max_ngram: Optional[int] = None

    @property
    def call_width(self) -> int:
        """The width the decoder's calls are sized by: the native decoder's window, else W."""
        return self.native_window or self.width

    def fields(self) -> dict[str, Any]:
        """The identity as the record's fields (JSON values)."""
        values = dataclasses.asdict(self)
        values["end_of_turn"] = list(self.end_of_turn)
        return {name: value for name, value in values.items() if value is not None or name not in OPTIONAL_IDENTITY_FIELDS}

    @property
    def config_hash(self) -> str:
        """16 hex digits of the sha256 of the canonical JSON of the identity."""
        canonical = json.dumps(self.fields(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def record_path(self, out_dir: str | Path) -> Path:
        """<out_dir>/<model>/<task>/<schedule>[-n<max_ngram>][-nopad][-lora][-W<width>]-T<temperature>[-<verify>]
        [-<order>]-s<seed>[-C<concurrency>][-compiled-<mode>][-cost-<shape>-<L>L-<dtype>-<device>]-<config hash>.jsonl:
        the readable parts name the
        usual axes, and the hash makes the name unique per identity (dtype, output cap, ...)."""
        name = self.schedule
        if self.max_ngram is not None and self.max_ngram != DEFAULT_MAX_NGRAM:
            name += f"-n{self.max_ngram}"
        if self.pad_verify is False:
            name += "-nopad"
        if self.lora:
            name += "-lora"
        if self.width:
            name += f"-W{self.width}"
        name += f"-T{self.temperature:g}"
        if self.temperature > 0:
            name += f"-{self.verify}"
        if self.order:
            name += f"-{self.order}"
        name += f"-s{self.seed}"
        if self.concurrency > 1:
            name += f"-C{self.concurrency}"
        if self.compile != "none":
            name += f"-compiled-{self.compile}"
        if self.cost_model:  # shape:layersL:dtype:device, a shape directory by its own name
            shape, layers, dtype, device = self.cost_model.rsplit(":", 3)
            name += f"-cost-{Path(shape).name}-{layers}-{dtype}-{device}"
        return Path(out_dir) / self.model / self.task / f"{name}-{self.config_hash}.jsonl"


IDENTITY_FIELDS = tuple(f.name for f in dataclasses.fields(JobSpec))
# Fields added after records existed: a record (and the hash) holds one only where it is set, so
# the jobs it does not concern keep their identity and their record files (docs/records.md).
OPTIONAL_IDENTITY_FIELDS = ("sampler", "max_ngram")
REQUIRED_IDENTITY_FIELDS = tuple(name for name in IDENTITY_FIELDS if name not in OPTIONAL_IDENTITY_FIELDS)


@dataclass(frozen=True)
class ResolvedJob:
    """Everything one job needs, resolved and checked once (`job_spec`): its identity, where its
    weights are, and what only selects or places its responses."""

    identity: JobSpec
    model_config: ModelConfig  # the model's settings as plain values (what the loaders take)
    model_path: Path  # the checkpoint's local directory
    max_block: Optional[int]  # the largest block its drafter holds (None: its config.json states none)
    prompt_reserve: int  # the rows every prompt of the model leaves for a call (Family.prompt_reserve)
    device: Any  # the torch.device it runs on
    cost: Any  # the cost twin's checked packedss.models.cost_twin.CostSpec; None: the model's own time
    task_config: Any  # the TaskConfig (the identity holds its fields)
    width: int  # the W the decoder's settings carry (the identity's is 0 where the schedule reads none)
    # Where W came from (config.width_source: explicit, model, default), a record field beside the
    # identity (the same W decodes the same responses wherever it came from); None where the
    # schedule reads no W.
    width_source: Optional[str]
    sampling_rule: str  # the verification rule as configured (the identity says "greedy" at T = 0)
    settings_fields: dict  # the family's own decode settings (pad_verify, order, native_window, max_ngram)
    limit: Optional[int]  # the first `limit` questions (None: all)
    samples: int
    repeats: int
    data_dir: Optional[str]  # as configured (the identity holds it resolved)
    out_dir: str
    progress: bool

    @property
    def family(self) -> Family:
        return family_named(self.identity.family)

    @property
    def record_path(self) -> Path:
        return self.identity.record_path(self.out_dir)


def job_spec(cfg) -> ResolvedJob:
    """The job `cfg` describes, validated and resolved on this machine: the device, dtype and
    threads it runs with, the cost twin, the checkpoint and the width its drafter holds. Raises
    PackedSSError (one message) before anything loads; creates nothing."""
    import torch
    from omegaconf import OmegaConf

    from packedss.models import resolve_path, select_checkpoint
    from packedss.models.checkpoint import read_config

    validate(cfg)
    check_out_dir(cfg.out_dir)
    family = family_named(cfg.model.family)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype_name(cfg.dtype, device)
    # Small CPU models are dominated by per-op overhead; a second intra-op thread buys little
    # alone and costs up to 100x per op when the cores are shared (OpenMP spin-waits).
    threads = cfg.threads if cfg.threads > 0 else (1 if device.type == "cpu" else torch.get_num_threads())
    cost = cost_of(cfg.model, device, dtype)
    model_path = resolve_path(cfg.model, select_checkpoint(cfg.model, cfg.checkpoint_dirs))
    checkpoint_config = read_config(model_path, f"model {cfg.model.name}")
    max_block = family.max_block(checkpoint_config)
    validate_width(cfg, max_block)
    task_config = task_config_for(cfg)
    identity = identity_of(cfg, task_config, device=device_name(device), dtype=dtype, threads=threads,
                           max_block=max_block, cost_model=None if cost is None else cost.label)  # fmt: skip
    options = {"pad_verify": cfg.schedule.pad_verify, "order": identity.order, "native_window": identity.native_window,
               "max_ngram": identity.max_ngram}
    return ResolvedJob(
        identity=identity, model_config=ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True)),
        model_path=model_path, max_block=max_block,
        prompt_reserve=family.prompt_reserve(checkpoint_config), device=device, cost=cost, task_config=task_config,
        width=int(cfg.width), width_source=width_source(cfg) if identity.width else None, sampling_rule=cfg.verify,
        settings_fields=family.settings_fields(identity.schedule, options, max_block),
        limit=cfg.limit, samples=int(cfg.samples), repeats=int(cfg.repeats), data_dir=cfg.data_dir,
        out_dir=str(cfg.out_dir), progress=bool(cfg.progress),
    )  # fmt: skip


def cost_of(model_cfg, device, dtype: str):
    """The cost twin's checked CostSpec (model.cost_*; its device and dtype default to the job's),
    None without one: checked before anything loads."""
    from packedss.models.cost_twin import cost_spec

    if model_cfg.cost_shape is None:
        return None
    cost_device = device if model_cfg.cost_device is None else resolve_device(model_cfg.cost_device)
    return cost_spec(model_cfg.cost_shape, model_cfg.cost_layers, model_cfg.cost_dtype or dtype, cost_device)


def resolve_device(name: str):
    """The torch.device of a device setting (auto: CUDA when there is one)."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise PackedSSError("device=cuda but no CUDA device is available; use device=cpu or device=auto")
    return torch.device(name)


def device_name(device) -> str:
    """"cpu", or the CUDA device's name: runs on different GPUs are different jobs."""
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def resolve_dtype_name(name: str, device) -> str:
    return name if name != "auto" else ("bfloat16" if device.type == "cuda" else "float32")


def identity_of(
    cfg,
    task_config,
    *,
    device: str,
    dtype: str,
    threads: int,
    max_block: Optional[int],
    cost_model: Optional[str] = None,
) -> JobSpec:
    """The identity of the job `cfg` describes (`cfg` validated). `task_config` is its TaskConfig (the model's chat
    prompt applied); device, dtype and threads as resolved on the machine that runs the job (the
    sweep, which keys jobs before any runs, passes the configured values); `max_block`: the
    largest block of the checkpoint's drafter (None when its config.json is not at hand), which
    sets the native decoder's default window; `cost_model`: the cost twin's label (None: none)."""
    from packedss.models import select_checkpoint
    from packedss.tasks.core import identity_fields as task_identity_fields

    family = family_named(cfg.model.family)
    decoder = family.schedule(cfg.schedule.name)
    order = resolved_order(cfg)
    options = {"pad_verify": cfg.schedule.pad_verify, "order": order, "native_window": cfg.native_window,
               "max_ngram": cfg.schedule.max_ngram}
    settings = family.settings_fields(cfg.schedule.name, options, max_block)
    width = cfg.width if decoder.uses_width else 0
    checkpoint = select_checkpoint(cfg.model, cfg.checkpoint_dirs)
    return JobSpec(
        model=cfg.model.name,
        family=family.name,
        checkpoint=checkpoint.hub_id or str(checkpoint.path),
        checkpoint_dir=str(checkpoint.path) if checkpoint.path else None,
        chat=bool(cfg.model.chat),
        end_of_turn=tuple(cfg.model.end_of_turn),
        lora=bool(cfg.model.lora),
        lora_path=cfg.model.lora_path if cfg.model.lora else None,
        device=device,
        dtype=dtype,
        threads=threads,
        compile=cfg.model.compile,
        timing=cfg.timing,
        cost_model=cost_model,
        warmup_decode=bool(cfg.warmup),
        task=task_config.name,
        task_config=task_identity_fields(task_config),
        data_dir=str(Path(cfg.data_dir).expanduser().resolve()) if cfg.data_dir else None,
        schedule=decoder.name,
        width=width,
        block=family.block_of_width(width),
        pad_verify=bool(settings["pad_verify"]) if "pad_verify" in settings and decoder.reads_pad_verify else None,
        native_window=settings.get("native_window"),
        temperature=float(cfg.temperature),
        verify=GREEDY if cfg.temperature == 0 else cfg.verify,
        order=order,
        seed=int(cfg.seed),
        max_new_tokens=int(cfg.max_new_tokens or task_config.max_new_tokens),
        lossy=decoder.lossy,
        concurrency=int(cfg.concurrency),
        sampler=decoder.sampler if cfg.temperature > 0 and decoder.sampler == SAMPLER else None,
        max_ngram=settings.get("max_ngram"),
    )


def task_config_for(cfg):
    """The job's task config: the task's own, with the model's chat prompt for this task (the
    released evaluation's wording) when the model lists one."""
    from packedss.tasks import config_from_dict

    task_cfg = config_from_dict(cfg.task)
    prompt = (cfg.model.prompts or {}).get(task_cfg.name)
    return dataclasses.replace(task_cfg, prompt_chat=prompt) if prompt else task_cfg


def configured_spec(cfg, max_block: Optional[int] = None) -> JobSpec:
    """The identity of a job from its config alone, before it runs (device, dtype and threads as
    configured): what the sweep keys jobs by, so that two overrides that decode the same
    responses (AR at two widths) run once."""
    model = cfg.model
    cost = None
    if model.cost_shape is not None:  # as configured: the layer count, dtype and device not resolved
        cost = f"{model.cost_shape}:{model.cost_layers or 'all'}L:{model.cost_dtype or cfg.dtype}:{model.cost_device or cfg.device}"
    return identity_of(cfg, task_config_for(cfg), device=cfg.device, dtype=cfg.dtype, threads=cfg.threads,
                    max_block=max_block, cost_model=cost)  # fmt: skip
