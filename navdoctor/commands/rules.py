"""`navdoctor rules list | check | test | explain`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import click

from ..errors import NavdoctorError
from ..textsafe import terminal_text
from .outputs import progress_printer, terminal_block


def rules_list(rules_dirs: Sequence[str], as_json: bool) -> int:
    from ..rules import load_rules
    loaded = load_rules([Path(d) for d in rules_dirs])
    if as_json:
        click.echo(json.dumps([r.model_dump(mode="json") for r in loaded], indent=2))
        return 0
    for r in sorted(loaded, key=lambda r: (r.category, r.id)):
        params = ", ".join(f"{k}={v}" for k, v in r.params.items())
        click.echo(terminal_text(f"{r.id:32} {r.category:8} {r.severity:8} {r.title}"
                                 + (f"  [{params}]" if params else "")))
    return 0


def rules_check(directory: str) -> int:
    from ..rulecheck import check_rules
    from ..rules import load_rules_dir
    loaded = load_rules_dir(Path(directory))
    problems = check_rules(loaded)
    for e in problems:
        click.echo(f"error: {terminal_text(str(e))}", err=True)
    if problems:
        return 2
    click.echo(terminal_text(f"{len(loaded)} rule(s) OK in {directory}"))
    return 0


def rules_test(directory: str, require_examples: bool, quiet: bool) -> int:
    from ..rulecheck import check_rules
    from ..rules import load_rules_dir
    from ..ruletest import run_examples
    loaded = load_rules_dir(Path(directory))
    problems = check_rules(loaded)
    if problems:
        raise problems[0]
    results, without = run_examples(loaded, progress_printer(quiet))
    for r in results:
        if not quiet or not r.passed:
            click.echo(terminal_text(r.line()))
    missing = []
    if require_examples:
        for rule in loaded:
            kinds = {ex.expect for ex in rule.examples}
            for k in ("fire", "quiet"):
                if k not in kinds:
                    missing.append(f"FAIL {rule.id}: no example where it must {'fire' if k == 'fire' else 'stay quiet'}")
    for line in missing:
        click.echo(terminal_text(line))
    failed = sum(not r.passed for r in results) + len(missing)
    note = f"; {len(without)} rule(s) without examples" if without and not require_examples else ""
    click.echo(terminal_text(f"{len(results) - sum(not r.passed for r in results)} of "
                             f"{len(results)} case(s) passed in {directory}{note}"))
    return 1 if failed else 0


def rules_explain(rule_id: str, rules_dirs: Sequence[str]) -> int:
    from ..rules import load_rules
    from ..ruletest import explain
    by_id = {r.id: r for r in load_rules([Path(d) for d in rules_dirs])}
    if rule_id not in by_id:
        import difflib
        close = difflib.get_close_matches(rule_id, list(by_id), n=1)
        raise NavdoctorError(f"no rule '{rule_id}'" + (f" (did you mean '{close[0]}'?)" if close
                                                       else " (see `navdoctor rules list`)"))
    click.echo(terminal_block(explain(by_id[rule_id])), nl=False)
    return 0
