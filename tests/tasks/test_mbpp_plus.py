"""MBPP+ in EvalPlus's release format: EvalPlus's input deserialization, its output comparison
(float tolerance, special oracles) and its per-input time limits decide the grade."""

import gzip
import json
import sys

import pytest

from packedss.tasks import DataUnavailable, load_task, load_task_config
from packedss.tasks.code import mbpp_program
from packedss.tasks.sandbox import _preload


def release_task(tmp_path, task_id, entry_point, canonical, base_input, plus_input, atol=0):
    row = {
        "task_id": task_id, "prompt": f'"""\nSolve it.\nassert {entry_point} is not None\n"""\n',
        "entry_point": entry_point, "canonical_solution": canonical, "base_input": base_input,
        "plus_input": plus_input, "atol": atol, "contract": "", "assertion": "",
    }  # fmt: skip
    with gzip.open(tmp_path / "MbppPlus.jsonl.gz", "wt") as fh:
        fh.write(json.dumps(row) + "\n")
    task = load_task(load_task_config("mbpp"), str(tmp_path))
    (q,) = task.questions()
    return task, q


def test_inputs_are_deserialized_as_evalplus_does(tmp_path):
    # Mbpp/106's second argument is a tuple in EvalPlus (JSON holds it as a list)
    canonical = "def add_lists(test_list, test_tup):\n    return test_tup + tuple(test_list)\n"
    task, q = release_task(tmp_path, "Mbpp/106", "add_lists", canonical, [[[5, 6], [9, 10]]], [[[1], [2, 3]]])
    assert q.reference["base_input"] == "[[[5, 6], (9, 10)]]"
    assert task.grade(q, canonical).correct is True
    tuples_only = "def add_lists(l, t):\n    assert isinstance(t, tuple)\n    return t + tuple(l)\n"
    assert task.grade(q, tuples_only).correct is True
    assert task.grade(q, "def add_lists(l, t):\n    return list(t) + l\n").correct is False


def test_float_outputs_within_evalplus_tolerance(tmp_path):
    task, q = release_task(tmp_path, "Mbpp/900", "third", "def third(x):\n    return x / 3\n", [[1.0], [2]], [[1e6]])
    assert task.grade(q, "def third(x):\n    return x / 3 + 1e-9\n").correct is True  # atol 0: EvalPlus uses 1e-6
    assert task.grade(q, "def third(x):\n    return x / 3 + 1e-3\n").correct is False
    assert task.grade(q, "def third(x):\n    return round(x / 3, 2)\n").correct is False


def test_evalplus_special_oracle_compares_as_sets(tmp_path):
    # similar_elements is one of EvalPlus's MBPP_OUTPUT_SET_EQ_TASKS: any order passes
    canonical = "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))\n"
    task, q = release_task(tmp_path, "Mbpp/2", "similar_elements", canonical, [[[3, 4, 5], [5, 4, 9]]], [[[1, 2], [2, 1]]])
    assert task.grade(q, "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b), reverse=True))\n").correct is True
    assert task.grade(q, "def similar_elements(a, b):\n    return tuple(set(a) | set(b))\n").correct is False


def test_evalplus_per_input_time_limit(tmp_path):
    # the ground truth takes no time, so each input gets EvalPlus's minimum limit (1 s)
    task, q = release_task(tmp_path, "Mbpp/901", "double", "def double(x):\n    return 2 * x\n", [[1], [2]], [[3]])
    slow = "import time\n\ndef double(x):\n    time.sleep(2.5)\n    return 2 * x\n"
    grade = task.grade(q, slow)
    assert grade.correct is False and "EvalPlus base inputs" in grade.details["stderr_tail"]
    assert grade.details["duration_s"] < 10


def test_the_solutions_imports_reach_the_sandbox_preload(tmp_path):
    task, q = release_task(tmp_path, "Mbpp/902", "hue", "def hue(r, g, b):\n    return round(r + g + b, 3)\n", [[0.1, 0.2, 0.3]], [])
    solution = "import colorsys\nfrom fractions import Fraction\n\ndef hue(r, g, b):\n    return round(colorsys.rgb_to_hsv(r, g, b)[2] * 0 + r + g + b, 3)\n"
    assert {"colorsys", "fractions"} <= set(_preload(mbpp_program(q.reference, solution)))
    assert task.grade(q, solution).correct is True


def test_release_format_without_evalplus_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "evalplus.data.mbpp", None)
    with pytest.raises(DataUnavailable) as err:
        release_task(tmp_path, "Mbpp/2", "f", "def f(a):\n    return a\n", [[1]], [])
    msg = str(err.value)
    assert "evalplus" in msg and "--no-deps" in msg and "docs/data.md" in msg and "\n" not in msg
