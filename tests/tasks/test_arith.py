"""The offline arith task: generator, splits, grading."""

import re

from packedss.tasks import load_task, load_task_config
from packedss.tasks import arith
from packedss.tasks.arith import generate, split_of


def test_deterministic_and_prefix_stable():
    a = generate("test", 50, seed=3)
    assert a == generate("test", 50, seed=3)
    assert generate("test", 20, seed=3) == a[:20]
    assert generate("test", 50, seed=4) != a


def test_train_and_test_are_disjoint():
    train = {r["question"] for r in generate("train", 5000, seed=0)}
    test = {r["question"] for r in generate("test", 3000, seed=0)}
    other_seed = {r["question"] for r in generate("test", 2000, seed=1)}
    assert len(test) == 3000 and len(train) == 5000
    assert not train & test and not train & other_seed
    assert all(split_of(q) == "test" for q in test)


def test_solutions_are_worked_and_correct():
    step = re.compile(r"<<([\d+\-*/]+)=(\d+)>>(\d+)")
    for r in generate("test", 500, seed=0) + generate("train", 500, seed=0):
        lines = r["answer"].split("\n")
        assert lines[-1].startswith("#### ")
        steps = [step.search(l) for l in lines[:-1]]
        assert 2 <= len(steps) <= 4 and all(steps)
        for m in steps:
            expr, val, shown = m.groups()
            assert eval(expr.replace("/", "//")) == int(val) == int(shown)
            assert 0 <= int(val) < arith.LIMIT
        final = int(lines[-1][5:])
        assert final == int(steps[-1].group(2)) and 0 <= final < arith.LIMIT
        assert len(r["question"]) < 300


def test_task_defaults_and_grading():
    task = load_task(load_task_config("arith"), None)
    qs = task.questions()
    assert len(qs) == 200 and qs[0].question_id == "arith/test/0" and qs[-1].question_id == "arith/test/199"
    q = qs[0]
    prompt = task.build_prompt(q)
    assert prompt == f"Question: {q.text}\nAnswer:"
    assert task.stop == ["\nQuestion:"]
    assert task.grade(q, " " + q.metadata["solution"]).correct is True
    assert task.grade(q, " #### 100000").correct is False
    assert all(task.grade(x, x.metadata["solution"]).correct for x in qs)
    train = load_task(load_task_config("arith", split="train", n=10), None).questions()
    assert train[0].question_id == "arith/train/0" and len(train) == 10
