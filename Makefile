# Quick start: `make demo` and `make test`. Each target creates or updates the
# project's own environment (.venv) when pyproject.toml or this file changed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU machines take the pinned CPU wheel; on a GPU machine install your own
# torch into .venv first and run `make ... TORCH=` to keep it.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo test golden clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(strip $(TORCH)),$(PY) -m pip install -q "$(TORCH)",)
	$(PY) -m pip install -q -e ".[dev]"
	# EvalPlus's MBPP+ data and checker only: its declared LLM-client dependencies are not needed
	$(PY) -m pip install -q --no-deps "evalplus==0.3.1"
	touch $(STAMP)

# The embedded default (tiny model, arith, CPU) swept over the schedules, then the paper's
# Table 6 layout of the results; reruns resume and only reprint.
demo: $(STAMP)
	$(PY) run.py -m schedule=ar,linear,quadratic,packed out_dir=results/demo/records
	$(PY) -m packedss.analysis results/demo --tables 6 --figures 3 --n-resamples 2000
	@cat results/demo/tables/table6.md

test: $(STAMP)
	$(PY) -m pytest

# Regenerate the NFE regression file deliberately (tests/golden/nfe_tiny.json); commit the result.
golden: $(STAMP)
	$(PY) -m tests.test_golden_nfe --write

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache

# plan-table2 ... plan-table13, plan-figure3 ... plan-figure5, plan-all: the jobs of the targets below,
# checked and costed without loading a model; reproduce-table2 ... reproduce-table13,
# reproduce-figure3 ... figure5, reproduce-all
include scripts/reproduce.mk
