"""Which sandboxed programs of this process run at a time (packedss.tasks.sandbox): any number
beside each other, or one alone, as the code graders' second attempt after a timeout runs
(docs/sandbox.md §8)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ProgramGate:
    """Which sandboxed programs of this process may run at a time: any number beside each other
    (`beside_others`), or one with no other running (`alone`). A program waiting to run alone
    keeps new ones from starting, so it runs as soon as those already running have ended."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = 0
        self._alone_waiting = 0
        self._alone_running = False

    @contextmanager
    def beside_others(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._alone_running and not self._alone_waiting)
            self._running += 1
        try:
            yield
        finally:
            with self._changed:
                self._running -= 1
                self._changed.notify_all()

    @contextmanager
    def alone(self) -> Iterator[None]:
        with self._changed:
            self._alone_waiting += 1
            self._changed.wait_for(lambda: not self._alone_running and self._running == 0)
            self._alone_waiting -= 1
            self._alone_running = True
        try:
            yield
        finally:
            with self._changed:
                self._alone_running = False
                self._changed.notify_all()


#: every sandboxed program of this process (a job, or one `python -m packedss.grade`) passes it
PROGRAMS = ProgramGate()
