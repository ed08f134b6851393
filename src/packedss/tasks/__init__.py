"""Tasks: data sets, prompts and graders (docs/data.md).

    from packedss.tasks import load_task, load_task_config
    task = load_task(load_task_config("gsm8k"), data_dir="../shared/data")
    q = task.questions(limit=5)[0]
    prompt = task.build_prompt(q)              # plain template; chat=True + tokenizer for instruct models
    grade = task.grade(q, output_text)         # Grade(extracted_answer, correct, details)
"""

from __future__ import annotations

from typing import Optional

from packedss.errors import PackedSSError
from packedss.tasks.answers import grade_math, grade_none, grade_numeric
from packedss.tasks.code import grade_humaneval, grade_mbpp
from packedss.tasks.core import (
    CONF_DIR,
    TASK_NAMES,
    DataUnavailable,
    Grade,
    Question,
    Task,
    TaskConfig,
    build_prompt,
    config_from_dict,
    load_task_config,
    usable_cpus,
)
from packedss.tasks.data import LOADERS

#: grader name (TaskConfig.grader) -> (function, runs code in the sandbox)
GRADERS = {
    "numeric": (grade_numeric, False),
    "math": (grade_math, False),
    "humaneval": (grade_humaneval, True),
    "mbpp": (grade_mbpp, True),
    "none": (grade_none, False),
}


def load_task(cfg: TaskConfig, data_dir: Optional[str] = None) -> Task:
    """Load a task's questions; raises DataUnavailable (one clear message) when the data
    set cannot be read. ``cfg`` may also be a dict or an OmegaConf node (Hydra ``cfg.task``)."""
    if not isinstance(cfg, TaskConfig):
        cfg = config_from_dict(cfg)
    if cfg.name not in LOADERS:
        raise PackedSSError(f"unknown task {cfg.name!r}; valid tasks: {', '.join(TASK_NAMES)}")
    if cfg.grader not in GRADERS:
        raise PackedSSError(f"task {cfg.name}: unknown grader {cfg.grader!r}; valid graders: {', '.join(GRADERS)}")
    data_dir = None if data_dir in (None, "") else str(data_dir)
    questions = LOADERS[cfg.name](cfg, data_dir)
    ids = [q.question_id for q in questions]
    if len(set(ids)) != len(ids):
        raise PackedSSError(f"task {cfg.name}: duplicate question ids in the data set")
    fn, parallel = GRADERS[cfg.grader]
    return Task(cfg=cfg, _questions=questions, _grader=fn, parallel=parallel)


__all__ = [
    "CONF_DIR",
    "DataUnavailable",
    "GRADERS",
    "Grade",
    "PackedSSError",
    "Question",
    "TASK_NAMES",
    "Task",
    "TaskConfig",
    "build_prompt",
    "config_from_dict",
    "load_task",
    "load_task_config",
    "usable_cpus",
]
