"""`navdoctor compare`: before and after captures, faster, slower or within the noise."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import click

from ..errors import NavdoctorError
from ..textsafe import terminal_text
from .outputs import (check_before_work, check_html_path, check_outputs, emit, progress_printer,
                      terminal_block)


def run(before_items: Sequence[str], after_items: Sequence[str], margin: float,
        fail_slower: float | None, fail_cats: set[str], rules_dirs: Sequence[str],
        json_path: str | None, html_path: str | None, quiet: bool) -> int:
    from ..compare import analyse_capture, compare_captures, new_finding_categories, render_text
    from ..rulecheck import require_valid_sql
    from ..rules import load_rules
    check_before_work(json_path)
    check_html_path(html_path)
    # the captures, the traces they stand for, and their run folders' reports are inputs
    items = [*before_items, *after_items]
    check_outputs({"--json": json_path, "--html": html_path}, items + _traces_of(items))
    rules = load_rules([Path(d) for d in rules_dirs])
    require_valid_sql(rules)
    progress = progress_printer(quiet or json_path == "-")
    caps = {}
    for side, items in (("before", before_items), ("after", after_items)):
        caps[side] = []
        for item in items:
            progress(f"{side}: analysing {item}")
            caps[side].append(analyse_capture(item, rules))
    result = compare_captures(caps["before"], caps["after"], margin)
    emit(result.model_dump_json(indent=2) + "\n", lambda: terminal_block(render_text(result)), json_path, quiet,
         announce=False)
    if html_path:
        from ..report import write_atomic
        from ..reporters.html import render_compare_html
        write_atomic(html_path, render_compare_html(result.model_dump()))
        if not quiet and json_path != "-":
            click.echo(f"HTML: {terminal_text(html_path)}")
    code = 0
    slow_low = result.step_time.slowdown_ci[0]
    if fail_slower is not None and result.step_time.comparable and slow_low > fail_slower / 100:
        click.echo(f"navdoctor: --fail-if-slower: at least {slow_low:.1%} slower "
                   f"(the whole interval above {fail_slower:g}%)", err=True)
        code = 1
    new = new_finding_categories(result, caps["after"]) & fail_cats
    if new:
        click.echo(f"navdoctor: --fail-on-new: new finding(s) in {', '.join(sorted(new))}", err=True)
        code = 1
    return code


def _traces_of(items: Sequence[str]) -> list[str]:
    """The trace files the captures stand for (a report names them; a run folder holds
    them), where they can be found: outputs must not replace them or their run's reports."""
    from ..compare import resolve
    found: list[str] = []
    for item in items:
        try:
            found += resolve(item)
        except NavdoctorError:
            pass   # said when the capture is analysed
    return found
