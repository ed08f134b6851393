"""Row selection for the tables: which records a table reads (`subset`), how they are grouped
into rows in the paper's order (`groups`), and the key columns a row is labelled with.

The paper defines its tables per model family: Tables 3-7 and 11-13 (and Figures 3's left part,
4 and 5) for Nemotron, Tables 8-10 for SetDLM; the SDAR table (ours) reads the SDAR family. They
select records by family name, and take the family's schedules from the family table
(packedss.families)."""

from __future__ import annotations

import pandas as pd

from packedss.analysis.metrics import (
    block_label,
    model_label,
    order_rank,
    schedule_label,
    schedule_rank,
    task_label,
    task_rank,
)
from packedss.families import FAMILIES

NEMOTRON = "nemotron"
SETDLM = "setdlm"
SDAR = "sdar"


def family_schedules(family: str) -> tuple[str, ...]:
    return FAMILIES[family].schedules


def subset(pq: pd.DataFrame, family=None, temperature=None, lora=None, schedules=None, order=None) -> pd.DataFrame:
    """temperature: "zero" (T = 0) or "positive" (T > 0)."""
    mask = pd.Series(True, index=pq.index)
    if family is not None:
        mask &= pq["family"] == family
    if temperature == "zero":
        mask &= pq["temperature"] == 0
    elif temperature == "positive":
        mask &= pq["temperature"] > 0
    if lora is not None:
        mask &= pq["lora"] == lora
    if schedules is not None:
        mask &= pq["schedule"].isin(schedules)
    if order is not None:
        mask &= pq["order_group"] == order
    return pq[mask]


def varies(frame: pd.DataFrame, within: list[str], column: str) -> bool:
    if frame.empty:
        return False
    return bool((frame.groupby(within)[column].nunique() > 1).any())


def _sort_key(column: str, value):
    if column == "schedule":
        return schedule_rank(value)
    if column == "task":
        return task_rank(value)
    if column == "order_group":
        return order_rank(value)
    if column == "pad_verify":
        return ({"true": 0, "false": 1}.get(value, 2), value)
    return (0, value)


def groups(frame: pd.DataFrame, by: list[str]):
    """(values dict, rows) for each group, in the paper's order (tasks, schedules, widths); runs
    of different configs (load's `config`: dtype, output cap, ...) and, where any run decoded
    several responses together, of different concurrencies are always separate groups."""
    if frame.empty:
        return []
    if "config" not in by and varies(frame, by, "config"):
        by = [*by, "config"]
    if "max_ngram" not in by and varies(frame, by, "max_ngram"):
        by = [*by, "max_ngram"]  # pld runs of two n
    if "concurrency" not in by and (frame["concurrency"] != 1).any():
        by = [*by, "concurrency"]
    out = [(dict(zip(by, values if isinstance(values, tuple) else (values,), strict=True)), g) for values, g in frame.groupby(by, sort=False)]
    out.sort(key=lambda item: tuple(_sort_key(c, item[0][c]) for c in by))
    return out


ORDER_SECTIONS = {"ltr": "LTR verification and native decoding", "confidence": "Confidence-ordered verification"}


def labels(values: dict, family: str | None = None) -> dict:
    """Display labels of a group's key values; "B" needs the family (its block rule)."""
    out = {}
    if "model" in values:
        out["Model"] = model_label(values["model"])
    if "task" in values:
        out["Task"] = task_label(values["task"])
    if "schedule" in values:
        out["Method"] = schedule_label(values["schedule"])
    if "width" in values:
        family = values.get("family", family)
        out["B"] = block_label(family, values["width"]) if family is not None else ""
        out["Window"] = f"W={int(values['width'])}"
    if "temperature" in values:
        out["T"] = f"{values['temperature']:g}"
    if "verify" in values:
        out["Verify"] = values["verify"]
    if "pad_verify" in values:
        out["Padded"] = {"true": "yes", "false": "no"}.get(values["pad_verify"], "")
    if "order_group" in values:
        out["Order"] = ORDER_SECTIONS.get(values["order_group"], values["order_group"])
    if "concurrency" in values:
        out["C"] = str(int(values["concurrency"]))
    if "max_ngram" in values:
        out["n"] = str(int(values["max_ngram"])) if values["max_ngram"] else ""
    if "config" in values:
        out["Config"] = values["config"]
    return out


def key_labels(names: dict, keys: list[str]) -> dict:
    """The row's key columns of `labels`, and its C and Config where the group has them."""
    extra = {k: names[k] for k in ("C", "n", "Config") if names.get(k) and k not in keys}
    return {k: names[k] for k in keys} | extra


LABEL_OF = {"width": "B", "temperature": "T", "verify": "Verify", "pad_verify": "Padded", "config": "Config", "concurrency": "C",
            "max_ngram": "n"}


def optional_keys(frame: pd.DataFrame, within: list[str], positive: bool) -> list[str]:
    """Columns added only when they tell rows apart (several widths per schedule, several
    temperatures or verification rules, both Packed-SS paddings, several configs: dtype, output
    cap, compile mode, ...), and the config wherever it names a cost twin."""
    extra = []
    if varies(frame, within, "width"):
        extra.append("width")
    if positive and varies(frame, within, "temperature"):
        extra.append("temperature")
    if positive and varies(frame, within, "verify"):
        extra.append("verify")
    if varies(frame, within, "pad_verify"):
        extra.append("pad_verify")
    if varies(frame, within, "config") or frame["config"].str.contains("cost_model=").any():
        extra.append("config")  # a cost twin's time is named even when every run has it
    return extra


def speed_only_tasks(frame: pd.DataFrame) -> list[str]:
    """The tasks (labels) whose records carry no score (WritingBench)."""
    if frame.empty:
        return []
    return sorted({task_label(t) for t, g in frame.groupby("task") if g["correct_f"].isna().all()})


def speed_only_note(frame: pd.DataFrame) -> list[str]:
    speed = speed_only_tasks(frame)
    return [f"{', '.join(speed)}: speed only (no accuracy)."] if speed else []
