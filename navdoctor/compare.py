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
from .verify import stats

COMPARE_SCHEMA_VERSION = "1.0"
FASTER, SLOWER, NO_CHANGE = "faster", "slower", "no change beyond the noise"
TOP_CHANGES = 10
# Run-to-run noise that one capture per side cannot show: the same configuration captured
# twice, in two processes one after the other, differed by up to 1.64x in median step
# (18 A/A pairs of five workloads on the H200, 2026-12-05: the largest ratio, memory_item_sync,
# whose whole second run was 1.64x faster, every step of it; docs/compare.md). With one
# capture on a side the interval is widened by this factor both ways, so that only a change
# beyond what a rerun alone can give is called faster or slower.
RUN_TO_RUN_NOISE = 1.64
MIN_STEPS = 3            # fewer steps on a side than this: no verdict (an interval of one step is none)
RUN_DIR_TRACES = ("kineto.json.gz", "kineto.json", "nsys.sqlite", "nsys.sqlite.gz")


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


def resolve(item: str) -> list[str]:
    """The trace files of one capture."""
    p = Path(item)
    if not p.exists():
        raise NavdoctorError(f"{item}: no such file or directory")
    if p.is_dir():
        found = [str(p / n) for n in RUN_DIR_TRACES if (p / n).is_file()]
        # one nsys export: the sqlite if both it and its gzip are there
        if str(p / "nsys.sqlite") in found and str(p / "nsys.sqlite.gz") in found:
            found.remove(str(p / "nsys.sqlite.gz"))
        if not found:
            raise NavdoctorError(f"{item}: a directory without kineto.json.gz or nsys.sqlite "
                                 "(give a `navdoctor diagnose` run directory, a report or traces)")
        return found
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
    paths = resolve(item)
    with tempfile.TemporaryDirectory(prefix="navdoctor-compare-") as tmp:
        db = str(Path(tmp) / "trace.duckdb")
        a = analyze(paths, rules, db_path=db)
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
                   kernels_ms=dict(kernels), ops_ms=ops, notes=list(v.notes))


# --- the comparison --------------------------------------------------------------------------

class CaptureOut(BaseModel):
    label: str
    inputs: list[str]
    steps: int
    step_ms: float | None
    bound: str
    confidence: float


class SideOut(BaseModel):
    captures: list[CaptureOut]
    bound: str = Field(description="the class most of the side's captures give")
    step_ms: float | None = Field(description="median step over the side's pooled steps")
    shares: dict[str, float] = Field(description="bucket shares, mean over captures")
    buckets_ms: dict[str, float] = Field(description="ms per step by bucket, mean over captures")


class ChangeOut(BaseModel):
    name: str
    before_ms: float = Field(description="ms per step")
    after_ms: float
    delta_ms: float


class StepTimeOut(BaseModel):
    result: str = Field(description="faster | slower | no change beyond the noise")
    detail: str
    speedup: float = Field(description="before / after, of median step times (>1: faster)")
    ci: list[float] = Field(description="95% interval of the speedup")
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
                             step_ms=round(stats._median(c.steps_ms), 4) if c.steps_ms else None,
                             bound=c.bound, confidence=c.confidence) for c in caps],
        bound=Counter(c.bound for c in caps).most_common(1)[0][0],
        step_ms=round(stats._median(pooled), 4) if pooled else None,
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


def compare_captures(before: list[Capture], after: list[Capture], margin: float = 0.05) -> CompareReport:
    for side, caps in (("before", before), ("after", after)):
        empty = [c.label for c in caps if not c.steps_ms]
        if empty:
            raise NavdoctorError(f"{empty[0]}: no steps to time on the {side} side")
    c = stats.compare([x.steps_ms for x in before], [x.steps_ms for x in after],
                      margin=margin, paired=False)
    low, high, verdict = c.ci_low, c.ci_high, c.verdict
    single = len(before) < 2 or len(after) < 2
    if single:
        low, high = low / RUN_TO_RUN_NOISE, high * RUN_TO_RUN_NOISE
        verdict = stats.decide(low, high, margin)
    result = {stats.HELPS: FASTER, stats.HURTS: SLOWER}.get(verdict, NO_CHANGE)
    detail = {stats.HELPS: f"the whole interval is above 1 + {margin:.0%}",
              stats.HURTS: f"the whole interval is below 1 / (1 + {margin:.0%})",
              stats.NO_EFFECT: f"the whole interval is within ±{margin:.0%}: any change is smaller",
              stats.INCONCLUSIVE: "the interval reaches past the margin without clearing it: "
                                  "more captures or steps would tell"}[verdict]
    notes = []
    if single:
        notes.append(f"one capture on a side: the interval is the steps' own spread widened "
                     f"{RUN_TO_RUN_NOISE:.2f}x both ways for run-to-run noise, the most that two "
                     f"captures of one configuration differed on the H200 (docs/compare.md); "
                     f"give several captures per side (--before A B C --after D E F) for an "
                     f"interval from the runs themselves")
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
        step_time=StepTimeOut(result=result, detail=detail, speedup=round(c.speedup, 4),
                              ci=[round(low, 4), round(high, 4)],
                              slowdown_ci=[round(1 / high - 1, 4), round(1 / low - 1, 4)],
                              margin=margin, before_ms=round(c.before_ms, 4),
                              after_ms=round(c.after_ms, 4), comparable=comparable),
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
    out = [f"COMPARE  {st.result.upper()}: {st.before_ms:.2f} -> {st.after_ms:.2f} ms/step, "
           f"{st.speedup:.2f}x [{st.ci[0]:.2f}, {st.ci[1]:.2f}] (95%; margin ±{st.margin:.0%})",
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
