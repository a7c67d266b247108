"""The outputs every command shares: progress lines, output paths checked before any work
(never replacing what the user had), reports written atomically and announced."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

import click

from .. import store
from ..errors import NavdoctorError
from ..textsafe import terminal_text


def progress_printer(quiet: bool) -> Callable[[str], None]:
    def emit(message: str) -> None:
        if not quiet:
            click.echo(f"navdoctor: {terminal_text(message)}", err=True)
    return emit


def emit(json_text: str, render, json_path: str | None, quiet: bool, announce: bool = True) -> None:
    """The JSON to stdout ('-') or to a file, and unless quiet the terminal text (render(),
    called only when shown) and, with announce, where the JSON went."""
    from ..report import write_atomic
    if json_path == "-":
        click.echo(json_text, nl=False)
        return
    if json_path:
        write_atomic(json_path, json_text)
    if not quiet:
        click.echo(render(), nl=False)
        if json_path and announce:
            click.echo(f"JSON report: {terminal_text(json_path)}")


def emit_report(report, json_path: str | None, quiet: bool) -> None:
    from ..report import render_terminal, report_to_json
    emit(report_to_json(report),
         lambda: render_terminal(report, color=sys.stdout.isatty()) + "\n", json_path, quiet)


def terminal_block(text: str) -> str:
    """Text of several lines made safe for the terminal, line by line (textsafe)."""
    return "".join(terminal_text(line) + ("\n" if end else "")
                   for line, end in _lines_and_ends(text))


def _lines_and_ends(text: str):
    parts = text.split("\n")
    for i, part in enumerate(parts):
        if i < len(parts) - 1 or part:
            yield part, i < len(parts) - 1


def fail_on_exit(report, fail_on: set[str]) -> int:
    hits = [f for f in report.findings if f.category in fail_on]
    if hits:
        click.echo(f"navdoctor: --fail-on: {len(hits)} finding(s) in "
                   f"{', '.join(sorted({f.category for f in hits}))}", err=True)
        return 1
    return 0


def write_html(report, html_data: dict | None, html_path: str | None, announce: bool = False) -> None:
    if html_path:
        from ..reporters.html import render_report_html
        from ..report import write_atomic
        write_atomic(html_path, render_report_html(report, html_data))
        if announce:
            click.echo(f"HTML report: {terminal_text(html_path)}")


def write_markdown(report, md_path: str | None) -> None:
    if md_path:
        from ..report import render_markdown, write_atomic
        write_atomic(md_path, render_markdown(report))


def check_before_work(json_path: str | None) -> None:
    """What would otherwise stop a command only after its work (diagnose: the script run
    twice): a malformed NAVDOCTOR_MEMORY_LIMIT, a --json path that cannot be written."""
    store.memory_limit()
    check_output_path(json_path)


def check_markdown_path(md_path: str | None) -> None:
    from ..report import is_navdoctor_summary
    # An empty file (GitHub's step summary at the start of a step) holds nothing to lose.
    check_output_path(md_path, "--markdown", "summary",
                      lambda p: p.stat().st_size == 0 or is_navdoctor_summary(p))


def check_html_path(html_path: str | None, *others: str | None) -> None:
    """--html PATH: a file path navdoctor may write (as --json), and not the path another
    output option of the same command writes."""
    if not html_path:
        return
    from ..reporters.html import is_navdoctor_html
    if html_path == "-":
        raise NavdoctorError("--html needs a file path ('-' is for --json)")
    check_output_path(html_path, "--html", "HTML report", is_navdoctor_html)
    if html_path and any(o and o != "-" and Path(o).resolve() == Path(html_path).resolve()
                         for o in others):
        raise NavdoctorError(f"{html_path}: is also the path of another output option; "
                             "give --html a path of its own")


def check_output_path(path: str | None, option: str = "--json", what: str = "report",
                      ours=None) -> None:
    """A path navdoctor may write: a file in an existing directory, and, if it exists, one
    navdoctor wrote (`ours`; by default a navdoctor JSON report). Never replace what the user
    had (a trace given by mistake, say); an earlier navdoctor output is replaced, as asked."""
    from ..report import is_navdoctor_report
    if not path or path == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise NavdoctorError(f"{path}: is a directory ({option} needs a file path)")
    if not p.parent.exists():
        raise NavdoctorError(f"{path}: directory {p.parent} does not exist")
    if p.exists() and not (ours or is_navdoctor_report)(p):
        raise NavdoctorError(f"{path}: exists and is not a navdoctor {what}; "
                             f"choose another {option} path")
    if not p.parent.is_dir():
        raise NavdoctorError(f"{path}: {p.parent} is not a directory")
    if not _can_create_in(p.parent):  # the write goes through a temp file in that directory
        raise NavdoctorError(f"{path}: cannot write in {p.parent} (permission denied or "
                             f"read-only); choose another {option} path")


def _can_create_in(directory: Path) -> bool:
    import tempfile
    try:
        fd, tmp = tempfile.mkstemp(prefix=".navdoctor-check-", dir=directory)
    except OSError:
        return False
    os.close(fd)
    os.unlink(tmp)
    return True
