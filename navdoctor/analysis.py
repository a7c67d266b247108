"""One analysis: traces -> store -> breakdown -> views -> rules -> verdict -> report."""
from __future__ import annotations

import gzip
import os
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence

import duckdb

from . import breakdown, engine, stepfinder, store, verdict as verdict_mod, views, whatif
from .profiling import phase
from .errors import TraceError, interrupted
from .loaders.base import LoadResult, TraceInput, inflate_bounded, trace_input
from .loaders.kineto import EarlyInflate, inflate_early, load_kineto, sniff_kineto
from .rules import Rule


@dataclass
class Analysis:
    inputs: list[LoadResult]
    verdict: verdict_mod.Verdict
    findings: list[engine.Finding]
    rule_failures: list[engine.RuleFailure]
    rules_run: int
    db_path: str | None = None
    warnings: list[str] = field(default_factory=list)


class StoreReader(Protocol):
    """What a layer above the analysis reads from the store while the analysis has it open
    (the HTML report's views: reporters/data.py), without the analysis importing it.
    keep_segments: keep the breakdown's sweep segments until after_breakdown has read them."""
    keep_segments: bool

    def after_breakdown(self, con: duckdb.DuckDBPyConnection) -> None: ...

    def after_verdict(self, con: duckdb.DuckDBPyConnection, rules: list[Rule],
                      verdict: verdict_mod.Verdict, progress: Callable[[str], None]) -> None: ...


def detect_format(path: str) -> str:
    """'kineto', 'nsys-sqlite', 'nsys-sqlite.gz' or 'nsys-rep', from the file's content."""
    p = Path(path)
    if not p.exists():
        raise TraceError(path, "no such file")
    if p.is_dir():
        raise TraceError(path, "is a directory, not a trace file")
    if not p.is_file():
        raise TraceError(path, "not a regular file (a pipe, socket or device): save the trace "
                               "to a file first")
    if not os.access(path, os.R_OK):
        raise TraceError(path, "permission denied")
    if p.stat().st_size == 0:
        raise TraceError(path, "file is empty")
    try:
        # A Kineto trace first (what is JSON, maybe gzipped, is no export), so that the nsys
        # loader is imported only for exports; anything else in the order below.
        try:
            if sniff_kineto(path):
                return "kineto"
        except TraceError:
            pass  # corrupt gzip: an export's checks first, then this error again
        from .loaders import nsys
        if _gzipped_sqlite(path):
            return "nsys-sqlite.gz"
        if nsys.is_nsys_sqlite(path):
            return "nsys-sqlite"
        if nsys.is_nsys_rep(path):
            return "nsys-rep"
        if sniff_kineto(path):
            return "kineto"
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    raise TraceError(path, "unrecognised content: expected a torch.profiler/Kineto JSON "
                           "(.json or .json.gz) or an Nsight Systems export (.sqlite or .nsys-rep)")


def _gzipped_sqlite(path: str) -> bool:
    with open(path, "rb") as f:
        if f.read(2) != b"\x1f\x8b":
            return False
    try:
        with gzip.open(path, "rb") as g:
            return g.read(16) == b"SQLite format 3\x00"
    except (OSError, EOFError, zlib.error):
        return False


def load_inputs(con: duckdb.DuckDBPyConnection, paths: "Sequence[str | TraceInput]",
                progress: Callable[[str], None] = lambda m: None,
                early: EarlyInflate | None = None) -> list[LoadResult]:
    """`early`: the first trace already being inflated (kineto.inflate_early), if it was.
    A path may be a TraceInput (one process of an export, an export already inflated)."""
    with tempfile.TemporaryDirectory(prefix="navdoctor-") as tmpdir:
        results = [_load_one(con, trace_input(path), trace_id, tmpdir, progress,
                             early if trace_id == 1 else None)
                   for trace_id, path in enumerate(paths, start=1)]
    # Kernel classification is shared by both formats, so it is done once here, once per
    # distinct name: traces hold millions of kernels but few kernel names.
    with phase("load.classify_kernels"):
        _classify_kernels(con)
    return results


def _classify_kernels(con: duckdb.DuckDBPyConnection) -> None:
    """uses_tensor_cores and is_communication of the kernels a loader left NULL, from their
    names (navdoctor/kernelnames.py): the distinct names classified here in Python, and only
    the rows whose value this changes written back, by one UPDATE. Both loaders classify
    their kernels as they insert them, so this mostly finds nothing to write (through the SQL
    functions it was two UPDATEs of every Kineto kernel: 2 MB fixture ~17 ms, 250 MB ~45 ms).
    A kernel without a name keeps uses_tensor_cores NULL and gets is_communication FALSE."""
    from .kernelnames import communication_kernel, tensor_core_kernel
    todo = []
    for name, tc_null, comm_null in con.execute("""
            SELECT name, bool_or(uses_tensor_cores IS NULL), bool_or(is_communication IS NULL)
            FROM kernels WHERE uses_tensor_cores IS NULL OR is_communication IS NULL
            GROUP BY name""").fetchall():
        tc = tensor_core_kernel(name) if tc_null and name is not None else None
        comm = communication_kernel(name) if comm_null else None
        if tc is not None or comm is not None:
            todo.append((name, tc, comm))
    if not todo:
        return
    con.execute("""
        UPDATE kernels
        SET uses_tensor_cores = COALESCE(kernels.uses_tensor_cores, m.tc),
            is_communication = COALESCE(kernels.is_communication, m.comm)
        FROM (SELECT unnest(?::VARCHAR[]) AS name, unnest(?::BOOLEAN[]) AS tc,
                     unnest(?::BOOLEAN[]) AS comm) m
        WHERE kernels.name IS NOT DISTINCT FROM m.name
          AND ((kernels.uses_tensor_cores IS NULL AND m.tc IS NOT NULL)
               OR (kernels.is_communication IS NULL AND m.comm IS NOT NULL))""",
        [list(c) for c in zip(*todo)])


def _load_one(con: duckdb.DuckDBPyConnection, inp: TraceInput, trace_id: int, tmpdir: str,
              progress: Callable[[str], None], early: EarlyInflate | None = None) -> LoadResult:
    path = inp.path
    fmt = detect_format(path)
    progress(f"loading {inp.name} ({fmt})")
    with phase(f"load.{fmt}"):
        res = _load_format(con, path, fmt, trace_id, tmpdir, early, inp)
    return res


def _load_format(con: duckdb.DuckDBPyConnection, path: str, fmt: str, trace_id: int,
                 tmpdir: str, early: EarlyInflate | None = None,
                 inp: TraceInput | None = None) -> LoadResult:
    inp = inp or TraceInput(path)
    if fmt == "kineto":
        try:
            res = load_kineto(con, path, trace_id, early)
        except duckdb.Error as e:  # an input no check foresaw: still one line naming the file
            if interrupted(e):
                raise
            lines = str(e).strip().splitlines()
            raise TraceError(path, "could not load this Kineto trace: "
                             + (lines[0][:300] if lines else type(e).__name__)) from None
    else:
        from .loaders import nsys
        sqlite_path = path
        if fmt == "nsys-rep":
            sqlite_path = nsys.convert_nsys_rep(path, tmpdir)
        elif fmt == "nsys-sqlite.gz":
            sqlite_path = inp.sqlite or inflate_bounded(
                path, os.path.join(tmpdir, f"input{trace_id}.sqlite"))
        res = nsys.load_nsys_sqlite(con, sqlite_path, trace_id, shown=path, process=inp.process)
        res.format = fmt
    res.path = inp.name
    con.execute("INSERT INTO inputs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [trace_id, res.path, res.format, res.source, res.producer, res.start_ns,
                 res.end_ns, res.events, res.warnings])
    return res


def prepare_store(con: duckdb.DuckDBPyConnection, paths: list[str],
                  progress: Callable[[str], None] = lambda m: None,
                  reader: StoreReader | None = None,
                  export: Callable[[duckdb.DuckDBPyConnection], None] | None = None,
                  early: EarlyInflate | None = None, functions: bool = True,
                  unprofiled_step_ms: float | None = None, origin: str = "given",
                  unprofiled_loader_wait_ms: float | Sequence[float] | None = None):
    """Load the traces, find and break down their steps, create the views rules query, and
    lock the connection down: the store as every rule sees it (analyze, `rules test`).
    `functions`: register the store's Python functions (store.FUNCTIONS), which the rules
    or `export` may call; without them numpy is never imported.
    `unprofiled_step_ms`: the same run's step timed without a tracer (diagnose's timing pass,
    or the user's own meters); each Nsight Systems input's tracer cost is then measured from
    it (unprofiled_steps, views.tracer_cost). `unprofiled_loader_wait_ms`: of that step, how long
    the GPU waited for DataLoader batches (diagnose's timing pass measures it): the trace's data
    wait beyond it is the tracers' own (docs/verdict.md, "Loader wait").
    Returns (load results, inferred steps, traces with no steps found, traces with none at all)."""
    with phase("schema"):
        store.create_schema(con, functions)
        store.bound_spill(con, _input_bytes(paths))
    with phase("load"):
        results = load_inputs(con, paths, progress, early)
        if unprofiled_step_ms is not None:
            record_unprofiled_step(con, unprofiled_step_ms, origin, unprofiled_loader_wait_ms)
    progress("computing the per-step breakdown")
    with phase("steps.infer"):
        breakdown.drop_loop_tails(con)
        inferred = stepfinder.infer_steps(con)
        missing_steps = breakdown.ensure_steps(con)
        stepless = {r[0] for r in con.execute(
            "SELECT trace_id FROM inputs WHERE trace_id NOT IN (SELECT trace_id FROM steps)").fetchall()}
    with phase("steps.align_to_gpu"):
        breakdown.align_steps_to_gpu(con)
    with phase("breakdown"):
        breakdown.compute_breakdown(con, keep_segments=reader is not None and reader.keep_segments)
    if reader is not None:
        reader.after_breakdown(con)
    with phase("views"):
        views.create_views(con)
        if export:
            export(con)
        engine.lock_down(con, functions)
    return results, inferred, missing_steps, stepless


def _input_bytes(paths) -> int:
    total = 0
    for p in paths:
        try:
            total += os.path.getsize(trace_input(p).path)
        except OSError:
            pass   # (the loader says so)
    return total


def record_unprofiled_step(con: duckdb.DuckDBPyConnection, step_ms: float, origin: str,
                           loader_wait_ms: float | Sequence[float] | None = None) -> None:
    """One unprofiled_steps row per input: the views then measure each trace's tracer cost
    (Nsight Systems' or torch.profiler's) from the step without it. loader_wait_ms: one wait,
    or each timing run's (their mean is the wait; their least and most are kept, so that runs
    on either side of the loader's line are seen: verdict.loader_wait_of)."""
    waits = [] if loader_wait_ms is None else (
        [float(loader_wait_ms)] if isinstance(loader_wait_ms, (int, float)) else [float(w) for w in loader_wait_ms])
    several = len(waits) > 1
    con.execute("INSERT INTO unprofiled_steps SELECT trace_id, $ns, $origin, $wait, $low, $high FROM inputs",
                {"ns": round(step_ms * 1e6), "origin": origin,
                 "wait": round(sum(waits) / len(waits) * 1e6) if waits else None,
                 "low": round(min(waits) * 1e6) if several else None,
                 "high": round(max(waits) * 1e6) if several else None})


def order_findings(verdict: verdict_mod.Verdict, findings: list[engine.Finding],
                   compute_may_lead: bool = True) -> list[engine.Finding]:
    """The findings ranked (engine.rank), led by the verdict's class (none for balanced and
    unknown), or by compute's where its remedies are expected to give more and a compute
    finding fired to say which (verdict.leading_class; a note then says so). Sets
    verdict.findings_lead to the class that leads; once per verdict (the note is appended).
    compute_may_lead=False for a multi-rank job: its class shares are the ranks' mean while a
    compute headroom is one rank's, so the two expected figures do not compare (a straggler's
    loading, 51% of its step, is a quarter of four ranks' mean)."""
    own = verdict.bound if verdict.bound in verdict_mod.CLASSES else None
    lead = verdict_mod.leading_class(verdict) if compute_may_lead else own
    if lead != own:
        if any(str(f.rule.category) == lead for f in findings):
            verdict.notes.append(verdict_mod.leading_note(verdict))
        else:
            lead = own
    verdict.findings_lead = lead
    return engine.rank(findings, lead)


def analyze(paths: list[str], rules: list[Rule], db_path: str | None = None,
            progress: Callable[[str], None] = lambda m: None, reader: StoreReader | None = None,
            export: Callable[[duckdb.DuckDBPyConnection], None] | None = None,
            early: EarlyInflate | None = None, unprofiled_step_ms: float | None = None,
            unprofiled_origin: str = "given",
            unprofiled_loader_wait_ms: float | Sequence[float] | None = None) -> Analysis:
    """`reader` (StoreReader) reads what it needs from the store while it is open, after the
    breakdown and after the verdict (the HTML report's views): a plain analysis pays nothing.
    `export(con)` runs once the breakdown and views exist and before the store is locked
    down (files can still be written): the job layer (navdoctor/ranks/) takes each rank's
    steps and collectives out there."""
    # A small gzipped first trace is inflated while the store is made (kineto.EarlyInflate),
    # unless the caller started that earlier still.
    if early is None and paths and not isinstance(paths[0], TraceInput):
        early = inflate_early(paths[0])
    con = store.connect_new(db_path)
    try:
        # the job layer's export calls collective_kind() and host_collective()
        functions = export is not None or engine.rules_use_functions(rules)
        results, inferred, missing_steps, stepless = prepare_store(
            con, paths, progress, reader, export, early, functions, unprofiled_step_ms,
            unprofiled_origin, unprofiled_loader_wait_ms)
        progress(f"evaluating {len(rules)} rules")
        with phase("rules"):
            evaluation = engine.evaluate_rules(con, rules)
        with phase("verdict"):
            verdict = verdict_mod.compute_verdict(con)
        with phase("whatif"):
            verdict.whatif = whatif.for_trace(con, verdict.primary_trace)
        findings = order_findings(verdict, engine.merge_by_rule(evaluation, verdict.primary_trace))
        failures = evaluation.failures
        if reader is not None:
            reader.after_verdict(con, rules, verdict, progress)
    except (RuntimeError, duckdb.InterruptException) as e:
        if interrupted(e):  # Ctrl-C inside a DuckDB query: an interrupt, not an error
            raise KeyboardInterrupt from None
        raise
    finally:
        con.close()
    names = [trace_input(p).name for p in paths]
    warnings = [f"{r.path}: {w}" for r in results for w in r.warnings]
    for tid in missing_steps:
        warnings.append(f"{names[tid - 1]}: " + (
            "nothing to time: no kernels, copies, CUDA API calls, CPU ops or DataLoader waits, "
            "so no step to analyse" if tid in stepless else
            "no step markers and no repeating structure to infer steps from; the whole trace "
            "is one step"))
    for tid, inf in inferred.items():
        warnings.append(f"{names[tid - 1]}: {inf.note()}")
    return Analysis(results, verdict, findings, failures, len(rules), db_path, warnings)
