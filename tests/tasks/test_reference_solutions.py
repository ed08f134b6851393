"""Every code data set graded with its own reference solutions, given as fenced model outputs:
all of them pass; the same solutions with every function body replaced by `return None` all
fail, and so do empty outputs (a grader that passes anything would pass those)."""

import ast

import pytest

from packedss.tasks import load_task, load_task_config
from packedss.tasks import code
from packedss.tasks.code import canonical_output

DATA_SETS = [
    # (task, config overrides, file in ../shared/data, number of tasks)
    ("humaneval", {}, "HumanEval.jsonl.gz", 164),
    ("mbpp", {"variant": "plus"}, "MbppPlus.jsonl.gz", 378),
    ("mbpp", {"variant": "original"}, "mbpp.jsonl", 500),
]


class _ReturnNone(ast.NodeTransformer):
    def visit_FunctionDef(self, node):
        node.body = [ast.Return(ast.Constant(None))]
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        node.body = ast.Constant(None)
        return node


def return_none_copy(source: str) -> str:
    """``source`` with the body of every function (methods and lambdas too) replaced by
    ``return None``; imports, classes and module-level code stay."""
    tree = _ReturnNone().visit(ast.parse(source))
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def fenced(code: str) -> str:
    return f"Here is the solution:\n```python\n{code}\n```\n"


def full_solution(task_name: str, q) -> str:
    """The whole reference program: HumanEval's canonical solution is the body of the prompt's stub."""
    solution = canonical_output(q)
    return q.reference["prompt"] + solution if task_name == "humaneval" else solution


def test_return_none_copy():
    source = "import math\n\nclass P:\n    def f(self, x):\n        return x + 1\n\ng = lambda y: y * 2\n\ndef h(n):\n    def inner():\n        return n\n    return inner()\n"
    namespace = {}
    exec(return_none_copy(source), namespace)
    assert namespace["P"]().f(1) is None and namespace["g"](2) is None and namespace["h"](3) is None
    assert "math" in namespace


@pytest.mark.slow
@pytest.mark.parametrize("task_name, overrides, file_name, count", DATA_SETS, ids=["humaneval", "mbpp-plus", "mbpp-original"])
def test_reference_solutions_pass_and_stubs_fail(shared_data, h, monkeypatch, task_name, overrides, file_name, count):
    h.need(shared_data, file_name)
    # this test is about inputs and outputs: on a loaded machine a reference solution's time
    # may exceed EvalPlus's per-input limit (4 x its own time, at least 1 s) by chance
    monkeypatch.setattr(code, "EVALPLUS_MIN_TIME_LIMIT_S", 20.0)
    task = load_task(load_task_config(task_name, **overrides), str(shared_data))
    qs = task.questions()
    assert len(qs) == count
    references = [(q, fenced(canonical_output(q))) for q in qs]
    stubs = [(q, fenced(return_none_copy(full_solution(task_name, q)))) for q in qs]
    grades = task.grade_many(references + stubs)
    reference_failures = [
        (q.question_id, g.details.get("status"), g.details.get("stderr_tail", "")[-300:])
        for (q, _), g in zip(references, grades[:count])
        if not g.correct
    ]
    assert reference_failures == []
    assert [q.question_id for (q, _), g in zip(stubs, grades[count:]) if g.correct] == []
    for q in qs:
        for empty in ("", "```python\n```\n"):
            grade = task.grade(q, empty)
            assert grade.correct is False and grade.details["status"] == "empty"
