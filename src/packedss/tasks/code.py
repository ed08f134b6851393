"""Code graders (humaneval, mbpp): build the test program, run it in the sandbox, pass@1.

Code extraction rule (both tasks): if the output contains a fenced block (a line starting
with three backticks), the code is the content of the FIRST fenced block (its language tag,
e.g. ``python``, dropped; an unclosed block runs to the end of the output); otherwise the
whole output is the code. Programs:
- humaneval: ``prompt + code + "\\n\\n" + test + "\\n\\ncheck(entry_point)\\n"`` (a chat reply
  that restates the whole function simply redefines it after the prompt's stub);
- mbpp (original): ``code + test_setup_code + test_imports + the test_list asserts``;
- mbpp+ (hub format): ``code + test_imports + the test program``; (EvalPlus release format):
  ``code`` + a comparison of the candidate with the canonical solution on base+plus inputs
  (exact, or within ``atol`` for floats).
"""

from __future__ import annotations

import re
from typing import Optional

from packedss.tasks.core import Grade, Question, TaskConfig
from packedss.tasks.sandbox import run_program

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


_IO_CHECK = '''

import math as _pk_math

def _pk_equal(out, exp, atol):
    if isinstance(exp, float) or isinstance(out, float):
        try:
            if _pk_math.isnan(exp) and _pk_math.isnan(out):
                return True
            return abs(out - exp) <= (atol or 1e-06) + 1e-07 * abs(exp)
        except TypeError:
            return False
    if isinstance(exp, (list, tuple)) and isinstance(out, (list, tuple)):
        return type(out) is type(exp) and len(out) == len(exp) and all(_pk_equal(a, b, atol) for a, b in zip(out, exp))
    return out == exp

_pk_ref = {{}}
exec(compile({canonical!r}, "canonical.py", "exec"), _pk_ref)
_pk_inputs = {inputs}
for _pk_inp in _pk_inputs:
    _pk_exp = _pk_ref[{entry!r}](*__import__("copy").deepcopy(_pk_inp))
    _pk_out = {entry}(*_pk_inp)
    assert _pk_equal(_pk_out, _pk_exp, {atol!r}), (_pk_inp, _pk_out, _pk_exp)
'''


def mbpp_program(ref: dict, code: str) -> str:
    imports = "\n".join(ref.get("test_imports") or [])
    fmt = ref.get("format")
    if fmt == "asserts":
        return "\n\n".join([code, ref.get("test_setup_code") or "", imports, "\n".join(ref["test_list"])]) + "\n"
    if fmt == "program":
        return "\n\n".join([code, imports, ref["test"]]) + "\n"
    if fmt == "io":
        inputs = ref["inputs"]
        inputs_src = inputs["repr"] if isinstance(inputs, dict) else repr(inputs)
        return code + _IO_CHECK.format(
            canonical=ref["canonical_solution"], inputs=inputs_src, entry=ref["entry_point"], atol=float(ref["atol"])
        )
    raise ValueError(f"unknown mbpp reference format {fmt!r}")


def _grade_program(cfg: TaskConfig, program: str, fenced: bool, code: str) -> Grade:
    if not code.strip():
        return Grade(extracted_answer=None, correct=False, details={"status": "empty", "fenced": fenced})
    res = run_program(program, time_limit_s=cfg.time_limit_s, memory_limit_mb=cfg.memory_limit_mb)
    return Grade(
        extracted_answer=code[:20000],
        correct=res.passed,
        details={
            "status": res.status,
            "returncode": res.returncode,
            "duration_s": res.duration_s,
            "fenced": fenced,
            "stderr_tail": res.stderr_tail[-1000:],
        },
    )


def grade_humaneval(cfg: TaskConfig, q: Question, output: str) -> Grade:
    code, fenced = extract_code(output)
    return _grade_program(cfg, humaneval_program(q.reference, code), fenced, code)


def grade_mbpp(cfg: TaskConfig, q: Question, output: str) -> Grade:
    code, fenced = extract_code(output)
    return _grade_program(cfg, mbpp_program(q.reference, code), fenced, code)


def canonical_output(q: Question) -> Optional[str]:
    """The data set's reference solution in the form a model would output it (tests)."""
    return q.metadata.get("canonical_solution")
