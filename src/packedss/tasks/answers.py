"""Answer graders for gsm8k/arith (final number) and math500 (math-verify)."""

from __future__ import annotations

import re
import threading
from fractions import Fraction
from typing import Optional

from packedss.tasks.core import Grade, Question, TaskConfig

# A number: optional sign and "$", digits with thousands commas or plain digits, optional
# decimals. A trailing "." (end of sentence) is never part of it.
_NUMBER = re.compile(r"(?<![\w.])([-\u2212]?)\s?\$?\s?((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?!\d)")
#: the answer line's marker in GSM8K-style solutions.
MARKER = "####"
#: outputs longer than this are graded on their first and last parts only (numbers only).
_MAX_SCAN = 200_000


def normalize_number(sign: str, digits: str) -> str:
    s = digits.replace(",", "").replace("$", "")
    if s.startswith("."):
        s = "0" + s
    if "." in s:
        s = s.rstrip("0").rstrip(".") or "0"
    s = s.lstrip("0") or "0" if not s.startswith("0.") else s
    neg = sign in ("-", "\u2212") and s.strip("0.") != ""
    return ("-" if neg else "") + s


def _numbers(text: str) -> list[str]:
    return [normalize_number(m.group(1), m.group(2)) for m in _NUMBER.finditer(text)]


def last_boxed(text: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}`` (nested braces matched), or None."""
    start = text.rfind("\\boxed{")
    while start != -1:
        depth, position = 0, start + len("\\boxed")
        for position in range(position, len(text)):
            depth += {"{": 1, "}": -1}.get(text[position], 0)
            if depth == 0:
                return text[start + len("\\boxed{") : position]
        start = text.rfind("\\boxed{", 0, start)  # unclosed: try the one before
    return None


def extract_number(text: str) -> tuple[Optional[str], str]:
    """(number, rule): the first number inside the last ``\\boxed{}``; else the first number on
    a line after ``####``; else the last number in the text; (None, "none") when there is no
    number at all. (The released evaluations of both model families ask for a boxed answer.)"""
    if len(text) > _MAX_SCAN:  # huge outputs: the marker search and the last number stay linear
        head, tail = text[:_MAX_SCAN], text[-_MAX_SCAN:]
    else:
        head = tail = text
    boxed = last_boxed(tail)
    if boxed is not None and _numbers(boxed):
        return _numbers(boxed)[0], "boxed"
    start = head.find(MARKER)
    while start != -1:
        line = head[start + len(MARKER) :].split("\n", 1)[0]
        nums = _numbers(line[:200])
        if nums:
            return nums[0], "marker"
        start = head.find(MARKER, start + len(MARKER))
    nums = _numbers(tail)
    if nums:
        return nums[-1], "last_number"
    return None, "none"


def gold_number(solution: str) -> str:
    """The gold number of a GSM8K-style solution (text after the last ``####``)."""
    tail = solution.rsplit(MARKER, 1)[-1]
    nums = _numbers(tail)
    if not nums:
        raise ValueError(f"no number after {MARKER!r} in gold solution {solution[-80:]!r}")
    return nums[0]


def same_number(a: str, b: str) -> bool:
    try:
        return Fraction(a) == Fraction(b)
    except (ValueError, ZeroDivisionError):
        return False


def grade_numeric(cfg: TaskConfig, q: Question, output: str) -> Grade:
    got, rule = extract_number(output)
    gold = str(q.reference)
    return Grade(
        extracted_answer=got,
        correct=bool(got is not None and same_number(got, gold)),
        details={"rule": rule, "gold": gold},
    )


def _math_timeout() -> Optional[int]:
    # math-verify times out with SIGALRM, which only works on the main thread.
    return 5 if threading.current_thread() is threading.main_thread() else None


def parse_gold(gold: str):
    from math_verify import parse

    t = _math_timeout()
    parsed = parse("$" + gold + "$", parsing_timeout=t)
    if not parsed:
        parsed = parse("\\boxed{" + gold + "}", parsing_timeout=t)
    return parsed


def grade_math(cfg: TaskConfig, q: Question, output: str) -> Grade:
    """math-verify: ``verify(parse(gold), parse(output))``, gold first."""
    from math_verify import parse, verify

    t = _math_timeout()
    gold = parse_gold(str(q.reference))
    pred = parse(output, parsing_timeout=t) if output.strip() else []
    extracted = str(pred[-1]) if pred else None
    ok = bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=t))
    return Grade(
        extracted_answer=extracted,
        correct=ok,
        details={"gold": str(q.reference), "gold_parsed": bool(gold)},
    )


def grade_none(cfg: TaskConfig, q: Question, output: str) -> Grade:
    """Speed-only tasks (writingbench): nothing to score."""
    return Grade(extracted_answer=None, correct=None, details={"rule": "speed_only"})
