"""Every code data set graded with its own reference solutions, given as fenced model outputs:
all of them pass; the same solutions with every function body replaced by `return None` all
fail, and so do empty outputs (a grader that passes anything would pass those).

`make test` grades a fixed part of each data set: every SUBSET_STRIDE-th task, and every task
that takes a grading path no task before it in the part took (`paths`: each module a program
imports, one path per module; a task's own set-up code, tolerance, not-None oracle or inputs that
JSON cannot hold, one path per task). `make test-references` (pytest's --all-references) grades
every task."""

import ast
from math import inf, nan
from types import SimpleNamespace

import pytest
from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS

from packedss.tasks import load_task, load_task_config
from packedss.tasks.code import _imported_modules, canonical_output

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


SUBSET_STRIDE = 8


def holds_non_json(value) -> bool:
    """Whether an input holds a tuple, set or complex number (MBPP+ rebuilds those from JSON per task)."""
    if isinstance(value, (tuple, set, frozenset, complex)):
        return True
    if isinstance(value, list):
        return any(map(holds_non_json, value))
    return isinstance(value, dict) and any(map(holds_non_json, value.values()))


def paths(q) -> set[tuple]:
    """The grading paths q takes that most tasks do not. A module the program imports (the sandbox
    loads it before it drops privileges) is one path whichever task imports it, and so is each of
    MBPP's test imports; MBPP's set-up code and MBPP+'s tolerance, not-None oracle and inputs that
    JSON cannot hold (which EvalPlus rebuilds task by task) are each task's own."""
    ref = q.reference
    program = ref.get("prompt", "") + canonical_output(q) + ref.get("ground_truth", "")
    taken = {("import", module) for module in _imported_modules(program)}
    taken |= {("test import", line) for line in ref.get("test_imports") or []}
    if ref.get("test_setup_code"):
        taken.add(("set-up code", id(q)))
    if ref.get("format") == "evalplus":
        inputs = [eval(ref[part], {"inf": inf, "nan": nan}) for part in ("base_input", "plus_input")]  # the loader's repr()
        if ref["atol"] or ref["entry_point"] in MBPP_OUTPUT_NOT_NONE_TASKS or holds_non_json(inputs):
            taken.add(("own check", id(q)))
    return taken


def graded_part(questions: list, everything: bool) -> list:
    if everything:
        return questions
    part, taken = [], set()
    for i, q in enumerate(questions):
        own = paths(q)
        if i % SUBSET_STRIDE == 0 or not own <= taken:
            part.append(q)
            taken |= own
    return part


def test_the_part_graded_by_default_takes_every_path_and_a_share_of_the_rest():
    def question(**reference):
        return SimpleNamespace(reference=reference, metadata={"canonical_solution": "def f(x):\n    return x\n"})

    plain = dict(format="evalplus", entry_point="f", ground_truth="def f(x):\n    return x\n", atol=0,
                 base_input="[[1]]", plus_input="[[2, 'a', inf]]")  # fmt: skip
    set_up = {"format": "asserts", "test_setup_code": "x = 1", "test_imports": [], "test_list": []}
    test_import = {"format": "asserts", "test_setup_code": "", "test_imports": ["import re"], "test_list": []}
    # (reference, graded): a module imported before is no new path; a task's own check always is
    special = [(plain | {"atol": 1e-6}, True), (plain | {"ground_truth": "import math\n"}, True),
               ({"prompt": "import math\n", "test": "", "entry_point": "f"}, False),
               (plain | {"plus_input": "[[(1, 2)]]"}, True), (plain | {"base_input": "[[[{1}]]]"}, True),
               (plain | {"plus_input": "[[(1+2j)]]"}, True),
               (plain | {"entry_point": sorted(MBPP_OUTPUT_NOT_NONE_TASKS)[0]}, True), (set_up, True),
               (plain, True),  # at a multiple of SUBSET_STRIDE
               (test_import, True), (plain | {"ground_truth": "import math\nimport heapq\n"}, True),
               (set_up, True), (plain | {"atol": 1e-6}, True),
               (plain | {"ground_truth": "from heapq import nlargest\n"}, False), (test_import, False),
               (plain, False)]  # fmt: skip
    questions = [question(**plain) for _ in range(2 * SUBSET_STRIDE)] + [question(**ref) for ref, _ in special]
    graded = [0, SUBSET_STRIDE] + [2 * SUBSET_STRIDE + k for k, (_, taken) in enumerate(special) if taken]
    position = {id(q): i for i, q in enumerate(questions)}
    assert [position[id(q)] for q in graded_part(questions, everything=False)] == graded
    assert graded_part(questions, everything=True) == questions


def test_return_none_copy():
    source = "import math\n\nclass P:\n    def f(self, x):\n        return x + 1\n\ng = lambda y: y * 2\n\ndef h(n):\n    def inner():\n        return n\n    return inner()\n"
    namespace = {}
    exec(return_none_copy(source), namespace)
    assert namespace["P"]().f(1) is None and namespace["g"](2) is None and namespace["h"](3) is None
    assert "math" in namespace


@pytest.mark.slow
@pytest.mark.parametrize("task_name, overrides, file_name, count", DATA_SETS, ids=["humaneval", "mbpp-plus", "mbpp-original"])
def test_reference_solutions_pass_and_stubs_fail(shared_data, h, request, task_name, overrides, file_name,
                                                  count):  # fmt: skip
    h.need(shared_data, file_name)
    # The task's own limits: a program the load stretches past its 10 s (MBPP+: the whole check's)
    # runs again alone on its CPU clock, and that verdict counts; EvalPlus's per-input limits are
    # 4x the reference's time measured in the same run, so they scale with the load (docs/sandbox.md §8)
    task = load_task(load_task_config(task_name, **overrides), str(shared_data))
    every = task.questions()
    assert len(every) == count
    qs = graded_part(every, request.config.getoption("all_references"))
    references = [(q, fenced(canonical_output(q))) for q in qs]
    stubs = [(q, fenced(return_none_copy(full_solution(task_name, q)))) for q in qs]
    grades = task.grade_many(references + stubs)
    reference_failures = [
        (q.question_id, g.details.get("status"), g.attempts, g.details.get("stderr_tail", "")[-300:])
        for (q, _), g in zip(references, grades[:len(qs)])
        if not g.correct
    ]
    assert reference_failures == []
    assert [q.question_id for (q, _), g in zip(stubs, grades[len(qs):]) if g.correct] == []
    for q in every:
        for empty in ("", "```python\n```\n"):
            grade = task.grade(q, empty)
            assert grade.correct is False and grade.details["status"] == "empty"
