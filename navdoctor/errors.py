"""Errors the user sees as one line (and exit 2), never as a traceback; and the signals that
end a run (Ctrl-C: exit 130, SIGTERM: exit 143), wherever the run is."""
from __future__ import annotations

import signal

# Set by the CLI's signal handlers (note_interrupt, note_terminate): once the user pressed
# Ctrl-C (or the run was sent SIGTERM), an error that follows is the signal's doing. DuckDB
# turns a SIGINT inside a query into its own error, and a loader thread still using the
# connection then fails with "connection is busy" (seen under load in
# tests/test_no_data_loss.py), which must read as interrupted too.
interrupt_seen = False
# SIGTERM in particular: the run ends with exit 143 rather than 130.
terminate_seen = False

# SQLite virtual-machine instructions between two calls of sqlite_progress (about a
# millisecond of work): a statement of SQLite's that a signal interrupts stops this soon.
SQLITE_PROGRESS_STEPS = 100_000


class Terminated(KeyboardInterrupt):
    """SIGTERM: unwinds as Ctrl-C does (every `except KeyboardInterrupt` cleans up the same
    way: children stopped, temporary files removed, partial outputs discarded); the CLI then
    exits 143."""


def note_interrupt(signum, frame) -> None:
    """SIGINT: remember it, then Python's own behaviour (KeyboardInterrupt)."""
    global interrupt_seen
    interrupt_seen = True
    signal.default_int_handler(signum, frame)


def note_terminate(signum, frame) -> None:
    """SIGTERM: remember it, then unwind (Terminated)."""
    global interrupt_seen, terminate_seen
    interrupt_seen = terminate_seen = True
    raise Terminated()


def reset_signals() -> None:
    """A new run in this process: an earlier run's signal is not this one's."""
    global interrupt_seen, terminate_seen
    interrupt_seen = terminate_seen = False


def sqlite_progress() -> int:
    """sqlite3's progress handler (Connection.set_progress_handler): non-zero stops the
    statement. SQLite does not look at signals, and Python runs a signal's handler only
    between its own instructions, so without this a statement of SQLite's (a view over an
    endless recursive query, a cross join) ignores Ctrl-C. Calling this Python function from
    SQLite's loop lets the handler run (and note the signal); the statement then stops, and
    its sqlite3.OperationalError('interrupted') reads as the interrupt (interrupted())."""
    return 1 if interrupt_seen else 0


def guard_sqlite(con) -> None:
    """Make a sqlite3 connection stop within a millisecond or so of Ctrl-C or SIGTERM."""
    con.set_progress_handler(sqlite_progress, SQLITE_PROGRESS_STEPS)


def interrupted(e: BaseException) -> bool:
    """DuckDB turns a SIGINT that arrives during a query into RuntimeError('Query
    interrupted') or InterruptException, and Python's KeyboardInterrupt is lost; a DuckDB
    error after a Ctrl-C the CLI saw and did not handle (errors.interrupt_seen: a loader thread
    left with a busy connection) is the interrupt's too; and so is a sqlite3 error after one
    (sqlite_progress stopped the statement)."""
    import sqlite3

    import duckdb
    if interrupt_seen and isinstance(e, (duckdb.Error, sqlite3.Error)):
        return True
    return isinstance(e, duckdb.InterruptException) or (
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
