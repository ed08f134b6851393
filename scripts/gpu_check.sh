#!/usr/bin/env bash
# The CUDA path in one command on one H100/H200-class GPU, inside 480 s from a bare machine:
#
#     bash scripts/gpu_check.sh                      # with the Python's own packages
#     WHEELS=.whl bash scripts/gpu_check.sh          # first installs the wheels of scripts/gpu_wheels.sh
#     DRY=1 bash scripts/gpu_check.sh                # the same plan on the CPU at toy sizes (1.5-2 minutes)
#     PLAN=1 bash scripts/gpu_check.sh               # print the plan and its budgets, run nothing
#     ONLY=graphs-8b,syncs bash scripts/gpu_check.sh # rerun just these steps (SKIP=step,... leaves steps out)
#     PY=/path/to/python RESULTS=dir OUT=dir COMPILE=default bash scripts/gpu_check.sh
#
# PY defaults to .venv/bin/python (else python3). Needs a Python with torch (a CUDA build on the GPU), numpy, pandas, scipy, matplotlib, tokenizers,
# safetensors and huggingface-hub; transformers at the project's pin, hydra-core and omegaconf come
# from the wheels folder WHEELS when the Python lacks them (installed with pip --no-index --no-deps
# --target SITE, default /tmp/packedss-site, put on PYTHONPATH right after src/). The package itself is read
# from src/, no install needed; the shipped tiny model (assets/models/tiny); no network.
#
# The plan, in this order, each step under its own time limit (its budget; the budgets sum to at
# most 480 s, checked before anything runs):
#   wheels         install WHEELS (nothing when it is unset)
#   preflight      python -m packedss.preflight: one line of versions; refuses a transformers whose
#                  backbones do not take the adapters' cache keyword, absent hydra-core/omegaconf
#                  and a missing CUDA device (then the run stops: one error line, status 2); cut
#                  short by its budget it is not fatal (every step's adapter checks its backbone too)
#   audit-fp32     scripts/check_decode.py: tiny, float32, greedy, W = 8, 16, 31, 5 arith
#                  questions: every lossless schedule's output equals AR's token for token
#   audit-bf16     the same in bfloat16: no divergence from AR without a recorded near-tie
#   graphs-8b      scripts/gpu_calls.py: the 8B shape's calls under CUDA graphs and eager, B = 32,
#                  16, 8 in that order, one compilation per block (rows 64, 32, 16: Packed-SS's 2B
#                  at every B, the B-row calls at B = 32 and 16), each compiled call checked against
#                  the eager call of the same input before it is timed, beside the products and
#                  HBM floors
#   syncs          scripts/check_decode.py: host syncs per response under set_sync_debug_mode
#   sampler        scripts/bench_sampler.py: one T > 0 draw of 64 and 2,048 rows over 131,072 entries,
#                  the blocked inverse CDF beside the whole-vocabulary one: time and peak memory
#   concurrency-8b scripts/gpu_concurrency.py: tiny deciding, an 8B cost twin timed (eager calls:
#                  host-bound), AR, Linear-SS and Packed-SS at W = 31, C = 1 against C = 8, 8 arith
#                  questions, 32 new tokens
#   summary        scripts/gpu_summary.py: one PASS/FAIL/SKIP/INFO line per check, gpu_check.json
#   pack           RESULTS packed into OUT: gpu_check.tar.gz, gpu_check.json, summary.md
# ONLY=step,... runs only the named steps, SKIP=step,... all but them (wheels, summary and pack
# always run: without them nothing imports or comes back); the plan line counts what runs, and the
# summary says which steps ran. A failed run ends with the line that reruns what failed.
# DRY=1 gives each step DRY_SLACK (default 3) x its budget on the CPU; the records carry the
# commit PACKEDSS_COMMIT (default: git here, else the COMMIT file gpu_wheels.sh left in WHEELS).
# Every step writes its JSON as soon as it has a figure (each row, each block, every 2 s of a sweep), so a step cut
# short by its budget keeps what it measured; a failed step is reported and the rest go on.
# Everything is written under RESULTS (default results/gpu_check); OUT (default
# results/gpu_check-packed) receives the 3 packed files (at most 8, each under 16 MiB). Exit
# status 1 when a step or a check failed. Bad settings (DRY, DRY_SLACK, PLAN, ONLY, SKIP, COMPILE,
# PY, RESULTS, OUT, WHEELS, a leftover PASS) are one `error:` line, status 2.
set -u
cd "$(dirname "$0")/.."
die() { echo "error: $*" >&2; exit 2; }
WINDOW=480
DRY=${DRY:-0}
ONLY=${ONLY:-}
SKIP=${SKIP:-}
PLAN=${PLAN:-0}
COMPILE=${COMPILE:-reduce-overhead}
RESULTS=${RESULTS:-results/gpu_check}
OUT=${OUT:-results/gpu_check-packed}
WHEELS=${WHEELS:-}
SITE=${SITE:-${TMPDIR:-/tmp}/packedss-site}
[ -z "${PASS:-}" ] || die "PASS=$PASS: the check is one plan now (no passes); unset PASS"
case $DRY in 0 | 1) ;; *) die "DRY=$DRY; use DRY=1 (toy sizes on the CPU) or DRY=0 (the GPU run)" ;; esac
case $PLAN in 0 | 1) ;; *) die "PLAN=$PLAN; use PLAN=1 (print the plan only) or PLAN=0" ;; esac
case $COMPILE in default | reduce-overhead | max-autotune) ;;
  *) die "COMPILE=$COMPILE; use reduce-overhead (CUDA graphs, the default), default or max-autotune" ;; esac
DEFAULT_PY=$(command -v python3 || command -v python)
[ -x .venv/bin/python ] && DEFAULT_PY=.venv/bin/python
PY=${PY:-$DEFAULT_PY}
[ -n "$PY" ] && command -v "$PY" >/dev/null || die "no Python found (PY=${PY:-unset}); set PY=/path/to/python"
if [ -n "$WHEELS" ]; then
  [ -d "$WHEELS" ] || die "WHEELS=$WHEELS is not a folder; give the folder scripts/gpu_wheels.sh filled"
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || die "WHEELS=$WHEELS holds no .whl files; fill it with bash scripts/gpu_wheels.sh $WHEELS"
fi

# DRY=1: the budgets are the H200's, checked all the same; the toy steps run on a CPU that may be
# shared and slower per step than the GPU (no compile cache, 2 cores, other work beside), so each
# gets DRY_SLACK x its budget (default 3; the test suite gives 20, so that load never decides).
DRY_SLACK=${DRY_SLACK:-3}
[[ $DRY_SLACK =~ ^[0-9]+([.][0-9]+)?$ ]] && awk -v s="$DRY_SLACK" 'BEGIN { exit !(s > 0) }' \
  || die "DRY_SLACK=$DRY_SLACK; give a positive number, the factor on each step's budget in a DRY=1 run (default 3)"
if [ "$DRY" = 1 ]; then
  SLACK=$DRY_SLACK DEVICE=cpu THREADS=1 SHAPE=test CUDA_FLAG= DEVICE_CHECK=
  AUDIT="--limit 2 --max-new-tokens 12 --widths 8" NEW=12
  CALLS="--blocks 2,1 --prefix 8 --warmup 1 --iters 2 --stream-mib 4"
  CONCURRENCY="--concurrency 1,2 --width 3 --limit 2 --max-new-tokens 8"
  SAMPLER="--vocab 1000 --rows 2048 --repeats 2"
else
  SLACK=1 DEVICE=cuda THREADS=0 SHAPE=nemotron8b CUDA_FLAG=--cuda DEVICE_CHECK="--device cuda"
  AUDIT="--limit 5 --max-new-tokens 64 --widths 8,16,31" NEW=64
  CALLS="--blocks 32,16,8 --prefix 1024 --warmup 3 --iters 10"
  CONCURRENCY="--concurrency 1,8 --width 31 --limit 8 --max-new-tokens 32"
  SAMPLER="--vocab 131072 --rows 64,2048 --repeats 3"
fi

# name, budget (s) on an H200, what it runs; docs/performance.md §8 gives each budget's source.
ALL_STEPS=(wheels preflight audit-fp32 audit-bf16 graphs-8b syncs sampler concurrency-8b summary pack)
ALWAYS=" wheels summary pack "
declare -A BUDGET=([wheels]=10 [preflight]=45 [audit-fp32]=25 [audit-bf16]=25 [graphs-8b]=260 [syncs]=20
                   [sampler]=10 [concurrency-8b]=55 [summary]=5 [pack]=10)
[ -z "${ONLY:-}" ] || [ -z "${SKIP:-}" ] || die "ONLY=$ONLY and SKIP=$SKIP both set; give one: ONLY names the steps to run, SKIP those to leave out"
for name in ${ONLY//,/ } ${SKIP//,/ }; do
  [ -n "${BUDGET[$name]:-}" ] || die "no step '$name' (ONLY=${ONLY:-}, SKIP=${SKIP:-}); the steps: ${ALL_STEPS[*]}"
  [[ $ALWAYS != *" $name "* ]] || [ -z "${SKIP:-}" ] || die "SKIP=$SKIP: $name always runs (without wheels, summary and pack nothing imports or comes back); leave it out of SKIP"
done
STEPS=()
for name in "${ALL_STEPS[@]}"; do
  if [[ $ALWAYS == *" $name "* ]] || { [ -n "${ONLY:-}" ] && [[ ,$ONLY, == *",$name,"* ]]; } \
     || { [ -z "${ONLY:-}" ] && [[ ,${SKIP:-}, != *",$name,"* ]]; }; then
    STEPS+=("$name")
  fi
done
selected() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }
declare -A WHAT=(
  [wheels]="pip install --no-index --no-deps --target $SITE ${WHEELS:-(none: WHEELS unset)}"
  [preflight]="python -m packedss.preflight --require hydra-core,omegaconf $DEVICE_CHECK"
  [audit-fp32]="scripts/check_decode.py --dtype float32 --checks audit --exact $AUDIT"
  [audit-bf16]="scripts/check_decode.py --dtype bfloat16 --checks audit $AUDIT"
  [graphs-8b]="scripts/gpu_calls.py --shape $SHAPE --compile $COMPILE $CALLS"
  [syncs]="scripts/check_decode.py --dtype bfloat16 --checks syncs --limit 1 --max-new-tokens $NEW"
  [sampler]="scripts/bench_sampler.py --device $DEVICE $SAMPLER"
  [concurrency-8b]="scripts/gpu_concurrency.py --shape $SHAPE --schedules ar,linear,packed $CONCURRENCY"
  [summary]="scripts/gpu_summary.py --results RESULTS $CUDA_FLAG"
  [pack]="tar RESULTS into OUT/gpu_check.tar.gz; OUT/gpu_check.json, OUT/summary.md"
)
TOTAL=0
for name in "${STEPS[@]}"; do
  printf '  %-15s %4d s  %s\n' "$name" "${BUDGET[$name]}" "${WHAT[$name]}"
  TOTAL=$((TOTAL + BUDGET[$name]))
done
echo "plan: ${#STEPS[@]} steps, budgets sum to $TOTAL s"
LEFT_OUT=()
for name in "${ALL_STEPS[@]}"; do selected "$name" || LEFT_OUT+=("$name"); done
[ ${#LEFT_OUT[@]} = 0 ] || echo "not run (ONLY/SKIP): ${LEFT_OUT[*]}"
[ "$TOTAL" -le "$WINDOW" ] || die "the plan's budgets sum to $TOTAL s, over the $WINDOW s a GPU run may take; lower a step's budget (questions, tokens, blocks) until they fit"
[ "$PLAN" = 1 ] && exit 0

mkdir -p "$RESULTS" 2>/dev/null && [ -w "$RESULTS" ] || die "cannot write to RESULTS=$RESULTS; set RESULTS to a writable folder"
mkdir -p "$OUT" 2>/dev/null && [ -w "$OUT" ] || die "cannot write to OUT=$OUT; set OUT to a writable folder"
[ "$(cd "$OUT" && pwd -P)" != "$(cd "$RESULTS" && pwd -P)" ] || die "OUT and RESULTS are the same folder ($OUT); give OUT a folder of its own"
for name in "${ALL_STEPS[@]}"; do rm -f "$RESULTS/$name".{json,md,stderr}; done
rm -rf "$RESULTS/concurrency-8b" "$RESULTS"/{steps.tsv,plan.tsv,summary.md,summary.stdout,gpu_check.json}
rm -f "$OUT/gpu_check.tar.gz" "$OUT/gpu_check.json" "$OUT/summary.md"
for name in "${STEPS[@]}"; do printf '%s\t%s\n' "$name" "${BUDGET[$name]}" >>"$RESULTS/plan.tsv"; done
# The commit the records carry (packedss.runner.code_version reads it where .git is absent).
if [ -z "${PACKEDSS_COMMIT:-}" ]; then
  PACKEDSS_COMMIT=$(git describe --always --dirty --abbrev=12 2>/dev/null) \
    || PACKEDSS_COMMIT=$(cat "${WHEELS:-/nonexistent}/COMMIT" 2>/dev/null) || PACKEDSS_COMMIT=
fi
echo "code: ${PACKEDSS_COMMIT:-unknown commit (no .git, no PACKEDSS_COMMIT, no COMMIT file in WHEELS)}"
export PACKEDSS_COMMIT
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# Every step is a fresh interpreter importing torch and transformers. Where bytecode writing is off
# (PYTHONDONTWRITEBYTECODE, common in images) and a package came without its .pyc (the wheels, which
# pip installs --no-compile), each step would compile those sources again: about 9 s of CPU a step
# on a 2-core CPU. Written once by the first step, where its folder is writable, they are read since.
unset PYTHONDONTWRITEBYTECODE
FAILED=()
STARTED=$SECONDS

cut_short() { [ "$1" = 124 ] || [ "$1" = 137 ]; }  # timeout's status, or SIGKILL's when the step ignored its TERM

step() {  # step NAME CMD...: runs CMD (a command or an exported function) under NAME's budget; output in RESULTS/NAME.{md,stderr}
  local name=$1 limit
  limit=$(awk -v b="${BUDGET[$1]}" -v s="$SLACK" 'BEGIN { printf "%g", b * s }')
  shift
  selected "$name" || return 0
  echo "=== $name (budget ${BUDGET[$name]}s$([ "$SLACK" = 1 ] || echo "; limit ${limit}s on this CPU")): ${WHAT[$name]}"
  local t0=$SECONDS table="$RESULTS/$name.md"
  [ "$name" = summary ] && table="$RESULTS/summary.stdout"  # summary.md is gpu_summary.py's own file
  timeout -k 3 "$limit" bash -c '"$@"' "$name" "$@" 2>"$RESULTS/$name.stderr" | tee "$table"
  local rc=${PIPESTATUS[0]}
  local took=$((SECONDS - t0))
  printf '%s\t%s\t%s\t%s\n' "$name" "${BUDGET[$name]}" "$rc" "$took" >>"$RESULTS/steps.tsv"
  echo "=== $name: rc=$rc in ${took}s$(cut_short "$rc" && echo ' (cut short by its budget)')"
  if [ "$rc" != 0 ]; then
    tail -3 "$RESULTS/$name.stderr"
    FAILED+=("$name")
  fi
  return "$rc"
}

install_wheels() {
  if [ -z "$WHEELS" ]; then
    echo "no wheels carried (WHEELS unset): the Python's own packages are used"
    return 0
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
    && ls "$WHEELS"/*.whl | xargs -n 1 basename
}

pack() {  # the results folder as one tar, beside the summary; at most 8 files of under 16 MiB
  local parent base
  parent=$(dirname "$RESULTS") base=$(basename "$RESULTS")
  tar -czf "$OUT/gpu_check.tar.gz" -C "$parent" "$base" || return 1
  cp "$RESULTS/gpu_check.json" "$RESULTS/summary.md" "$OUT"/ 2>/dev/null
  local files big
  files=$(find "$OUT" -maxdepth 1 -type f | wc -l)
  big=$(find "$OUT" -maxdepth 1 -type f -size +16M | xargs -r -n 1 basename)
  ls -l "$OUT"
  [ "$files" -le 8 ] || { echo "OUT=$OUT holds $files files, more than the 8 that come back" >&2; return 1; }
  [ -z "$big" ] || { echo "over 16 MiB: $big" >&2; return 1; }
}

export -f install_wheels pack  # steps too: run under timeout in a bash of their own
export PY WHEELS SITE RESULTS OUT

finish() {  # the verdicts and the packed files, whatever happened before
  step summary "$PY" scripts/gpu_summary.py --results "$RESULTS" $CUDA_FLAG
  step pack pack
  echo "gpu_check: $((SECONDS - STARTED)) s in all (budgets: $TOTAL s)"
}

refused() {  # a step that stops the run (wheels, preflight): the verdicts and the packing, then its one error line
  local line rc=$3
  if [ "$1" = preflight ] && cut_short "$rc"; then
    echo "preflight cut short by its budget: not fatal; the steps run (each adapter checks its backbone's cache keyword itself)"
    return 0
  fi
  line=$(grep '^error: ' "$RESULTS/$1.stderr" | tail -1)
  finish
  echo "${line:-error: $1 failed (see $RESULTS/$1.stderr); $2}" >&2
  exit 2
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi: not available'
step wheels install_wheels || refused wheels "refill WHEELS with bash scripts/gpu_wheels.sh" $?
[ -n "$WHEELS" ] && export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH#"$PWD/src"}"
step preflight "$PY" -m packedss.preflight --require hydra-core,omegaconf $DEVICE_CHECK --json "$RESULTS/preflight.json" \
  || refused preflight "run it alone: $PY -m packedss.preflight" $?
step audit-fp32 "$PY" scripts/check_decode.py --device $DEVICE --dtype float32 --checks audit --exact $AUDIT \
  --json "$RESULTS/audit-fp32.json"
step audit-bf16 "$PY" scripts/check_decode.py --device $DEVICE --dtype bfloat16 --checks audit $AUDIT \
  --json "$RESULTS/audit-bf16.json"
step graphs-8b "$PY" scripts/gpu_calls.py --shape $SHAPE --device $DEVICE --dtype bfloat16 --compile "$COMPILE" \
  --threads $THREADS $CALLS --json "$RESULTS/graphs-8b.json"
step syncs "$PY" scripts/check_decode.py --device $DEVICE --dtype bfloat16 --checks syncs --limit 1 \
  --max-new-tokens $NEW --json "$RESULTS/syncs.json"
step sampler "$PY" scripts/bench_sampler.py --device $DEVICE $SAMPLER --json "$RESULTS/sampler.json"
step concurrency-8b "$PY" scripts/gpu_concurrency.py --shape $SHAPE --device $DEVICE --threads $THREADS \
  --schedules ar,linear,packed $CONCURRENCY --out "$RESULTS/concurrency-8b" --json "$RESULTS/concurrency-8b.json"
finish
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "gpu_check: FAILED: ${FAILED[*]}; results in $RESULTS, packed in $OUT"
  RERUN=$(printf '%s\n' "${FAILED[@]}" | grep -vx 'wheels\|summary\|pack' | paste -sd, -)
  [ -z "$RERUN" ] || echo "rerun what failed: ONLY=$RERUN${WHEELS:+ WHEELS=$WHEELS} OUT=<a new folder> bash scripts/gpu_check.sh"
  exit 1
fi
echo "gpu_check: all checks passed$([ ${#LEFT_OUT[@]} = 0 ] || echo " (a partial run: ${LEFT_OUT[*]} not run)"); results in $RESULTS, packed in $OUT"
