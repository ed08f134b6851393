#!/usr/bin/env bash
# The CUDA path in two commands of at most 600 s each on one H100/H200-class GPU (the sum of each
# pass's step limits, plus about 15 s of start-up and verdicts, stays under 600 s):
#
#     PASS=1 bash scripts/gpu_check.sh            # exactness, syncs, audit, overheads, 3B calls under CUDA graphs
#     PASS=2 bash scripts/gpu_check.sh            # tiny's schedules and the 8B calls under CUDA graphs
#     PASS=3 bash scripts/gpu_check.sh            # concurrency: C requests per call, and the crossover
#     bash scripts/gpu_check.sh                   # passes 1 and 2 in one command (PASS=all, at most 1200 s)
#     DRY=1 bash scripts/gpu_check.sh             # the same code paths on the CPU at toy sizes (about 2 minutes)
#     PY=/path/to/python OUT=/some/dir COMPILE=default bash scripts/gpu_check.sh
#
# Needs a Python with a CUDA build of torch, transformers 5.x, numpy, scipy, pandas, omegaconf,
# tokenizers and safetensors (the project's dependencies; the package itself is read from src/,
# no install needed), the shipped tiny model (assets/models/tiny), and no network.
#
# Every step has its own time limit; a failed step is reported and the rest go on. Each step
# writes its table to $OUT/STEP.md and its numbers to $OUT/STEP.json ($OUT: default
# results/gpu_check); at the end of each pass scripts/gpu_summary.py prints one line per check,
# PASS, FAIL, SKIP (with the reason) or INFO, with its criterion, and writes every number to
# $OUT/gpu_check.json. The exit status is 1 when a check or a step failed.
#
# Pass 1 (at most 570 s of steps):
#   exact-fp32, exact-bf16, events-bf16: the tiny model, greedy, W = 8, 30 arith questions, AR +
#     every LTR schedule interleaved. Check fp32-exact: float32 matches AR token for token;
#     bfloat16 (sync and events timing) reports its match rate.
#   info-attn-8b: SDPA against FlexAttention for the 8B shape at B = 32 (informational).
#   schedules-3b, schedules-8b: the schedules on random-weight 3B and 8B shapes (overhead shares).
#   decode-bf16 (scripts/check_decode.py): checks syncs (host syncs per iteration of every LTR
#     schedule under torch.cuda.set_sync_debug_mode: greedy <= iterations + 2 per response, T = 1
#     <= 2 x iterations + 2) and audit-bf16 (the divergence audit of tiny in bfloat16 at W = 8,
#     16, 31: no unexplained divergence from AR).
#   graphs-3b (scripts/gpu_calls.py): the 3B shape's calls eager and under CUDA graphs, as
#     graphs-8b below. Check graph-replays-3b.
# Pass 2 (at most 570 s of steps):
#   compiled-tiny: the tiny model's schedules eager and under CUDA graphs side by side. Checks
#     compiled-dispatch (Compiled calls 100%) and cuda-graph-calls (every timed call after prefill
#     replayed a CUDA graph, no cudagraph skips).
#   graphs-8b (scripts/gpu_calls.py): the 8B shape's calls, R = 1, B, 2B at B = 8, 16, 32 and
#     B(B+1) at B = 8 (cache of 1024 rows), eager and under CUDA graphs, round-robin beside the products floor (the call's
#     matrix products alone), the weight-streaming floor, and the HBM floor (the weight bytes at
#     the measured device-to-device copy bandwidth, printed), with the achieved bandwidth. Checks
#     graph-replays-8b, memory-bound-8b (2B/B <= 1.3 at B = 32 under CUDA graphs: the eager ratio
#     is also printed, but an eager call is host-bound and passes it without showing anything)
#     and hbm-floor-8b (R = 1, B, 2B within 2x the HBM floor).
# Pass 3 (at most 570 s of steps; not part of PASS=all):
#   concurrency-8b (scripts/gpu_concurrency.py): tiny decides, a cost twin of the 8B shape (random
#     weights, bfloat16, eager calls) is timed, AR / Linear-SS / Packed-SS at W = 31 and
#     Quadratic-SS at W = 7, at C = 1, 4, 16, 64, 64 arith questions each, 32 new tokens. Checks concurrency-audit (no unexplained
#     divergence from AR at the same C) and concurrency-runs (every job wrote every response);
#     INFO crossover-8b: Packed/Linear by C and the C at which it reaches 1.
# DRY=1 runs the steps on the CPU with toy shapes, few questions and short outputs (compiled-tiny
# packed at W = 1 only; events-bf16 and schedules-8b, which repeat another step's command on a
# CPU, are left out): it checks the plumbing, not the numbers; the CUDA-only checks are reported
# as SKIP with the reason. MODEL=DIR points the model steps at another Nemotron-format checkpoint.
set -u
cd "$(dirname "$0")/.."
die() { echo "error: $*" >&2; exit 2; }
PY=${PY:-$(command -v python3 || command -v python)}
[ -n "$PY" ] && command -v "$PY" >/dev/null || die "no Python found (PY=${PY:-unset}); set PY=/path/to/python"
OUT=${OUT:-results/gpu_check}
MODEL=${MODEL:-tiny}
COMPILE=${COMPILE:-reduce-overhead}
PASS=${PASS:-all}
DRY=${DRY:-0}
case $PASS in all | 1 | 2 | 3) ;; *) die "PASS=$PASS is not a pass; use PASS=1, PASS=2, PASS=3 or PASS=all (1 and 2)" ;; esac
case $DRY in 0 | 1) ;; *) die "DRY=$DRY; use DRY=1 (toy sizes on the CPU) or DRY=0 (the GPU run)" ;; esac
case $COMPILE in default | reduce-overhead | max-autotune) ;;
  *) die "COMPILE=$COMPILE; use reduce-overhead (CUDA graphs, the default), default or max-autotune" ;; esac
mkdir -p "$OUT" 2>/dev/null && [ -w "$OUT" ] || die "cannot write to OUT=$OUT; set OUT to a writable folder"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
FAILED=()

if [ "$DRY" = 1 ]; then
  DEVICE=cpu S3B=test S8B=test N=2 NQ=2 THREADS=1 ATTN=packedss,sdpa MAXNEW="--max-new-tokens 12"
  BLOCKS=1 QBLOCKS=1 PREFIX=8 ITERS="--warmup 1 --iters 2" STREAM="--stream-mib 4" CWIDTH="--schedules packed --width 1"
  DECODE="--limit 1 --max-new-tokens 12 --widths 8"
  CONCURRENCY="--concurrency 1,2 --width 3 --quadratic-width 2 --limit 3 --max-new-tokens 8"
else
  DEVICE=cuda S3B=nemotron3b S8B=nemotron8b N=30 NQ=4 THREADS=0 ATTN=packedss,sdpa,flex_attention MAXNEW=
  BLOCKS=8,16,32 QBLOCKS=8 PREFIX=1024 ITERS="--warmup 5 --iters 20" STREAM= CWIDTH=
  DECODE="--limit 10 --max-new-tokens 64 --widths 8,16,31"
  CONCURRENCY="--concurrency 1,4,16,64 --width 31 --quadratic-width 7 --limit 64 --max-new-tokens 32"
fi

step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>"$OUT/$name.stderr" | tee "$OUT/$name.md"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: rc=$rc in $((SECONDS - t0))s"
  if [ "$rc" != 0 ]; then
    tail -5 "$OUT/$name.stderr"
    case $name in info-* | schedules-*) echo "($name is informational: not counted as a failure)" ;; *) FAILED+=("$name(rc=$rc)") ;; esac
  fi
}

verdicts() {  # verdicts PASS
  echo "=== checks of pass $1"
  "$PY" scripts/gpu_summary.py --out "$OUT" --pass "$1" $([ "$DEVICE" = cuda ] && echo --cuda) || FAILED+=("checks-pass-$1")
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi: not available'
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'transformers', transformers.__version__)" \
  || die "$PY cannot import torch and transformers; set PY to the project's Python (e.g. PY=.venv/bin/python)"
[ "$DEVICE" = cpu ] || "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || die "no CUDA device visible to $PY; run on a GPU machine with a CUDA build of torch, or DRY=1 on a CPU"

TINY="--model $MODEL --task arith --limit $N --width 8 --schedules ar,linear,quadratic,packed --device $DEVICE --threads $THREADS $MAXNEW $STREAM"
GRAPHS="--compile $COMPILE --device $DEVICE --dtype bfloat16 --threads $THREADS --blocks $BLOCKS --quadratic-blocks $QBLOCKS --prefix $PREFIX $ITERS $STREAM"
if [ "$PASS" = 1 ] || [ "$PASS" = all ]; then
  step exact-fp32 60 "$PY" scripts/bench_schedules.py $TINY --dtype float32 --json "$OUT/exact-fp32.json"
  step exact-bf16 55 "$PY" scripts/bench_schedules.py $TINY --dtype bfloat16 --json "$OUT/exact-bf16.json"
  if [ "$DRY" = 1 ]; then
    echo "=== events-bf16: skipped (DRY=1: on a CPU timing=events times calls exactly as timing=sync does)"
  else
    step events-bf16 55 "$PY" scripts/bench_schedules.py $TINY --dtype bfloat16 --timing events --json "$OUT/events-bf16.json"
  fi
  step info-attn-8b 50 "$PY" scripts/bench_calls.py --shape $S8B --attn $ATTN --device $DEVICE --dtype bfloat16 --threads $THREADS --blocks ${BLOCKS##*,} --prefix $PREFIX $ITERS $STREAM --json "$OUT/info-attn-8b.json"
  RANDOM_RUN="--model $MODEL --task arith --limit $NQ --width 31 --quadratic-width 7 --schedules linear,quadratic,packed --max-new-tokens 64 --device $DEVICE --dtype bfloat16 --threads $THREADS --no-grade $STREAM"
  [ "$DRY" = 1 ] && RANDOM_RUN="--model $MODEL --task arith --limit $NQ --width 3 --quadratic-width 2 --schedules linear,quadratic,packed --max-new-tokens 12 --device cpu --dtype bfloat16 --threads 1 --no-grade $STREAM"
  step schedules-3b 50 "$PY" scripts/bench_schedules.py $RANDOM_RUN --shape $S3B --json "$OUT/schedules-3b.json"
  if [ "$DRY" = 1 ]; then
    echo "=== schedules-8b: skipped (DRY=1: the same toy shape and command as schedules-3b)"
  else
    step schedules-8b 60 "$PY" scripts/bench_schedules.py $RANDOM_RUN --shape $S8B --json "$OUT/schedules-8b.json"
  fi
  step decode-bf16 60 "$PY" scripts/check_decode.py --device $DEVICE --dtype bfloat16 $DECODE --json "$OUT/decode-bf16.json"
  step graphs-3b 180 "$PY" scripts/gpu_calls.py --shape $S3B $GRAPHS --json "$OUT/graphs-3b.json"
  verdicts 1
fi
if [ "$PASS" = 2 ] || [ "$PASS" = all ]; then
  step compiled-tiny 270 "$PY" scripts/bench_schedules.py $TINY --dtype float32 --compile "$COMPILE" $CWIDTH --json "$OUT/compiled-tiny.json"
  step graphs-8b 300 "$PY" scripts/gpu_calls.py --shape $S8B $GRAPHS --json "$OUT/graphs-8b.json"
  verdicts 2
fi
if [ "$PASS" = 3 ]; then
  step concurrency-8b 570 "$PY" scripts/gpu_concurrency.py --shape $S8B --device $DEVICE --threads $THREADS $CONCURRENCY --out "$OUT/concurrency-8b" --json "$OUT/concurrency-8b.json"
  verdicts 3
fi

if [ ${#FAILED[@]} -gt 0 ]; then echo "gpu_check: FAILED: ${FAILED[*]}; results in $OUT"; exit 1; fi
echo "gpu_check: all checks passed; results in $OUT"
