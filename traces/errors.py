"""The project's error hierarchy.

Every error a user can cause derives from `EplbError`; its message is one line that says what was expected,
what was found, and how to fix it. The command line prints that line and exits with status 2.
It lives in `traces` because `traces` is the one package every other package may import.
"""


class EplbError(Exception):
    """Base of all errors caused by bad input or an impossible request."""


class TraceFormatError(EplbError, ValueError):
    """A routing trace file or array is missing, unreadable, or has the wrong shape, dtype or values."""
