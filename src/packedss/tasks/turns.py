"""Multi-turn questions (docs/data.md, Spec-Bench): a later turn is its own question, whose prompt
holds the conversation so far, the model's own answers included. Its metadata names the turns
before it (`earlier_ids`, `earlier_texts`); the runner decodes it only once every earlier turn is
recorded (`ready_turns`), and its prompt is built from their recorded answers
(`earlier_turns`), so resume and concurrency need no other ordering."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from packedss.errors import PackedSSError
from packedss.tasks.core import Question, TaskConfig

EARLIER_IDS = "earlier_ids"  # question ids of the turns before this one, in order
EARLIER_TEXTS = "earlier_texts"  # their user messages
EARLIER_TURNS = "earlier_turns"  # [(user message, the model's answer), ...], set once answered


def follows_earlier_turns(question: Question) -> bool:
    return bool(question.metadata.get(EARLIER_IDS))


def ready_turns(questions: list[Question], answers: Callable[[], Mapping[str, str]],
                samples: int) -> tuple[list[Question], list[Question]]:  # fmt: skip
    """(the questions to decode now, those left for later): a later turn is ready once every
    earlier turn's answer is recorded, and then carries them (EARLIER_TURNS). `answers` is read
    only when some question follows earlier turns: question id -> its recorded output text."""
    if not any(map(follows_earlier_turns, questions)):
        return questions, []
    if samples > 1:
        raise PackedSSError(
            f"samples={samples}: a later turn's prompt holds the first sample's answer to the turn before it; "
            "run multi-turn tasks with samples=1"
        )
    known = answers()
    ready, waiting = [], []
    for question in questions:
        ids = question.metadata.get(EARLIER_IDS) or []
        if all(i in known for i in ids):
            ready.append(answered(question, [known[i] for i in ids]) if ids else question)
        else:
            waiting.append(question)
    return ready, waiting


def answered(question: Question, answers: list[str]) -> Question:
    """The question with its earlier turns' messages and answers."""
    turns = [list(pair) for pair in zip(question.metadata[EARLIER_TEXTS], answers)]
    return dataclasses.replace(question, metadata={**question.metadata, EARLIER_TURNS: turns})


def conversation_prompt(cfg: TaskConfig, question: Question, tokenizer=None, chat: bool = False) -> str:
    """The prompt of a later turn: every earlier turn with the model's answer, then this one.
    Chat: the messages through the model's chat template. Plain: each earlier prompt followed by
    its answer exactly as the model continued it, a newline, then this turn's prompt."""
    turns = question.metadata.get(EARLIER_TURNS)
    if turns is None:
        raise PackedSSError(f"task {cfg.name}: question {question.question_id} needs its earlier turns' answers")
    if not chat:
        plain = "".join(cfg.prompt_plain.replace("{question}", user) + answer + "\n" for user, answer in turns)
        return plain + cfg.prompt_plain.replace("{question}", question.text)
    if tokenizer is None:
        raise PackedSSError(f"task {cfg.name}: chat=True needs a tokenizer with a chat template")
    messages = []
    for user, answer in turns:
        messages += [{"role": "user", "content": cfg.prompt_chat.replace("{question}", user)},
                     {"role": "assistant", "content": answer}]  # fmt: skip
    messages.append({"role": "user", "content": cfg.prompt_chat.replace("{question}", question.text)})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
