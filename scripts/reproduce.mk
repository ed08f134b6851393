# Reproduce the paper's appendix tables (2-13) and figures (3-5): each target runs its experiment
# preset (conf/experiment/tableN.yaml) and then the analysis. Included by the main Makefile,
# which defines PY (and optionally MODEL, LIMIT).
#
#   make reproduce-table6                      # the paper's models (GPUs and the weights)
#   make reproduce-table6 MODEL=tiny LIMIT=10  # the same pipeline offline on the tiny model
#   make reproduce-table10 MODEL=tiny-set LIMIT=10
#   make reproduce-all ANALYSIS_FLAGS=--compare-paper
#
# MODEL=tiny runs the any-order presets (tables 8-10) on tiny-set. Outputs: results/tableN/records
# (JSONL), results/tableN/tables (CSV, Markdown, LaTeX), results/figureN/figures (PNG, PDF, CSV).
# Records are resumed: rerunning a target skips the questions already recorded.

PY ?= .venv/bin/python
MODEL ?=
LIMIT ?=
RESULTS ?= results
ANALYSIS_FLAGS ?=

REPRO_TABLES := 2 3 4 5 6 7 8 9 10 11 12 13
REPRO_FIGURES := 3 4 5
ANYORDER_TABLES := 8 9 10

# The tiny models' offline runs read the benchmark files of ../shared/data (DATA_DIR=DIR to
# change); MBPP+ is not among them, so those runs use MBPP's original test split
# (task.variant=original). Runs of the paper's models load through datasets unless DATA_DIR is set.
OFFLINE := $(filter tiny tiny-set,$(MODEL))
DATA_DIR ?= $(if $(OFFLINE),$(wildcard ../shared/data))

# Empty MODEL / LIMIT are not passed, so the presets' own models and question sets apply.
repro_model = $(strip $(if $(filter $(1),$(ANYORDER_TABLES)),$(if $(filter tiny,$(MODEL)),tiny-set,$(MODEL)),$(MODEL)))
repro_overrides = $(if $(call repro_model,$(1)),model=$(call repro_model,$(1))) $(if $(strip $(LIMIT)),limit=$(strip $(LIMIT))) \
	$(if $(strip $(DATA_DIR)),data_dir=$(abspath $(DATA_DIR))) $(if $(OFFLINE),task.variant=original)

# The runs behind each figure: Figure 3 greedy (Nemotron table 6, SetDLM table 9 with native),
# Figure 4 temperature 1 (table 7), Figure 5 timing on GSM8K and MATH-500 (table 6).
FIGURE3_RUNS := 6 9
FIGURE4_RUNS := 7
FIGURE5_RUNS := 6

.PHONY: reproduce-all $(foreach n,$(REPRO_TABLES),reproduce-table$(n) repro-run-table$(n)) $(foreach n,$(REPRO_FIGURES),reproduce-figure$(n))

# Tables 11 and 12 are computed from Table 6's runs and Table 13 from Table 7's (their presets
# extend those), so their records live, and resume, in the same folder.
RUNS_OF_11 := 6
RUNS_OF_12 := 6
RUNS_OF_13 := 7
runs_of = $(or $(RUNS_OF_$(1)),$(1))

define repro_table_rules
repro-run-table$(1): $(STAMP)
	$(PY) run.py -m +experiment=table$(1) $(call repro_overrides,$(1)) out_dir=$(RESULTS)/table$(call runs_of,$(1))/records

reproduce-table$(1): repro-run-table$(1)
	$(PY) -m packedss.analysis $(RESULTS)/table$(1) --tables $(1) $(if $(RUNS_OF_$(1)),--records $(RESULTS)/table$(call runs_of,$(1))/records) $(ANALYSIS_FLAGS)
endef
$(foreach n,$(REPRO_TABLES),$(eval $(call repro_table_rules,$(n))))

define repro_figure_rules
reproduce-figure$(1): $(foreach r,$(FIGURE$(1)_RUNS),repro-run-table$(r))
	$(PY) -m packedss.analysis $(RESULTS)/figure$(1) --figures $(1) --records $(foreach r,$(FIGURE$(1)_RUNS),$(RESULTS)/table$(r)/records) $(ANALYSIS_FLAGS)
endef
$(foreach n,$(REPRO_FIGURES),$(eval $(call repro_figure_rules,$(n))))

reproduce-all: $(foreach n,$(REPRO_TABLES),reproduce-table$(n)) $(foreach n,$(REPRO_FIGURES),reproduce-figure$(n))
