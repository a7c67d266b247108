"""Errors the user sees as one line (and exit 2), never as a traceback."""
from __future__ import annotations

import signal

# Set by the CLI's SIGINT handler (note_interrupt): once the user pressed Ctrl-C, an error that
# follows is the interrupt's doing. DuckDB turns a SIGINT inside a query into its own error,
# and a loader thread still using the connection then fails with "connection is busy"
# (seen under load in tests/test_no_data_loss.py), which must read as interrupted too.
interrupt_seen = False


def note_interrupt(signum, frame) -> None:
    """SIGINT: remember it, then Python's own behaviour (KeyboardInterrupt)."""
    global interrupt_seen
    interrupt_seen = True
    signal.default_int_handler(signum, frame)


def interrupted(e: BaseException) -> bool:
    """DuckDB turns a SIGINT that arrives during a query into RuntimeError('Query
    interrupted') or InterruptException, and Python's KeyboardInterrupt is lost; a DuckDB
    error after a Ctrl-C the CLI saw and did not handle (errors.interrupt_seen: a loader thread
    left with a busy connection) is the interrupt's too."""
    import duckdb
    return (interrupt_seen and isinstance(e, duckdb.Error)) or isinstance(e, duckdb.InterruptException) or (
        isinstance(e, RuntimeError) and "interrupted" in str(e).lower())


class NavdoctorError(Exception):
    """A problem with the user's input or usage; str(e) is the one-line message."""


class TraceError(NavdoctorError):
    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self):
        # A rank's error crosses a process boundary (pool, Dask); pickle's default would call
        # __init__ with the message alone, which kills the pool's result thread: a hang.
        return (type(self), (self.path, self.reason))


class RuleError(NavdoctorError):
    def __init__(self, file: str, rule_id: str | None, field: str | None, reason: str):
        where = file
        if rule_id:
            where += f": rule '{rule_id}'"
        if field:
            where += f": field '{field}'"
        super().__init__(f"{where}: {reason}")
        self.file, self.rule_id, self.field, self.reason = file, rule_id, field, reason

    def __reduce__(self):
        return (type(self), (self.file, self.rule_id, self.field, self.reason))
