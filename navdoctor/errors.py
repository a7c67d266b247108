"""Errors the user sees as one line (and exit 2), never as a traceback."""
from __future__ import annotations


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
