"""Numeric (gsm8k/arith) and math-verify (math500) graders."""

import pytest

from packedss.tasks import Question, load_task_config
from packedss.tasks.answers import extract_number, gold_number, grade_math, grade_numeric


CFG = load_task_config("gsm8k")
Q = Question("gsm8k/x", "q", "18", {})


@pytest.mark.parametrize(
    "output, expected, correct",
    [
        ("She makes 9 * 2 = $<<9*2=18>>18.\n#### 18", "18", True),  # right
        ("#### 17", "17", False),  # wrong
        ("The answer is $18.", "18", True),  # last number, $ and trailing . removed
        ("#### 18.00", "18", True),  # numeric comparison
        ("#### 1,000", "1000", False),  # commas removed
        ("", None, False),  # empty
        ("#### \n\nno digits at all ###", None, False),  # malformed
        ("Réponse : 18 œufs 🥚", "18", True),  # unicode
        ("#### −18", "-18", False),  # unicode minus
        ("The answer is 18 but 3 eggs are left", "3", False),  # right number in the wrong place
        ("18 eggs are sold.\n#### 18\nQuestion: 5 more", "18", True),  # marker wins over last number
    ],
)
def test_numeric_hand_written(output, expected, correct):
    g = grade_numeric(CFG, Q, output)
    assert g.extracted_answer == expected
    assert g.correct is correct


def test_numeric_huge_output_is_fast():
    import time

    t = time.monotonic()
    g = grade_numeric(CFG, Q, "blah 7 " * 2_000_000 + "#### 18")
    assert time.monotonic() - t < 5
    # the marker is past the scanned head, so the last number (18) decides
    assert g.correct is True
    g = grade_numeric(CFG, Q, "x" * 10_000_000)
    assert g.extracted_answer is None and g.correct is False


def test_gold_number():
    assert gold_number("a\nb <<2*3=6>>6\n#### 6") == "6"
    assert gold_number("#### 1,234") == "1234"
    with pytest.raises(ValueError):
        gold_number("no marker and no number")


def test_extract_number_rules():
    assert extract_number("#### 42")[1] == "marker"
    assert extract_number("it is 42")[1] == "last_number"
    assert extract_number("nothing") == (None, "none")


MQ = Question("math500/x", "q", "\\frac{1}{2}", {})
MCFG = load_task_config("math500")


@pytest.mark.parametrize(
    "output, correct",
    [
        ("So the answer is $\\boxed{\\frac{1}{2}}$.", True),
        ("The answer is $\\boxed{0.5}$", True),
        ("$\\boxed{\\frac{1}{3}}$", False),
        ("", False),
        ("\\boxed{", False),
        ("答案是 $\\boxed{\\dfrac{1}{2}}$ ✓", True),
        ("\\boxed{7} " * 20000 + "$\\boxed{\\frac12}$", None),  # huge: must not crash
    ],
)
def test_math_hand_written(output, correct):
    g = grade_math(MCFG, MQ, output)
    if correct is None:
        assert g.correct in (True, False)
    else:
        assert g.correct is correct


def test_gsm8k_gold_against_itself(task_from_shared, shared_data, h):
    h.need(shared_data, "gsm8k_test.jsonl")
    task = task_from_shared("gsm8k")
    qs = task.questions()
    assert len(qs) == 1319
    grades = task.grade_many([(q, q.metadata["solution"]) for q in qs])
    assert all(g.correct for g in grades)
    # the right number in the wrong place: without "####" the LAST number decides
    q = qs[0]  # gold 18
    assert task.grade(q, f"She makes {q.reference} dollars from 9 eggs.").correct is False
    assert task.grade(q, f"From 9 eggs she makes {q.reference} dollars.").correct is True


def test_math500_gold_against_itself(task_from_shared, shared_data, h):
    h.need(shared_data, "math500_test.jsonl")
    task = task_from_shared("math500")
    qs = task.questions()
    assert len(qs) == 500
    bad = [q.question_id for q in qs if not task.grade(q, "The final answer is $\\boxed{" + q.reference + "}$.").correct]
    assert bad == []
    # and the reference solutions themselves (they end in \boxed{...})
    wrong = task.grade(qs[0], "$\\boxed{42}$")
    assert wrong.correct is False


def test_writingbench_is_speed_only():
    from packedss.tasks.answers import grade_none

    g = grade_none(load_task_config("writingbench"), Question("writingbench/1", "q", None), "any text")
    assert g.correct is None and g.extracted_answer is None
    assert g.record_fields("none")["correct"] is None


@pytest.mark.parametrize(
    "text,expected",
    [
        ("so the total is \\boxed{1,234}. Then 5 more", ("1234", "boxed")),
        ("#### 7\nand finally \\boxed{$12}", ("12", "boxed")),
        ("\\boxed{x{y}} then #### 9", ("9", "marker")),  # a boxed answer without a number is skipped
        ("the answer is 4 and \\boxed{5", ("5", "last_number")),  # unclosed box: last number
    ],
)
def test_boxed_answer_first_then_marker_then_last_number(text, expected):
    assert extract_number(text) == expected
