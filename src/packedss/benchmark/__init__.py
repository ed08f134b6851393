"""The benchmarks behind scripts/bench_calls.py (one model call: rows, prefix, eager against
compiled) and scripts/bench_schedules.py (whole decodes of every schedule side by side)."""

import platform


def cpu_name() -> str:
    """The CPU's model name, for a benchmark's regime line."""
    try:
        with open("/proc/cpuinfo") as handle:
            return next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"
