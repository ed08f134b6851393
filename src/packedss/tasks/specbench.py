"""Spec-Bench (hemingkx/Spec-Bench `data/spec_bench/question.jsonl`, commit fd2c1cd; docs/data.md):
480 questions in 13 categories, speed only. Each turn is a question: `specbench/<question_id>/<turn>`;
a second turn follows its first (packedss.tasks.turns). `per_category` selects the first n questions of
every category (0: all)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

from packedss.paths import PROJECT_ROOT
from packedss.tasks.core import DataUnavailable, Question, TaskConfig
from packedss.tasks.turns import EARLIER_IDS, EARLIER_TEXTS

FILE = "spec_bench_question.jsonl"
SHA256 = "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"
# Without data_dir the pinned file is read from the benchmark data directory beside the project.
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
CATEGORIES = MT_BENCH + ("translation", "summarization", "qa", "math_reasoning", "rag")
FIELDS = ("question_id", "category", "turns")
# Spec-Bench's questions per category and their turns (the pinned file; the plan counts with them).
SIZES = {category: (10, 2) for category in MT_BENCH} | {category: (80, 1) for category in CATEGORIES[8:]}


def response_count(n: int = 0) -> int:
    """Responses of `n` questions of every category (0: all 480 questions, 560 responses)."""
    return sum((min(n, size) if n else size) * turns for size, turns in SIZES.values())


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rows(cfg: TaskConfig, data_dir: Optional[str]) -> list[dict]:
    from packedss.tasks.data import _local

    name = cfg.local_file or FILE
    rows = _local(cfg, data_dir, "Spec-Bench question.jsonl", [name], FIELDS)
    if rows is not None:
        return rows
    path = SHARED_DATA / name
    if not path.is_file():
        raise DataUnavailable(f"task {cfg.name}: Spec-Bench's {name} is not in {SHARED_DATA}", expected=FILE)
    if sha256_of(path) != SHA256:
        raise DataUnavailable(f"task {cfg.name}: {path} is not Spec-Bench's question.jsonl of commit fd2c1cd "
                              f"(sha256 {SHA256})", expected=FILE)  # fmt: skip
    return _local(cfg, str(SHARED_DATA), "Spec-Bench question.jsonl", [name], FIELDS)


def _checked(cfg: TaskConfig, row: dict, number: int) -> list[str]:
    turns = row["turns"]
    if row["category"] not in CATEGORIES:
        raise DataUnavailable(f"task {cfg.name}: row {number} has category {row['category']!r}; "
                              f"Spec-Bench's are {', '.join(CATEGORIES)}", "fix the file (docs/data.md)")  # fmt: skip
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise DataUnavailable(f"task {cfg.name}: row {number}'s turns is not a list of strings",
                              "fix the file (docs/data.md)")  # fmt: skip
    return turns


def load_specbench(cfg: TaskConfig, data_dir: Optional[str]) -> list[Question]:
    rows = sorted(_rows(cfg, data_dir), key=lambda row: int(row["question_id"]))
    taken: dict[str, int] = {}
    questions = []
    for number, row in enumerate(rows, start=1):
        turns, category = _checked(cfg, row, number), row["category"]
        taken[category] = taken.get(category, 0) + 1
        if cfg.per_category and taken[category] > cfg.per_category:
            continue
        ids = [f"specbench/{int(row['question_id'])}/{turn}" for turn in range(1, len(turns) + 1)]
        for k, text in enumerate(turns):
            metadata = {"category": category, "turn": k + 1, "record_fields": {"category": category, "turn": k + 1},
                        EARLIER_IDS: ids[:k], EARLIER_TEXTS: turns[:k]}  # fmt: skip
            questions.append(Question(question_id=ids[k], text=text, reference=None, metadata=metadata))
    return questions
