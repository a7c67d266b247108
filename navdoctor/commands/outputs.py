"""The outputs every command shares: progress lines, output paths checked before any work
(never replacing what the user had), reports written atomically and announced."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

import click

from .. import store
from ..collect.rundir import TRACE_NAMES, is_run_dir
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


def write_reports(outputs, report, html_data: dict | None, json_path: str | None,
                  md_path: str | None, html_path: str | None, quiet: bool) -> None:
    """The reports the user asked for (JSON or the terminal's, Markdown, HTML), each on its own
    through `outputs` (attempts.Outputs): one that fails leaves the others written."""
    outputs.write(json_path if json_path and json_path != "-" else "the report",
                  lambda: emit_report(report, json_path, quiet))
    outputs.write(md_path, lambda: write_markdown(report, md_path))
    outputs.write(html_path, lambda: write_html(report, html_data, html_path,
                                                announce=not quiet and json_path != "-"))


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


def check_html_path(html_path: str | None) -> None:
    """--html PATH: a file path navdoctor may write (as --json); that it is not the path of
    another output is check_outputs' business."""
    if not html_path:
        return
    from ..reporters.html import is_navdoctor_html
    if html_path == "-":
        raise NavdoctorError("--html needs a file path ('-' is for --json)")
    check_output_path(html_path, "--html", "HTML report", is_navdoctor_html)


# What a `diagnose` run folder holds that navdoctor or the user may read again: its traces
# (collect/rundir.py) and reports. A folder holding one of these traces is an input's run
# folder, and none of these files of it is ever an output of another command.
RUN_DIR_FILES = (*(name for names in TRACE_NAMES for name in names),
                 "report.json", "report.md", "report.html", "trace.duckdb")


def check_outputs(outputs: dict[str, str | None], inputs=(), db: str | None = None) -> None:
    """Before any work: every output path (option -> path; '-' is stdout) is its own, and
    none of them is an input, or a file of an input's run folder (its traces, report.json,
    report.md, report.html, trace.duckdb: `compare runA runB --json runA/report.json` would
    replace the run's own report), so that no output replaces another or what the run
    reads, and a rerun gives the same result. db: --db's path (a new file: checked here
    too, so that a missing folder is said before the analysis, not by DuckDB after it)."""
    if db:
        outputs = {**outputs, "--db": db}
        check_db_path(db)
    named = [(option, path) for option, path in outputs.items() if path and path != "-"]
    seen: dict[str, str] = {}
    for option, path in named:
        key = _identity(path)
        if key in seen:
            raise NavdoctorError(f"{path}: is the path of both {seen[key]} and {option}; "
                                 "give each output a path of its own")
        seen[key] = option
    protected = _protected(inputs)
    for option, path in named:
        why = protected.get(_identity(path))
        if why:
            raise NavdoctorError(f"{path}: {why}; choose another {option} path")


def _identity(path: str) -> str:
    """A path as one file: symbolic links and '..' resolved (a hard link to an existing file
    by its device and inode)."""
    p = Path(path)
    try:
        st = p.stat()
        if p.is_file():
            return f"inode:{st.st_dev}:{st.st_ino}"
    except OSError:
        pass
    return str(p.resolve())


def _protected(inputs) -> dict[str, str]:
    """identity -> why no output may be written there: the inputs, and the files of their
    run folders (a folder holding a run's trace)."""
    out: dict[str, str] = {}
    for item in inputs:
        if not item:
            continue
        p = Path(item)
        if p.exists():
            out.setdefault(_identity(str(p)), f"is one of the inputs ({item})")
        folder = p if p.is_dir() else p.parent
        try:
            is_run = is_run_dir(folder)
        except OSError:
            is_run = False
        if is_run:
            for name in RUN_DIR_FILES:
                out.setdefault(_identity(str(folder / name)),
                               f"is a file of the run folder of an input ({folder})")
    return out


def discard_database(db_path: str) -> None:
    """The --db file of a run that failed or was interrupted, and its write-ahead log:
    removed, so that the retry's --db is free (check_db_path made sure that nothing was
    there before the run)."""
    for path in (db_path, db_path + ".wal"):
        try:
            os.unlink(path)
        except OSError:
            pass


def check_db_path(db_path: str) -> None:
    """--db PATH: a new file in an existing, writable folder (navdoctor never replaces a
    database)."""
    p = Path(db_path)
    if db_path.endswith(os.sep) or p.is_dir():
        raise NavdoctorError(f"{db_path}: is a directory (--db needs a file path)")
    if os.path.lexists(db_path):
        raise NavdoctorError(f"{db_path}: already exists; navdoctor never overwrites a database "
                             "(choose a new --db path)")
    parent = p.parent
    if not parent.exists():
        raise NavdoctorError(f"{db_path}: directory {parent} does not exist")
    if not parent.is_dir():
        raise NavdoctorError(f"{db_path}: {parent} is not a directory")
    if not _can_create_in(parent):
        raise NavdoctorError(f"{db_path}: cannot write in {parent} (permission denied or "
                             "read-only); choose another --db path")


def check_output_path(path: str | None, option: str = "--json", what: str = "report",
                      ours=None) -> None:
    """A path navdoctor may write: a file in an existing directory, and, if it exists, one
    navdoctor wrote (`ours`; by default a navdoctor JSON report). Never replace what the user
    had (a trace given by mistake, say); an earlier navdoctor output is replaced, as asked."""
    from ..report import is_navdoctor_report
    if not path or path == "-":
        return
    p = Path(path)
    if p.is_dir() or path.endswith(os.sep) or (os.altsep and path.endswith(os.altsep)):
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
