#!/usr/bin/env bash
# The GPU run rehearsed on this CPU with the GPU image's own torch: the rehearsal of
# tests/test_gpu_rehearsal.py (an empty venv holding only the image's packages, its transformers
# 5.17.0 and accelerate 1.15.0 beneath the kit of scripts/gpu_wheels.sh, then DRY=1 WHEELS=kit
# scripts/gpu_check.sh with that venv's Python) with TORCH instead of the Makefile's CPU wheel:
#
#     bash scripts/gpu_rehearsal.sh                          # TORCH=torch==2.11.0, the image's
#     TORCH=torch==2.11.0 PY=.venv/bin/python bash scripts/gpu_rehearsal.sh
#
# torch 2.11.0 from the package index is the CUDA 13.0 build the image holds, with its CUDA
# libraries (nvidia-*, triton: about 3 GB to download, all in the image's list
# tests/gpu_image_packages.txt); on a CPU it imports and runs as a CPU torch. That is why it is not
# part of `make test`, whose rehearsal uses the Makefile's CPU wheel. PY (default .venv/bin/python)
# runs pytest and downloads; it must reach the package index. Prints the dry run's seconds and
# pytest's verdict; exit status pytest's. A TORCH the index does not hold, or a Python without
# pytest: one `error:` line, status 2.
set -u
cd "$(dirname "$0")/.."
die() { echo "error: $*" >&2; exit 2; }
DEFAULT_PY=python3
[ -x .venv/bin/python ] && DEFAULT_PY=.venv/bin/python
PY=${PY:-$DEFAULT_PY}
TORCH=${TORCH:-torch==2.11.0}
command -v "$PY" >/dev/null || die "no Python at PY=$PY; set PY to the project's Python (e.g. PY=.venv/bin/python)"
"$PY" -c "import pytest" 2>/dev/null || die "$PY has no pytest; use the project's Python (make install, then PY=.venv/bin/python)"
[[ $TORCH =~ ^torch==[0-9][0-9a-z.+]*$ ]] || die "TORCH=$TORCH; give one exact release, e.g. TORCH=torch==2.11.0"
WANTED=${TORCH#torch==}
HELD=$("$PY" -m pip index versions torch 2>/dev/null | sed -n 's/^Available versions: //p')
[[ ", $HELD," == *", $WANTED,"* ]] || die "the package index holds no $TORCH (it lists: ${HELD:-nothing: is it reachable?}); give one it holds with TORCH=torch==X"
echo "gpu_rehearsal: $TORCH from the package index, the image's packages, the kit; DRY=1 gpu_check.sh"
PACKEDSS_REHEARSAL_TORCH=$TORCH exec "$PY" -m pytest -n 0 -q -s -p no:cacheprovider --timeout=3600 \
  tests/test_gpu_rehearsal.py
