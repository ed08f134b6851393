"""Proposal-only LoRA (paper Tables 4-5): a PEFT-format LoRA applied to the draft rows only.

The released Nemotron checkpoints ship a `linear_spec_lora` adapter that is switched on for the
drafter's rows and off for the verifier's. Here it is applied row-selectively inside ONE forward
pass: for a call that has any selected row the LoRA delta B(A x) * alpha/r is computed for ALL
rows of the call (these are the "evaluated" rows) and zeroed on the unselected ones (the
"selected" rows receive it). A call with no selected row computes nothing. The verifier's rows
are therefore bit-identical with and without the adapter, so every lossless schedule stays
lossless. `BackboneAdapter.run` calls `select(rows)` with the DRAFT-role rows before the forward
pass and `select(None)` after it; `calls` records (selected, evaluated) per call.

Format: PEFT's `adapter_config.json` (peft_type LORA) + `adapter_model.safetensors` with keys
`base_model.model.<module>.lora_A.weight` (r x in) and `...lora_B.weight` (out x r); `<module>`
is a Linear of the backbone, written `encoder.layers.N...` as in the Nemotron checkpoints
(`model.encoder.`, `backbone.`, `model.` prefixes are also accepted). peft is not needed at
inference; `save_peft_adapter` writes the config with peft's own LoraConfig.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from packedss.errors import PackedSSError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MODULE_PREFIXES = ("model.encoder.", "encoder.", "backbone.", "model.")
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+?)\.(?P<kind>lora_A|lora_B)(?:\.[^.]+)?\.weight$")


@dataclass
class _Pair:
    A: nn.Parameter  # (r, in)
    B: nn.Parameter  # (out, r)
    scale: float


def adapter_dtype(base: torch.dtype) -> torch.dtype:
    """PEFT keeps adapter weights in float32 on a half-precision base (autocast_adapter_dtype)."""
    return torch.float32 if base in (torch.float16, torch.bfloat16) else base


class ProposalLoRA(nn.Module):
    """LoRA pairs on Linear modules of a backbone, applied to the selected rows only.

    `select(rows)`: rows is a bool tensor broadcastable to the leading dims of the Linear
    outputs ((R,) for a call of R rows, (N, R) for a training batch) or None (the adapter is
    off). While selected, every hooked Linear adds `scale * B(A x)` on the selected rows.
    """

    def __init__(self, backbone: nn.Module, pairs: dict[str, tuple[torch.Tensor, torch.Tensor, float]], config: dict):
        super().__init__()
        modules = dict(backbone.named_modules())
        self.config = dict(config)
        self.module_names = sorted(pairs)
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        self.scales: dict[str, float] = {}
        self._hooks = []
        self._rows: Optional[torch.Tensor] = None
        for name in self.module_names:
            module = modules.get(name)
            if not isinstance(module, nn.Linear):
                raise PackedSSError(f"proposal LoRA: {name!r} is not a Linear module of the backbone")
            a, b, scale = pairs[name]
            if a.shape[1] != module.in_features or b.shape[0] != module.out_features or a.shape[0] != b.shape[1]:
                raise PackedSSError(
                    f"proposal LoRA: {name} has lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)}, which do not fit "
                    f"Linear({module.in_features}, {module.out_features})"
                )
            key = name.replace(".", "__")
            weight = module.weight
            dtype = adapter_dtype(weight.dtype)
            self.lora_A[key] = nn.Parameter(a.to(device=weight.device, dtype=dtype))
            self.lora_B[key] = nn.Parameter(b.to(device=weight.device, dtype=dtype))
            self.scales[key] = float(scale)
            self._hooks.append(module.register_forward_hook(self._hook(key)))

    # ----------------------------------------------------------------- construction

    @classmethod
    def create(
        cls,
        backbone: nn.Module,
        rank: int = 8,
        alpha: float = 16.0,
        targets: tuple[str, ...] | list[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
        seed: int = 0,
    ) -> "ProposalLoRA":
        """A fresh LoRA for training: A ~ kaiming-uniform (as peft), B = 0 (the delta starts at 0)."""
        generator = torch.Generator().manual_seed(seed)
        pairs = {}
        for name, module in backbone.named_modules():
            if isinstance(module, nn.Linear) and name.split(".")[-1] in targets:
                bound = 1.0 / module.in_features**0.5
                a = (torch.rand(rank, module.in_features, generator=generator) * 2 - 1) * bound
                pairs[name] = (a, torch.zeros(module.out_features, rank), alpha / rank)
        if not pairs:
            raise PackedSSError(f"proposal LoRA: no Linear module named {list(targets)} in the backbone")
        config = {"r": rank, "lora_alpha": alpha, "target_modules": sorted(set(targets))}
        return cls(backbone, pairs, config)

    # ----------------------------------------------------------------- row selection

    def select(self, rows: Optional[torch.Tensor], selected: Optional[int] = None) -> tuple[int, int]:
        """Switch the adapter on for `rows` (None: off). Returns (selected, evaluated): the rows
        that receive the update and the rows it is computed for (0, 0 when nothing is selected).
        `selected`: the count of True rows when the caller knows it on the host (a call's layout
        does), sparing a read-back of `rows` from the device."""
        if rows is None:
            self._rows = None
            return 0, 0
        rows = rows.to(torch.bool)
        if selected is None:
            selected = int(rows.sum())
        self._rows = rows if selected else None
        return selected, int(rows.numel()) if selected else 0

    def _hook(self, key: str):
        def hook(module, inputs, output):
            rows = self._rows
            if rows is None:
                return output
            x = inputs[0]
            a, b = self.lora_A[key], self.lora_B[key]
            # As PEFT: the input is cast to the adapter's dtype, the delta is added in that dtype
            # and the sum cast back to the base layer's (float32 adapters on a bf16 base).
            delta = (x.to(a.dtype) @ a.t()) @ b.t()  # every row of the call is evaluated
            keep = rows.to(device=output.device, dtype=delta.dtype)[..., None]
            return (output + delta * (self.scales[key] * keep)).to(output.dtype)

        return hook

    def detach(self) -> None:
        """Remove the hooks (the backbone is the plain model again)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._rows = None

    @property
    def rank(self) -> int:
        return int(next(iter(self.lora_A.values())).shape[0])


# --------------------------------------------------------------------------- PEFT format


def _strip(module: str, known: set[str]) -> Optional[str]:
    if module in known:
        return module
    for prefix in MODULE_PREFIXES:
        if module.startswith(prefix) and module[len(prefix) :] in known:
            return module[len(prefix) :]
    return None


def _pattern_value(patterns: dict, name: str, default):
    """peft's rank_pattern / alpha_pattern: a key matches a module name it ends (as a regex) ."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?{key}$", name):
            return value
    return default


def read_peft_config(path: str | Path) -> dict:
    directory = Path(path)
    config_file = directory / CONFIG_FILE
    if not directory.is_dir() or not config_file.is_file():
        raise PackedSSError(f"proposal LoRA: {directory} has no {CONFIG_FILE}; set model.lora_path to a PEFT adapter directory")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise PackedSSError(f"proposal LoRA: {config_file} is not valid JSON ({err}); fix it or save the adapter again") from None
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise PackedSSError(f"proposal LoRA: {config_file} has peft_type {config.get('peft_type')!r}; only LORA is supported")
    unsupported = [
        key
        for key, ok in (
            ("use_dora", not config.get("use_dora")),
            ("bias", config.get("bias", "none") == "none"),
            ("fan_in_fan_out", not config.get("fan_in_fan_out")),
            ("lora_bias", not config.get("lora_bias")),
            ("modules_to_save", not config.get("modules_to_save")),
        )
        if not ok
    ]
    if unsupported:
        raise PackedSSError(f"proposal LoRA: {config_file} uses unsupported options: {', '.join(unsupported)}")
    for key in ("r", "lora_alpha"):
        if key not in config:
            raise PackedSSError(f"proposal LoRA: {config_file} is missing {key}")
    return config


def load_pairs(path: str | Path, backbone: nn.Module) -> tuple[dict, dict]:
    """(module name -> (A, B, scale)), config from a PEFT adapter directory."""
    directory = Path(path)
    config = read_peft_config(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise PackedSSError(f"proposal LoRA: {directory} has no {WEIGHTS_FILE}; save the adapter again (it needs its weights beside {CONFIG_FILE})")
    known = {name for name, m in backbone.named_modules() if isinstance(m, nn.Linear)}
    found: dict[str, dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(weights), framework="pt", device="cpu") as f:
            for key in f.keys():
                match = _KEY.match(key)
                if match is None:
                    raise PackedSSError(f"proposal LoRA: unsupported tensor {key!r} in {weights.name} (only lora_A/lora_B of Linear layers)")
                name = _strip(match["module"], known)
                if name is None:
                    raise PackedSSError(f"proposal LoRA: {key!r} targets {match['module']!r}, not a Linear of the backbone")
                found.setdefault(name, {})[match["kind"]] = f.get_tensor(key)
    except PackedSSError:
        raise
    except Exception as err:
        raise PackedSSError(f"proposal LoRA: cannot read {weights} ({err}); save the adapter again") from None
    pairs = {}
    for name, parts in sorted(found.items()):
        if set(parts) != {"lora_A", "lora_B"}:
            raise PackedSSError(f"proposal LoRA: {name} has {sorted(parts)} but needs both lora_A and lora_B")
        a, b = parts["lora_A"], parts["lora_B"]
        r = _pattern_value(config.get("rank_pattern"), name, config["r"])
        alpha = _pattern_value(config.get("alpha_pattern"), name, config["lora_alpha"])
        if a.shape[0] != r:
            raise PackedSSError(f"proposal LoRA: {name} has rank {a.shape[0]}, adapter_config says r={r}")
        scale = alpha / (r**0.5 if config.get("use_rslora") else r)
        pairs[name] = (a, b, scale)
    if not pairs:
        raise PackedSSError(f"proposal LoRA: {weights} holds no LoRA weights")
    return pairs, config


def load_proposal_lora(path: str | Path, backbone: nn.Module) -> ProposalLoRA:
    pairs, config = load_pairs(path, backbone)
    return ProposalLoRA(backbone, pairs, config)


def attach_proposal_lora(adapter, path: str | Path) -> ProposalLoRA:
    """Load a PEFT-format adapter onto `adapter.backbone` and make it the proposal LoRA that
    `BackboneAdapter.run` switches on for the draft rows of every call."""
    pairs, config = load_pairs(path, adapter.backbone)  # fails before anything is changed
    if getattr(adapter, "proposal_lora", None) is not None:
        adapter.proposal_lora.detach()
    lora = ProposalLoRA(adapter.backbone, pairs, config)
    lora.eval()
    for p in lora.parameters():
        p.requires_grad_(False)
    adapter.proposal_lora = lora
    return lora


def detach_proposal_lora(adapter) -> None:
    if getattr(adapter, "proposal_lora", None) is not None:
        adapter.proposal_lora.detach()
    adapter.proposal_lora = None


def save_peft_adapter(lora: ProposalLoRA, path: str | Path, base_model: str = "", extra: dict | None = None) -> None:
    """Write `lora` as a PEFT adapter directory (config through peft's own LoraConfig).
    `extra` (e.g. training metadata) goes to packedss_training.json beside it."""
    from peft import LoraConfig

    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    targets = sorted({name.split(".")[-1] for name in lora.module_names})
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.config.get("lora_alpha", lora.rank),
        target_modules=targets,
        lora_dropout=0.0,
        bias="none",
        base_model_name_or_path=base_model or None,
    )
    config.save_pretrained(str(directory))
    tensors = {}
    for name in lora.module_names:
        key = name.replace(".", "__")
        tensors[f"base_model.model.encoder.{name}.lora_A.weight"] = lora.lora_A[key].detach().float().contiguous().cpu()
        tensors[f"base_model.model.encoder.{name}.lora_B.weight"] = lora.lora_B[key].detach().float().contiguous().cpu()
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    if extra:
        (directory / "packedss_training.json").write_text(json.dumps(extra, indent=2, sort_keys=True) + "\n")
