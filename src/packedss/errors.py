"""The one exception type the harness raises for bad input: its message says what was wrong and how
to fix it; and how every entry point reports it: one line `error: <what>; <fix>` on stderr, exit
status 2 (130 / 143 when a signal stopped the job). PACKEDSS_TRACEBACK=1 prints the traceback too.

Hydra's and OmegaConf's own errors (an unknown group option, an unknown key, a wrong type) are
bad input as well: `hydra_message` turns each into one line that names the valid choices or the
closest key."""

from __future__ import annotations

import argparse
import difflib
import errno
import math
import os
import re
import signal
import sys
import traceback
from typing import Callable, NoReturn, Optional

TRACEBACK_VARIABLE = "PACKEDSS_TRACEBACK"
INTERRUPTED = "interrupted; rerun the same command to resume"
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class PackedSSError(Exception):
    """A user-facing error with a clear, single message (no traceback needed to act on it)."""

    exit_status = 2


class Stopped(PackedSSError):
    """A signal stopped the job (SIGINT: Ctrl-C; SIGTERM: preemption); exit status 128 + signal."""

    def __init__(self, signum: int | str):
        if isinstance(signum, str):  # OmegaConf re-raises an error inside it as type(err)(its own message)
            words = signum.split(";")[0].split()
            signum = signal.Signals[words[-1]] if signum.startswith("stopped by ") else signal.SIGINT
        name = signal.Signals(signum).name
        super().__init__(INTERRUPTED if signum == signal.SIGINT else f"stopped by {name}; rerun the same command to resume")
        self.exit_status = 128 + signum


class InvalidJobs(PackedSSError):
    """The invalid jobs of a sweep: a first line that sums them up, then each job and its problem
    on lines of their own (the one message of more than one line)."""


_SIGNALS_STOPPED_BY: list[int] = []


def note_stop(signum: int) -> None:
    """Remember that a signal stopped the job: a library that catches the exception its handler
    raises while it loads (numpy's import turns it into an ImportError) must not turn the stop
    into a traceback. `stop_received` finds it again."""
    _SIGNALS_STOPPED_BY.append(signum)


def stop_received() -> Optional[Stopped]:
    """The stop a signal asked for, whatever exception it became on its way up; None without one.
    It is told once: the stop is forgotten."""
    if not _SIGNALS_STOPPED_BY:
        return None
    signum = _SIGNALS_STOPPED_BY[0]
    _SIGNALS_STOPPED_BY.clear()
    return Stopped(signum)


def raise_stopped(signum, frame) -> NoReturn:
    note_stop(signum)
    raise Stopped(signum)


def one_line(message: str) -> str:
    """A message on one line: its lines joined, runs of whitespace collapsed."""
    return " ".join(str(message).split())


def closest(word: str, choices) -> str:
    """' (did you mean X?)' for the nearest of `choices`, '' when none is near."""
    match = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {match[0]}?)" if match else ""


def unknown_key_message(full_key: str, valid) -> str:
    """An unknown config key, with the closest valid one and all of them."""
    key = full_key.rpartition(".")[2]
    valid = list(valid)
    if not valid:
        return f"unknown key {full_key}; remove it"
    return f"unknown key {full_key}{closest(key, valid)}; fix or remove it (valid keys: {', '.join(valid)})"


def hydra_message(err: BaseException) -> Optional[str]:
    """One line for a Hydra composition or OmegaConf error; None when `err` is neither (and when
    they are not installed: then no error can be theirs)."""
    try:
        from hydra.errors import HydraException, MissingConfigException, OverrideParseException
        from omegaconf import DictConfig
        from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError
    except ImportError:
        return None

    if isinstance(err, MissingConfigException):
        found = re.search(r"Could not find '([^']+)'", str(err))
        missing = found.group(1) if found else (err.missing_cfg_file or "")
        group, _, option = missing.rpartition("/")
        options = sorted(err.options or [])
        if options:
            return (f"Could not find '{missing}'{closest(option, options)}; valid choices for {group}: "
                    f"{', '.join(options)}")  # fmt: skip
        return f"Could not find '{missing}'; check the config name and the search path (conf/)"
    if isinstance(err, OverrideParseException):
        return f"cannot parse the override: {one_line(str(err).splitlines()[0])}; write key=value (docs: README 'Running')"
    cause = err.__cause__ if isinstance(err, HydraException) else err
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and getattr(cause, "full_key", None):
        keys = cause.parent_node.keys() if isinstance(cause.parent_node, DictConfig) else ()
        valid = [str(k) for k in keys if k != "hydra" and not str(k).startswith("_")]
        return unknown_key_message(str(cause.full_key), valid)
    if isinstance(cause, ValidationError) and getattr(cause, "full_key", None):
        reason = str(cause).splitlines()[0]
        return f"invalid value for {cause.full_key}: {reason}; give {cause.full_key} a value of its type (docs/configuration.md, top-level keys)"
    if isinstance(cause, OmegaConfBaseException) or isinstance(err, HydraException):
        text = str(err) if cause is None or cause is err else f"{err} ({str(cause).splitlines()[0]})"
        return one_line(text)
    return None


def user_message(err: BaseException) -> Optional[str]:
    """The one-line message of a bad-input error; None for anything else (a bug: traceback)."""
    if isinstance(err, InvalidJobs):
        return str(err)
    if isinstance(err, PackedSSError):
        return one_line(str(err))
    if isinstance(err, OSError) and err.errno in FULL_DISK:  # Hydra's own files, a cache
        where = f" writing {err.filename}" if err.filename else ""
        return f"{err.strerror}{where}; free space on its disk, then rerun the same command to resume"
    return hydra_message(err)


def report(message: str, err: Optional[BaseException] = None) -> None:
    if err is not None and os.environ.get(TRACEBACK_VARIABLE):
        traceback.print_exception(type(err), err, err.__traceback__)
    print(f"error: {message}", file=sys.stderr, flush=True)


def exit_status(err: BaseException) -> int:
    return getattr(err, "exit_status", 2)


def run_reporting(main: Callable[[], Optional[int]]) -> int:
    """main's exit status; a bad-input error or Ctrl-C is reported in one line and gives its status."""
    _SIGNALS_STOPPED_BY.clear()  # a stop an earlier main of this process caught itself is not this one's
    try:
        return main() or 0
    except KeyboardInterrupt as err:
        report(INTERRUPTED, err)
        return 130
    except SystemExit as err:
        if not isinstance(err.code, str):
            raise
        report(one_line(err.code))  # a library's `raise SystemExit(message)`
        return 2
    except Exception as err:
        err = stop_received() or err
        message = user_message(err)
        if message is None:
            raise
        report(message, err)
        return exit_status(err)


def run_cli(main: Callable[[], Optional[int]]) -> None:
    """Run an entry point's main; exit with its status when it failed. SIGTERM stops it like
    Ctrl-C (143)."""
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, raise_stopped)
    status = run_reporting(main)
    if status:
        sys.exit(status)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (`error: ...; see --help`), exit status 2."""

    def error(self, message: str) -> NoReturn:
        report(f"{one_line(message)}; see {self.prog} --help")
        sys.exit(2)


def number(kind: type = int, minimum: float | None = None) -> Callable[[str], float]:
    """An argparse type: a finite number of `kind`, at least `minimum`."""
    expected = ("an integer" if kind is int else "a finite number") + (f" >= {minimum:g}" if minimum is not None else "")

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not math.isfinite(value) or (minimum is not None and value < minimum):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


def numbers(minimum: int = 1) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated integers, each at least `minimum`."""
    one = number(int, minimum)

    def parse(text: str) -> list[int]:
        return [one(part.strip()) for part in text.split(",")]

    return parse


def names(valid) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names, each one of `valid`."""

    def parse(text: str) -> list[str]:
        chosen = [part.strip() for part in text.split(",") if part.strip()]
        unknown = [name for name in chosen if name not in valid]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown) or 'empty list'}; valid: {', '.join(valid)}")
        return chosen

    return parse
