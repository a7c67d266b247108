"""`navdoctor analyze`: traces a user has, one run's or a multi-rank job's."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Sequence

import click

from ..errors import NavdoctorError
from .attempts import Outputs
from .outputs import (check_before_work, check_html_path, check_markdown_path, check_output_path,
                      check_outputs, discard_database, fail_on_exit, progress_printer,
                      write_reports)


def run(traces: Sequence[str], ranks_spec: str | None, workers: int | None, executor: str | None,
        scheduler: str | None, rules_dirs: Sequence[str], overrides: dict[str, str],
        json_path: str | None, db_path: str | None, md_path: str | None, html_path: str | None,
        fail_cats: set[str], quiet: bool, profile_path: str | None,
        unprofiled_ms: float | None, loader_wait_ms: list[float] | None) -> int:
    """Analyse TRACES (or --ranks' job) and write the reports asked for; the exit code.
    overrides: --set's RULE.PARAM -> value; fail_cats: --fail-on's categories.
    A run that fails or is interrupted leaves no --db behind (a database of half a run would
    make the retry refuse its path). A `navdoctor diagnose` run directory given alone is
    analysed with all it recorded (its traces and its timing pass: collect/rundir.py)."""
    record, origin = None, "given"
    if not ranks_spec and any(Path(t).is_dir() for t in traces):
        record = _run_dir(traces)
        traces = tuple(record.traces)
        if unprofiled_ms is None and record.unprofiled_step_ms is not None:
            # the run's own timing pass, unless the user gives a step time of their own
            unprofiled_ms, origin = record.unprofiled_step_ms, "timing pass"
            if loader_wait_ms is None:
                loader_wait_ms = record.loader_waits_ms
    from ..loaders.kineto import inflate_early
    # one small gzipped trace: inflated on a thread while the rules load and the store is made
    early = inflate_early(traces[0]) if len(traces) == 1 and not ranks_spec else None
    from .. import profiling
    from ..ranks.detect import expand_ranks
    wall0, cpu0 = time.perf_counter(), time.process_time()
    check_before_work(json_path)
    check_markdown_path(md_path)
    check_html_path(html_path)
    executor = _check_executor(executor, scheduler, workers)
    if profile_path:
        check_output_path(profile_path, "--profile", "profile", ours=profiling.is_profile)
    outputs = {"--json": json_path, "--markdown": md_path, "--html": html_path,
               "--profile": profile_path}
    # a report written into the ranks' folder (by this run or an earlier one) is no rank
    paths = list(traces) + (expand_ranks(ranks_spec, skip=[p for p in outputs.values() if p])
                            if ranks_spec else [])
    check_outputs(outputs, paths + ([ranks_spec] if ranks_spec else []), db=db_path)
    if profile_path:
        profiling.start()
    try:
        return _run(traces, paths, ranks_spec, workers, executor, scheduler, rules_dirs,
                    overrides, json_path, db_path, md_path, html_path, fail_cats, quiet,
                    profile_path, unprofiled_ms, loader_wait_ms, early, wall0, cpu0,
                    record, origin)
    except BaseException:
        if db_path:
            discard_database(db_path)
        raise


def _run(traces, paths, ranks_spec, workers, executor, scheduler, rules_dirs, overrides,
         json_path, db_path, md_path, html_path, fail_cats, quiet, profile_path, unprofiled_ms,
         loader_wait_ms, early, wall0, cpu0, record=None, origin: str = "given") -> int:
    from .. import profiling
    from ..ranks.detect import job_ranks
    from ..report import build_report_lite
    from ..rulecheck import require_valid_sql
    from ..rules import load_rules
    with profiling.phase("rules.load_and_check"):
        rules = load_rules([Path(d) for d in rules_dirs], overrides)
        require_valid_sql(rules)
    if ranks_spec and len(paths) < 2:
        raise NavdoctorError(f"--ranks {ranks_spec}: one trace; a job needs two ranks or more")
    ranks = job_ranks(paths, required=bool(ranks_spec))
    split_dir = None
    if ranks is None and len(paths) == 1:
        ranks, split_dir, one = _split_export(paths[0], scheduler)
        if one is not None:   # one process: the export as inflated by the split, if it was
            paths = [one]
    if loader_wait_ms is not None and unprofiled_ms is None:
        raise click.UsageError("--unprofiled-loader-wait-ms is a part of the step that "
                               "--unprofiled-step-ms gives: give both")
    if loader_wait_ms is not None and max(loader_wait_ms) > unprofiled_ms:
        raise click.BadParameter(f"{max(loader_wait_ms):g} ms is longer than the step "
                                 f"({unprofiled_ms:g} ms)", param_hint="--unprofiled-loader-wait-ms")
    if ranks is None and (workers or executor or scheduler):
        used = "--workers" if workers else "--scheduler" if scheduler else "--executor"
        raise click.UsageError(f"{used} is for multi-rank jobs")
    try:
        if ranks is not None:
            if unprofiled_ms is not None:
                raise NavdoctorError("--unprofiled-step-ms: one run's traces only, not a multi-rank job")
            if profile_path:
                raise NavdoctorError("--profile: not available for multi-rank jobs (profile one rank's trace)")
            report = _analyse_job(ranks, rules, workers, executor, scheduler, db_path,
                                  progress_printer(quiet or json_path == "-"))
            outputs = Outputs()
            # the job's page: its verdict, shares, per-rank verdicts and findings (the step
            # timelines and kernel tables are per trace: analyse one rank for those)
            write_reports(outputs, report, None, json_path, md_path, html_path, quiet)
            return outputs.report() or fail_on_exit(report, fail_cats)
        analysis, html_data = _analyse_run(paths, rules, db_path,
                                           progress_printer(quiet or json_path == "-"),
                                           bool(html_path),
                                           early if paths == [traces[0]] else None,
                                           unprofiled_ms, loader_wait_ms, origin)
    finally:
        if split_dir is not None:
            split_dir.cleanup()
    with profiling.phase("report"):
        # (without pydantic where it can: report.py)
        report = build_report_lite(analysis, _run_section(record, unprofiled_ms, loader_wait_ms)
                                   if record else None)
        outputs = Outputs()
        write_reports(outputs, report, html_data, json_path, md_path, html_path, quiet)
    if profile_path:
        profiling.write(profile_path, profiling.stop(), time.perf_counter() - wall0,
                        time.process_time() - cpu0)
    return outputs.report() or fail_on_exit(report, fail_cats)


def _run_dir(traces: Sequence[str]):
    """A `navdoctor diagnose` run directory, given alone: its traces and what its timing pass
    measured (collect/rundir.py)."""
    from ..collect.rundir import read_run_dir
    if len(traces) > 1:
        folder = next(t for t in traces if Path(t).is_dir())
        raise NavdoctorError(f"{folder}: is a directory; a `navdoctor diagnose` run directory is "
                             "analysed alone (or give its trace files, or --ranks DIR for a job's ranks)")
    return read_run_dir(traces[0])


def _run_section(record, unprofiled_ms: float | None, loader_wait_ms: list[float] | None) -> dict:
    """The report's `run`: as diagnose recorded it, where it is now, and the step times this
    analysis was given (the run's timing pass, or the user's)."""
    run = dict(record.run or {"script": None, "args": [], "passes": []})
    if run.get("dir") != str(record.path):
        run["recorded_dir"] = run.get("dir")
    run["dir"] = str(record.path)
    run["reanalysed"] = True
    run["unprofiled_step_ms"] = unprofiled_ms
    run["unprofiled_loader_wait_ms"] = (sum(loader_wait_ms) / len(loader_wait_ms)
                                        if loader_wait_ms else None)
    run["unprofiled_loader_waits_ms"] = list(loader_wait_ms) if loader_wait_ms and len(loader_wait_ms) > 1 else None
    return run


def _split_export(path: str, scheduler: str | None):
    """One Nsight Systems export: (its ranks where several processes ran kernels, else None;
    the temporary folder of its inflated copy, if any; the export as one input where it is
    one rank's, else None). The ranks read the user's file (nsys_split.py)."""
    from ..analysis import detect_format
    fmt = detect_format(path)
    if fmt not in ("nsys-sqlite", "nsys-sqlite.gz"):   # (split_ranks takes only nsys exports)
        return None, None, None
    from ..ranks.nsys_split import split_ranks
    split_dir = tempfile.TemporaryDirectory(prefix="navdoctor-ranks-")
    try:
        ranks, one = split_ranks(path, fmt, Path(split_dir.name))
    except BaseException:
        split_dir.cleanup()
        raise
    if ranks and scheduler and fmt == "nsys-sqlite.gz":
        split_dir.cleanup()
        raise NavdoctorError("--scheduler: the ranks of one compressed Nsight Systems export "
                             "are read from its copy inflated here, which a remote cluster "
                             "cannot read (give the .sqlite)")
    return (ranks or None), split_dir, one


def _analyse_job(ranks, rules, workers, executor, scheduler, db_path, progress):
    """Each rank, then the job: its report (JobOut attached), ranks named as the user gave them."""
    from ..ranks.executor import run_ranks
    from ..ranks.job import build_job
    from ..report import JobOut, build_report
    outcomes = run_ranks(ranks, rules, workers, progress=progress,
                         executor=executor or "local", scheduler=scheduler)
    job = build_job(outcomes, rules, db_path, progress)
    report = build_report(job.analysis)
    report.job = JobOut.model_validate(job.job)
    return report


def _analyse_run(paths, rules, db_path, progress, html: bool, early, unprofiled_ms,
                 loader_wait_ms, origin: str = "given"):
    """One run's traces: the analysis, and what the HTML page draws (None without --html)."""
    from ..analysis import analyze
    from ..reporters.data import HtmlViews
    views = HtmlViews() if html else None
    analysis = analyze(paths, rules, db_path, progress, reader=views, early=early,
                       unprofiled_step_ms=unprofiled_ms, unprofiled_origin=origin,
                       unprofiled_loader_wait_ms=loader_wait_ms)
    return analysis, views.data if views else None


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
        from ..ranks.executor import DASK_INSTALL, dask_available
        if not dask_available():
            raise NavdoctorError(DASK_INSTALL)
    return executor
