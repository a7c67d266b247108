"""Command line: `navdoctor analyze`, `diagnose`, `verify`, `compare`, `rules ...`.

Exit codes: 0 analysis done; 1 a finding of a --fail-on category fired (or the diagnosed
script failed); 2 bad input or usage. Errors are one line on stderr, never a traceback
(set NAVDOCTOR_DEBUG=1 to see one).
"""
from __future__ import annotations

import math
import os
import signal
import sys


def _interrupted_while_starting(signum, frame) -> None:
    # Ctrl-C during the imports below (~0.15 s, longer on a loaded machine), before run()
    # handles it: the same line and exit code as later, instead of an import's traceback.
    # Nothing is written yet, so nothing is left half-done.
    sys.stderr.write("navdoctor: interrupted\n")
    os._exit(130)


def _guard_imports(on: bool) -> None:
    """Only where Python's own handler is in place (not where SIGINT is ignored or a caller
    set its own), and only from the main thread, where signal handlers can be set."""
    import threading
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGINT)
    if on and current is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_while_starting)
    elif not on and current is _interrupted_while_starting:
        from .errors import note_interrupt
        signal.signal(signal.SIGINT, note_interrupt)


_guard_imports(True)

import json  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import click  # noqa: E402

from . import __version__, store  # noqa: E402
from .errors import NavdoctorError  # noqa: E402
from .rulecheck import require_valid_sql  # noqa: E402

_guard_imports(False)   # from here run() turns Ctrl-C into the same line (KeyboardInterrupt)

CATEGORIES = ("io", "compute", "memory", "launch", "other")


def _progress(quiet: bool):
    def emit(message: str) -> None:
        if not quiet:
            click.echo(f"navdoctor: {message}", err=True)
    return emit


def _parse_sets(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or "." not in key:
            raise click.BadParameter(f"'{v}' is not RULE_ID.PARAM=VALUE", param_hint="--set")
        out[key.strip()] = val.strip()
    return out


def _check_step_ms(value: float | None) -> float | None:
    """A step time in ms: finite, at least 1 us (what a step can take), at most a day."""
    if value is not None and not (math.isfinite(value) and 1e-3 <= value <= 86_400_000):
        raise click.BadParameter(f"{value!r} is not a step time in ms (1 us to a day)",
                                 param_hint="--unprofiled-step-ms")
    return value


def _check_loader_wait_ms(value: str | None) -> list[float] | None:
    """Waits in ms, one or several timing runs' (comma-separated): each finite, 0 to a day."""
    if value is None:
        return None
    waits = []
    for part in value.split(","):
        try:
            wait = float(part)
        except ValueError:
            wait = math.nan
        if not (math.isfinite(wait) and 0 <= wait <= 86_400_000):
            raise click.BadParameter(f"{part.strip()!r} is not a wait in ms (0 to a day)",
                                     param_hint="--unprofiled-loader-wait-ms")
        waits.append(wait)
    return waits


def _parse_fail_on(value: str | None, option: str = "--fail-on") -> set[str]:
    if not value:
        return set()
    cats = {c.strip() for c in value.split(",") if c.strip()}
    bad = cats - set(CATEGORIES) - {"any"}
    if bad:
        raise click.BadParameter(f"unknown category {sorted(bad)[0]!r} (choose from "
                                 f"{', '.join(CATEGORIES)}, any)", param_hint=option)
    return set(CATEGORIES) if "any" in cats else cats


def emit(json_text: str, render, json_path: str | None, quiet: bool, announce: bool = True) -> None:
    """The JSON to stdout ('-') or to a file, and unless quiet the terminal text (render(),
    called only when shown) and, with announce, where the JSON went."""
    from .report import write_atomic
    if json_path == "-":
        click.echo(json_text, nl=False)
        return
    if json_path:
        write_atomic(json_path, json_text)
    if not quiet:
        click.echo(render(), nl=False)
        if json_path and announce:
            click.echo(f"JSON report: {json_path}")


def emit_report(report, json_path: str | None, quiet: bool) -> None:
    from .report import render_terminal, report_to_json
    emit(report_to_json(report),
         lambda: render_terminal(report, color=sys.stdout.isatty()) + "\n", json_path, quiet)


def fail_on_exit(report, fail_on: set[str]) -> int:
    hits = [f for f in report.findings if f.category in fail_on]
    if hits:
        click.echo(f"navdoctor: --fail-on: {len(hits)} finding(s) in "
                   f"{', '.join(sorted({f.category for f in hits}))}", err=True)
        return 1
    return 0


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="navdoctor")
def main() -> None:
    """Find why a PyTorch vision model is slow on an NVIDIA GPU: I/O-, compute-, memory-
    (host<->device) or launch-bound, with the remedies that apply."""


@main.command()
@click.argument("traces", nargs=-1)
@click.option("--ranks", "ranks_spec", metavar="DIR|GLOB",
              help="The ranks of one multi-rank job: a folder of Kineto traces, or a glob "
                   "(docs/distributed.md). Ranks given as TRACES are recognised too.")
@click.option("--workers", type=click.IntRange(1, 1024), metavar="N",
              help="Ranks analysed at once (default: the CPU cores available).")
@click.option("--executor", type=click.Choice(["local", "dask"]), default=None,
              help="Where a job's ranks are analysed: local processes (default), or Dask "
                   "distributed (a local cluster, or --scheduler's; pip install "
                   "'navdoctor[dask]').")
@click.option("--scheduler", metavar="ADDRESS",
              help="With --executor dask: an existing Dask scheduler (tcp://host:8786) whose "
                   "workers see the same trace paths.")
@click.option("--rules", "rules_dirs", multiple=True, metavar="DIR",
              help="Add rules from DIR (YAML); a rule with a built-in id replaces it.")
@click.option("--set", "sets", multiple=True, metavar="RULE.PARAM=VALUE",
              help="Override a rule parameter, e.g. --set io-dataloader-wait.min_share=0.2")
@click.option("--json", "json_path", metavar="PATH|-", help="Write the JSON report ('-' = stdout).")
@click.option("--db", "db_path", metavar="PATH", help="Keep the DuckDB database at PATH (new file).")
@click.option("--markdown", "md_path", metavar="PATH",
              help="Also write a short Markdown summary (CI step summaries, PR comments).")
@click.option("--html", "html_path", metavar="PATH",
              help="Also write the HTML report: one self-contained file with the charts (offline).")
@click.option("--fail-on", metavar="CATEGORY,...", help="Exit 1 when a finding of these categories "
              "fires (io, compute, memory, launch, other, any).")
@click.option("-q", "--quiet", is_flag=True, help="No progress and no terminal report.")
@click.option("--profile", "profile_path", metavar="PATH",
              help="Write the wall and CPU time of each phase (load, steps, breakdown, views, "
                   "each rule) to PATH as JSON.")
@click.option("--unprofiled-step-ms", "unprofiled_ms", metavar="MS", type=float,
              callback=lambda ctx, param, v: _check_step_ms(v),
              help="The same run's step time without a profiler (your own meters): each "
                   "tracer's cost per CUDA call (Nsight Systems', torch.profiler's) is then "
                   "measured from it and left out (docs/verdict.md, 'Tracer cost'). One run's "
                   "traces only.")
@click.option("--unprofiled-loader-wait-ms", "loader_wait_ms", metavar="MS[,MS...]",
              callback=lambda ctx, param, v: _check_loader_wait_ms(v),
              help="With --unprofiled-step-ms: how long of that step the GPU waited for "
                   "DataLoader batches (diagnose's timing pass measures it): the trace's data "
                   "wait beyond it is the tracer's own (docs/verdict.md, 'Loader wait'). "
                   "Several runs' waits, comma-separated: their mean is used, and runs on both "
                   "sides of the loader's line make the verdict a close call.")
def analyze(traces, ranks_spec, workers, executor, scheduler, rules_dirs, sets, json_path, db_path,
            md_path, html_path, fail_on, quiet, profile_path, unprofiled_ms, loader_wait_ms):
    """Diagnose traces you already have: Kineto JSON (.json, .json.gz) and Nsight Systems
    exports (.sqlite, .nsys-rep), recognised by content. The ranks of one torch.distributed
    job (Kineto distributedInfo) are analysed as a job: each rank, then stragglers and
    communication across them."""
    import time
    from .loaders.kineto import inflate_early
    # one small gzipped trace: inflated on a thread while the rules load and the store is made
    early = inflate_early(traces[0]) if len(traces) == 1 and not ranks_spec else None
    from . import profiling
    from .analysis import analyze as run_analysis
    from .ranks.detect import expand_ranks, job_ranks
    from .report import build_report, build_report_lite
    from .rules import load_rules
    if not traces and not ranks_spec:
        raise click.UsageError("give TRACES, or --ranks DIR|GLOB")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    fail_cats = _parse_fail_on(fail_on)
    _check_before_work(json_path)
    _check_markdown_path(md_path)
    _check_html_path(html_path, json_path, md_path)
    executor = _check_executor(executor, scheduler, workers)
    if profile_path:
        _check_output_path(profile_path, "--profile", "profile", ours=profiling.is_profile)
        profiling.start()
    with profiling.phase("rules.load_and_check"):
        rules = load_rules([Path(d) for d in rules_dirs], _parse_sets(sets))
        require_valid_sql(rules)
    paths = list(traces) + (expand_ranks(ranks_spec) if ranks_spec else [])
    if ranks_spec and len(paths) < 2:
        raise NavdoctorError(f"--ranks {ranks_spec}: one trace; a job needs two ranks or more")
    ranks = job_ranks(paths, required=bool(ranks_spec))
    split_dir, split_names = None, {}
    if ranks is None and len(paths) == 1:
        # one Nsight Systems export of several processes that ran kernels: their ranks
        from .analysis import detect_format
        fmt = detect_format(paths[0])
        if fmt != "kineto":   # (split_ranks takes only nsys exports)
            from .ranks.nsys_split import split_ranks
            split_dir = tempfile.TemporaryDirectory(prefix="navdoctor-ranks-")
            split = split_ranks(paths[0], fmt, Path(split_dir.name))
            ranks, split_names = split if split else (None, {})
        if ranks is not None and scheduler:
            raise NavdoctorError("--scheduler: the ranks of one Nsight Systems export are split "
                                 "into temporary files here, which a remote cluster cannot read")
    if loader_wait_ms is not None and unprofiled_ms is None:
        raise click.UsageError("--unprofiled-loader-wait-ms is a part of the step that "
                               "--unprofiled-step-ms gives: give both")
    if loader_wait_ms is not None and max(loader_wait_ms) > unprofiled_ms:
        raise click.BadParameter(f"{max(loader_wait_ms):g} ms is longer than the step "
                                 f"({unprofiled_ms:g} ms)", param_hint="--unprofiled-loader-wait-ms")
    if ranks is None and (workers or executor or scheduler):
        used = "--workers" if workers else "--scheduler" if scheduler else "--executor"
        raise click.UsageError(f"{used} is for multi-rank jobs")
    if ranks is not None:
        if unprofiled_ms is not None:
            raise NavdoctorError("--unprofiled-step-ms: one run's traces only, not a multi-rank job")
        if profile_path:
            raise NavdoctorError("--profile: not available for multi-rank jobs (profile one rank's trace)")
        from .ranks.executor import run_ranks
        from .ranks.job import build_job
        progress = _progress(quiet or json_path == "-")
        outcomes = run_ranks(ranks, rules, workers, progress=progress,
                             executor=executor or "local", scheduler=scheduler)
        job = build_job(outcomes, rules, db_path, progress)
        report = build_report(job.analysis)
        from .report import JobOut
        if split_dir is not None:   # name each rank by its process in the user's export
            for r in job.job.get("per_rank", []):
                r["path"] = split_names.get(r["path"], r["path"])
            for i in report.inputs:
                i.path = split_names.get(i.path, i.path)
        report.job = JobOut.model_validate(job.job)
        emit_report(report, json_path, quiet)
        write_markdown(report, md_path)
        # the job's page: its verdict, shares, per-rank verdicts and findings (the step
        # timelines and kernel tables are per trace: analyse one rank for those)
        write_html(report, None, html_path, announce=not quiet and json_path != "-")
        sys.exit(fail_on_exit(report, fail_cats))
    analysis = run_analysis(paths, rules, db_path, _progress(quiet or json_path == "-"),
                            html=bool(html_path), early=early if paths == [traces[0]] else None,
                            unprofiled_step_ms=unprofiled_ms, unprofiled_loader_wait_ms=loader_wait_ms)
    with profiling.phase("report"):
        report = build_report_lite(analysis)   # (without pydantic where it can: report.py)
        emit_report(report, json_path, quiet)
        write_markdown(report, md_path)
        write_html(report, analysis.html_data, html_path, announce=not quiet and json_path != "-")
    if profile_path:
        profiling.write(profile_path, profiling.stop(), time.perf_counter() - wall0,
                        time.process_time() - cpu0)
    sys.exit(fail_on_exit(report, fail_cats))


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--out", "out_base", default="navdoctor-runs", show_default=True, metavar="DIR",
              help="Where the new run directory is created.")
@click.option("--steps", "active", default=5, show_default=True, type=click.IntRange(1, 1000),
              help="Steps to record, after --wait and --warmup steps.")
@click.option("--wait", default=2, show_default=True, type=click.IntRange(0, 10000),
              help="Steps skipped at start-up.")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(0, 10000),
              help="Steps run under the profiler but not recorded.")
@click.option("--no-nsys", is_flag=True, help="Skip the Nsight Systems pass.")
@click.option("--nsys", "nsys_path", metavar="PATH", help="The nsys executable (else NAVDOCTOR_NSYS, PATH).")
@click.option("--no-timing", is_flag=True,
              help="Skip the short third pass that times the recorded steps without a tracer "
                   "(twice, in two processes, where a DataLoader fed the GPU; the tracers' cost "
                   "per CUDA call is then not measured: assumed for Nsight Systems, not taken "
                   "out of a torch.profiler trace).")
@click.option("--rules", "rules_dirs", multiple=True, metavar="DIR")
@click.option("--set", "sets", multiple=True, metavar="RULE.PARAM=VALUE")
@click.option("--json", "json_path", metavar="PATH|-", help="Also write the JSON report here.")
@click.option("--markdown", "md_path", metavar="PATH",
              help="Also write a short Markdown summary here (the run directory always gets report.md).")
@click.option("--html", "html_path", metavar="PATH",
              help="Also write the HTML report here (the run directory always gets report.html).")
@click.option("--fail-on", metavar="CATEGORY,...")
@click.option("--verify", "verify_remedies", is_flag=True,
              help="Then measure the remedies the findings suggest (see `navdoctor verify`).")
@click.option("-q", "--quiet", is_flag=True)
def diagnose(script, script_args, out_base, active, wait, warmup, no_nsys, nsys_path, no_timing,
             rules_dirs, sets, json_path, md_path, html_path, fail_on, quiet, verify_remedies=False):
    """Run SCRIPT [ARGS] under torch.profiler and then Nsight Systems (then, briefly, without
    a tracer, to measure the tracer's cost), and diagnose it. Without SCRIPT, diagnoses
    navdoctor's bundled navigation workload. Options go before SCRIPT."""
    from .analysis import analyze as run_analysis
    from .collect.diagnose import collect
    from .report import build_report, report_to_json, write_atomic
    from .rules import load_rules
    fail_cats = _parse_fail_on(fail_on)
    _check_before_work(json_path)
    _check_markdown_path(md_path)
    _check_html_path(html_path, json_path, md_path)
    rules = load_rules([Path(d) for d in rules_dirs], _parse_sets(sets))
    require_valid_sql(rules)
    progress = _progress(quiet)
    outcome = collect(script, list(script_args), out_base, wait, warmup, active, not no_nsys,
                      nsys_path, progress, stdout_to_stderr=json_path == "-", timing=not no_timing)
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
    for note in outcome.notes:
        progress(note)
    if not outcome.traces:
        raise NavdoctorError(f"nothing was captured (script exit code {outcome.script_exit}); "
                             f"logs are in {outcome.run_dir}")
    progress("loading traces and evaluating rules")
    try:
        analysis = run_analysis(outcome.traces, rules, str(outcome.run_dir / "trace.duckdb"), progress,
                                html=True, unprofiled_step_ms=outcome.unprofiled_step_ms,
                                unprofiled_origin="timing pass",
                                unprofiled_loader_wait_ms=outcome.loader_waits_ms or None)
    except Exception as e:  # the capture stays; say where it is
        why = str(e) if isinstance(e, NavdoctorError) else f"{type(e).__name__}: {e}"
        raise NavdoctorError(f"analysis failed; the captured traces are kept in {outcome.run_dir} "
                             f"({why.strip().splitlines()[0] if why.strip() else why})") from e
    report = build_report(analysis, run_info)
    write_atomic(str(outcome.run_dir / "report.json"), report_to_json(report))
    write_markdown(report, str(outcome.run_dir / "report.md"))
    write_html(report, analysis.html_data, str(outcome.run_dir / "report.html"))
    emit_report(report, json_path, quiet)
    write_markdown(report, md_path)
    write_html(report, analysis.html_data, html_path, announce=not quiet and json_path != "-")
    if not quiet and json_path != "-":
        click.echo(f"run directory: {outcome.run_dir} (traces, trace.duckdb, report.json, "
                   "report.html, logs)")
    if verify_remedies and not outcome.interrupted and not outcome.script_exit:
        from .verify.command import verify_after_diagnose
        verify_after_diagnose(report, script, list(script_args), outcome.run_dir, progress, quiet,
                              to_stderr=json_path == "-")
    if outcome.interrupted:
        click.echo("navdoctor: interrupted; what was captured is kept in the run directory", err=True)
        sys.exit(130)
    if outcome.script_exit:
        click.echo(f"navdoctor: the script failed (exit code {outcome.script_exit}); the report "
                   "covers what was captured before it stopped", err=True)
        sys.exit(outcome.script_exit if 0 < outcome.script_exit < 256 else 1)
    sys.exit(fail_on_exit(report, fail_cats))


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--remedy", "remedies", multiple=True, metavar="ID[+ID]",
              help="Remedy to measure (repeatable; ',' separates, '+' combines in one run): "
                   "num_workers, pin_memory, persistent_workers, prefetch_factor, amp_bf16, "
                   "amp_fp16, channels_last, compile, cuda_graphs, cudnn_benchmark; batch_size "
                   "is listed as a code change.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1, 100),
              help="Runs per arm (baseline and each remedy), interleaved.")
@click.option("--warmup", default=3, show_default=True, type=click.IntRange(0, 100000),
              help="Steps of each run left out of the timing.")
@click.option("--priming-runs", "priming", default=1, show_default=True, type=click.IntRange(0, 10),
              help="Untimed runs of every arm before the timed rounds (cold caches, compiling).")
@click.option("--steps", default=20, show_default=True, type=click.IntRange(1, 100000),
              help="Steps timed per run; the run is stopped after warmup + steps.")
@click.option("--margin", default=0.05, show_default=True, type=click.FloatRange(0, 1),
              help="Smallest speedup that counts: helps needs the CI above 1 + margin.")
@click.option("--classify", is_flag=True,
              help="Also diagnose one torch.profiler run per arm: did the bottleneck class change?")
@click.option("--timeout", default=900, show_default=True, type=click.IntRange(1, 86400),
              help="Seconds one run may take.")
@click.option("--out", "out_base", default="navdoctor-runs", show_default=True, metavar="DIR")
@click.option("--json", "json_path", metavar="PATH|-", help="Write the JSON result ('-' = stdout).")
@click.option("--html", "html_path", metavar="PATH",
              help="Also write the result as an HTML page (forest plot of the speed-ups).")
@click.option("-q", "--quiet", is_flag=True)
def verify(script, script_args, remedies, repeats, warmup, priming, steps, margin, classify,
           timeout, out_base, json_path, html_path, quiet):
    """Run SCRIPT [ARGS] with and without each remedy, interleaved, and say whether it helps.
    Without SCRIPT, the bundled navigation workload. Options go before SCRIPT."""
    from .verify import command as vc
    from .collect.diagnose import BUNDLED_WORKLOAD
    _check_before_work(json_path)
    _check_html_path(html_path, json_path)
    script = script or str(BUNDLED_WORKLOAD)
    cuda = False
    if not remedies:
        import torch
        cuda = torch.cuda.is_available()
    plan = vc.plan_from_ids(script, list(script_args), list(remedies), cuda)
    vc.check_script(script)
    settings = vc.Settings(repeats=repeats, warmup=warmup, steps=steps, margin=margin,
                           timeout=timeout, classify=classify, priming=priming)
    out_dir = vc.new_verify_dir(out_base, Path(script).stem)
    try:
        result = vc.verify(plan, settings, out_dir, _progress(quiet or json_path == "-"))
    except vc.ScriptFailed as e:
        click.echo(f"navdoctor: error: {e}", err=True)
        sys.exit(1)
    vc.emit(result, json_path, quiet, html_path=html_path)


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("sides", nargs=-1, type=click.UNPROCESSED)
@click.option("--margin", default=0.05, show_default=True, type=click.FloatRange(0, 1),
              help="A change smaller than this is no change (as in verify).")
@click.option("--fail-if-slower", "fail_slower", type=click.FloatRange(0, 1000), metavar="PCT",
              help="Exit 1 when the slowdown's whole interval lies above PCT percent.")
@click.option("--fail-on-new", "fail_new", metavar="CATEGORY,...",
              help="Exit 1 when a finding of these categories appears on the after side.")
@click.option("--rules", "rules_dirs", multiple=True, metavar="DIR")
@click.option("--json", "json_path", metavar="PATH|-", help="Write the JSON comparison ('-' = stdout).")
@click.option("--html", "html_path", metavar="PATH",
              help="Also write the comparison as one self-contained HTML page.")
@click.option("-q", "--quiet", is_flag=True)
def compare(sides, margin, fail_slower, fail_new, rules_dirs, json_path, html_path, quiet):
    """Did it get faster? Compare BEFORE and AFTER captures: each a `diagnose` run directory,
    a report.json or trace files. Several captures per side: --before A B C --after D E F
    (repeated captures of each side give an interval that holds run-to-run noise)."""
    from .compare import analyse_capture, compare_captures, new_finding_categories, render_text
    from .rules import load_rules
    before_items, after_items = _compare_sides(list(sides))
    if not before_items or not after_items:
        raise click.UsageError("both sides need at least one capture (--before and --after)")
    fail_cats = _parse_fail_on(fail_new, "--fail-on-new")
    _check_before_work(json_path)
    _check_html_path(html_path, json_path)
    rules = load_rules([Path(d) for d in rules_dirs])
    require_valid_sql(rules)
    progress = _progress(quiet or json_path == "-")
    for option, out in (("--json", json_path), ("--html", html_path)):
        if out and out != "-" and any(Path(i).resolve() == Path(out).resolve()
                                      for i in (*before_items, *after_items)):
            raise NavdoctorError(f"{out}: is one of the captures compared; choose another {option} path")
    caps = {}
    for side, items in (("before", before_items), ("after", after_items)):
        caps[side] = []
        for item in items:
            progress(f"{side}: analysing {item}")
            caps[side].append(analyse_capture(item, rules))
    result = compare_captures(caps["before"], caps["after"], margin)
    emit(result.model_dump_json(indent=2) + "\n", lambda: render_text(result), json_path, quiet,
         announce=False)
    if html_path:
        from .report import write_atomic
        from .reporters.html import render_compare_html
        write_atomic(html_path, render_compare_html(result.model_dump()))
        if not quiet and json_path != "-":
            click.echo(f"HTML: {html_path}")
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
    sys.exit(code)


def _check_before_work(json_path: str | None) -> None:
    """What would otherwise stop a command only after its work (diagnose: the script run
    twice): a malformed NAVDOCTOR_MEMORY_LIMIT, a --json path that cannot be written."""
    store.memory_limit()
    _check_output_path(json_path)


def _check_executor(executor: str | None, scheduler: str | None,
                    workers: int | None) -> str | None:
    """--executor/--scheduler agree, and Dask is there, before any trace is read."""
    if scheduler:
        if executor == "local":
            raise click.UsageError("--scheduler is for --executor dask")
        if workers:
            raise click.UsageError("--workers sizes the local pool or cluster; with "
                                   "--scheduler the cluster's own workers run the ranks")
        executor = "dask"
    if executor == "dask":
        from .ranks.executor import DASK_INSTALL, dask_available
        if not dask_available():
            raise NavdoctorError(DASK_INSTALL)
    return executor


def _check_markdown_path(md_path: str | None) -> None:
    from .report import is_navdoctor_summary
    # An empty file (GitHub's step summary at the start of a step) holds nothing to lose.
    _check_output_path(md_path, "--markdown", "summary",
                       lambda p: p.stat().st_size == 0 or is_navdoctor_summary(p))


def _compare_sides(args: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """BEFORE AFTER, or --before A [B ...] --after C [D ...] (each also as --before=A)."""
    marked = any(a == f"--{s}" or a.startswith(f"--{s}=") for a in args for s in ("before", "after"))
    if not marked:
        unknown = next((a for a in args if a.startswith("--")), None)
        if unknown:
            raise click.UsageError(f"no such option: {unknown}")
        if len(args) != 2:
            raise click.UsageError("compare takes BEFORE and AFTER (two captures), or "
                                   "--before ... --after ... for several per side")
        return (args[0],), (args[1],)
    sides: dict[str, list[str]] = {"before": [], "after": []}
    current = None
    for a in args:
        name, eq, value = a.partition("=")
        if name in ("--before", "--after"):
            current = name[2:]
            if eq:
                sides[current].append(value)
        elif a.startswith("--"):
            raise click.UsageError(f"no such option: {a}")
        elif current is None:
            raise click.UsageError("give BEFORE AFTER, or --before/--after, not both")
        else:
            sides[current].append(a)
    if not sides["before"] or not sides["after"]:
        raise click.UsageError("both sides need at least one capture (--before and --after)")
    return tuple(sides["before"]), tuple(sides["after"])


def _check_html_path(html_path: str | None, *others: str | None) -> None:
    """--html PATH: a file path navdoctor may write (as --json), and not the path another
    output option of the same command writes."""
    if not html_path:
        return
    from .reporters.html import is_navdoctor_html
    if html_path == "-":
        raise NavdoctorError("--html needs a file path ('-' is for --json)")
    _check_output_path(html_path, "--html", "HTML report", is_navdoctor_html)
    if html_path and any(o and o != "-" and Path(o).resolve() == Path(html_path).resolve()
                         for o in others):
        raise NavdoctorError(f"{html_path}: is also the path of another output option; "
                             "give --html a path of its own")


def write_html(report, html_data: dict | None, html_path: str | None, announce: bool = False) -> None:
    if html_path:
        from .reporters.html import render_report_html
        from .report import write_atomic
        write_atomic(html_path, render_report_html(report, html_data))
        if announce:
            click.echo(f"HTML report: {html_path}")


def write_markdown(report, md_path: str | None) -> None:
    if md_path:
        from .report import render_markdown, write_atomic
        write_atomic(md_path, render_markdown(report))


def _check_output_path(path: str | None, option: str = "--json", what: str = "report",
                       ours=None) -> None:
    """A path navdoctor may write: a file in an existing directory, and, if it exists, one
    navdoctor wrote (`ours`; by default a navdoctor JSON report). Never replace what the user
    had (a trace given by mistake, say); an earlier navdoctor output is replaced, as asked."""
    from .report import is_navdoctor_report
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


@main.group()
def rules() -> None:
    """List, check, test and explain rules."""


@rules.command("list")
@click.option("--rules", "rules_dirs", multiple=True, metavar="DIR")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
def rules_list(rules_dirs, as_json):
    """Show the rules that would run (built-in plus --rules DIR)."""
    from .rules import load_rules
    loaded = load_rules([Path(d) for d in rules_dirs])
    if as_json:
        click.echo(json.dumps([r.model_dump(mode="json") for r in loaded], indent=2))
        return
    for r in sorted(loaded, key=lambda r: (r.category, r.id)):
        params = ", ".join(f"{k}={v}" for k, v in r.params.items())
        click.echo(f"{r.id:32} {r.category:8} {r.severity:8} {r.title}"
                   + (f"  [{params}]" if params else ""))


@rules.command("check")
@click.argument("directory")
def rules_check(directory):
    """Validate the rules in DIRECTORY: fields, condition, and SQL against the schema."""
    from .rulecheck import check_rules
    from .rules import load_rules_dir
    loaded = load_rules_dir(Path(directory))
    problems = check_rules(loaded)
    for e in problems:
        click.echo(f"error: {e}", err=True)
    if problems:
        raise SystemExit(2)
    click.echo(f"{len(loaded)} rule(s) OK in {directory}")


@rules.command("test")
@click.argument("directory")
@click.option("--require-examples", is_flag=True,
              help="Also fail for a rule that declares no example where it fires and none where it stays quiet.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the cases that fail.")
def rules_test(directory, require_examples, quiet):
    """Run the examples the rules in DIRECTORY declare: each must fire, or stay quiet, on its
    traces, with its metrics inside the bounds given. Exit 1 on a miss (one line per case)."""
    from .rulecheck import check_rules
    from .rules import load_rules_dir
    from .ruletest import run_examples
    loaded = load_rules_dir(Path(directory))
    problems = check_rules(loaded)
    if problems:
        raise problems[0]
    results, without = run_examples(loaded, _progress(quiet))
    for r in results:
        if not quiet or not r.passed:
            click.echo(r.line())
    missing = []
    if require_examples:
        for rule in loaded:
            kinds = {ex.expect for ex in rule.examples}
            for k in ("fire", "quiet"):
                if k not in kinds:
                    missing.append(f"FAIL {rule.id}: no example where it must {'fire' if k == 'fire' else 'stay quiet'}")
    for line in missing:
        click.echo(line)
    failed = sum(not r.passed for r in results) + len(missing)
    note = f"; {len(without)} rule(s) without examples" if without and not require_examples else ""
    click.echo(f"{len(results) - sum(not r.passed for r in results)} of {len(results)} case(s) "
               f"passed in {directory}{note}")
    if failed:
        sys.exit(1)


@rules.command("explain")
@click.argument("rule_id")
@click.option("--rules", "rules_dirs", multiple=True, metavar="DIR")
def rules_explain(rule_id, rules_dirs):
    """Print a rule's documentation: what it measures, its condition and parameters, remedies
    and examples."""
    from .rules import load_rules
    from .ruletest import explain
    by_id = {r.id: r for r in load_rules([Path(d) for d in rules_dirs])}
    if rule_id not in by_id:
        import difflib
        close = difflib.get_close_matches(rule_id, list(by_id), n=1)
        raise NavdoctorError(f"no rule '{rule_id}'" + (f" (did you mean '{close[0]}'?)" if close
                                                       else " (see `navdoctor rules list`)"))
    click.echo(explain(by_id[rule_id]), nl=False)


def run() -> None:
    """Console entry point: one-line errors, exit 2, no tracebacks."""
    from . import errors
    errors.interrupt_seen = False      # (a Ctrl-C of an earlier in-process run is not this one's)
    try:
        main(standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("navdoctor: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        # One line, as every other error: the message and where to look for the usage.
        ctx = getattr(e, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        click.echo(f"navdoctor: error: {e.format_message()}{hint}", err=True)
        sys.exit(2)
    except NavdoctorError as e:
        click.echo(f"navdoctor: error: {e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("navdoctor: interrupted", err=True)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as e:  # a bug or an input we did not foresee: still one line
        from .analysis import interrupted
        if interrupted(e):  # Ctrl-C inside any DuckDB query (rule checks included)
            click.echo("navdoctor: interrupted", err=True)
            sys.exit(130)
        if os.environ.get("NAVDOCTOR_DEBUG"):
            traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        click.echo(f"navdoctor: error: {type(e).__name__}: {first} "
                   "(set NAVDOCTOR_DEBUG=1 for a traceback)", err=True)
        sys.exit(2)


def console() -> None:
    """The `navdoctor` command (pyproject.toml): run(), then end the process without the
    interpreter's teardown of every module (DuckDB, numpy, pydantic: ~25 ms of a small
    trace's analysis). Only when nothing else runs: with another thread alive, or when the
    streams cannot be flushed, it exits as sys.exit does. atexit's functions run first
    (temporary folders, logging). run() itself stays for callers in this process (tests)."""
    try:
        run()
        code = None
    except SystemExit as e:
        code = e.code
    _fast_exit(code)


def _fast_exit(code) -> None:
    import atexit
    import threading
    if threading.active_count() > 1:
        sys.exit(code)
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:   # what sys.exit does with a message
        print(code, file=sys.stderr)
        status = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # e.g. a closed pipe: the ordinary exit reports it as before
        sys.exit(status)
    os._exit(status)


if __name__ == "__main__":
    console()
