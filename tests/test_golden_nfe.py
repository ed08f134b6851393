"""CI regression of NFE counts: per-question `nfe_total`, rows evaluated and `output_hash` of the shipped tiny
models on fixed offline prompts, for every schedule and W in {4, 8, 16} ({3, 7, 15} on tiny-sdar) at T = 0 (float64).

A change that moves any count fails here with a readable diff; regenerate deliberately with
`make golden` (python -m tests.test_golden_nfe --write) and commit the new file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from packedss.paths import PROJECT_ROOT
from packedss.decoding import Sampling, question_seed
from packedss.families import FAMILIES
from packedss.records import output_hash
from packedss.tasks.stops import make_stop_check
from packedss.tasks import load_task, load_task_config

GOLDEN = Path(__file__).resolve().parent / "golden" / "nfe_tiny.json"
QUESTIONS = 4
MAX_NEW_TOKENS = 96
# model -> (family, schedules, widths); AR runs at W = 1 only (it reads no W).
MODELS = {
    "tiny": ("nemotron", ("ar", "linear", "quadratic", "packed", "pld"), (4, 8, 16)),
    "tiny-set": ("setdlm", ("ar", "linear", "quadratic", "packed", "native", "pld"), (4, 8, 16)),
    # W = 3 is SDAR's block of 4; 15 its Config-B block of 16.
    "tiny-sdar": ("sdar", ("ar", "linear", "packed", "sdar-native", "s2d2", "s2d2-always", "pld"), (3, 7, 15)),
}


def _model_dir(name: str) -> Path:
    return PROJECT_ROOT / "assets" / "models" / name


def _decoder(family_name: str, model):
    """(schedule, width, question id) -> decode(prompt ids, stop check) for the model's family
    (greedy; a schedule that draws at T = 0 gets the runner's seeded generator)."""
    family = FAMILIES[family_name]
    fields = {"order": "ltr"} if family.orders else {}

    def run(schedule, width, question_id, ids, stop_check):
        generator = torch.Generator().manual_seed(question_seed(0, question_id))
        settings = family.settings_type(schedule, width, MAX_NEW_TOKENS, model.eos_token_ids,
                                        Sampling(0.0, "rejection", generator), **fields)  # fmt: skip
        return family.decode(model, ids, settings, stop_check)

    return run


def measure() -> dict:
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    task = load_task(load_task_config("arith"))
    results = {}
    for name, (family, schedules, widths) in MODELS.items():
        path = _model_dir(name)
        if not (path / "config.json").is_file():
            continue
        model = FAMILIES[family].load_adapter(path, torch.device("cpu"), "float64")
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        stop_check = make_stop_check(tokenizer, task.stop)
        prompts = {q.question_id: tokenizer(task.build_prompt(q))["input_ids"] for q in task.questions(QUESTIONS)}
        run = _decoder(family, model)
        for schedule in schedules:
            for width in (1,) if schedule == "ar" else widths:
                for question_id, ids in prompts.items():
                    out = run(schedule, width, question_id, ids, stop_check)
                    results[f"{name} {schedule} W={width} {question_id}"] = {
                        "nfe_total": out.nfe_total,
                        "rows": sum(out.rows_evaluated),
                        "output_hash": output_hash(out.tokens),
                    }
    return results


def diff(expected: dict, measured: dict) -> list[str]:
    lines = []
    for key in sorted(set(expected) | set(measured)):
        if key not in measured:
            lines.append(f"{key}: missing from this run")
        elif key not in expected:
            lines.append(f"{key}: new (not in the golden file)")
        else:
            old, new = expected[key], measured[key]
            for count in ("nfe_total", "rows"):
                if old.get(count) != new[count]:
                    lines.append(f"{key}: {count} {old.get(count)} -> {new[count]}")
            if old["output_hash"] != new["output_hash"]:
                lines.append(f"{key}: output_hash {old['output_hash'][:12]} -> {new['output_hash'][:12]}")
    return lines


def test_diff_names_every_moved_count():
    old = {"tiny packed W=8 q1": {"nfe_total": 20, "rows": 400, "output_hash": "a" * 64},
           "tiny ar W=1 q1": {"nfe_total": 9, "rows": 30, "output_hash": "b" * 64}}
    new = {"tiny packed W=8 q1": {"nfe_total": 22, "rows": 410, "output_hash": "c" * 64},
           "tiny ar W=1 q2": {"nfe_total": 9, "rows": 30, "output_hash": "b" * 64}}
    assert diff(old, old) == []
    assert diff(old, new) == [
        "tiny ar W=1 q1: missing from this run",
        "tiny ar W=1 q2: new (not in the golden file)",
        "tiny packed W=8 q1: nfe_total 20 -> 22",
        "tiny packed W=8 q1: rows 400 -> 410",
        "tiny packed W=8 q1: output_hash aaaaaaaaaaaa -> cccccccccccc",
    ]


@pytest.mark.skipif(not (_model_dir("tiny") / "config.json").is_file(), reason="the shipped tiny model is absent")
def test_nfe_counts_match_the_golden_file():
    expected = json.loads(GOLDEN.read_text())
    changes = diff(expected, measure())
    assert not changes, "NFE regression (run `make golden` if the change is deliberate):\n" + "\n".join(changes)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.test_golden_nfe --write")
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(measure(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
