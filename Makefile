# Quick start: `make demo` and `make test`. Each target creates or updates the
# project's own environment (.venv) when pyproject.toml or this file changed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU machines take the pinned CPU wheel; on a GPU machine install your own
# torch into .venv first and run `make ... TORCH=` to keep it.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo test test-references golden clean bench-memory-bound

install: $(STAMP)

# pip takes the torch wheel (it finds the pinned CPU file where the machine's pip configuration
# says); uv installs the rest, an installed torch kept, in half of pip's time. Every source gets
# its bytecode at install: the suite's fresh interpreters would otherwise compile what they
# import, each of them, wherever PYTHONDONTWRITEBYTECODE is set.
UV := $(PY) -m uv pip install -q --python $(PY) --compile-bytecode
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "uv==0.13.10"
	$(if $(strip $(TORCH)),$(PY) -m pip install -q "$(TORCH)",)
	$(UV) -e ".[dev]"
	# EvalPlus's MBPP+ data and checker only: its declared LLM-client dependencies are not needed
	$(UV) --no-deps "evalplus==0.3.1"
	touch $(STAMP)

# The embedded default (tiny model, arith, CPU) swept over the schedules, then the paper's
# Table 6 layout of the results; a rerun decodes nothing new, re-runs the analysis and rewrites its files.
demo: $(STAMP)
	$(PY) run.py -m schedule=ar,linear,quadratic,packed out_dir=results/demo/records
	$(PY) -m packedss.analysis results/demo --tables 6 --figures 3 --n-resamples 2000
	@cat results/demo/tables/table6.md

# The suite on TEST_WORKERS processes (pytest-xdist; 0: in this process). The code data sets'
# reference solutions are graded on a fixed part of each set there; test-references grades all.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS)

test-references: $(STAMP)
	$(PY) -m pytest -n 0 --all-references tests/tasks/test_reference_solutions.py

# Regenerate the NFE regression file deliberately (tests/golden/nfe_tiny.json); commit the result.
golden: $(STAMP)
	$(PY) -m tests.test_golden_nfe --write

# The memory-bound regime (docs/performance.md §11): the calls of a 1.5B-parameter bfloat16 model
# against the weight-streaming floor, then the schedules decoding with the tiny model timed on a
# cost twin of that shape, beside the same decodes timed on tiny itself. CPU, one thread; about an
# hour on a shared 2-core machine (BENCH_LIMIT questions per width; BENCH_THREADS=2 for two threads).
BENCH_LIMIT ?= 3
BENCH_THREADS ?= 1
bench-memory-bound: $(STAMP)
	mkdir -p results/bench
	$(PY) scripts/bench_calls.py --shape nemotron3b --layers 6 --dtype bfloat16 --threads $(BENCH_THREADS) \
		--blocks 9 --prefix 256 --compile default --json results/bench/floor-1p5b-t$(BENCH_THREADS).json
	$(PY) scripts/bench_schedules.py --model tiny --schedules ar,linear,quadratic,packed --width 8,16,31 \
		--cost-shape nemotron3b --cost-layers 6 --cost-dtype bfloat16 --threads $(BENCH_THREADS) \
		--limit $(BENCH_LIMIT) --json results/bench/cost-twin-t$(BENCH_THREADS).json

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache

# The SDAR table (docs/analysis.md §5, docs/reproducing.md): the `sdar` preset (SDAR-8B and -4B Chat,
# MBPP+, HumanEval, GSM8K, MATH-500, AR/Linear-SS/Packed-SS/SDAR native/S2D2 at W = 3), or with
# MODEL=tiny the `sdar-tiny` preset (tiny-sdar on arith), then `--tables sdar` of RESULTS/sdar.
# LIMIT, OVERRIDES, DATA_DIR, RESULTS and ANALYSIS_FLAGS as for reproduce-tableN (scripts/reproduce.mk);
# another MODEL replaces the preset's two models.
SDAR_TINY = $(filter tiny tiny-sdar,$(MODEL))
SDAR_SWEEP = $(strip +experiment=$(if $(SDAR_TINY),sdar-tiny,sdar) $(if $(SDAR_TINY),,$(if $(strip $(MODEL)),model=$(strip $(MODEL)))) \
	$(if $(strip $(LIMIT)),limit=$(strip $(LIMIT))) $(if $(and $(strip $(DATA_DIR)),$(if $(SDAR_TINY),,yes)),data_dir=$(abspath $(DATA_DIR))) \
	$(OVERRIDES) out_dir=$(RESULTS)/sdar/records)
.PHONY: plan-sdar reproduce-sdar
plan-sdar: $(STAMP)
	$(PY) -m packedss.plan $(SDAR_SWEEP)

reproduce-sdar: $(STAMP)
	$(PY) run.py -m $(SDAR_SWEEP)
	$(PY) -m packedss.analysis $(RESULTS)/sdar --tables sdar $(ANALYSIS_FLAGS)

# Spec-Bench's leaderboard (docs/analysis.md §5.2, docs/reproducing.md): the `specbench` preset
# (Nemotron 3B and 8B, AR/PLD/Linear-SS/Packed-SS, cap 1,024), or with MODEL=tiny the
# `specbench-tiny` preset (2 questions of each category, cap 64), then `--tables specbench
# --figures SB` of RESULTS/specbench. LIMIT, OVERRIDES, DATA_DIR, RESULTS and ANALYSIS_FLAGS as for
# reproduce-tableN (scripts/reproduce.mk); another MODEL replaces the preset's two models.
SPECBENCH_TINY = $(filter tiny,$(MODEL))
SPECBENCH_SWEEP = $(strip +experiment=$(if $(SPECBENCH_TINY),specbench-tiny,specbench) \
	$(if $(SPECBENCH_TINY),,$(if $(strip $(MODEL)),model=$(strip $(MODEL)))) $(if $(strip $(LIMIT)),limit=$(strip $(LIMIT))) \
	$(if $(strip $(DATA_DIR)),data_dir=$(abspath $(DATA_DIR))) $(OVERRIDES) out_dir=$(RESULTS)/specbench/records)
.PHONY: plan-specbench reproduce-specbench
plan-specbench: $(STAMP)
	$(PY) -m packedss.plan $(SPECBENCH_SWEEP)

reproduce-specbench: $(STAMP)
	$(PY) run.py -m $(SPECBENCH_SWEEP)
	$(PY) -m packedss.analysis $(RESULTS)/specbench --tables specbench --figures SB $(ANALYSIS_FLAGS)

# plan-table2 ... plan-table13, plan-figure3 ... plan-figure5, plan-all: the jobs of the targets below,
# checked and costed without loading a model; reproduce-table2 ... reproduce-table13,
# reproduce-figure3 ... figure5, reproduce-all
include scripts/reproduce.mk
