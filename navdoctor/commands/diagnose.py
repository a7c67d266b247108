"""`navdoctor diagnose`: run a script under the tracers, then analyse what they captured."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import click

from ..errors import NavdoctorError
from ..textsafe import terminal_text
from .outputs import (check_before_work, check_html_path, check_markdown_path, check_outputs,
                      emit_report,
                      fail_on_exit, progress_printer, write_html, write_markdown)


def run(script: str | None, script_args: Sequence[str], out_base: str, active: int, wait: int,
        warmup: int, no_nsys: bool, nsys_path: str | None, no_timing: bool,
        rules_dirs: Sequence[str], overrides: dict[str, str], json_path: str | None,
        md_path: str | None, html_path: str | None, fail_cats: set[str], quiet: bool,
        verify_remedies: bool = False) -> int:
    """Capture, analyse, write the run directory's reports and those asked for; the exit code
    (the script's own where it failed, 130 where interrupted)."""
    from ..analysis import analyze
    from ..collect.diagnose import collect
    from ..report import build_report, report_to_json, write_atomic
    from ..reporters.data import HtmlViews
    from ..rulecheck import require_valid_sql
    from ..rules import load_rules
    check_before_work(json_path)
    check_markdown_path(md_path)
    check_html_path(html_path, json_path, md_path)
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
        raise NavdoctorError(f"nothing was captured (script exit code {outcome.script_exit}); "
                             f"logs are in {outcome.run_dir}")
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
    write_atomic(str(outcome.run_dir / "report.json"), report_to_json(report))
    write_markdown(report, str(outcome.run_dir / "report.md"))
    write_html(report, views.data, str(outcome.run_dir / "report.html"))
    emit_report(report, json_path, quiet)
    write_markdown(report, md_path)
    write_html(report, views.data, html_path, announce=not quiet and json_path != "-")
    if not quiet and json_path != "-":
        click.echo(f"run directory: {terminal_text(str(outcome.run_dir))} (traces, trace.duckdb, report.json, "
                   "report.html, logs)")
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
        return outcome.script_exit if 0 < outcome.script_exit < 256 else 1
    return fail_on_exit(report, fail_cats)


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
