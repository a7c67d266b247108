"""Outputs written one by one: one that cannot be written (the HTML page without plotly, a
full disk) leaves the others written, and is said in one line each; the command then exits 2
(docs/report.md, "Exit codes")."""
from __future__ import annotations

from typing import Callable

import click

from ..errors import NavdoctorError


class Outputs:
    def __init__(self) -> None:
        self.failed: list[str] = []
        self.attempted = 0

    def write(self, what: str | None, write: Callable[[], None]) -> None:
        """Run write(); a failure is kept (what: the output's path or name)."""
        if not what:
            return
        self.attempted += 1
        try:
            write()
        except (KeyboardInterrupt, SystemExit):
            raise
        except NavdoctorError as e:   # (its message names the file where it is about one)
            self.failed.append(str(e) if str(e).startswith(f"{what}:") else f"{what}: {e}")
        except OSError as e:
            self.failed.append(f"{what}: {e.strerror or e}")
        except Exception as e:  # a reporter's bug must not cost the other outputs
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self.failed.append(f"{what}: {type(e).__name__}: {first}")

    def report(self) -> int:
        """One line per output not written; 2 if any, else 0."""
        others = " (the other outputs are written)" if self.attempted > 1 else ""
        for line in self.failed:
            click.echo(f"navdoctor: error: {line}{others}" if ": cannot write" in line else
                       f"navdoctor: error: could not write {line}{others}", err=True)
        return 2 if self.failed else 0
