"""The first GPU run, rehearsed on the CPU from an empty environment: a fresh venv gets, with
--no-index only, torch (the CPU wheel the Makefile installs; PACKEDSS_REHEARSAL_TORCH names
another, as scripts/gpu_rehearsal.sh does with the image's torch 2.11), the packages the GPU image
already holds that the check imports (tests/gpu_image_packages.txt, the image's published list),
the image's own transformers 5.17.0 and accelerate 1.15.0 beneath the kit, and the wheels
scripts/gpu_wheels.sh downloads; nothing else. Then `DRY=1 WHEELS=... gpu_check.sh` runs with
that venv's Python: the kit's transformers must shadow the image's (the preflight reports 5.24),
and a missing wheel or an import of a package the image lacks fails here, before a GPU minute is
spent. Skipped only when the package index cannot be reached. This dry run is also
tests/test_gpu_check.py's (the session fixture gpu_dry_run of tests/conftest.py), so the suite
runs the check's dry run once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from packedss.paths import PROJECT_ROOT

# The check's imports among the image's packages, at the image's versions where they are known
# and matter to transformers (huggingface-hub, tokenizers, safetensors); pip adds their needs.
IMAGE_IMPORTS = ("numpy", "pandas", "scipy", "matplotlib", "tokenizers==0.23.2", "safetensors==0.8.0",
                 "huggingface-hub==1.33.0", "pyyaml", "tqdm", "regex", "typer", "psutil", "jinja2", "filelock",
                 "fsspec", "packaging")  # fmt: skip
# The image's own releases of what the kit replaces or does not need, installed beneath the kit
# (the image's transformers names the cache keyword `past_key_values`: the kit's must shadow it).
IMAGE_SHADOWED = ("transformers==5.17.0", "accelerate==1.15.0")
IMAGE_LIST = PROJECT_ROOT / "tests" / "gpu_image_packages.txt"


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> str:
    return normalized(path.name.split("-")[0])


def image_packages() -> set[str]:
    lines = IMAGE_LIST.read_text().splitlines()
    return {normalized(line) for line in lines if line and not line.startswith("#")}


def torch_spec() -> str:
    """The torch the Makefile installs on a CPU machine (TORCH ?= ...), or PACKEDSS_REHEARSAL_TORCH."""
    return os.environ.get("PACKEDSS_REHEARSAL_TORCH") or re.search(
        r"^TORCH \?= (\S+)", (PROJECT_ROOT / "Makefile").read_text(), re.M).group(1)  # fmt: skip


def pip(python: str, *args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "pip", *args], capture_output=True, text=True, env=env, timeout=timeout)


def empty_environment(tmp_path: Path) -> tuple[str, dict] | str:
    """A fresh venv holding only the image's packages and torch, with the kit in tmp_path/kit:
    (its Python, the environment that keeps pip off any index), each step checked on the way; or
    why the package index cannot be reached."""
    probe = pip(sys.executable, "download", "-q", "--no-deps", "-d", str(tmp_path / "probe"),
                f"hydra-core=={version('hydra-core')}", timeout=120)  # fmt: skip
    if probe.returncode:
        return f"the package index is unreachable: {(probe.stderr.strip().splitlines() or ['?'])[-1]}"
    kit = tmp_path / "kit"
    made = subprocess.run(["bash", str(PROJECT_ROOT / "scripts" / "gpu_wheels.sh"), str(kit)],
                          env={**os.environ, "PY": sys.executable}, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert re.search(r"^gpu_wheels: 4 wheels in .*, [\d.]+ MiB in all \(limit 30 MiB\)$", made.stdout, re.M), made.stdout
    assert {wheel_name(p) for p in kit.glob("*.whl")} == {"transformers", "hydra-core", "omegaconf", "antlr4-python3-runtime"}

    # The image's packages for this machine's Python (downloaded with their needs), kept only when
    # the image holds them: a need it lacks must not be smuggled in.
    downloads, image = tmp_path / "downloads", tmp_path / "image"
    fetched = pip(sys.executable, "download", "-q", "-d", str(downloads), torch_spec(), *IMAGE_IMPORTS, *IMAGE_SHADOWED,
                  timeout=1800)  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    image.mkdir()
    held = image_packages()
    for wheel in downloads.glob("*.whl"):
        if wheel_name(wheel) in held:
            (image / wheel.name).symlink_to(wheel)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    isolated = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    isolated["PIP_CONFIG_FILE"] = os.devnull  # no configured index or find-links: --no-index means nothing else
    # --no-compile: the steps compile what they import (a fraction of torch's files), not pip all of them
    installed = pip(python, "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    *map(str, sorted(image.glob("*.whl"))), env=isolated, timeout=900)  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-2000:]
    listed = subprocess.run([python, "-c", "import importlib.metadata as m, json; "
                             "print(json.dumps([d.metadata['Name'] for d in m.distributions()]))"],
                            capture_output=True, text=True, env=isolated, check=True)  # fmt: skip
    extra = {normalized(name) for name in json.loads(listed.stdout)} - held
    assert not extra, f"the venv holds packages the image does not: {sorted(extra)}"
    shadowed = subprocess.run([python, "-c", "import importlib.metadata as m; "
                               "print(m.version('transformers'), m.version('accelerate'))"],
                              capture_output=True, text=True, env=isolated, check=True)  # fmt: skip
    assert shadowed.stdout.split() == [spec.split("==")[1] for spec in IMAGE_SHADOWED], shadowed.stdout
    return python, {**isolated, "WHEELS": str(kit), "SITE": str(tmp_path / "site")}


@pytest.mark.slow
@pytest.mark.xdist_group("gpu-dry-run")
def test_the_check_runs_from_an_empty_environment_with_only_the_image_and_the_wheels(gpu_dry_run):
    if gpu_dry_run.unrehearsed:
        pytest.skip(gpu_dry_run.unrehearsed)
    versions = gpu_dry_run.report["steps"]["preflight"]["versions"]
    # the venv holds the image's transformers 5.17.0; the kit's, on PYTHONPATH first, is the one imported
    assert versions["transformers"] == version("transformers") and versions["transformers"].startswith("5.24")
    assert versions["hydra-core"] == version("hydra-core") and versions["omegaconf"] == version("omegaconf")


@pytest.mark.slow
@pytest.mark.xdist_group("gpu-dry-run")
def test_the_steps_compile_the_wheels_sources_once_though_bytecode_writing_is_off(gpu_dry_run):
    """The run had PYTHONDONTWRITEBYTECODE=1, as many images do; the wheels come without .pyc (pip
    --no-compile). The first step's bytecode is kept, so the later steps do not compile
    transformers again (about 9 s of CPU a step)."""
    if gpu_dry_run.unrehearsed:
        pytest.skip(gpu_dry_run.unrehearsed)
    assert list((gpu_dry_run.site / "transformers" / "__pycache__").glob("modeling_utils.*.pyc"))
