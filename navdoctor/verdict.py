"""The verdict: one bottleneck class for the run, a confidence, and the shares behind it.

Classes map onto breakdown buckets: compute <- compute, memory <- copy + sync (host<->device
traffic and the stalls it forces), io <- data, launch <- launch (GPU idle while the host is
busy issuing work). `idle` (nothing recorded on either side) belongs to no class.
The thresholds are explained in docs/verdict.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from .views import STALL_FACTOR

CLASSES = ("io", "compute", "memory", "launch")
MIN_TOP_SHARE = 0.30      # a class must own at least this much of the step to be named
MIN_MARGIN = 0.10         # ... and lead the runner-up by this much, else 'balanced'
DISAGREE_SHARE = 0.15     # traces of one run disagree when a share differs by more


@dataclass
class TraceVerdict:
    trace_id: int
    source: str
    bound: str
    confidence: float
    shares: dict[str, float]          # the six buckets, summing to 1
    class_shares: dict[str, float]    # the four classes
    steps: int
    step_ms: float
    has_gpu: bool
    step_origin: str
    stall_steps: int = 0              # isolated stalls left out of the shares (views.py)
    step_inference: dict | None = None  # how steps were inferred (stepfinder.py), if they were


@dataclass
class Verdict:
    bound: str
    confidence: float
    shares: dict[str, float]
    class_shares: dict[str, float]
    step_ms: float | None
    steps: int
    per_trace: list[TraceVerdict] = field(default_factory=list)
    primary_trace: int | None = None
    disagreements: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def class_shares(shares: dict[str, float]) -> dict[str, float]:
    return {"io": shares["data"], "compute": shares["compute"],
            "memory": shares["copy"] + shares["sync"], "launch": shares["launch"]}


def decide(cls: dict[str, float], has_gpu: bool, steps: int) -> tuple[str, float]:
    ranked = sorted(cls.items(), key=lambda kv: -kv[1])
    (top, top_share), (_, second_share) = ranked[0], ranked[1]
    if top_share <= 0:
        return "unknown", 0.0
    margin = top_share - second_share
    if top_share < MIN_TOP_SHARE or margin < MIN_MARGIN:
        bound = "balanced"
        # Confident that it is balanced when no class stands out at all.
        confidence = max(0.0, 1.0 - margin / MIN_MARGIN) * 0.6 if margin < MIN_MARGIN else 0.3
    else:
        bound = top
        # Half from how far the class leads, half from how much of the step it owns.
        confidence = 0.5 * min(1.0, margin / 0.4) + 0.5 * min(1.0, top_share / 0.7)
    if not has_gpu:
        confidence *= 0.7          # no GPU timeline: copy, sync and launch cannot be seen
    if steps < 3:
        confidence *= 0.8          # one window: no evidence the pattern repeats
    return bound, round(min(1.0, max(0.0, confidence)), 3)


def compute_verdict(con: duckdb.DuckDBPyConnection) -> Verdict:
    rows = con.execute("""
        SELECT trace_id, source, steps, step_ms, has_gpu, step_origin, stall_steps,
               compute_share, copy_share, data_share, sync_share, launch_share, idle_share
        FROM trace_summary ORDER BY trace_id""").fetchall()
    inferred = _step_inferences(con)
    per_trace = []
    for (tid, source, steps, step_ms, has_gpu, origin, stalls, *vals) in rows:
        shares = dict(zip(("compute", "copy", "data", "sync", "launch", "idle"),
                          (round(float(v or 0.0), 4) for v in vals)))
        cls = class_shares(shares)
        bound, conf = decide(cls, bool(has_gpu), steps)
        per_trace.append(TraceVerdict(tid, source, bound, conf, shares, cls, steps,
                                      round(float(step_ms or 0.0), 3), bool(has_gpu), origin,
                                      int(stalls or 0), inferred.get(tid)))
    if not per_trace:
        return Verdict("unknown", 0.0, {}, {}, None, 0,
                       notes=["no steps and no activity in the inputs: nothing to classify"])

    primary = pick_primary(per_trace)
    shares = dict(primary.shares)
    cls = class_shares(shares)
    bound, conf = decide(cls, primary.has_gpu, primary.steps)
    verdict = Verdict(bound, conf, shares, {k: round(v, 4) for k, v in cls.items()},
                      primary.step_ms, primary.steps, per_trace, primary.trace_id)
    if len(per_trace) > 1:
        verdict.notes.append(f"verdict from trace {primary.trace_id} ({primary.source}); "
                             "the others corroborate (see per_trace)")
    verdict.disagreements = _disagreements(per_trace)
    if verdict.disagreements:
        verdict.confidence = round(verdict.confidence * 0.8, 3)
    if not primary.has_gpu:
        verdict.notes.append("CPU-only trace: GPU compute, copies and launch overhead are not "
                             "visible; the verdict weighs CPU op time against data loading")
    if primary.stall_steps:
        verdict.notes.append(f"{primary.stall_steps} isolated stall step(s) (over "
                             f"{STALL_FACTOR}x the median step) left out of the shares and the step "
                             f"time: a one-off wait is not the steady state (see step_breakdown)")
    if primary.step_origin == "whole-trace":
        verdict.notes.append("no step markers (ProfilerStep#N or NVTX navdoctor.step#N) and no "
                             "repeating structure in the trace: its whole span was treated as one step")
    elif primary.step_inference:
        verdict.notes.append(primary.step_inference["note"])
    return verdict


def _step_inferences(con: duckdb.DuckDBPyConnection) -> dict[int, dict]:
    try:
        rows = con.execute("""
            SELECT trace_id, method, detail, steps, period_calls, start_up_ns, tear_down_ns,
                   irregular_ns, irregular_stretches, note FROM step_inference""").fetchall()
    except duckdb.CatalogException:
        return {}
    return {r[0]: {"method": r[1], "detail": r[2], "steps_inferred": r[3], "period_calls": r[4],
                   "start_up_ms": round(r[5] / 1e6, 3), "tear_down_ms": round(r[6] / 1e6, 3),
                   "irregular_ms": round(r[7] / 1e6, 3), "irregular_stretches": r[8], "note": r[9]}
            for r in rows}


def pick_primary(per_trace: list[TraceVerdict]) -> TraceVerdict:
    """The trace whose timeline the verdict trusts most: one with a GPU timeline, then one
    with real step markers, then Nsight Systems over Kineto, because torch.profiler with
    shapes, memory and stacks adds host time to every op and so inflates launch overhead
    (measured on an H200: a step of batched metrics took 8.5 ms under torch.profiler and
    5.2 ms under nsys; the navigation workload 28.0 ms against 18.7 ms)."""
    return max(per_trace, key=lambda t: (t.has_gpu, t.step_origin != "whole-trace",
                                         not (t.step_origin or "").startswith(("inferred", "gpu-window")),
                                         t.source == "nsys", t.steps, -t.trace_id))


def _disagreements(per_trace: list[TraceVerdict]) -> list[str]:
    out = []
    gpu = [t for t in per_trace if t.has_gpu]
    for i, a in enumerate(gpu):
        for b in gpu[i + 1:]:
            if a.bound != b.bound:
                out.append(f"trace {a.trace_id} ({a.source}) says {a.bound}, "
                           f"trace {b.trace_id} ({b.source}) says {b.bound}")
            for k in a.shares:
                d = a.shares[k] - b.shares[k]
                if abs(d) > DISAGREE_SHARE:
                    out.append(f"{k} share: {a.shares[k]:.0%} in trace {a.trace_id} ({a.source}) vs "
                               f"{b.shares[k]:.0%} in trace {b.trace_id} ({b.source})")
    return out
