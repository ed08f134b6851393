"""The benchmarks behind scripts/bench_calls.py (one model call: rows, prefix, eager against
compiled) and scripts/bench_schedules.py (whole decodes of every schedule side by side), and what
the benchmark scripts share: the CPU's name for their regime lines, and the whole-file JSON writes
of the steps of scripts/gpu_check.sh."""

import json
import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name, for a benchmark's regime line."""
    try:
        with open("/proc/cpuinfo") as handle:
            return next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def write_report(path: Path, report: dict) -> None:
    """`report` as `path`'s JSON, whole: written beside it and moved over it, so that a reader
    (gpu_summary.py after a step cut short by its budget) never sees a half-written file."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(report, indent=1) + "\n")
    temporary.replace(path)
