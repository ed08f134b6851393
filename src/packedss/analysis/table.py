"""The table model: a `Table` holds a numeric frame for CSV (CI columns split into estimate / low /
high) and a formatted frame for Markdown and LaTeX, with notes and bold cells; `build` assembles
one from row dicts, optionally beside the paper's published rows (`paper_numbers`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from packedss.analysis import paper_numbers
from packedss.analysis.bootstrap import CI

PAPER = "(paper)"


@dataclass(frozen=True)
class Col:
    """A value column: `kind` is "num" (a float), "ci" (a CI or (estimate, low, high)) or "text"."""

    name: str
    kind: str = "num"
    digits: int = 2
    signed: bool = False
    suffix: str = ""

    @property
    def header(self) -> str:
        return f"{self.name} [95% CI]" if self.kind == "ci" else self.name


# The absolute measurements of Tables 6-9, the per-run summary and the SDAR table.
ABS_COLS = [
    Col("Tokens/s", digits=2),
    Col("Tokens/NFE", digits=3),
    Col("Time/NFE (ms)", digits=3),
    Col("Accuracy (%)", digits=2),
    Col("Tokens", digits=1),
    Col("Wall (s)", digits=3),
    Col("NFE", digits=2),
]
ABS_NOTE = "Tokens, wall time and NFE are means per response; rates use aggregate totals (pooled, the paper's averaging)."


@dataclass
class Table:
    key: int | str  # the paper's table number, or the name of a table of our own ("runs")
    title: str
    data: pd.DataFrame  # CSV
    display: pd.DataFrame  # Markdown / LaTeX (strings)
    notes: list[str] = field(default_factory=list)
    bold: set[tuple[int, str]] = field(default_factory=set)  # (row, display column)
    measured: bool = True  # False: no row of the records (the paper's rows at most)

    @property
    def stem(self) -> str:
        """The file name without suffix (and the LaTeX label): "table6", "runs"."""
        return f"table{self.key}" if isinstance(self.key, int) else str(self.key)


def _fmt(value, col: Col) -> str:
    if col.kind == "text":
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)
    if col.kind == "ci":
        if value is None:
            return "-"
        ci = value if isinstance(value, CI) else CI(*value, n=0, method="paper")
        return ci.format(col.digits, col.signed)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(float(value), f"{'+' if col.signed else ''}.{col.digits}f") + col.suffix


def _ci_parts(value) -> tuple[float, float, float]:
    if value is None:
        return (math.nan, math.nan, math.nan)
    if isinstance(value, CI):
        return (value.estimate, value.low, value.high)
    return tuple(float(v) for v in value)


def _beside_paper(key, rows: list[dict], keys: list[str], value_names: list[str]) -> tuple[list[str], list[dict]]:
    """The paper's value columns this table has, and the rows with the paper's values merged in
    (matched on the key columns both have; unmatched paper rows appended)."""
    paper_rows = paper_numbers.PAPER_TABLES.get(key, [])
    if not paper_rows:
        return [], rows
    join = [k for k in keys if all(k in p for p in paper_rows)]
    paper_cols = [c for c in value_names if any(c in p for p in paper_rows)]
    matched: set[int] = set()
    for row in rows:
        for index, p in enumerate(paper_rows):
            if index not in matched and all(str(row.get(k)) == str(p.get(k)) for k in join):
                matched.add(index)
                row.update({f"{c} {PAPER}": p.get(c) for c in paper_cols})
                break
    for index, p in enumerate(paper_rows):
        if index not in matched:
            row = {k: p.get(k, "") for k in keys} | {f"{c} {PAPER}": p.get(c) for c in paper_cols} | {"_measured": False}
            # after the last row of its group (the first key: model, temperature half), else at the end
            same = [i for i, r in enumerate(rows) if keys and str(r.get(keys[0])) == str(row[keys[0]])]
            rows.insert(same[-1] + 1 if same else len(rows), row)
    return paper_cols, rows


def _bold_highest_throughput(rows: list[dict], bold_within: list[str]) -> set[tuple[int, str]]:
    best: dict[tuple, tuple[float, int]] = {}
    for index, row in enumerate(rows):
        value = row.get("Tokens/s")
        if not row["_measured"] or value is None or not np.isfinite(value):
            continue
        group = tuple(str(row.get(k)) for k in bold_within)
        if group not in best or value > best[group][0]:
            best[group] = (value, index)
    return {(index, "Tokens/s") for _, index in best.values()}


def build(
    key: int | str,
    title: str,
    rows: list[dict],
    keys: list[str],
    values: list[Col],
    compare_paper: bool = False,
    bold_within: list[str] | None = None,
    notes: list[str] | None = None,
) -> Table:
    """Assemble a table from row dicts (key columns + value columns), optionally beside the
    paper's rows. `bold_within`: the key columns within which the highest Tokens/s is bold."""
    notes = list(notes or [])
    if "C" not in keys and any(str(r.get("C", "1")) != "1" for r in rows):
        at = keys.index("Config") if "Config" in keys else len(keys)
        keys = [*keys[:at], "C", *keys[at:]]
        notes.append("C: the concurrency, responses decoded together (every call carrying each one's rows); each C is its own row.")
    if "n" not in keys and any(r.get("n") for r in rows):
        at = keys.index("Config") if "Config" in keys else len(keys)
        keys = [*keys[:at], "n", *keys[at:]]
        notes.append("n: PLD's longest n-gram looked up (schedule.max_ngram), where runs of two n sit in one folder; each n is its own row.")
    if "Config" not in keys and any(r.get("Config") for r in rows):
        keys = [*keys, "Config"]
        notes.append("Config: the identity fields in which runs of otherwise equal settings differ; each is its own row.")
    if any("cost_model=" in str(r.get("Config", "")) and "cost_model=null" not in str(r.get("Config")) for r in rows):
        notes.append("cost_model: the times are those of a cost twin (shape:layers:dtype:device) that ran every call; "
                     "the model named decided the tokens.")
    rows = [dict(r, _measured=True) for r in rows]
    value_names = [c.name for c in values]
    paper_cols: list[str] = []
    if compare_paper:
        paper_cols, rows = _beside_paper(key, rows, keys, value_names)
        if paper_cols:
            notes.append("Columns marked (paper) hold the paper's published numbers; '-' where it has none.")
    columns: list[Col] = []
    for col in values:
        columns.append(col)
        if col.name in paper_cols:
            columns.append(Col(f"{col.name} {PAPER}", col.kind, col.digits, col.signed, col.suffix))
    data_records, display_records = [], []
    for row in rows:
        data_row = {k: row.get(k, "") for k in keys}
        display_row = {k: "" if row.get(k) is None else str(row.get(k, "")) for k in keys}
        for col in columns:
            value = row.get(col.name)
            if col.kind == "ci":
                estimate, low, high = _ci_parts(value)
                data_row[col.name] = estimate
                data_row[f"{col.name} CI low"] = low
                data_row[f"{col.name} CI high"] = high
            else:
                data_row[col.name] = value
            display_row[col.header] = _fmt(value, col)
        data_records.append(data_row)
        display_records.append(display_row)
    data_columns = list(keys)
    for col in columns:
        data_columns += [col.name, f"{col.name} CI low", f"{col.name} CI high"] if col.kind == "ci" else [col.name]
    data = pd.DataFrame(data_records, columns=data_columns)
    display = pd.DataFrame(display_records, columns=list(keys) + [c.header for c in columns])
    bold = _bold_highest_throughput(rows, bold_within) if bold_within is not None and "Tokens/s" in value_names else set()
    measured = any(r["_measured"] for r in rows)
    if not measured:
        notes.insert(0, "No records for this table in the results folder.")
    return Table(key, title, data, display, notes, bold, measured)
