"""The model families: one entry per family says everything the rest of the harness needs to
know about it. The runner, the config validation, the model loading, the record checks and the
analysis read this table; adding a family means adding one entry (with `register_family`) and
its modules. See docs/schedules.md for the schedules and their row formulas."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packedss.decoding import (
    ANYORDER_DECODERS,
    LTR_DECODERS,
    ORDERS,
    SDAR_DECODERS,
    AnyOrderSettings,
    CallModel,
    DecodeSettings,
    Decoded,
    Decoder,
    LTRSettings,
    StopCheck,
)
from packedss.decoding.driver import Response, run_alone
from packedss.decoding.pld import DEFAULT_MAX_NGRAM
from packedss.decoding.pld_schedules import LOOKUP_DECODERS
from packedss.errors import PackedSSError


@dataclass(frozen=True)
class Family:
    name: str
    # The family's schedules: each class carries its name, calls per iteration, largest call and
    # rows formula (packedss.decoding.Decoder).
    decoders: tuple[type[Decoder], ...]
    # Verification orders the family can run; () when it has none (the order setting must stay unset).
    orders: tuple[str, ...]
    # B = rows of one draft block for a speculative width W.
    block_of_width: Callable[[int], int]
    settings_type: type[DecodeSettings]
    # (schedule, options, largest block of the checkpoint) -> the family's own settings fields;
    # options: the run's pad_verify, order (None: the family's first), native_window (None: default),
    # max_ngram (pld; None: default).
    settings_fields: Callable[[str, Mapping, int | None], dict]
    # (checkpoint directory, torch device, dtype name) -> a CallModel with eos_token_ids.
    load_adapter: Callable[[Path, object, str], CallModel]
    # config.json of a checkpoint -> the largest block its drafter holds (None: not stated).
    max_block: Callable[[dict], int | None]
    # checkpoint directory -> its backbone's transformers config, read without loading weights
    # (the runner sizes the caches of concurrency C with it before anything loads).
    backbone_config: Callable[[Path], object]

    @property
    def schedules(self) -> tuple[str, ...]:
        return tuple(decoder.name for decoder in self.decoders)

    @property
    def lossy_schedules(self) -> frozenset[str]:
        return frozenset(decoder.name for decoder in self.decoders if decoder.lossy)

    @property
    def calls_per_iteration(self) -> dict[str, int]:
        return {decoder.name: decoder.calls_per_iteration for decoder in self.decoders}

    def schedule(self, name: str) -> type[Decoder]:
        for decoder in self.decoders:
            if decoder.name == name:
                return decoder
        raise PackedSSError(
            f"invalid schedule={name!r} for the {self.name} family; valid choices: {', '.join(self.schedules)}"
        )

    def response(self, model: CallModel, prompt: Sequence[int], settings: DecodeSettings,
                 stop_check: StopCheck | None = None) -> Response:  # fmt: skip
        """One response of the settings' schedule, as a coroutine (run alone by `decode`, or in a
        batch by packedss.decoding.engine)."""
        return Response(model, prompt, settings, stop_check, self.schedule(settings.schedule))

    def decode(self, model: CallModel, prompt: Sequence[int], settings: DecodeSettings,
               stop_check: StopCheck | None = None) -> Decoded:  # fmt: skip
        """Decode one response with the settings' schedule."""
        return run_alone(self.response(model, prompt, settings, stop_check))

    def largest_width(self, max_block: int) -> int:
        """The largest W whose block fits a drafter of `max_block` rows (0: none does)."""
        return max((w for w in range(1, max_block + 1) if self.block_of_width(w) <= max_block), default=0)

    def prompt_reserve(self, config: dict) -> int:
        """The rows a model's prompts leave for a call beside the output cap: the largest call any
        of the family's schedules makes at the largest width the checkpoint's drafter holds (a
        family whose checkpoints state no limit: its training block, config.json `block_size`).
        It is the model's, not the job's, so every schedule and every width of a model decodes the
        same prompt (an AR run pairs with the runs of every W)."""
        block = self.max_block(config) or config.get("block_size")
        width = self.largest_width(int(block)) if block else 1
        return max(decoder.largest_call_rows(width) for decoder in self.decoders)


def _load_nemotron(path: Path, device, dtype: str) -> CallModel:
    from packedss.models.nemotron import load_nemotron

    return load_nemotron(path, device=device, dtype=dtype)


def _load_setdlm(path: Path, device, dtype: str) -> CallModel:
    from packedss.models.setdlm import load_setdlm

    return load_setdlm(path, device=device, dtype=dtype)


def _nemotron_backbone(path: Path):
    from packedss.models.checkpoint import quiet_transformers, read_config
    from packedss.models.nemotron import backbone_config

    config = read_config(path, f"Nemotron-format checkpoint {path}")
    with quiet_transformers():
        return backbone_config(config)


def _setdlm_backbone(path: Path):
    from packedss.models.checkpoint import quiet_transformers, read_config
    from packedss.models.setdlm import qwen3_config

    what = f"SetDLM checkpoint {path}"
    config = read_config(path, what)
    with quiet_transformers():
        return qwen3_config(config, Path(path), what, vocab_size=None)


def _setdlm_window(config: dict) -> int | None:
    # The released config keeps smax (= the largest window W) in noise_config.
    value = (config.get("noise_config") or {}).get("max_block_size")
    return int(value) if value is not None else None


def _lookup_settings(schedule: str, options: Mapping) -> dict:
    """pld's own field, max_ngram (None: transformers' default); no other schedule reads it."""
    if schedule != "pld":
        return {}
    max_ngram = options.get("max_ngram")
    return {"max_ngram": DEFAULT_MAX_NGRAM if max_ngram is None else int(max_ngram)}


def _ltr_settings(schedule: str, options: Mapping, max_block: int | None) -> dict:
    return {"pad_verify": bool(options.get("pad_verify", True))} | _lookup_settings(schedule, options)


def _setdlm_settings(schedule: str, options: Mapping, max_block: int | None) -> dict:
    fields = {"order": options.get("order") or ORDERS[0]} | _lookup_settings(schedule, options)
    if schedule == "pld" and fields["order"] != "ltr":
        raise PackedSSError(f"invalid order={fields['order']} for schedule=pld; prompt lookup verifies left to right: use order=ltr")
    if schedule == "native" and (options.get("native_window") or max_block):
        # The released native sampler runs a window of half the checkpoint's smax (4 on smax8, 8 on smax16).
        fields["native_window"] = options.get("native_window") or max(1, max_block // 2)
    return fields


def _load_sdar(path: Path, device, dtype: str) -> CallModel:
    from packedss.models.sdar import load_sdar

    return load_sdar(path, device=device, dtype=dtype)


def _sdar_backbone(path: Path):
    from packedss.models.checkpoint import read_config
    from packedss.models.sdar import qwen3_config

    return qwen3_config(read_config(path, f"SDAR checkpoint {path}"))


def _nemotron_block(config: dict) -> int | None:
    value = config.get("block_size")
    return int(value) if value is not None else None


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    FAMILIES[family.name] = family
    return family


register_family(
    Family(
        name="nemotron",
        decoders=(*LTR_DECODERS, LOOKUP_DECODERS["nemotron"]),
        orders=(),
        block_of_width=lambda width: width + 1,
        settings_type=LTRSettings,
        settings_fields=_ltr_settings,
        load_adapter=_load_nemotron,
        max_block=_nemotron_block,
        backbone_config=_nemotron_backbone,
    )
)
register_family(
    Family(
        name="setdlm",
        decoders=(*ANYORDER_DECODERS, LOOKUP_DECODERS["setdlm"]),
        orders=ORDERS,
        block_of_width=lambda width: width,
        settings_type=AnyOrderSettings,
        settings_fields=_setdlm_settings,
        load_adapter=_load_setdlm,
        max_block=_setdlm_window,
        backbone_config=_setdlm_backbone,
    )
)

# SDAR: B = W + 1 is the block of every schedule (the draft block of Linear-/Packed-SS, the aligned
# block of sdar-native and s2d2; W = 3 is the release's block of 4). config.json's block_size is
# the training block, not a limit: the release decodes other block lengths on the same weights.
register_family(
    Family(
        name="sdar",
        decoders=(*SDAR_DECODERS, LOOKUP_DECODERS["sdar"]),
        orders=(),
        block_of_width=lambda width: width + 1,
        settings_type=LTRSettings,
        settings_fields=_ltr_settings,
        load_adapter=_load_sdar,
        max_block=lambda config: None,
        backbone_config=_sdar_backbone,
    )
)


def family_named(name: str) -> Family:
    family = FAMILIES.get(name)
    if family is None:
        raise PackedSSError(f"invalid model.family={name!r}; valid choices: {', '.join(FAMILIES)}")
    return family


def schedule_names() -> tuple[str, ...]:
    """Every schedule of every family, in the order the families list them (tables use it)."""
    names: list[str] = []
    for family in FAMILIES.values():
        names += [s for s in family.schedules if s not in names]
    return tuple(names)
