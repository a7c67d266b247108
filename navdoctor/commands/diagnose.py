"""`navdoctor diagnose`: run a script under the tracers, then analyse what they captured."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import click

from ..errors import NavdoctorError
from ..textsafe import terminal_text
from .attempts import Outputs
from .outputs import (check_before_work, check_html_path, check_markdown_path, check_outputs,
                      fail_on_exit, progress_printer, write_html, write_markdown, write_reports)


def run(script: str | None, script_args: Sequence[str], out_base: str, active: int, wait: int,
        warmup: int, no_nsys: bool, nsys_path: str | None, no_timing: bool,
        rules_dirs: Sequence[str], overrides: dict[str, str], json_path: str | None,
        md_path: str | None, html_path: str | None, fail_cats: set[str], quiet: bool,
        verify_remedies: bool = False) -> int:
    """Capture, analyse, write the run directory's reports and those asked for; the exit code
    (the script's own where it failed, 130 where interrupted)."""
    from ..collect.requirements import require_torch
    require_torch("diagnose", bundled=script is None)
    from ..analysis import analyze
    from ..collect.diagnose import collect
    from ..report import build_report, report_to_json, write_atomic
    from ..reporters.data import HtmlViews
    from ..rulecheck import require_valid_sql
    from ..rules import load_rules
    check_before_work(json_path)
    check_markdown_path(md_path)
    check_html_path(html_path)
    check_outputs({"--json": json_path, "--markdown": md_path, "--html": html_path},
                  [script] if script else [])
    rules = load_rules([Path(d) for d in rules_dirs], overrides)
    require_valid_sql(rules)
    progress = progress_printer(quiet)
    outcome = collect(script, list(script_args), out_base, wait, warmup, active, not no_nsys,
                      nsys_path, progress, stdout_to_stderr=json_path == "-", timing=not no_timing)
    run_info = _run_info(outcome, script, script_args)
    for note in outcome.notes:
        progress(note)
    if not outcome.traces:
        if outcome.interrupted:
            click.echo(f"navdoctor: interrupted before anything was captured; logs are in "
                       f"{outcome.run_dir}", err=True)
            return 130
        if outcome.script_exit:   # the script's own failure: its exit code (docs/report.md)
            click.echo(f"navdoctor: error: the script failed (exit code {outcome.script_exit}) "
                       f"before anything was captured; logs are in {outcome.run_dir}", err=True)
            return script_exit_code(outcome.script_exit)
        raise NavdoctorError(f"nothing was captured (the script exited 0); logs are in "
                             f"{outcome.run_dir}")
    progress("loading traces and evaluating rules")
    views = HtmlViews()
    try:
        analysis = analyze(outcome.traces, rules, str(outcome.run_dir / "trace.duckdb"), progress,
                           reader=views, unprofiled_step_ms=outcome.unprofiled_step_ms,
                           unprofiled_origin="timing pass",
                           unprofiled_loader_wait_ms=outcome.loader_waits_ms or None)
    except Exception as e:  # the capture stays; say where it is
        why = str(e) if isinstance(e, NavdoctorError) else f"{type(e).__name__}: {e}"
        raise NavdoctorError(f"analysis failed; the captured traces are kept in {outcome.run_dir} "
                             f"({why.strip().splitlines()[0] if why.strip() else why})") from e
    report = build_report(analysis, run_info)
    # each output on its own: one that fails (the page without plotly) leaves the others
    outputs = Outputs()
    in_run = {name: str(outcome.run_dir / name) for name in ("report.json", "report.md", "report.html")}
    outputs.write(in_run["report.json"], lambda: write_atomic(in_run["report.json"], report_to_json(report)))
    outputs.write(in_run["report.md"], lambda: write_markdown(report, in_run["report.md"]))
    outputs.write(in_run["report.html"], lambda: write_html(report, views.data, in_run["report.html"]))
    write_reports(outputs, report, views.data, json_path, md_path, html_path, quiet)
    if not quiet and json_path != "-":
        written = [n for n, p in in_run.items() if not any(f.startswith(p + ":") for f in outputs.failed)]
        click.echo(f"run directory: {terminal_text(str(outcome.run_dir))} (traces, trace.duckdb, "
                   f"{', '.join(written + ['logs'])})")
    not_written = outputs.report()
    if verify_remedies and not outcome.interrupted and not outcome.script_exit:
        from ..verify.command import verify_after_diagnose
        verify_after_diagnose(report, script, list(script_args), outcome.run_dir, progress, quiet,
                              to_stderr=json_path == "-")
    if outcome.interrupted:
        click.echo("navdoctor: interrupted; what was captured is kept in the run directory", err=True)
        return 130
    if outcome.script_exit:
        click.echo(f"navdoctor: the script failed (exit code {outcome.script_exit}); the report "
                   "covers what was captured before it stopped", err=True)
        return script_exit_code(outcome.script_exit)
    return not_written or fail_on_exit(report, fail_cats)


def script_exit_code(code: int) -> int:
    """The script's own exit code where it is one a process can return (1-255), else 1."""
    return code if 0 < code < 256 else 1


def _run_info(outcome, script: str | None, script_args: Sequence[str]) -> dict:
    """The report's `run`: the script, its passes and what the timing pass measured."""
    run_info = {"dir": str(outcome.run_dir), "script": script or "navdoctor/workloads/navigation.py",
                "args": list(script_args), "script_exit_code": outcome.script_exit,
                "interrupted": outcome.interrupted, "notes": outcome.notes,
                "passes": [{"pass": p.name, "exit_code": p.exit_code, "steps": p.status.get("steps"),
                            "step_source": p.status.get("step_source"),
                            "step_module": p.status.get("step_module"),
                            "whole_run": bool(p.status.get("whole")),
                            "recording": p.status.get("plan"), "trace": p.trace,
                            "log": p.log, "seconds": p.status.get("seconds")} for p in outcome.passes]}
    sources = [p.status.get("step_source") for p in outcome.passes if p.trace]
    run_info["step_source"] = next((s for s in sources if s), None)
    run_info["unprofiled_step_ms"] = outcome.unprofiled_step_ms
    run_info["unprofiled_loader_wait_ms"] = outcome.unprofiled_loader_wait_ms
    run_info["unprofiled_loader_waits_ms"] = outcome.unprofiled_loader_waits_ms
    return run_info
