"""The paper's appendix tables 2-13, the SDAR table (`sdar`, ours) and Spec-Bench's leaderboard (`specbench`): which function makes each,
what records it reads, and the experiment preset that produces them. The table model is
`table.py`, the row selection `select.py`, the definitions `measured_tables.py` (runs, 2-9) and
`paired_tables.py` (10-13, sdar)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from packedss.analysis import concurrency
from packedss.analysis.measured_tables import table2, table3, table4, table5, table6, table7, table8, table9
from packedss.analysis.paired_tables import sdar_table, table10, table11, table12, table13
from packedss.analysis.specbench import specbench_table
from packedss.analysis.table import Table


@dataclass(frozen=True)
class TableSpec:
    function: Callable[..., Table]
    needs: str  # the record subset the table reads
    experiment: str  # the run.py experiment preset that produces it


# `--tables acceptance`: the tables acceptance and latency and each run's acceptance_profile.json.
ACCEPTANCE = "acceptance"
# `--tables concurrency`: the tables concurrency and crossover (packedss.analysis.concurrency).
CONCURRENCY = concurrency.CONCURRENCY

# Keyed by the paper's number, or by the name of a table of our own (`--tables sdar`).
TABLES: dict[int | str, TableSpec] = {
    2: TableSpec(table2, "any family (rows_evaluated per call, iterations), every schedule and W", "table2"),
    3: TableSpec(table3, "nemotron, T=0, lora=false, several widths", "table3"),
    4: TableSpec(table4, "nemotron, T=0, lora=true", "table4"),
    5: TableSpec(table5, "nemotron, T=0, lora=true and lora=false", "table5"),
    6: TableSpec(table6, "nemotron, T=0, lora=false", "table6"),
    7: TableSpec(table7, "nemotron, T>0 (K samples per question), lora=false", "table7"),
    8: TableSpec(table8, "setdlm, T=0, LTR order + native", "table8"),
    9: TableSpec(table9, "setdlm, T=0, LTR and confidence orders + native", "table9"),
    10: TableSpec(table10, "setdlm, T=0: packed with linear and quadratic", "table10"),
    11: TableSpec(table11, "nemotron, T=0 and T>0, scored tasks: packed, linear, quadratic", "table11"),
    12: TableSpec(table12, "nemotron, T=0: packed with linear and quadratic", "table12"),
    13: TableSpec(table13, "nemotron, T>0: packed with linear and quadratic", "table13"),
    "sdar": TableSpec(sdar_table, "sdar, lora=false: every schedule, each against AR of its model and task", "sdar"),
    "specbench": TableSpec(specbench_table, "task=specbench, lora=false: every schedule against AR of its model", "specbench"),
}
