"""The one exception type the harness raises for bad input: its message says what was wrong and how to fix it."""


class PackedSSError(Exception):
    """A user-facing error with a clear, single message (no traceback needed to act on it)."""
