"""Command line: `navdoctor analyze`, `diagnose`, `verify`, `compare`, `rules ...`. This module
parses the options, calls one function per command (navdoctor/commands/) and maps errors to
exit codes.

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
    # Ctrl-C (or SIGTERM) during the imports below (~0.15 s, longer on a loaded machine),
    # before run() handles it: the same line and exit code as later, instead of an import's
    # traceback or a silent end. Nothing is written yet, so nothing is left half-done.
    term = signum == signal.SIGTERM
    sys.stderr.write("navdoctor: terminated\n" if term else "navdoctor: interrupted\n")
    os._exit(143 if term else 130)


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
    current = signal.getsignal(signal.SIGTERM)
    if on and current == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupted_while_starting)
    elif not on and current is _interrupted_while_starting:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)   # run() handles it from there on


_guard_imports(True)

import traceback  # noqa: E402

import click  # noqa: E402

from . import __version__  # noqa: E402
from .errors import NavdoctorError  # noqa: E402

_guard_imports(False)   # from here run() turns Ctrl-C into the same line (KeyboardInterrupt)

CATEGORIES = ("io", "compute", "memory", "launch", "other")


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
    if not traces and not ranks_spec:
        raise click.UsageError("give TRACES, or --ranks DIR|GLOB")
    fail_cats = _parse_fail_on(fail_on)
    overrides = _parse_sets(sets)
    from .commands import analyze as command
    sys.exit(command.run(traces, ranks_spec, workers, executor, scheduler, rules_dirs, overrides,
                         json_path, db_path, md_path, html_path, fail_cats, quiet, profile_path,
                         unprofiled_ms, loader_wait_ms))


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
    fail_cats = _parse_fail_on(fail_on)
    overrides = _parse_sets(sets)
    from .commands import diagnose as command
    sys.exit(command.run(script, script_args, out_base, active, wait, warmup, no_nsys, nsys_path,
                         no_timing, rules_dirs, overrides, json_path, md_path, html_path,
                         fail_cats, quiet, verify_remedies))


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--remedy", "remedies", multiple=True, metavar="ID[+ID]",
              help="Remedy to measure (repeatable; ',' separates, '+' combines in one run): "
                   "num_workers, pin_memory, persistent_workers, prefetch_factor, amp_bf16, "
                   "amp_fp16, channels_last, compile, cuda_graphs, cudnn_benchmark, "
                   "zero_grad_set_to_none, foreach_optimizer; batch_size is listed as a code "
                   "change.")
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
    from .commands import verify as command
    sys.exit(command.run(script, script_args, remedies, repeats, warmup, priming, steps, margin,
                         classify, timeout, out_base, json_path, html_path, quiet))


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
    before_items, after_items = _compare_sides(list(sides))
    if not before_items or not after_items:
        raise click.UsageError("both sides need at least one capture (--before and --after)")
    fail_cats = _parse_fail_on(fail_new, "--fail-on-new")
    from .commands import compare as command
    sys.exit(command.run(before_items, after_items, margin, fail_slower, fail_cats, rules_dirs,
                         json_path, html_path, quiet))


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


@main.group()
def rules() -> None:
    """List, check, test and explain rules."""


@rules.command("list")
@click.option("--rules", "rules_dirs", multiple=True, metavar="DIR")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
def rules_list(rules_dirs, as_json):
    """Show the rules that would run (built-in plus --rules DIR)."""
    from .commands.rules import rules_list as command
    sys.exit(command(rules_dirs, as_json))


@rules.command("check")
@click.argument("directory")
def rules_check(directory):
    """Validate the rules in DIRECTORY: fields, condition, and SQL against the schema."""
    from .commands.rules import rules_check as command
    sys.exit(command(directory))


@rules.command("test")
@click.argument("directory")
@click.option("--require-examples", is_flag=True,
              help="Also fail for a rule that declares no example where it fires and none where it stays quiet.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the cases that fail.")
def rules_test(directory, require_examples, quiet):
    """Run the examples the rules in DIRECTORY declare: each must fire, or stay quiet, on its
    traces, with its metrics inside the bounds given. Exit 1 on a miss (one line per case)."""
    from .commands.rules import rules_test as command
    sys.exit(command(directory, require_examples, quiet))


@rules.command("explain")
@click.argument("rule_id")
@click.option("--rules", "rules_dirs", multiple=True, metavar="DIR")
def rules_explain(rule_id, rules_dirs):
    """Print a rule's documentation: what it measures, its condition and parameters, remedies
    and examples."""
    from .commands.rules import rules_explain as command
    sys.exit(command(rule_id, rules_dirs))


def run() -> None:
    """Console entry point: one-line errors, exit 2, no tracebacks. Ctrl-C ends the run with
    exit 130, SIGTERM with exit 143, each with one line, wherever the run is (errors.py)."""
    from . import errors
    errors.reset_signals()   # (a signal of an earlier in-process run is not this one's)
    _tolerant_streams()
    previous = _handle_sigterm()
    try:
        _run()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _handle_sigterm():
    """SIGTERM unwinds the run (errors.note_terminate) where nobody else handles it; returns
    the handler to put back, or None."""
    import threading
    from .errors import note_terminate
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return None
    return signal.signal(signal.SIGTERM, note_terminate)


def _tolerant_streams() -> None:
    """A terminal whose encoding cannot show a character (a kernel name in Unicode on an
    ASCII or Latin-1 terminal, LANG=C) gets it as a \\u escape, not a UnicodeEncodeError
    once the analysis is done."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream.errors == "strict":
                stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass   # not a text stream of io's (a test's StringIO): left as it is


def _os_error_text(e: OSError) -> str:
    """'<file>: <reason>' of an OSError (a full disk, a folder that vanished), as one line."""
    what = e.strerror or str(e) or type(e).__name__
    where = e.filename if e.filename is not None else None
    return f"{where}: {what}" if where is not None else what


def _run() -> None:
    from . import errors
    from .textsafe import terminal_text
    try:
        main(standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("navdoctor: terminated" if errors.terminate_seen else "navdoctor: aborted",
                   err=True)
        sys.exit(143 if errors.terminate_seen else 130)
    except click.ClickException as e:
        # One line, as every other error: the message and where to look for the usage.
        ctx = getattr(e, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        click.echo(f"navdoctor: error: {terminal_text(e.format_message())}{hint}", err=True)
        sys.exit(2)
    except NavdoctorError as e:
        click.echo(f"navdoctor: error: {terminal_text(str(e))}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        _signal_exit(errors)
    except SystemExit:
        raise
    except Exception as e:  # a bug or an input we did not foresee: still one line
        from .errors import interrupted
        if interrupted(e):  # Ctrl-C inside any DuckDB or SQLite query (rule checks included)
            _signal_exit(errors)
        if os.environ.get("NAVDOCTOR_DEBUG"):
            traceback.print_exc()
        if isinstance(e, OSError):   # a full disk, say: which file, and why, in one line
            click.echo(f"navdoctor: error: {terminal_text(_os_error_text(e))}", err=True)
            sys.exit(2)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        click.echo(f"navdoctor: error: {type(e).__name__}: {terminal_text(first)} "
                   "(set NAVDOCTOR_DEBUG=1 for a traceback)", err=True)
        sys.exit(2)


def _signal_exit(errors) -> None:
    if errors.terminate_seen:
        click.echo("navdoctor: terminated", err=True)
        sys.exit(143)
    click.echo("navdoctor: interrupted", err=True)
    sys.exit(130)


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
