"""Before anything runs: the versions this environment holds, on one line, and whether its
transformers can run the harness.

    python -m packedss.preflight [--require hydra-core,omegaconf] [--device cuda] [--json PATH]

It prints one line: the versions of Python, torch and the CUDA it was built for, transformers,
hydra-core and omegaconf ("absent" when they cannot be imported), and the GPU's name or "no
CUDA device". Then it checks the forward of the two backbones the families load (transformers'
Ministral3Model and Qwen3Model) for the cache keyword the adapters pass
(packedss.models.adapter.check_backbone): a transformers that calls it otherwise would swallow
the cache through **kwargs and decode wrong outputs without an error. A refused backbone, a
package named by --require that is absent, or --device cuda without a CUDA device is one
`error: ...` line, exit status 2. hydra-core and omegaconf are imported only here, inside a
guard: the jobs and benchmarks need them, the line does not.
"""

from __future__ import annotations

import importlib
import json
import platform
from pathlib import Path

from packedss.errors import ArgumentParser, PackedSSError, names, run_cli

BACKBONES = ("Ministral3Model", "Qwen3Model")  # transformers' classes behind the nemotron and setdlm families
OPTIONAL = {"hydra-core": "hydra", "omegaconf": "omegaconf"}  # distribution -> the module it is imported as
ABSENT = "absent"


def optional_version(module: str) -> str:
    """`module.__version__`, or "absent" when it cannot be imported."""
    try:
        return str(importlib.import_module(module).__version__)
    except ImportError:
        return ABSENT


def versions() -> dict[str, str]:
    """What the line reports; torch and transformers must import (nothing runs without them)."""
    try:
        import torch
        import transformers
    except ImportError as err:
        raise PackedSSError(f"cannot import {err.name or 'torch or transformers'} ({err}); run with a Python that holds "
                            "torch and transformers (pip install -e ., or carry their wheels)") from None  # fmt: skip
    found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda or "none",
             "transformers": transformers.__version__}  # fmt: skip
    found |= {name: optional_version(module) for name, module in OPTIONAL.items()}
    found["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    return found


def line(found: dict[str, str]) -> str:
    return (f"versions: python {found['python']}, torch {found['torch']} (CUDA {found['cuda']}), transformers "
            f"{found['transformers']}, hydra-core {found['hydra-core']}, omegaconf {found['omegaconf']}, {found['gpu']}")  # fmt: skip


def check_backbones() -> dict[str, str]:
    """Each backbone class's verdict ("takes the cache keyword"); raises PackedSSError on the first refused."""
    import transformers

    from packedss.models.adapter import CACHE_KEYWORD, check_backbone

    verdicts = {}
    for name in BACKBONES:
        check_backbone(getattr(transformers, name))
        verdicts[name] = f"takes {CACHE_KEYWORD!r}"
    return verdicts


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m packedss.preflight", description=__doc__.split("\n\n")[0])
    ap.add_argument("--require", type=names(OPTIONAL), default=[], help=f"comma-separated packages that must be present ({', '.join(OPTIONAL)})")
    ap.add_argument("--device", default="any", choices=("any", "cuda"), help="cuda: refuse without a CUDA device")
    ap.add_argument("--json", default=None, help="also write the versions and verdicts to this file")
    args = ap.parse_args(argv)
    if args.json and not Path(args.json).expanduser().absolute().parent.is_dir():
        raise PackedSSError(f"--json {args.json}: its directory does not exist; create it or pick another path")
    found = versions()
    report = {"versions": found, "line": line(found), "backbones": {}, "refused": None}

    def write() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1) + "\n")

    print(report["line"], flush=True)
    write()
    try:
        report["backbones"] = check_backbones()
        absent = [name for name in args.require if found[name] == ABSENT]
        if absent:
            raise PackedSSError(f"{' and '.join(absent)} absent, but the steps after this one import "
                                f"{'it' if len(absent) == 1 else 'them'}; install the project (pip install -e .), or "
                                "carry the wheels scripts/gpu_wheels.sh downloads and pass WHEELS=DIR")  # fmt: skip
        if args.device == "cuda" and found["gpu"] == "no CUDA device":
            raise PackedSSError(f"no CUDA device visible to torch {found['torch']}; run on a GPU machine with a CUDA build "
                                "of torch, or drop --device cuda")  # fmt: skip
    except PackedSSError as err:
        report["refused"] = str(err)
        write()
        raise
    write()
    return 0


if __name__ == "__main__":
    run_cli(main)
