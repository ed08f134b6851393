# Reproduce the paper's appendix tables (2-13) and figures (3-5): each target runs the experiment
# presets behind it (conf/experiment/NAME.yaml) and then the analysis; each plan target lists,
# without loading any model, every job its reproduce target would run, with an estimate of the
# GPU time. Included by the main Makefile, which defines PY (and optionally MODEL, LIMIT).
#
#   make plan-table6                           # the jobs of reproduce-table6, checked and costed
#   make reproduce-table6                      # the paper's models (GPUs and the weights)
#   make reproduce-table6 MODEL=tiny LIMIT=10  # the same pipeline offline on the tiny model
#   make reproduce-table10 MODEL=tiny-set LIMIT=10
#   make reproduce-all ANALYSIS_FLAGS=--compare-paper
#   make reproduce-table8 OVERRIDES=+paths=local   # more overrides for every job (here: checkpoints)
#   make reproduce-table7 MODEL=tiny LIMIT=5 SAMPLES=3  # K samples per question in the T = 1 presets
#
# MODEL=tiny runs the any-order presets (tables 8-10) on tiny-set. Outputs: results/FOLDER/records
# (JSONL), results/tableN/tables (CSV, Markdown, LaTeX), results/figureN/figures (PNG, PDF, CSV).
# Records are resumed: rerunning a target skips the questions already recorded. Each preset's sweep
# prints its jobs done and left with the time left (from the jobs finished so far) as each job
# ends; a log that is not a terminal gets each job's progress lines every 30 s (packedss.progress).

PY ?= .venv/bin/python
MODEL ?=
LIMIT ?=
SAMPLES ?=
OVERRIDES ?=
RESULTS ?= results
ANALYSIS_FLAGS ?=

REPRO_TABLES := 2 3 4 5 6 7 8 9 10 11 12 13
REPRO_FIGURES := 3 4 5
ANYORDER_PRESETS := table8 table9 table10
# The temperature-1 presets: SAMPLES=K replaces their samples per question (greedy ones have one).
SAMPLED_PRESETS := table7 figure4

# The presets behind each target. Tables 11-13 and the figures are computed from the runs of
# other tables; Figures 3 and 4 add their WritingBench runs (speed only).
PRESETS_table2 := table2
PRESETS_table3 := table3
PRESETS_table4 := table4
PRESETS_table5 := table5
PRESETS_table6 := table6
PRESETS_table7 := table7
PRESETS_table8 := table8
PRESETS_table9 := table9
PRESETS_table10 := table10
PRESETS_table11 := table6 table7
PRESETS_table12 := table6
PRESETS_table13 := table7
PRESETS_figure3 := table6 table9 figure3
PRESETS_figure4 := table7 figure4
PRESETS_figure5 := figure5
ALL_PRESETS := table2 table3 table4 table5 table6 table7 table8 table9 table10 figure3 figure4 figure5

# The records folder of each preset (results/FOLDER/records, as the preset's out_dir): presets
# that share runs share the folder, so either target resumes the records the other wrote.
FOLDER_table5 := table4
FOLDER_table8 := table9
FOLDER_table10 := table9
FOLDER_figure5 := table6
folder_of = $(or $(FOLDER_$(1)),$(1))

# The tiny models' offline runs read the benchmark files of ../shared/data (DATA_DIR=DIR to
# change), MBPP+ (MbppPlus.jsonl.gz) included; a DATA_DIR without an MBPP+ file gives MBPP's
# original test split instead (task.variant=original). Runs of the paper's models load through
# datasets unless DATA_DIR is set.
OFFLINE := $(filter tiny tiny-set,$(MODEL))
DATA_DIR ?= $(if $(OFFLINE),$(wildcard ../shared/data))
MBPP_PLUS_FILES := MbppPlus.jsonl.gz MbppPlus.jsonl mbppplus.jsonl
NO_MBPP_PLUS := $(if $(and $(OFFLINE),$(strip $(DATA_DIR))),$(if $(wildcard $(addprefix $(DATA_DIR)/,$(MBPP_PLUS_FILES))),,yes))

# Empty MODEL / LIMIT are not passed, so the presets' own models and question sets apply.
repro_model = $(strip $(if $(filter $(1),$(ANYORDER_PRESETS)),$(if $(filter tiny,$(MODEL)),tiny-set,$(MODEL)),$(MODEL)))
repro_overrides = $(if $(call repro_model,$(1)),model=$(call repro_model,$(1))) $(if $(strip $(LIMIT)),limit=$(strip $(LIMIT))) \
	$(if $(strip $(DATA_DIR)),data_dir=$(abspath $(DATA_DIR))) $(if $(NO_MBPP_PLUS),task.variant=original) \
	$(if $(and $(strip $(SAMPLES)),$(filter $(1),$(SAMPLED_PRESETS))),samples=$(strip $(SAMPLES)))
# One preset's sweep: its overrides on the command line of run.py -m (and of the plan).
preset_sweep = $(strip +experiment=$(1) $(call repro_overrides,$(1)) $(OVERRIDES) out_dir=$(RESULTS)/$(call folder_of,$(1))/records)
# Several presets' sweeps for the plan, separated by --and.
plan_sweeps = $(foreach p,$(1),$(if $(filter-out $(firstword $(1)),$(p)),--and) $(call preset_sweep,$(p)))
records_of = $(sort $(foreach p,$(PRESETS_$(1)),$(RESULTS)/$(call folder_of,$(p))/records))
# The analysis of RESULTS/TARGET reads RESULTS/TARGET/records itself: --records names the others.
other_records_of = $(filter-out $(RESULTS)/$(1)/records,$(call records_of,$(1)))

TARGETS := $(foreach n,$(REPRO_TABLES),table$(n)) $(foreach n,$(REPRO_FIGURES),figure$(n))

.PHONY: reproduce-all plan-all $(foreach t,$(TARGETS),reproduce-$(t) plan-$(t)) $(foreach p,$(ALL_PRESETS),repro-run-$(p))

define repro_run_rule
repro-run-$(1): $(STAMP)
	$(PY) run.py -m $(call preset_sweep,$(1))
endef
$(foreach p,$(ALL_PRESETS),$(eval $(call repro_run_rule,$(p))))

# $(1): target (table6, figure3); $(2): the analysis option (--tables 6, --figures 3).
define repro_target_rules
plan-$(1): $(STAMP)
	$(PY) -m packedss.plan $(call plan_sweeps,$(PRESETS_$(1)))

reproduce-$(1): $(foreach p,$(PRESETS_$(1)),repro-run-$(p))
	$(PY) -m packedss.analysis $(RESULTS)/$(1) $(2) $(if $(call other_records_of,$(1)),--records $(call other_records_of,$(1))) $(ANALYSIS_FLAGS)
endef
$(foreach n,$(REPRO_TABLES),$(eval $(call repro_target_rules,table$(n),--tables $(n))))
$(foreach n,$(REPRO_FIGURES),$(eval $(call repro_target_rules,figure$(n),--figures $(n))))

plan-all: $(STAMP)
	$(PY) -m packedss.plan $(call plan_sweeps,$(ALL_PRESETS))

reproduce-all: $(foreach t,$(TARGETS),reproduce-$(t))
