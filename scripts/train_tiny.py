#!/usr/bin/env python
"""Train the shipped tiny dual-mode model (`tiny`), its proposal-only LoRA (`tiny-lora`), the
any-order model (`tiny-set`) or the block-diffusion model (`tiny-sdar`).

The training code lives in packedss.training (corpus and tokenizer, the training sequences,
the loop, the families); this is its command line. The training sequences are built as
decoding calls with the decoding core's builders, so training and decoding share one attention
rule (packedss.training.layouts describes the layouts).

    python scripts/train_tiny.py                       # tiny -> assets/models/tiny
    python scripts/train_tiny.py --lora                # tiny-lora -> assets/models/tiny-lora
    python scripts/train_tiny.py --family setdlm       # tiny-set -> assets/models/tiny-set
    python scripts/train_tiny.py --family sdar --init-from assets/models/tiny-set
                                                       # tiny-sdar -> assets/models/tiny-sdar

Deterministic from --seed for a fixed --steps (the wall-clock cap --max-minutes only stops a
run early; the model card records the steps actually run). Checkpoints are written every
--save-every steps, so a stopped run still leaves a usable model. A run the wall-clock cap
stopped after K steps is reproduced without the clock by `--steps N --stop-after K` (the first
K steps of the N-step schedule).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Idle OpenMP threads sleep instead of spinning: on a shared 2-core machine spinning threads
# made a step 4-7x slower (measured: 2.3-9 s vs 1.2 s per step under load).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from packedss.errors import ArgumentParser, number, run_cli  # noqa: E402
from packedss.paths import PROJECT_ROOT  # noqa: E402
from packedss.training import TrainConfig, train_nemotron, train_proposal_lora, train_sdar, train_setdlm  # noqa: E402

DEFAULT_STEPS = {"nemotron": 3800, "setdlm": 2800, "sdar": 3000}
DEFAULTS = TrainConfig()


def parser() -> ArgumentParser:
    ap = ArgumentParser(prog="scripts/train_tiny.py", description=__doc__.split("\n\n")[0])

    def setting(flag: str, text: str | None = None, **kwargs) -> None:
        """A flag of a TrainConfig field, with the field's default."""
        default = getattr(DEFAULTS, flag.lstrip("-").replace("-", "_"))
        kwargs.setdefault("type", type(default))
        ap.add_argument(flag, default=default, help=text, **kwargs)

    ap.add_argument("--lora", action="store_true", help="train the proposal LoRA on top of --base")
    ap.add_argument(
        "--family", choices=tuple(DEFAULT_STEPS), default="nemotron",
        help="nemotron: tiny (dual-mode, Nemotron layout); setdlm: tiny-set (SetDLM layout, set objective); "
        "sdar: tiny-sdar (SDAR layout, block diffusion)",
    )  # fmt: skip
    ap.add_argument(
        "--out", default=None, help="output directory (default assets/models/tiny, tiny-lora, tiny-set or tiny-sdar)"
    )
    ap.add_argument("--base", default=None, help="--lora: the base checkpoint (default assets/models/tiny)")
    ap.add_argument(
        "--init-from", default=None,
        help="start from this checkpoint instead of a fresh model (nemotron: a tiny checkpoint; sdar: a tiny-set one)",
    )  # fmt: skip
    ap.add_argument("--threads", type=number(int, 1), default=2)
    ap.add_argument(
        "--data-dir", default=os.environ.get("PACKEDSS_DATA_DIR", str(PROJECT_ROOT.parent / "shared" / "data")),
        help="directory with gsm8k_train.jsonl (left out when the directory is absent)",
    )  # fmt: skip
    ap.add_argument("--steps", type=number(int, 1), default=None, help="default 3800 (nemotron), 2800 (setdlm), 3000 (sdar)")
    setting("--seed")
    setting("--arith-n")
    setting("--code-bytes")
    setting("--vocab")
    setting("--max-len", text="longest question+answer (longer ones are dropped)")
    setting("--hidden")
    setting("--intermediate")
    setting("--layers")
    setting("--heads")
    setting("--kv-heads")
    setting("--batch")
    setting("--lr")
    setting("--warmup")
    setting("--weight-decay")
    setting("--diff-weight")
    setting("--draft-ratio", text="draft rows per answer token")
    setting("--mask-blocks", text="share of pure-mask (Quadratic-SS) blocks")
    setting("--mix-arith")
    setting("--mix-gsm8k")
    setting("--mix-code")
    setting("--max-minutes", text="wall-clock cap for the whole run (0: none)")
    setting("--save-every")
    setting("--log-every")
    setting("--smax", text="--family setdlm: the model's max block size (W <= smax)")
    setting("--set-ltr", text="--family setdlm: share of left-to-right orders")
    setting("--set-local", text="--family setdlm: share of block-local permutations")
    setting(
        "--stop-after",
        text="stop after this many steps of the --steps schedule (0: run it all); "
        "reproduces a run the wall-clock cap stopped, without the clock",
    )
    setting("--set-eos-tail", text="--family setdlm: up to this many EOS after the answer")
    setting("--sdar-ar", text="--family sdar: share of batches with block size 1 (the AR mode)")
    setting("--sdar-block", text="--family sdar: the block size of the other batches (config.json block_size)")
    setting("--lora-steps")
    setting("--lora-lr")
    setting("--lora-rank")
    setting("--lora-alpha")
    setting("--lora-ce")
    setting("--lora-draft-ratio", text="--lora: draft rows per answer token")
    setting("--lora-targets", nargs="+", type=str)
    return ap


def check_checkpoints(ap: ArgumentParser, args) -> None:
    """The checkpoints a run starts from exist, before any training (which takes minutes)."""
    if args.init_from and (args.lora or args.family == "setdlm"):
        ap.error("--init-from applies to --family nemotron and sdar; drop it (--lora starts from --base)")
    if args.base and not args.lora:
        ap.error("--base applies to --lora only; drop it, or add --lora")
    for flag, path in (("--base", args.base), ("--init-from", args.init_from)):
        if path and not (Path(path) / "config.json").is_file():
            ap.error(f"{flag} {path}: not a checkpoint directory (no config.json); name one, e.g. assets/models/tiny")


def shown(path: Path) -> str:
    """A path as the training record names it: relative to the repository when inside it."""
    return str(path.relative_to(PROJECT_ROOT)) if path.is_relative_to(PROJECT_ROOT) else str(path)


def main(argv=None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    check_checkpoints(ap, args)
    settings = vars(args)
    if args.data_dir and not Path(args.data_dir).is_dir():
        settings["data_dir"] = None
    if args.steps is None:
        settings["steps"] = DEFAULT_STEPS[args.family]
    config = TrainConfig(**{f.name: settings[f.name] for f in dataclasses.fields(TrainConfig)})
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if args.lora:
        base = Path(args.base or PROJECT_ROOT / "assets/models/tiny")
        train_proposal_lora(config, base, Path(args.out or PROJECT_ROOT / "assets/models/tiny-lora"), shown(base))
    elif args.family == "sdar":
        train_sdar(config, Path(args.out or PROJECT_ROOT / "assets/models/tiny-sdar"), args.init_from)
    elif args.family == "setdlm":
        train_setdlm(config, Path(args.out or PROJECT_ROOT / "assets/models/tiny-set"))
    else:
        train_nemotron(config, Path(args.out or PROJECT_ROOT / "assets/models/tiny"), args.init_from)


if __name__ == "__main__":
    run_cli(main)
