"""`navdoctor compare`: two sets of captures (before / after), each analysed on its own, then
set side by side: step time with a confidence interval, buckets, class, findings, and the
kernels and operators whose time changed most. A layer above the single-trace analysis: it
calls `analysis.analyze` per capture and reads the store that analysis leaves.

A capture is one run: a `navdoctor diagnose` run directory (its traces together), a navdoctor
report.json (the traces it names, or its run directory), or a trace file. The step times of a
capture are its primary trace's steady steps (isolated stalls left out, as in the verdict).
The interval and the verdict reuse `verify`'s statistics (navdoctor/verify/stats.py): a
two-level bootstrap over captures, then steps, and an equivalence margin.
"""
from __future__ import annotations

import json
import math
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
from pydantic import BaseModel, Field

from . import __version__
from .analysis import analyze
from .breakdown import BUCKETS
from .errors import NavdoctorError
from .kernelnames import cut_name, display_kernel_name, kernel_family
from .report import build_report, is_navdoctor_report
from .collect.rundir import is_run_dir, read_run_dir
from .verify import stats

COMPARE_SCHEMA_VERSION = "2.0"   # 2.0: the mean step (as the analysis reports it) instead of the
# median; step_time.method, step_ci, run_to_run and statistic
FASTER, SLOWER, NO_CHANGE = "faster", "slower", "no change beyond the noise"
TOP_CHANGES = 10
MIN_STEPS = 3            # fewer steps on a side than this: no verdict (an interval of one step is none)
BETWEEN_RUNS_AT = 3      # captures a side from which their own spread gives the interval
CONFIDENCE = 0.95


@dataclass
class Capture:
    label: str
    inputs: list[str]
    steps_ms: list[float]
    bound: str
    confidence: float
    shares: dict[str, float]
    buckets_ms: dict[str, float]
    findings: dict[str, tuple[str, str]]   # rule id -> (category, severity)
    kernels_ms: dict[str, float]        # per step, by normalised name
    ops_ms: dict[str, float]
    step_origin: str | None = None
    source: str | None = None           # the primary trace's tool: kineto | nsys
    notes: list[str] = field(default_factory=list)
    # a diagnose run directory's timing runs (two processes where a DataLoader fed the GPU)
    timing_runs_ms: list[float] = field(default_factory=list)


def resolve(item: str) -> list[str]:
    """The trace files of one capture."""
    p = Path(item)
    if not p.exists():
        raise NavdoctorError(f"{item}: no such file or directory")
    if p.is_dir():
        return read_run_dir(p).traces
    report = _as_report(p)
    if report is None:
        return [item]
    if "step_time" in report and "verdict" not in report:
        raise NavdoctorError(f"{item}: a compare result, not a navdoctor report; give the "
                             "captures it compared")

    def located(q: str) -> Path | None:
        # A relative path was relative to where the analysis ran, which the report does not
        # record: next to the report first (where `analyze t.json --json r.json` leaves both),
        # then the current directory.
        qp = Path(q)
        for cand in ([qp] if qp.is_absolute() else [p.parent / qp, qp]):
            if cand.exists():
                return cand
        return None

    run_dir = (report.get("run") or {}).get("dir")
    found_dir = located(run_dir) if run_dir else None
    if found_dir is not None and found_dir.is_dir():
        return resolve(str(found_dir))
    paths = [i.get("path") for i in report.get("inputs", []) if i.get("path")]
    here = [str(c) for c in (located(q) for q in paths) if c is not None and c.is_file()]
    if not here:
        raise NavdoctorError(f"{item}: a report whose traces are gone ({', '.join(paths) or 'none'}); "
                             "compare needs the step times, so give the traces or the run directory")
    return here


# A report is tens of kB (a job's of many ranks, a few MB); one larger is not read whole.
MAX_REPORT_BYTES = 64 << 20


def _as_report(p: Path) -> dict | None:
    if p.suffix != ".json" or not is_navdoctor_report(p):
        return None
    try:
        if p.stat().st_size > MAX_REPORT_BYTES:
            raise NavdoctorError(f"{p}: {p.stat().st_size / 2**20:.0f} MiB: larger than any "
                                 f"navdoctor report (at most {MAX_REPORT_BYTES >> 20} MiB read)")
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    except RecursionError:
        raise NavdoctorError(f"{p}: nested too deeply to be a navdoctor report") from None
    return doc if isinstance(doc, dict) else None


def analyse_capture(item: str, rules) -> Capture:
    """One capture analysed as `navdoctor analyze` would: a run directory (or a report of one)
    with what its timing pass measured (collect/rundir.py)."""
    paths = resolve(item)
    folder = Path(paths[0]).parent
    # a run directory, given as one or through its report.json: its timing pass counts too
    record = read_run_dir(folder) if is_run_dir(folder) else None
    if record is not None and sorted(record.traces) != sorted(paths):
        record = None
    timed = {} if record is None or record.unprofiled_step_ms is None else dict(
        unprofiled_step_ms=record.unprofiled_step_ms, unprofiled_origin="timing pass",
        unprofiled_loader_wait_ms=record.loader_waits_ms)
    with tempfile.TemporaryDirectory(prefix="navdoctor-compare-") as tmp:
        db = str(Path(tmp) / "trace.duckdb")
        a = analyze(paths, rules, db_path=db, **timed)
        report = build_report(a)
        v = a.verdict
        t = v.primary_trace
        con = duckdb.connect(db, read_only=True)
        try:
            steps = [r[0] / 1e6 for r in con.execute("""
                SELECT b.step_ns FROM step_breakdown b JOIN steady_steps s USING (trace_id, step_num)
                WHERE b.trace_id = ? ORDER BY b.step_num""", [t]).fetchall()] if t else []
            n = max(1, len(steps))
            buckets = con.execute(
                "SELECT " + ", ".join(f"avg({b}_ns) / 1e6" for b in BUCKETS) + """
                FROM step_breakdown b JOIN steady_steps s USING (trace_id, step_num)
                WHERE b.trace_id = ?""", [t]).fetchone() if t else None
            kernels = Counter()
            for name, ns in con.execute("""SELECT name, sum(dur_ns) FROM kernels_in_steps
                                           WHERE trace_id = ? GROUP BY name""", [t]).fetchall():
                kernels[kernel_family(name)] += ns / 1e6 / n
            # Operators come from the capture's trace that has them (Kineto; nsys records
            # none), per that trace's own steady steps.
            ops_trace = con.execute("""
                SELECT o.trace_id, count(DISTINCT o.step_num) FROM cpu_ops_in_steps o
                WHERE o.category IN ('cpu_op', 'operator') GROUP BY o.trace_id
                ORDER BY (o.trace_id = ?) DESC, o.trace_id LIMIT 1""", [t]).fetchone()
            ops = {}
            if ops_trace:
                ops = {name: ns / 1e6 / max(1, ops_trace[1]) for name, ns in con.execute("""
                    SELECT name, sum(dur_ns) FROM cpu_ops_in_steps
                    WHERE trace_id = ? AND category IN ('cpu_op', 'operator') GROUP BY name""",
                    [ops_trace[0]]).fetchall()}
        finally:
            con.close()
    primary = next((x for x in v.per_trace if x.trace_id == t), None)
    return Capture(label=item, inputs=paths, steps_ms=steps, bound=v.bound,
                   step_origin=primary.step_origin if primary else None,
                   source=primary.source if primary else None,
                   confidence=v.confidence, shares=dict(v.shares),
                   buckets_ms=dict(zip(BUCKETS, (float(x or 0.0) for x in (buckets or [])))),
                   findings={f.rule: (f.category, f.severity) for f in report.findings},
                   kernels_ms=dict(kernels), ops_ms=ops, notes=list(v.notes),
                   timing_runs_ms=list(record.timing_runs_ms) if record else [])


# --- the comparison --------------------------------------------------------------------------

class CaptureOut(BaseModel):
    label: str
    inputs: list[str]
    steps: int
    step_ms: float | None = Field(description="mean of the capture's steady steps: the analysis's "
                                  "verdict.step_ms of its primary trace")
    bound: str
    confidence: float


class SideOut(BaseModel):
    captures: list[CaptureOut]
    bound: str = Field(description="the class most of the side's captures give")
    step_ms: float | None = Field(description="mean step over the side's pooled steady steps")
    shares: dict[str, float] = Field(description="bucket shares, mean over captures")
    buckets_ms: dict[str, float] = Field(description="ms per step by bucket, mean over captures")


class ChangeOut(BaseModel):
    name: str
    before_ms: float = Field(description="ms per step")
    after_ms: float
    delta_ms: float


class RunToRunOut(BaseModel):
    factor: float = Field(description="the interval's widening for run-to-run noise, both ways "
                                      "(1.96 standard deviations of the difference between two runs)")
    source: str = Field(description="what measured it: 'halves of each capture', 'captures of a "
                                    "side' or 'timing runs' (a diagnose run directory's)")
    measured: dict[str, float] = Field(description="each source's factor")


class StepTimeOut(BaseModel):
    result: str = Field(description="faster | slower | no change beyond the noise")
    detail: str
    statistic: str = Field("mean", description="the step time of a side: the mean of its steady "
                                               "steps, as the analysis's verdict.step_ms")
    method: str = Field("steps", description="'steps': the captures' steps are the samples (bootstrap), "
                                    "with the run_to_run term; 'between runs': Welch's t on the "
                                    "captures' own step times (3 or more captures a side)")
    speedup: float = Field(description="before / after, of mean step times (>1: faster)")
    ci: list[float] = Field(description="95% interval of the speedup")
    step_ci: list[float] | None = Field(None, description="method 'steps': the interval of the "
                                        "steps alone, before the run-to-run term")
    run_to_run: RunToRunOut | None = Field(None, description="method 'steps': the run-to-run term")
    slowdown_ci: list[float] = Field(description="the interval as after/before - 1 (the gate's terms)")
    margin: float
    before_ms: float
    after_ms: float
    comparable: bool = Field(description="false when the steps cannot support a verdict (too few, "
                                         "or whole-trace steps with start-up): the gates never trip")


class CompareReport(BaseModel):
    schema_version: str = COMPARE_SCHEMA_VERSION
    tool: str = f"navdoctor {__version__}"
    step_time: StepTimeOut
    class_change: dict[str, str] = Field(description="before / after class")
    before: SideOut
    after: SideOut
    buckets: list[dict[str, Any]] = Field(description="per bucket: share and ms per step, before/after")
    findings: dict[str, list[str]] = Field(description="appeared, disappeared, both (rule ids)")
    kernels: list[ChangeOut] = Field(description="kernels (by family) whose time per step changed most")
    operators: list[ChangeOut] = Field(description="CPU operators (Kineto, inclusive time) that changed most")
    notes: list[str]


def _side(caps: list[Capture]) -> SideOut:
    pooled = [x for c in caps for x in c.steps_ms]
    mean = lambda key: {b: round(sum(getattr(c, key).get(b, 0.0) for c in caps) / len(caps), 4)  # noqa: E731
                        for b in BUCKETS}
    return SideOut(
        captures=[CaptureOut(label=c.label, inputs=c.inputs, steps=len(c.steps_ms),
                             step_ms=round(stats._mean(c.steps_ms), 4) if c.steps_ms else None,
                             bound=c.bound, confidence=c.confidence) for c in caps],
        bound=Counter(c.bound for c in caps).most_common(1)[0][0],
        step_ms=round(stats._mean(pooled), 4) if pooled else None,
        shares=mean("shares"), buckets_ms=mean("buckets_ms"))


def _changes(before: list[dict[str, float]], after: list[dict[str, float]]) -> list[ChangeOut]:
    def avg(side):
        total = Counter()
        for d in side:
            total.update(d)
        return {k: v / len(side) for k, v in total.items()}
    b, a = avg(before), avg(after)
    rows = [ChangeOut(name=k, before_ms=round(b.get(k, 0.0), 4), after_ms=round(a.get(k, 0.0), 4),
                      delta_ms=round(a.get(k, 0.0) - b.get(k, 0.0), 4)) for k in set(b) | set(a)]
    rows.sort(key=lambda r: (-abs(r.delta_ms), r.name))
    return [r for r in rows if r.delta_ms][:TOP_CHANGES]


def run_to_run(before: list[Capture], after: list[Capture]) -> RunToRunOut:
    """The run-to-run term of an interval made from steps, measured from the captures at hand
    (docs/compare.md, "One capture a side"): the difference between two runs of one
    configuration, read from (a) the two halves of each capture, as two runs of it; (b) the
    captures of a side that has several; (c) a diagnose run directory's two timing runs. Each
    gives the log-ratios d of such pairs; a run's own level then varies with sd r, r**2 =
    mean(d**2) / 2, and the difference between the sides' means by r * sqrt(1/n_before +
    1/n_after) (n: captures). The largest source is used (each one's factor is reported)."""
    ratios: dict[str, list[float]] = {"halves of each capture": [], "captures of a side": [],
                                      "timing runs": []}
    for c in before + after:
        d = stats.halves_log_ratio(c.steps_ms)
        if d is not None:
            ratios["halves of each capture"].append(d)
        runs = c.timing_runs_ms
        ratios["timing runs"] += [math.log(runs[i] / runs[j]) for i in range(len(runs))
                                  for j in range(i + 1, len(runs)) if runs[i] > 0 and runs[j] > 0]
    for caps in (before, after):
        means = [stats._mean(c.steps_ms) for c in caps]
        ratios["captures of a side"] += [math.log(means[i] / means[j]) for i in range(len(means))
                                         for j in range(i + 1, len(means))]
    scale = math.sqrt(1 / len(before) + 1 / len(after))
    z = stats.normal_quantile(CONFIDENCE)
    measured = {name: math.exp(z * math.sqrt(sum(d * d for d in ds) / len(ds) / 2) * scale)
                for name, ds in ratios.items() if ds}
    if not measured:
        return RunToRunOut(factor=1.0, source="none (under 3 steps a capture)", measured={})
    source = max(measured, key=measured.get)
    return RunToRunOut(factor=round(measured[source], 4), source=source,
                       measured={k: round(v, 4) for k, v in measured.items()})


def _widen(speedup: float, step_ci: tuple[float, float], run_log: float) -> tuple[float, float]:
    """The steps' interval and the run-to-run term, independent, added on a log scale."""
    c = math.log(speedup)
    low = c - math.hypot(c - math.log(step_ci[0]), run_log)
    high = c + math.hypot(math.log(step_ci[1]) - c, run_log)
    return math.exp(low), math.exp(high)


def interval_words(method: str, step_ci, run_term: RunToRunOut | None, nb: int, na: int) -> str:
    """What the interval is made of, in one note."""
    if method == "between runs":
        return (f"interval: between runs, Welch's t on the {nb} and {na} captures' mean steps "
                "(their own spread is the run-to-run noise)")
    term = (f"a run-to-run term of x{run_term.factor:.2f} both ways, measured from the "
            f"{run_term.source}" if run_term.measured else "no run-to-run term (too few steps to measure one)")
    return (f"interval: the captures' steps as samples (bootstrap of the mean step, "
            f"[{step_ci[0]:.2f}, {step_ci[1]:.2f}] alone) and {term}; one capture a side cannot "
            "show a shift between processes that its own steps do not: give 3 or more captures a "
            "side (--before A B C --after D E F) for the between-runs test")


def compare_captures(before: list[Capture], after: list[Capture], margin: float = 0.05) -> CompareReport:
    for side, caps in (("before", before), ("after", after)):
        empty = [c.label for c in caps if not c.steps_ms]
        if empty:
            raise NavdoctorError(f"{empty[0]}: no steps to time on the {side} side")
    b_runs, a_runs = [x.steps_ms for x in before], [x.steps_ms for x in after]
    before_ms = stats._mean([v for r in b_runs for v in r])
    after_ms = stats._mean([v for r in a_runs for v in r])
    speedup = before_ms / after_ms
    step_ci, run_term = None, None
    if len(before) >= BETWEEN_RUNS_AT and len(after) >= BETWEEN_RUNS_AT:
        method = "between runs"
        low, high = stats.between_runs_interval([stats._mean(r) for r in b_runs],
                                                [stats._mean(r) for r in a_runs], speedup, CONFIDENCE)
    else:
        method = "steps"
        step_ci = stats.steps_interval(b_runs, a_runs, CONFIDENCE)
        run_term = run_to_run(before, after)
        low, high = _widen(speedup, step_ci, math.log(run_term.factor))
    verdict = stats.decide(low, high, margin)
    result = {stats.HELPS: FASTER, stats.HURTS: SLOWER}.get(verdict, NO_CHANGE)
    detail = {stats.HELPS: f"the whole interval is above 1 + {margin:.0%}",
              stats.HURTS: f"the whole interval is below 1 / (1 + {margin:.0%})",
              stats.NO_EFFECT: f"the whole interval is within ±{margin:.0%}: any change is smaller",
              stats.INCONCLUSIVE: "the interval reaches past the margin without clearing it: "
                                  "more captures or steps would tell"}[verdict]
    notes = [interval_words(method, step_ci, run_term, len(before), len(after))]
    comparable = True
    few = {side: sum(len(x.steps_ms) for x in caps) for side, caps in (("before", before), ("after", after))}
    if min(few.values()) < MIN_STEPS:
        comparable = False
        detail = (f"too few steps to tell ({few['before']} before, {few['after']} after; at least "
                  f"{MIN_STEPS} a side): no verdict")
    whole = [x.label for x in before + after if x.step_origin == "whole-trace"]
    if whole:
        comparable = False
        detail = (f"{whole[0]} has no steps, only its whole span (start-up included), which is "
                  "not a step time: no verdict")
    if not comparable:
        result = NO_CHANGE
    kinds = {x.step_origin or "?" for x in before} , {x.step_origin or "?" for x in after}
    if kinds[0] != kinds[1]:
        notes.append(f"the sides' steps come from different sources ({', '.join(sorted(kinds[0]))} "
                     f"before, {', '.join(sorted(kinds[1]))} after): a step may not mean the same")
    tools = {x.source for x in before}, {x.source for x in after}
    if tools[0] != tools[1]:
        notes.append(f"the sides were traced by different tools ({', '.join(sorted(map(str, tools[0])))} "
                     f"before, {', '.join(sorted(map(str, tools[1])))} after): each tool's own cost is "
                     "in its step times (torch.profiler with shapes and stacks adds host time)")
    for side, caps in (("before", before), ("after", after)):
        seen = [tuple(x.inputs) for x in caps]
        if len(set(seen)) < len(seen):
            notes.append(f"the same capture is given twice on the {side} side: it is counted twice, "
                         "and the interval does not hold run-to-run noise")
    for caps in (before, after):
        for x in caps:
            notes += [f"{x.label}: {n}" for n in x.notes]
    sb, sa = _side(before), _side(after)
    buckets = [{"bucket": b, "before_share": sb.shares[b], "after_share": sa.shares[b],
                "before_ms": sb.buckets_ms[b], "after_ms": sa.buckets_ms[b],
                "delta_ms": round(sa.buckets_ms[b] - sb.buckets_ms[b], 4)} for b in BUCKETS]
    fb = set().union(*(x.findings for x in before))
    fa = set().union(*(x.findings for x in after))
    return CompareReport(
        step_time=StepTimeOut(result=result, detail=detail, method=method,
                              speedup=round(speedup, 4), ci=[round(low, 4), round(high, 4)],
                              step_ci=[round(x, 4) for x in step_ci] if step_ci else None,
                              run_to_run=run_term,
                              slowdown_ci=[round(1 / high - 1, 4), round(1 / low - 1, 4)],
                              margin=margin, before_ms=round(before_ms, 4),
                              after_ms=round(after_ms, 4), comparable=comparable),
        class_change={"before": sb.bound, "after": sa.bound}, before=sb, after=sa,
        buckets=buckets,
        findings={"appeared": sorted(fa - fb), "disappeared": sorted(fb - fa), "both": sorted(fa & fb)},
        kernels=_changes([x.kernels_ms for x in before], [x.kernels_ms for x in after]),
        operators=_changes([x.ops_ms for x in before], [x.ops_ms for x in after]),
        notes=notes)


def new_finding_categories(report: CompareReport, after: list[Capture]) -> set[str]:
    """Categories of the findings that appeared, info findings (what a trace holds, not a
    problem) left out."""
    cats = {}
    for x in after:
        cats.update(x.findings)
    return {cats[r][0] for r in report.findings["appeared"] if r in cats and cats[r][1] != "info"}


def render_text(r: CompareReport) -> str:
    st = r.step_time
    out = [f"COMPARE  {st.result.upper()}: {st.before_ms:.2f} -> {st.after_ms:.2f} ms/step "
           f"({st.statistic} of the steady steps), {st.speedup:.2f}x [{st.ci[0]:.2f}, "
           f"{st.ci[1]:.2f}] (95%; margin ±{st.margin:.0%})",
           f"  {st.detail}",
           f"  class: {r.class_change['before']} -> {r.class_change['after']}",
           "  per step (ms):  " + " | ".join(
               f"{b['bucket']} {b['before_ms']:.2f}->{b['after_ms']:.2f}" for b in r.buckets
               if b["before_ms"] >= 0.005 or b["after_ms"] >= 0.005)]
    if r.findings["appeared"]:
        out.append("  findings appeared: " + ", ".join(r.findings["appeared"]))
    if r.findings["disappeared"]:
        out.append("  findings gone: " + ", ".join(r.findings["disappeared"]))
    for title, rows, show in (("kernels", r.kernels, display_kernel_name),
                              ("operators", r.operators, cut_name)):
        if rows:
            out.append(f"  {title} that changed most (ms/step):")
            out += [f"    {x.delta_ms:+9.3f}  {x.before_ms:9.3f} -> {x.after_ms:9.3f}  {show(x.name, 90)}"
                    for x in rows[:5]]
    out += [f"  note: {n}" for n in r.notes]
    return "\n".join(out) + "\n"


def compare_json_schema() -> dict:
    return CompareReport.model_json_schema()
