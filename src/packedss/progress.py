"""Progress of long work, on a terminal and in a log alike: how much is done, how much is left,
and the time left estimated from what has finished so far.

- A sweep's jobs (`SweepProgress`, the packedss sweeper): a line when the sweep starts and one as
  each job ends, whatever the launcher.
- A job's responses (`response_progress`, the runner): tqdm's bar on a terminal; when stderr is
  not a terminal (a log file, a pipe, `make ... > log`), where tqdm shows nothing, plain lines
  instead: one at the start, one every `interval_s` (30 s: a timer thread, so that a long
  response still gives its line) and one at the end.
- A job before its responses are counted (`JobHeartbeat`, run.py): loading the model and the
  data, the warm-up (minutes for a large model or a compiled one); off a terminal, a line every
  `interval_s` until the job's response progress starts.

Clocks are injectable (`clock`), and a plain progress's line can be asked for (`tick`), so that
tests do not depend on the machine's speed."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Optional

from tqdm import tqdm

LINE_INTERVAL_S = 30.0  # the most seconds between two plain progress lines (a log gets two a minute)


def duration(seconds: float) -> str:
    """`45 s`, `3 min 20 s`, `2 h 05 min`."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def done_and_left(done: int, total: int, unit: str, elapsed_s: float) -> str:
    """`3 of 10 jobs done, 7 left, 1 min 0 s so far; about 2 min 20 s left (20 s a job, from the 3 done)`.
    The estimate is the mean time of the finished ones times those left; none before one finished."""
    left = total - done
    text = f"{done} of {total} {unit}s done, {left} left, {duration(elapsed_s)} so far"
    if left == 0:
        return text
    if done == 0:
        return f"{text}; no estimate of the time left yet (none finished)"
    per_item = elapsed_s / done
    return f"{text}; about {duration(per_item * left)} left ({duration(per_item)} a {unit}, from the {done} done)"


def start_ticking(tick: Callable[[], None], stopped: threading.Event, interval_s: float) -> threading.Thread:
    """The timer thread of a progress that prints lines: `tick()` (which decides whether a line is
    due) at least once a second, more often when `interval_s` is shorter, until `stopped` is set."""

    def tick_until_stopped() -> None:
        while not stopped.wait(min(interval_s, 1.0)):
            tick()

    thread = threading.Thread(target=tick_until_stopped, daemon=True)
    thread.start()
    return thread


class SweepProgress:
    """A sweep's progress lines: `sweep: 0 of 45 jobs done, 45 left, ...` at the start and after
    each job (a failed job is done too; the line says how many failed)."""

    def __init__(self, total: int, file: Optional[IO[str]] = None, clock: Callable[[], float] = time.monotonic):
        self.total = total
        self.file = file
        self.clock = clock
        self.started = clock()
        self.done = 0
        self.failed = 0
        self.line()

    def job_finished(self, failed: bool = False) -> None:
        self.done += 1
        self.failed += int(failed)
        self.line()

    def line(self) -> None:
        failed = f" ({self.failed} failed)" if self.failed else ""
        text = done_and_left(self.done, self.total, "job", self.clock() - self.started)
        print(f"sweep: {text}{failed}", file=self.file or sys.stderr, flush=True)


class PlainProgress:
    """tqdm's interface (update, set_postfix, close) as plain lines, for a stderr that is not a
    terminal: one at the start, at most `interval_s` apart (the timer thread asks with `tick`; an
    update asks too), and one at the end."""

    printed: tuple[int, str] = (-1, "")  # (responses done, postfix) of the last line

    def __init__(self, total: int, desc: str, file: IO[str], interval_s: float = LINE_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, timer: bool = True):  # fmt: skip
        if JobHeartbeat.current is not None:
            JobHeartbeat.current.hand_over(self)  # these lines take over
        self.total, self.desc, self.file, self.interval_s, self.clock = total, desc, file, interval_s, clock
        self.started = self.last_line = clock()
        self.done = 0
        self.postfix = ""
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.line()
        self.thread = start_ticking(self.tick, self.stopped, interval_s) if timer else None

    def update(self, n: int = 1) -> None:
        with self.lock:
            self.done += n
        self.tick()

    def set_postfix(self, **values: str) -> None:
        with self.lock:
            self.postfix = ", ".join(f"{key} {value}" for key, value in values.items())

    def tick(self) -> None:
        """A line when `interval_s` have passed since the last one (none once closed or its job ended)."""
        if not self.stopped.is_set() and self.clock() - self.last_line >= self.interval_s:
            self.line()

    def line(self) -> None:
        with self.lock:
            now = self.clock()
            self.last_line = now
            self.printed = (self.done, self.postfix)
            text = done_and_left(self.done, self.total, "response", now - self.started)
            postfix = f"; {self.postfix}" if self.postfix else ""
            print(f"{self.desc}: {text}{postfix}", file=self.file, flush=True)

    def close(self) -> None:
        """The last line, unless the one before says the same."""
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()
        if self.printed != (self.done, self.postfix):
            self.line()


class JobHeartbeat:
    """While a job prepares (`with JobHeartbeat(label):` around it), when `file` is not a
    terminal: `label: preparing (model, data, warm-up), 1 min 0 s so far` every `interval_s`,
    until the job's PlainProgress starts (it stops the heartbeat) or the job ends."""

    current: Optional[JobHeartbeat] = None  # the running job's (one job at a time in a process)

    def __init__(self, label: str, enabled: bool = True, file: Optional[IO[str]] = None,
                 interval_s: float = LINE_INTERVAL_S, clock: Callable[[], float] = time.monotonic,
                 timer: bool = True):  # fmt: skip
        self.label, self.file, self.interval_s, self.clock = label, file or sys.stderr, interval_s, clock
        self.enabled = enabled and not _is_terminal(self.file)
        self.timer = timer
        self.started = self.last_line = clock()
        self.stopped = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.successors: list[PlainProgress] = []

    def __enter__(self) -> JobHeartbeat:
        if self.enabled:
            JobHeartbeat.current = self
            if self.timer:
                self.thread = start_ticking(self.tick, self.stopped, self.interval_s)
        return self

    def __exit__(self, *exc) -> None:
        """The job ended (or raised: a signal, an error, whose line must be the last): no more lines."""
        self.stop()
        for progress in self.successors:
            progress.stopped.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()

    def hand_over(self, progress: PlainProgress) -> None:
        """The job's responses are counted now: `progress` gives the lines until the job ends."""
        self.stop()
        self.successors.append(progress)

    def stop(self) -> None:
        self.stopped.set()
        if JobHeartbeat.current is self:
            JobHeartbeat.current = None

    def tick(self) -> None:
        """A line when `interval_s` have passed since the last one (none once stopped)."""
        now = self.clock()
        if self.enabled and not self.stopped.is_set() and now - self.last_line >= self.interval_s:
            self.last_line = now
            print(f"{self.label}: preparing (model, data, warm-up), {duration(now - self.started)} so far",
                  file=self.file, flush=True)  # fmt: skip


def response_progress(total: int, desc: str, enabled: bool, file: Optional[IO[str]] = None, **plain):
    """A job's progress over its `total` responses: tqdm on a terminal, PlainProgress elsewhere,
    a disabled tqdm when progress=false. `plain`: PlainProgress's interval_s, clock, timer."""
    file = file or sys.stderr
    if not enabled or total == 0:
        return tqdm(total=total, disable=True)
    if _is_terminal(file):
        return tqdm(total=total, desc=desc, unit="response", file=file)
    return PlainProgress(total, desc, file, **plain)


def _is_terminal(file: IO[str]) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False
