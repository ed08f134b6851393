"""What one benchmark of the schedules measures: the command line of scripts/bench_schedules.py
as settings (read by packedss.benchmark.loading and packedss.benchmark.schedules)."""

from __future__ import annotations

from dataclasses import dataclass, field

from packedss.analysis.bootstrap import N_RESAMPLES


@dataclass
class BenchSettings:
    """What one benchmark run measures (the command line of scripts/bench_schedules.py)."""

    model: str = "tiny"  # a conf/model name, or a Nemotron-format checkpoint directory
    model_path: str | None = None  # local directory for a named model (model.path)
    shape: str | None = None  # random weights of a named shape (packedss.benchmark.calls.SHAPES)
    config: str | None = None  # random weights of the shape in this config.json / directory
    task: str = "arith"
    data_dir: str | None = None
    limit: int = 30
    schedules: list[str] = field(default_factory=lambda: ["linear", "quadratic", "packed"])
    widths: list[int] = field(default_factory=lambda: [8])  # W of every schedule (each width its own rows)
    quadratic_width: int | None = None
    pad_verify: bool = True
    order: str | None = None  # any-order families: the verification order (None: the family's first)
    temperature: float = 0.0
    verify: str = "rejection"
    seed: int = 0
    max_new_tokens: int | None = None
    repeats: int = 1
    warmup: int = 1
    device: str = "auto"
    dtype: str = "auto"
    threads: int = 1  # CPU intra-op threads (0: the runner's default, 1 on CPU)
    timing: str = "sync"
    compile: str = "none"  # a packedss.models.static mode: compiled rows next to the eager ones
    grade: bool = True
    n_resamples: int = N_RESAMPLES
    replay: bool = False
    cost_shape: str | None = None  # a cost twin of this shape (cost_twin.SHAPES or a config directory)
    cost_layers: int | None = None
    cost_dtype: str | None = None  # None: the run's dtype
    stream_mib: int | None = None  # the floor's products cover at least this many MiB (None: calls.stream_min_bytes)
