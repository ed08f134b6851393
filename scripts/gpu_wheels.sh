#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh needs on a GPU machine with no network, downloaded here:
#
#     bash scripts/gpu_wheels.sh [DIR]        # DIR: default .whl (ignored by git)
#     PY=/path/to/python bash scripts/gpu_wheels.sh DIR
#
# The GPU image the check is built for holds Python 3.12, a CUDA build of torch, transformers
# 5.17, numpy, pandas, scipy, matplotlib, tokenizers, safetensors, huggingface-hub, pyyaml, tqdm
# and the like, but not hydra-core or omegaconf, and its transformers predates the cache keyword
# the adapters pass (python -m packedss.preflight refuses it). So the kit is:
#   transformers  at the exact version the project's Python holds (pyproject pins ~=5.24.0); its
#                 requirements (huggingface-hub >= 1.31, tokenizers 0.23, safetensors >= 0.8,
#                 regex, pyyaml, tqdm, typer, ...) are met by the image's own packages;
#   hydra-core, omegaconf, antlr4-python3-runtime (4.9, the version both require), at the
#                 versions the project's Python holds.
# Each is fetched with `pip download --no-deps --only-binary=:all: --python-version 3.12
# --implementation cp` and the manylinux x86-64 platforms; a release published as source only
# (antlr4-python3-runtime 4.9.3) is built here into its pure-Python wheel. The script lists every
# wheel in DIR with its size and refuses a total of 30 MiB or more (what travels with the check)
# and two versions of one package (the install would stop), and writes DIR/COMMIT (the commit
# here, which gpu_check.sh passes to the records as PACKEDSS_COMMIT). On the GPU machine:
#
#     WHEELS=DIR bash scripts/gpu_check.sh    # installs them with pip --no-index --no-deps --target
#
# Bad arguments, a Python without the packages, a failed download: one `error: ...` line, exit 2.
set -u
cd "$(dirname "$0")/.."
die() { echo "error: $*" >&2; exit 2; }
case ${1:-} in -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
[ $# -le 1 ] || die "too many arguments ($*); give at most one folder: bash scripts/gpu_wheels.sh [DIR]"
DIR=${1:-.whl}
[ -e "$DIR" ] && [ ! -d "$DIR" ] && die "DIR=$DIR is a file; give a folder for the wheels (default .whl)"
mkdir -p "$DIR" 2>/dev/null && [ -w "$DIR" ] || die "cannot write to DIR=$DIR; give a writable folder"
DEFAULT_PY=python3
[ -x .venv/bin/python ] && DEFAULT_PY=.venv/bin/python
PY=${PY:-$DEFAULT_PY}
command -v "$PY" >/dev/null || die "no Python at PY=$PY; set PY to the project's Python (e.g. PY=.venv/bin/python)"
KIT="transformers hydra-core omegaconf antlr4-python3-runtime"
LIMIT_MIB=30
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"

# The exact versions the project's Python holds: what the tests ran with.
PINS=$("$PY" - $KIT <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

try:
    print(" ".join(f"{name}=={version(name)}" for name in sys.argv[1:]))
except PackageNotFoundError:
    sys.exit(1)
EOF
) || die "$PY holds not all of $KIT; set PY to the project's Python (make install, then PY=.venv/bin/python)"

normalized() {  # a wheel file's distribution name, as pip compares them
  basename "$1" | cut -d- -f1 | tr 'A-Z_.' 'a-z--'
}

STAGE=$(mktemp -d)
LOG=$(mktemp)
trap 'rm -rf "$STAGE"' EXIT
for pin in $PINS; do
  if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS \
      -d "$STAGE" "$pin" >>"$LOG" 2>&1; then
    # Published as source only: build its wheel here, and keep it only if it is pure Python.
    "$PY" -m pip wheel -q --no-deps --no-binary=:all: -w "$STAGE" "$pin" >>"$LOG" 2>&1 \
      || die "pip could neither download nor build $pin (its output: $LOG); run where the package index is reachable"
  fi
done
for wheel in "$STAGE"/*.whl; do
  case $(basename "$wheel") in
    *-none-any.whl | *manylinux*x86_64*.whl) ;;
    *) die "$(basename "$wheel") is not for Python 3.12 on x86-64 (built for this machine only); download a wheel published for it" ;;
  esac
done
# Replace the kit's earlier wheels in DIR (an older version beside a newer one would stop the install).
for wheel in "$STAGE"/*.whl; do
  name=$(normalized "$wheel")
  for old in "$DIR"/*.whl; do
    [ -e "$old" ] && [ "$(normalized "$old")" = "$name" ] && rm -f "$old"
  done
  mv "$wheel" "$DIR"/
done
rm -f "$LOG"
# The commit the kit was made at: gpu_check.sh passes it to the records where .git does not travel.
git describe --always --dirty --abbrev=12 >"$DIR/COMMIT" 2>/dev/null || rm -f "$DIR/COMMIT"

TOTAL=0
for wheel in "$DIR"/*.whl; do
  bytes=$(stat -c %s "$wheel")
  TOTAL=$((TOTAL + bytes))
  awk -v b="$bytes" -v n="$(basename "$wheel")" 'BEGIN { printf "  %-60s %7.2f MiB\n", n, b / 1048576 }'
done
DUPLICATES=$(for wheel in "$DIR"/*.whl; do normalized "$wheel"; done | sort | uniq -d | tr '\n' ' ')
[ -z "${DUPLICATES// /}" ] || die "$DIR holds two versions of ${DUPLICATES% }; remove the older wheel"
COUNT=$(ls "$DIR"/*.whl | wc -l)
awk -v t="$TOTAL" -v c="$COUNT" -v d="$DIR" -v l="$LIMIT_MIB" \
  'BEGIN { printf "gpu_wheels: %d wheels in %s, %.2f MiB in all (limit %d MiB)\n", c, d, t / 1048576, l }'
[ "$TOTAL" -lt $((LIMIT_MIB * 1048576)) ] || die "the wheels in $DIR total $((TOTAL / 1048576)) MiB, not under $LIMIT_MIB MiB; remove wheels the check does not need"
