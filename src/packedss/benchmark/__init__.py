"""The benchmarks behind scripts/bench_calls.py (one model call: rows, prefix, eager against
compiled) and scripts/bench_schedules.py (whole decodes of every schedule side by side)."""
