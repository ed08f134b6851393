"""Progress of long work (packedss.progress): jobs and responses done, left, and the time left
estimated from those finished so far; tqdm on a terminal, plain lines in a log, at least one a
minute. Clocks are fakes and lines are asked for, so no verdict depends on the machine's speed."""

from __future__ import annotations

import io
import threading

import pytest
from tqdm import tqdm

from packedss.progress import LINE_INTERVAL_S, PlainProgress, SweepProgress, done_and_left, duration, response_progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_durations_read_as_a_person_writes_them():
    assert [duration(s) for s in (0, 44.6, 60, 200, 3600, 7500)] == ["0 s", "45 s", "1 min 0 s", "3 min 20 s",
                                                                     "1 h 00 min", "2 h 05 min"]  # fmt: skip


def test_the_estimate_is_the_mean_time_of_those_done_times_those_left():
    # 2 of 6 done in 40 s: 20 s each, 4 left -> 80 s
    assert done_and_left(2, 6, "job", 40) == "2 of 6 jobs done, 4 left, 40 s so far; about 1 min 20 s left (20 s a job, from the 2 done)"
    assert done_and_left(0, 6, "job", 40) == "0 of 6 jobs done, 6 left, 40 s so far; no estimate of the time left yet (none finished)"
    assert done_and_left(6, 6, "job", 90) == "6 of 6 jobs done, 0 left, 1 min 30 s so far"


def test_a_sweep_says_what_is_done_and_left_at_its_start_and_after_each_job():
    clock, log = FakeClock(), io.StringIO()
    progress = SweepProgress(3, file=log, clock=clock)
    clock.now += 30
    progress.job_finished()
    clock.now += 90  # the second job took longer: the estimate is the mean of both
    progress.job_finished(failed=True)
    clock.now += 30
    progress.job_finished()
    assert log.getvalue().splitlines() == [
        "sweep: 0 of 3 jobs done, 3 left, 0 s so far; no estimate of the time left yet (none finished)",
        "sweep: 1 of 3 jobs done, 2 left, 30 s so far; about 1 min 0 s left (30 s a job, from the 1 done)",
        "sweep: 2 of 3 jobs done, 1 left, 2 min 0 s so far; about 1 min 0 s left (1 min 0 s a job, from the 2 done) (1 failed)",
        "sweep: 3 of 3 jobs done, 0 left, 2 min 30 s so far (1 failed)",
    ]


def test_plain_lines_come_at_the_start_every_interval_and_at_the_end():
    clock, log = FakeClock(), io.StringIO()
    progress = PlainProgress(4, "tiny/arith/packed W=8", log, interval_s=60, clock=clock, timer=False)
    clock.now += 10
    progress.update(1)  # within the interval: no line
    progress.set_postfix(tok_s="12.5", accepted="2.00")
    clock.now += 50
    progress.tick()  # 60 s since the last line
    clock.now += 59
    progress.tick()
    clock.now += 20
    progress.update(3)  # 79 s since the last line
    progress.close()
    assert log.getvalue().splitlines() == [
        "tiny/arith/packed W=8: 0 of 4 responses done, 4 left, 0 s so far; no estimate of the time left yet (none finished)",
        "tiny/arith/packed W=8: 1 of 4 responses done, 3 left, 1 min 0 s so far; about 3 min 0 s left (1 min 0 s a "
        "response, from the 1 done); tok_s 12.5, accepted 2.00",
        "tiny/arith/packed W=8: 4 of 4 responses done, 0 left, 2 min 19 s so far; tok_s 12.5, accepted 2.00",
    ]  # close adds none: the last line says it already
    clock.now += 5
    ended = PlainProgress(1, "job", log, interval_s=60, clock=clock, timer=False)
    ended.update(1)
    ended.close()
    assert log.getvalue().splitlines()[-1] == "job: 1 of 1 responses done, 0 left, 0 s so far"


def test_a_log_gets_a_line_at_least_once_a_minute():
    assert LINE_INTERVAL_S <= 60


class Lines(io.StringIO):
    """A log that says when its n-th line is written."""

    def __init__(self, wanted: int) -> None:
        super().__init__()
        self.wanted, self.reached = wanted, threading.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if self.getvalue().count("\n") >= self.wanted:
            self.reached.set()
        return written


def test_the_timer_gives_a_line_while_no_response_ends():
    clock, log = FakeClock(), Lines(wanted=2)
    progress = PlainProgress(2, "job", log, interval_s=60, clock=clock)
    clock.now += 61  # a minute passes inside one response: only the timer can give the line
    try:
        assert log.reached.wait(timeout=120), log.getvalue()
    finally:
        progress.close()
    lines = log.getvalue().splitlines()
    assert lines[1] == "job: 0 of 2 responses done, 2 left, 1 min 1 s so far; no estimate of the time left yet (none finished)"


def test_tqdm_on_a_terminal_plain_lines_elsewhere_nothing_when_disabled():
    on_terminal = response_progress(3, "job", True, file=Terminal())
    assert isinstance(on_terminal, tqdm) and not on_terminal.disable
    on_terminal.close()
    log = io.StringIO()
    in_a_log = response_progress(3, "job", True, file=log, timer=False)
    assert isinstance(in_a_log, PlainProgress)
    in_a_log.close()
    assert log.getvalue().startswith("job: 0 of 3 responses done")
    quiet = io.StringIO()
    disabled = response_progress(3, "job", False, file=quiet)
    disabled.update(1)
    disabled.close()
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("progress", ["true", "false"])
def test_a_job_whose_stderr_is_a_log_writes_its_progress_lines_there(progress, tmp_path):
    from tests.bad_inputs import run_py

    result = run_py([f"progress={progress}", "limit=2", "max_new_tokens=8", f"out_dir={tmp_path / 'out'}"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("tiny/arith/packed W=8: ")]
    if progress == "false":
        assert lines == []
    else:
        assert lines[0].startswith("tiny/arith/packed W=8: 0 of 2 responses done, 2 left")
        assert lines[-1].startswith("tiny/arith/packed W=8: 2 of 2 responses done, 0 left")


def test_a_job_preparing_gives_lines_until_its_responses_are_counted():
    from packedss.progress import JobHeartbeat

    clock, log = FakeClock(), io.StringIO()
    with JobHeartbeat("tiny/arith/packed", file=log, interval_s=30, clock=clock, timer=False) as heartbeat:
        clock.now += 10
        heartbeat.tick()  # within the interval: no line
        clock.now += 20
        heartbeat.tick()
        clock.now += 45
        heartbeat.tick()
        responses = PlainProgress(2, "tiny/arith/packed W=8", log, clock=clock, timer=False)  # takes over
        clock.now += 60
        heartbeat.tick()
    responses.tick()  # the job ended without closing it (a signal, an error): its lines end with the job
    assert log.getvalue().splitlines() == [
        "tiny/arith/packed: preparing (model, data, warm-up), 30 s so far",
        "tiny/arith/packed: preparing (model, data, warm-up), 1 min 15 s so far",
        "tiny/arith/packed W=8: 0 of 2 responses done, 2 left, 0 s so far; no estimate of the time left yet (none finished)",
    ]
    assert JobHeartbeat.current is None
    terminal = Terminal()
    with JobHeartbeat("job", file=terminal, interval_s=30, clock=clock, timer=False) as quiet:
        clock.now += 60
        quiet.tick()  # tick is asked for here; on a terminal the heartbeat is off (no thread, no current)
        assert JobHeartbeat.current is None
    assert terminal.getvalue() == ""


def test_the_heartbeats_timer_gives_its_line_within_a_second_of_it_being_due():
    """The heartbeat's lines come from the timer alone while a job loads; the timer asks at least
    once a second (not once an interval: the fake clock's 31 s pass at once, the wall's do not)."""
    from packedss.progress import JobHeartbeat

    clock, log = FakeClock(), Lines(wanted=1)
    with JobHeartbeat("tiny/arith/packed", file=log, interval_s=30, clock=clock):
        clock.now += 31
        reached = log.reached.wait(timeout=25)  # well under the 30 s a timer waiting an interval would take
    assert reached, log.getvalue()
    assert log.getvalue().splitlines() == ["tiny/arith/packed: preparing (model, data, warm-up), 31 s so far"]
