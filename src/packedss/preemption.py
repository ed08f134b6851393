"""Preemption-safe jobs. A cluster ends a job with a signal: SLURM sends SIGTERM when it preempts
a job, submitit sends SIGUSR2 shortly before the time limit (and then requeues the job). On
either, the response in flight is abandoned, never half-written: a record is appended, flushed
and fsynced as a whole, and a signal that arrives while one is written takes effect right after.
The job then stops; its next run resumes from the records on disk and loses nothing. Ctrl-C
(SIGINT) stops it the same way, with exit status 130 (143 for SIGTERM: 128 + the signal).

A handler installed before ours (submitit's requeue on SIGUSR2) still runs, after the record
file is safe; without one the job raises `Preempted`."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

from packedss.errors import Stopped, note_stop, raise_stopped

SIGNALS = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)


def slurm_attempt() -> dict | None:
    """Which SLURM run of a job this process is, for the records it writes: the job's id as squeue
    shows it (`<array job>_<task>` for a task of a sweep's array) and SLURM_RESTART_COUNT (0 for
    the first run, one more at each requeue, preemption or time limit). None outside SLURM."""
    if "SLURM_JOB_ID" not in os.environ:
        return None
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job_id = f"{array}_{task}" if array and task else os.environ["SLURM_JOB_ID"]
    return {"job_id": job_id, "restart_count": int(os.environ.get("SLURM_RESTART_COUNT") or 0)}


class Preempted(Stopped):
    """The job was told to stop (SIGTERM, SIGUSR2 or SIGINT) and did, at a record boundary."""


class SignalGuard:
    """While active, SIGTERM/SIGUSR2 stop the job, except inside `critical()`, where they wait."""

    def __init__(self):
        self._previous: dict[int, object] = {}
        self._in_critical = False
        self._pending: int | None = None

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self._in_critical:
            self._pending = signum
            return
        self._stop(signum, frame)

    def _stop(self, signum, frame) -> None:
        previous = self._previous.get(signum)
        # Python's and the entry points' own handlers only raise: Preempted says the same
        if callable(previous) and previous not in (signal.default_int_handler, raise_stopped):
            previous(signum, frame)  # e.g. submitit: checkpoint, requeue, exit
        note_stop(signum)
        raise Preempted(signum)

    @contextlib.contextmanager
    def critical(self):
        """Defer the stop until the block is done (a record being written)."""
        self._in_critical = True
        try:
            yield
        finally:
            self._in_critical = False
        if self._pending is not None:
            signum, self._pending = self._pending, None
            self._stop(signum, None)
