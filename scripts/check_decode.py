#!/usr/bin/env python
"""Two checks of the decode path on one device, for scripts/gpu_check.sh: host syncs per
iteration and the divergence audit.

1. Syncs: the tiny model decodes greedily and at T = 1 (rule rejection) with timing=events, every
   LTR schedule at W = 8. On CUDA the syncs are counted by torch itself: under
   `torch.cuda.set_sync_debug_mode("warn")` every synchronizing call warns "called a
   synchronizing CUDA operation" (c10's warn_or_error_on_sync), and only that text is counted
   (`is_sync_warning`), not torch's one-time notice that the mode "does not yet detect all
   synchronizing operations". On a CPU, where that mode sees nothing, the Tensor read-backs
   (item, tolist, ...) are counted as the tests do. PASS: greedy at most iterations + 2 syncs
   per response (the prefill's first token, one per iteration, the near-ties' read-back at the
   end), T > 0 at most 2 x iterations + 2. The prompt's upload adds none: on CUDA it is copied
   from pinned memory with non_blocking=True (packedss.decoding.rows.uploaded), a copy the sync
   debug mode does not flag and that does not block the host, so the bound has no term for it.
2. Audit: AR and every lossless LTR schedule at each --widths decode the first --limit arith
   questions in --dtype; each output is classed against AR's (packedss.analysis.audit). PASS: no
   unexplained divergence; with --exact (float32): every output equal to AR's, token for token.

--checks picks either or both (default both). --json is rewritten after every measured row, so
a run cut short keeps what it measured.

    python scripts/check_decode.py --device cuda --dtype bfloat16 --json results/gpu_check/decode.json
    python scripts/check_decode.py --device cuda --dtype float32 --checks audit --exact --json results/gpu_check/audit-fp32.json
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch
from transformers import AutoTokenizer

from packedss.analysis.audit import CLASSES, classify
from packedss.benchmark import write_report
from packedss.decoding import LTRSettings, Sampling, decode_ltr
from packedss.errors import ArgumentParser, PackedSSError, names, number, numbers, run_cli
from packedss.models.checkpoint import DTYPES
from packedss.models.nemotron import load_nemotron
from packedss.numerics import exact_reductions
from packedss.paths import PROJECT_ROOT
from packedss.tasks import load_task, load_task_config

SCHEDULES = ("ar", "linear", "quadratic", "packed")
# Not `numpy`: it refuses a tensor on a GPU, and on a CPU it is a view (tests/decoding/test_syncs.py: the same list).
READ_BACKS = ("item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__")
CHECKS = ("syncs", "audit")
SYNC_WARNING = "called a synchronizing CUDA operation"  # c10's warn_or_error_on_sync, one per sync


def is_sync_warning(message: str) -> bool:
    """Whether a warning raised under torch.cuda.set_sync_debug_mode("warn") reports one host sync
    (torch's own notice that the mode is a prototype mentions synchronizing too, and is none)."""
    return SYNC_WARNING in message


@contextlib.contextmanager
def counted_syncs(device: torch.device):
    """Yields a list that collects one entry per host sync made inside the block."""
    seen: list[str] = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield seen
            finally:
                torch.cuda.set_sync_debug_mode("default")
        seen += [str(w.message) for w in caught if is_sync_warning(str(w.message))]
        return
    originals = {name: getattr(torch.Tensor, name) for name in READ_BACKS}
    for name, original in originals.items():
        def counted(self, *args, _original=original, _name=name, **kwargs):
            seen.append(_name)
            return _original(self, *args, **kwargs)

        setattr(torch.Tensor, name, counted)
    try:
        yield seen
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def main(argv=None) -> int:
    parser = ArgumentParser(prog="scripts/check_decode.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    parser.add_argument("--checks", type=names(CHECKS), default=list(CHECKS), help="syncs, audit or both (default)")
    parser.add_argument("--exact", action="store_true", help="the audit passes only on outputs equal to AR's (float32)")
    parser.add_argument("--limit", type=number(int, 1), default=20)
    parser.add_argument("--max-new-tokens", type=number(int, 1), default=96)
    parser.add_argument("--widths", type=numbers(1), default=[8, 16, 31])
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    if not Path(args.json).expanduser().absolute().parent.is_dir():
        raise PackedSSError(f"--json {args.json}: its directory does not exist; create it or pick another path")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise PackedSSError("--device cuda but no CUDA device is available; use --device cpu")
    exact_reductions()
    device = torch.device(args.device)
    path = PROJECT_ROOT / "assets" / "models" / "tiny"
    model = load_nemotron(path, device=device, dtype=args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    task = load_task(load_task_config("arith"))
    prompts = [tokenizer(task.build_prompt(q))["input_ids"] for q in task.questions(args.limit)]
    eos = model.eos_token_ids
    report: dict = {"device": str(device), "dtype": args.dtype, "checks": args.checks, "exact": args.exact,
                    "syncs": [], "audit": [], "failed": [], "done": False}  # fmt: skip

    def write() -> None:
        write_report(Path(args.json), report)

    def decode(schedule, width, prompt, sampling):
        return decode_ltr(model, prompt, LTRSettings(schedule, width, args.max_new_tokens, eos, sampling, timing="events"))

    write()
    if "syncs" in args.checks:
        count_syncs(decode, prompts[0], device, report, write)
    if "audit" in args.checks:
        audit(decode, prompts, args, report, write)
    report["done"] = True
    write()
    return 1 if report["failed"] else 0


def count_syncs(decode, prompt, device: torch.device, report: dict, write) -> None:
    """The host syncs of one response of every schedule at W = 8, greedy and at T = 1."""
    for temperature in (0.0, 1.0):
        for schedule in SCHEDULES:
            sampling = lambda: Sampling(temperature, "rejection", torch.Generator(device=device).manual_seed(0))  # noqa: E731
            decode(schedule, 8, prompt, sampling())  # warm: layouts, biases, kernels
            with counted_syncs(device) as syncs:
                out = decode(schedule, 8, prompt, sampling())
            bound = out.iterations + 2 if temperature == 0 else 2 * out.iterations + 2
            ok = len(syncs) <= bound
            row = {"schedule": schedule, "temperature": temperature, "iterations": out.iterations,
                   "syncs": len(syncs), "syncs_per_iteration": len(syncs) / max(out.iterations, 1), "bound": bound,
                   "pass": ok}  # fmt: skip
            report["syncs"].append(row)
            print(f"syncs {schedule} T={temperature:g}: {len(syncs)} in {out.iterations} iterations "
                  f"({row['syncs_per_iteration']:.2f}/iteration; bound {bound}): {'PASS' if ok else 'FAIL'}", flush=True)  # fmt: skip
            if not ok:
                report["failed"].append(f"syncs-{schedule}-T{temperature:g}")
            write()


def audit(decode, prompts: list, args, report: dict, write) -> None:
    """Every lossless schedule at every width against AR, greedy, one row per (schedule, W)."""
    greedy = Sampling(0.0, "rejection", None)
    reference = [decode("ar", 1, prompt, greedy) for prompt in prompts]
    report["near_ties_ar"] = sum(len(ar.extra["near_ties"]) for ar in reference)
    for schedule in SCHEDULES[1:]:
        for width in args.widths:
            verdicts = dict.fromkeys(CLASSES, 0)
            for prompt, ar in zip(prompts, reference):
                out = decode(schedule, width, prompt, greedy)
                verdict, first = classify(out.tokens, out.extra["near_ties"], ar.tokens, ar.extra["near_ties"])
                verdicts[verdict] += 1
                if verdict == "unexplained":
                    print(f"UNEXPLAINED DIVERGENCE: {schedule} W={width}: differs from AR at output index {first}")
            ok = verdicts["unexplained"] == 0 and (not args.exact or verdicts["equal"] == len(prompts))
            report["audit"].append({"schedule": schedule, "width": width, **verdicts, "pass": ok})
            print(f"audit {schedule} W={width} ({args.dtype}{', exact' if args.exact else ''}): "
                  + ", ".join(f"{k} {v}" for k, v in verdicts.items()) + f": {'PASS' if ok else 'FAIL'}", flush=True)  # fmt: skip
            if not ok:
                report["failed"].append(f"audit-{schedule}-W{width}")
            write()


if __name__ == "__main__":
    run_cli(main)
