"""Code graders (humaneval, mbpp): build the test program, run it in the sandbox, pass@1.

Code extraction rule (both tasks): if the output contains a fenced block (a line starting
with three backticks), the code is the content of the FIRST fenced block (its language tag,
e.g. ``python``, dropped; an unclosed block runs to the end of the output); otherwise the
whole output is the code. Programs:
- humaneval: ``prompt + code + "\\n\\n" + test + "\\n\\ncheck(entry_point)\\n"`` (a chat reply
  that restates the whole function simply redefines it after the prompt's stub);
- mbpp (original): ``code + test_setup_code + test_imports + the test_list asserts``;
- mbpp+ (hub format): ``code + test_imports + the test program``; (EvalPlus release format):
  EvalPlus's own check (below) of ``code`` against the ground truth on the base, then the
  plus inputs.

A program that times out (the sandbox's limit, or EvalPlus's per-input limit) runs once more,
alone and with its limit on its own CPU time, and that run's verdict counts; the record's
``grade_attempts`` lists the runs (``run_attempts``, docs/sandbox.md §8).

EvalPlus release format: the program runs EvalPlus's own pieces in the sandbox as
``evalplus.evaluate`` does, for the base inputs and then, when they pass, for the plus inputs:
``trusted_exec`` of ``prompt + canonical_solution`` gives the expected outputs and reference
times, then ``evalplus.eval.unsafe_execute`` (the body of ``untrusted_check``'s worker
process) checks ``code``: per-input time limits ``max(min_time_limit, gt_time_limit_factor *
ref_time)`` (EvalPlus's defaults, 1 s and 4, unless set below), exact match, ``atol`` and
float handling, MBPP's special oracles. The sandbox process stands in for EvalPlus's worker
process: it already runs in a fresh directory (and forbids ``chdir``) under its own guard
(modelled on the same ``reliability_guard``) and memory limits, so EvalPlus's per-check
temporary directory, guard and memory limit are left out of the program (the sandbox gets
EvalPlus's memory limit instead). Each check stops at its first failing input
(``fast_check``), which gives the same verdict.
"""

from __future__ import annotations

import ast
import re
from typing import Optional

from packedss.tasks.core import Grade, Question, TaskConfig
from packedss.tasks.sandbox import ExecResult, run_program

_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+#.-]*)[ \t]*$", re.M)


def extract_code(output: str) -> tuple[str, bool]:
    """(code, fenced): see the module docstring for the rule."""
    m = _FENCE.search(output)
    if not m:
        return output, False
    start = m.end() + 1 if m.end() < len(output) else m.end()
    end = _FENCE.search(output, start)
    # the closing fence has no language tag; a tagged fence before it is a new block
    while end and end.group(1):
        end = _FENCE.search(output, end.end())
    body = output[start : end.start() if end else len(output)]
    return body, True


def humaneval_program(ref: dict, code: str) -> str:
    return ref["prompt"] + code + "\n\n" + ref["test"] + f"\n\ncheck({ref['entry_point']})\n"


_EVALPLUS_CHECK = """{imports}
import contextlib
import sys
from math import inf, nan  # repr() writes infinite and NaN floats as these names

import evalplus.eval as evalplus_eval
from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS
from evalplus.eval.utils import TimeoutException
from evalplus.gen.util import trusted_exec

# the sandbox's own directory, guard and memory limits stand in for EvalPlus's
evalplus_eval.create_tempdir = contextlib.nullcontext
evalplus_eval.reliability_guard = lambda maximum_memory_bytes=None: None
evalplus_eval.query_maximum_memory_bytes = lambda: None
EVALPLUS_TIME_LIMIT = evalplus_eval.time_limit
TIMED_OUT = []  # the per-input limits that fired (unsafe_execute counts those inputs as failed)


@contextlib.contextmanager
def time_limit(seconds):
    try:
        with EVALPLUS_TIME_LIMIT(seconds):
            yield
    except TimeoutException:
        TIMED_OUT.append(seconds)
        raise


evalplus_eval.time_limit = time_limit


class Shared:
    # stands in for the multiprocessing.Value through which unsafe_execute reports
    def __init__(self, value):
        self.value = value


ENTRY_POINT = {entry_point!r}
GROUND_TRUTH = {ground_truth!r}
SOLUTION = {solution!r}
ATOL = {atol!r}
MIN_TIME_LIMIT = {min_time_limit!r}
GT_TIME_LIMIT_FACTOR = {gt_time_limit_factor!r}
INPUTS = {{"base": {base_input}, "plus": {plus_input}}}
NOT_NONE = ENTRY_POINT in MBPP_OUTPUT_NOT_NONE_TASKS

for part, inputs in INPUTS.items():
    outputs, ref_time = trusted_exec(GROUND_TRUTH, inputs, ENTRY_POINT, record_time=True, output_not_none=NOT_NONE)
    time_limits = [max(MIN_TIME_LIMIT, GT_TIME_LIMIT_FACTOR * t) for t in ref_time]
    stat, progress, details = Shared(evalplus_eval._UNKNOWN), Shared(0), [False] * len(inputs)
    evalplus_eval.unsafe_execute(
        "mbpp", ENTRY_POINT, SOLUTION, inputs, outputs, time_limits, ATOL, True, stat, details, progress
    )
    if not (stat.value == evalplus_eval._SUCCESS and progress.value == len(inputs) and all(details)):
        if TIMED_OUT:
            print(f"EvalPlus {{part}} inputs: input {{progress.value}} of {{len(inputs)}} ran past its time limit of "
                  f"{{TIMED_OUT[-1]:.3g}} s", file=sys.stderr)
            raise SystemExit({time_limit_exit})
        status = evalplus_eval._mapping[stat.value] or evalplus_eval.TIMEOUT
        raise AssertionError(f"EvalPlus {{part}} inputs: {{status}} ({{progress.value}} of {{len(inputs)}} run)")
"""

#: the exit status of the EvalPlus check when a solution ran past EvalPlus's per-input time limit
EVALPLUS_TIME_LIMIT_EXIT = 124

#: EvalPlus's evaluate options --min-time-limit and --gt-time-limit-factor (None: its defaults,
#: DEFAULT_MIN_TIME_LIMIT and DEFAULT_GT_TIME_LIMIT_FACTOR of evalplus.config).
EVALPLUS_MIN_TIME_LIMIT_S: Optional[float] = None
EVALPLUS_GT_TIME_LIMIT_FACTOR: Optional[float] = None

#: EvalPlus's own cap on one check (``untrusted_check`` joins its worker for at most
#: min(EVALPLUS_TIMEOUT_PER_TASK = 60, sum of the per-input limits) + 2 seconds).
EVALPLUS_CHECK_CAP_S = 62.0


def evalplus_limits(cfg: TaskConfig) -> tuple[float, int]:
    """The sandbox's (wall-clock seconds, memory MiB) for an EvalPlus check. Time:
    ``time_limit_s`` for start-up and the ground truth plus EvalPlus's cap for the base and the
    plus check (a merely slow solution is stopped earlier by the per-input limits). Memory:
    EvalPlus's own limit for its worker (4 GiB or all of the RAM, EVALPLUS_MAX_MEMORY_BYTES),
    which holds the expected outputs too (some need over 1 GiB); ``memory_limit_mb`` when
    EvalPlus sets none."""
    from evalplus.eval import query_maximum_memory_bytes

    memory_bytes = query_maximum_memory_bytes()
    memory_mb = cfg.memory_limit_mb if memory_bytes is None else memory_bytes >> 20
    return float(cfg.time_limit_s) + 2 * EVALPLUS_CHECK_CAP_S, memory_mb


def _imported_modules(source: str) -> list[str]:
    """The absolute imports of ``source`` (none when it does not parse: it fails anyway)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return list(dict.fromkeys(names))


def _import_lines(*sources: str) -> str:
    """Import statements for the modules ``sources`` import. The EvalPlus check executes the
    solution from a string, so these lines are what names its modules to the sandbox, which
    loads a program's imports before it drops privileges; a module that fails to import
    here fails, as it would in EvalPlus, when the solution itself imports it."""
    modules = dict.fromkeys(m for source in sources for m in _imported_modules(source))
    return "".join(f"try:\n    import {m}\nexcept Exception:\n    pass\n" for m in modules)


def mbpp_program(ref: dict, code: str) -> str:
    imports = "\n".join(ref.get("test_imports") or [])
    fmt = ref.get("format")
    if fmt == "asserts":
        return "\n\n".join([code, ref.get("test_setup_code") or "", imports, "\n".join(ref["test_list"])]) + "\n"
    if fmt == "program":
        return "\n\n".join([code, imports, ref["test"]]) + "\n"
    if fmt == "evalplus":
        from evalplus.config import DEFAULT_GT_TIME_LIMIT_FACTOR, DEFAULT_MIN_TIME_LIMIT

        return _EVALPLUS_CHECK.format(
            imports=_import_lines(ref["ground_truth"], code),
            entry_point=ref["entry_point"],
            ground_truth=ref["ground_truth"],
            solution=code,
            atol=ref["atol"],
            base_input=ref["base_input"],
            plus_input=ref["plus_input"],
            min_time_limit=float(EVALPLUS_MIN_TIME_LIMIT_S or DEFAULT_MIN_TIME_LIMIT),
            gt_time_limit_factor=float(EVALPLUS_GT_TIME_LIMIT_FACTOR or DEFAULT_GT_TIME_LIMIT_FACTOR),
            time_limit_exit=EVALPLUS_TIME_LIMIT_EXIT,
        )
    raise ValueError(f"unknown mbpp reference format {fmt!r}")


def attempt_status(result: ExecResult, evalplus: bool) -> str:
    """What one run of a program ended in: the sandbox's status, or `timeout` where the EvalPlus
    check stopped at EvalPlus's per-input time limit."""
    if evalplus and result.status == "failed" and result.returncode == EVALPLUS_TIME_LIMIT_EXIT:
        return "timeout"
    return result.status


def run_attempts(program: str, limits: tuple[float, int], evalplus: bool = False) -> list[tuple[ExecResult, str, dict]]:
    """The program's runs: (result, what it ended in, how it ran). One that timed out runs once
    more, alone (no other sandboxed program of this process running), its limit on its own CPU
    time, and the second run's verdict counts: so a verdict does not depend on what else the
    machine runs (docs/sandbox.md §8). Inside the EvalPlus check, EvalPlus's limits per input stay
    on the wall clock: they are set from the reference's time measured in the same run."""
    time_limit_s, memory_limit_mb = limits
    attempts = []
    for how in ({"alone": False, "clock": "wall"}, {"alone": True, "clock": "cpu"}):
        result = run_program(program, time_limit_s=time_limit_s, memory_limit_mb=memory_limit_mb, alone=how["alone"],
                             cpu_clock=how["clock"] == "cpu")  # fmt: skip
        attempts.append((result, attempt_status(result, evalplus), how))
        if attempts[-1][1] != "timeout":
            break
    return attempts


def _grade_program(program: str, fenced: bool, code: str, limits: tuple[float, int], evalplus: bool = False) -> Grade:
    if not code.strip():
        return Grade(extracted_answer=None, correct=False, details={"status": "empty", "fenced": fenced})
    attempts = run_attempts(program, limits, evalplus)
    res, status, _ = attempts[-1]
    return Grade(
        extracted_answer=code[:20000],
        correct=res.passed,
        details={
            "status": status,
            "returncode": res.returncode,
            "duration_s": res.duration_s,
            "fenced": fenced,
            "stderr_tail": res.stderr_tail[-1000:],
        },
        sandbox=res.sandbox,
        attempts=[{"status": status, "duration_s": r.duration_s, **how} for r, status, how in attempts],
    )


def grade_humaneval(cfg: TaskConfig, q: Question, output: str) -> Grade:
    code, fenced = extract_code(output)
    return _grade_program(humaneval_program(q.reference, code), fenced, code, (cfg.time_limit_s, cfg.memory_limit_mb))


def grade_mbpp(cfg: TaskConfig, q: Question, output: str) -> Grade:
    code, fenced = extract_code(output)
    evalplus = q.reference.get("format") == "evalplus"
    limits = evalplus_limits(cfg) if evalplus else (cfg.time_limit_s, cfg.memory_limit_mb)
    return _grade_program(mbpp_program(q.reference, code), fenced, code, limits, evalplus)


def canonical_output(q: Question) -> Optional[str]:
    """The data set's reference solution in the form a model would output it (tests)."""
    return q.metadata.get("canonical_solution")
