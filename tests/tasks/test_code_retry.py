"""A code program that times out runs once more, alone, before its verdict counts, and the record
says each attempt (docs/sandbox.md §8, docs/records.md §2: grade_attempts).

Which attempt times out does not depend on the machine's speed: a program here sleeps far past
its limit unless it finds a marker file in its working directory, and the test puts the marker
into the working directory of the program's second run only (the sandbox lets a program write
nothing that outlives its run, so the program cannot leave the marker itself)."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

from packedss import grade as grade_cli
from packedss.tasks import Question, Task, TaskConfig
from packedss.tasks import code, sandbox
from packedss.tasks.code import grade_humaneval, grade_mbpp
from packedss.tasks.gate import ProgramGate

MARKER = "retry-marker"
LIMIT = 3.0  # seconds: what the passing run may take on a busy machine; the slow one sleeps 20x past it
SLOW_UNLESS_MARKED = f"import os, time\nif not os.path.exists({MARKER!r}):\n    time.sleep(60)\n"


def humaneval_question(test: str = "def check(f):\n    assert f() == 1\n") -> Question:
    reference = {"prompt": "", "test": test, "entry_point": "f"}
    return Question("HumanEval/x", "", reference)


class Runs:
    """Wraps the sandbox's run of one program (`_run_in`): puts the marker into the working
    directory of every run after a program's first, and keeps each run's interval and the number
    of runs that were going on beside it."""

    def __init__(self, monkeypatch, hold=None):
        self.real = sandbox._run_in
        self.lock = threading.Lock()
        self.seen: dict[str, int] = {}
        self.live = 0
        self.runs: list[dict] = []  # {"program", "attempt", "start", "end", "beside"}
        self.hold = hold  # called before a run with (program, attempt): may wait on the test's events
        monkeypatch.setattr(sandbox, "_run_in", self)

    def __call__(self, tmp, program, *args):
        with self.lock:
            attempt = self.seen[program] = self.seen.get(program, 0) + 1
        if attempt > 1:
            Path(tmp, MARKER).write_text("")
        if self.hold:
            self.hold(program, attempt)
        with self.lock:
            self.live += 1
            run = {"program": program, "attempt": attempt, "start": time.monotonic(), "beside": self.live - 1}
        try:
            return self.real(tmp, program, *args)
        finally:
            with self.lock:
                self.live -= 1
                run["end"] = time.monotonic()
                self.runs.append(run)


def test_a_program_that_times_out_once_and_then_passes_is_recorded_with_two_attempts(monkeypatch, tmp_path, capsys):
    Runs(monkeypatch)
    cfg = TaskConfig(name="humaneval", grader="humaneval", time_limit_s=LIMIT, memory_limit_mb=512)
    question = humaneval_question()
    task = Task(cfg, [question], grade_humaneval, parallel=True)
    record = {"task": "humaneval", "task_config": {"name": "humaneval"}, "data_dir": None, "question_id": question.question_id,
              "output_text": f"```python\n{SLOW_UNLESS_MARKED}def f():\n    return 1\n```\n", "correct": None}  # fmt: skip
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(record) + "\n")
    tasks = {(json.dumps(record["task_config"], sort_keys=True), None): (task, {question.question_id: question})}
    counts = grade_cli.regrade_file(path, tasks=tasks)
    (graded,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert graded["correct"] is True and graded["grader"]["status"] == "passed", graded
    assert [(a["status"], a["alone"], a["clock"]) for a in graded["grade_attempts"]] == [("timeout", False, "wall"),
                                                                                       ("passed", True, "cpu")]
    assert graded["grade_attempts"][0]["duration_s"] >= LIMIT
    assert grade_cli.summary(path, counts) == (f"{path}: re-graded 1 records, 1/1 correct (1 timed out and ran again "
                                               "alone, 1 of them then passed); 0 lines kept unchanged")  # fmt: skip


def test_programs_that_end_within_their_limit_run_once_and_one_that_always_times_out_twice(monkeypatch):
    runs = Runs(monkeypatch)
    cfg = TaskConfig(name="humaneval", grader="humaneval", time_limit_s=1.0, memory_limit_mb=512)
    question = humaneval_question()
    passed, failed = (grade_humaneval(cfg, question, f"def f():\n    return {value}\n") for value in (1, 2))
    assert [a["status"] for a in passed.attempts] == ["passed"] and passed.correct is True
    assert [a["status"] for a in failed.attempts] == ["failed"] and failed.correct is False
    # computes for 1.5 s of its own CPU time: past the 1 s limit on either clock, however busy the machine
    computes = grade_humaneval(cfg, question, "import time\nwhile time.process_time() < 1.5:\n    pass\ndef f():\n    return 1\n")
    assert [(a["status"], a["clock"]) for a in computes.attempts] == [("timeout", "wall"), ("timeout", "cpu")]
    assert computes.correct is False and computes.details["status"] == "timeout"
    assert len(runs.runs) == 4
    assert passed.record_fields("humaneval")["grade_attempts"] == passed.attempts


def test_the_second_attempt_counts_the_programs_own_cpu_time_not_the_wall_clock(monkeypatch):
    """A program that takes longer than its limit on the wall clock, as a loaded machine makes it,
    but computes for less than that passes on its second run."""
    Runs(monkeypatch)
    cfg = TaskConfig(name="humaneval", grader="humaneval", time_limit_s=1.0, memory_limit_mb=512)
    waits = "import os, time\ntime.sleep(60 if not os.path.exists('retry-marker') else 1.5)\ndef f():\n    return 1\n"
    grade = grade_humaneval(cfg, humaneval_question(), waits)
    assert [(a["status"], a["clock"]) for a in grade.attempts] == [("timeout", "wall"), ("passed", "cpu")], grade.details
    assert grade.attempts[1]["duration_s"] > 1.5 and grade.correct is True


def test_the_second_attempt_runs_alone(monkeypatch):
    """Two other programs of the job start while the first attempt runs and are still running
    when it times out: the second attempt waits for both to end, and none starts beside it."""
    first_attempt_over = threading.Event()
    slow = f"{SLOW_UNLESS_MARKED}def f():\n    return 1\n"
    others = [f"import time\ndef f():\n    time.sleep(1.5)\n    return {k}\n" for k in (1, 2)]

    def hold(program, attempt):  # the others, already let in beside it, wait until the first attempt is over
        if not program.startswith(SLOW_UNLESS_MARKED):
            assert first_attempt_over.wait(60), "the first attempt never ended"

    runs = Runs(monkeypatch, hold)
    real = runs.real

    def first_then_signal(tmp, program, *args):
        try:
            return real(tmp, program, *args)
        finally:
            if program.startswith(SLOW_UNLESS_MARKED):
                first_attempt_over.set()

    runs.real = first_then_signal
    cfg = TaskConfig(name="humaneval", grader="humaneval", time_limit_s=LIMIT, memory_limit_mb=512)
    question = humaneval_question("def check(f):\n    assert f() in (1, 2)\n")
    task = Task(cfg, [question], grade_humaneval, parallel=True)
    monkeypatch.setattr("packedss.tasks.core.usable_cpus", lambda: 3)
    grades = task.grade_many([(question, slow)] + [(question, other) for other in others], workers=3)
    assert [g.correct for g in grades] == [True, True, True]
    assert [len(g.attempts) for g in grades] == [2, 1, 1]
    (second,) = [r for r in runs.runs if r["attempt"] == 2]
    beside = [r for r in runs.runs if r is not second]
    assert second["beside"] == 0
    assert all(r["end"] <= second["start"] or r["start"] >= second["end"] for r in beside), runs.runs
    # the others were let in before the second attempt asked to run alone, and it waited for them
    assert all(r["start"] < second["start"] for r in beside)


def test_evalplus_per_input_time_limit_is_a_timeout_and_runs_again(monkeypatch, task_from_shared, h, shared_data):
    """The EvalPlus check reports a solution that ran past EvalPlus's per-input limit as a timeout
    (EvalPlus's own worker counts that input as failed), so it too runs once more, alone."""
    h.need(shared_data, "MbppPlus.jsonl.gz")
    Runs(monkeypatch)
    monkeypatch.setattr(code, "EVALPLUS_MIN_TIME_LIMIT_S", 2.0)  # EvalPlus's limit per input (its default: 1 s)
    task = task_from_shared("mbpp", variant="plus")
    question = next(q for q in task.questions() if q.question_id == "mbppplus/2")
    solution = ("import os, time\ndef similar_elements(a, b):\n    if not os.path.exists('retry-marker'):\n"
                "        time.sleep(60)\n    return tuple(set(a) & set(b))\n")  # fmt: skip
    grade = grade_mbpp(task.cfg, question, solution)
    assert [(a["status"], a["alone"], a["clock"]) for a in grade.attempts] == [("timeout", False, "wall"),
                                                                              ("passed", True, "cpu")], grade.details
    assert grade.correct is True
    never = grade_mbpp(task.cfg, question, solution.replace("'retry-marker'", "'never-there'"))
    assert [a["status"] for a in never.attempts] == ["timeout", "timeout"] and never.correct is False
    assert "ran past its time limit of 2 s" in never.details["stderr_tail"], never.details


def test_the_gate_runs_a_program_alone_once_those_running_end_and_starts_none_beside_it():
    gate = ProgramGate()
    entered = {name: threading.Event() for name in ("a", "alone", "b")}
    release = {name: threading.Event() for name in ("a", "alone", "b")}

    def run(name, context):
        with context():
            entered[name].set()
            release[name].wait(30)

    threads = {"a": threading.Thread(target=run, args=("a", gate.beside_others))}
    threads["a"].start()
    assert entered["a"].wait(30)
    threads["alone"] = threading.Thread(target=run, args=("alone", gate.alone))
    threads["alone"].start()
    for _ in range(3000):  # until the lone program waits: a program asked for after it waits too
        if gate._alone_waiting:
            break
        time.sleep(0.01)
    threads["b"] = threading.Thread(target=run, args=("b", gate.beside_others))
    threads["b"].start()
    assert not entered["alone"].wait(0.5), "ran alone beside a running program"
    release["a"].set()
    assert entered["alone"].wait(30)
    assert not entered["b"].wait(0.5), "a program started beside the one running alone"
    release["alone"].set()
    assert entered["b"].wait(30)
    release["b"].set()
    for thread in threads.values():
        thread.join(30)


@pytest.mark.parametrize("status, returncode, evalplus, expected", [
    ("failed", code.EVALPLUS_TIME_LIMIT_EXIT, True, "timeout"),
    ("failed", code.EVALPLUS_TIME_LIMIT_EXIT, False, "failed"),  # only the EvalPlus check exits so
    ("failed", 1, True, "failed"),
    ("timeout", -9, False, "timeout"),
    ("output_limit", -9, True, "output_limit"),
    ("timeout", -24, False, "timeout"),  # the sandbox's verdict on the CPU limit's SIGXCPU
])  # fmt: skip
def test_attempt_status(status, returncode, evalplus, expected):
    assert code.attempt_status(sandbox.ExecResult(status, returncode, 0.1, "", ""), evalplus) == expected


def test_the_cpu_limits_signal_is_a_timeout():
    assert sandbox._verdict("running", -signal.SIGXCPU, "", "", "0" * 32)[0] == "timeout"
    assert sandbox._verdict("running", -signal.SIGSEGV, "", "", "0" * 32)[0] == "failed"
