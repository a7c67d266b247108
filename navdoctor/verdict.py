"""The verdict: one bottleneck class for the run, a confidence, and the shares behind it.

Classes map onto the breakdown's eight buckets (class_shares): compute <- compute, memory <-
copy + sync + comm (host<->device traffic, the stalls it forces, exposed communication), io <-
data + host (the GPU waits for batches or for the host's own work between launches), launch <-
launch (GPU idle while the host is busy issuing work). `idle` (nothing recorded on either
side) belongs to no class.
The thresholds are explained in docs/verdict.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from .breakdown import BUCKETS
from .headroom import HEADROOM_COLUMNS, expected_speedup, speedup_without_share
from .steady import STALL_FACTOR

CLASSES = ("io", "compute", "memory", "launch")
CAUSES = ("io", "memory", "launch")   # the classes that are causes of GPU idle time
CAUSE_SHARE = 0.20        # a cause owning this much of the step binds it (XProf: >= 20% input
                          # wait is "highly input-bound"); see docs/verdict.md, "Policy"
# The tracer's cost per CUDA call is not one number (the traced step exceeded the unprofiled one
# by -6.7 to 56.4 us per call on the mixed corpus, docs/accuracy.md, "Tracer cost"): an nsys trace's class is
# also decided with no correction and with twice the assumed cost; where those differ from the
# class at the assumed cost, the verdict says so and is this much less sure.
TRACER_CHECK_FACTORS = (0, 2)
# Where the cost is measured (the step also timed without a tracer) the check is around the
# measurement instead: the costs the unprofiled step implies at this much more and less. The
# timing pass read within 3% of the scripts' own meters on the H100 checks (docs/diagnose.md).
TIMING_NOISE = 0.05
# A close call: the class depends on the tracer's cost (above), or the largest cause of GPU idle
# time is within CLOSE_BAND of CAUSE_SHARE, where the mixed corpus's labels go either way
# (docs/accuracy.md, "Close calls"). The verdict names the other class and is this much less sure.
CLOSE_BAND = 0.07
# Where the GPU's wait for DataLoader batches was timed without a tracer (diagnose's timing
# pass: steady.steady_loader_wait_ms), a wait of this share of the unprofiled step binds the run
# to io even under CAUSE_SHARE: the workers remedy then clears verify's 5% margin (the step
# without a wait of 1 - 1/1.05 = 4.76% of it is 1.05x faster; the measured wait predicted the workers' gain
# within 3.2%, never above it, on 12 re-timed corpus points), while faster GPU work is not
# expected to shorten a step whose GPU waits on the host's loop (on the 18 corpus data points
# where workers helped, bf16 + channels_last gave less than the workers on all 18, at most
# 1.09x on 16); the TensorBoard plugin flags a DataLoader from 5% too (docs/verdict.md,
# "Loader wait"). (Once a rounded 5%: 1.053x, a little above its own reason.)
LOADER_WAIT_BINDS = 1 - 1 / 1.05
CLOSE_CALL_FACTOR = 0.6
MIN_TOP_SHARE = 0.30      # a class must own at least this much of the step to be named
MIN_MARGIN = 0.10         # ... and lead the runner-up by this much, else 'balanced'
DISAGREE_SHARE = 0.15     # traces of one run disagree when a share differs by more


@dataclass
class TraceVerdict:
    trace_id: int
    source: str
    bound: str
    confidence: float
    shares: dict[str, float]          # the eight buckets, summing to 1
    class_shares: dict[str, float]    # the four classes
    steps: int
    step_ms: float
    has_gpu: bool
    step_origin: str
    stall_steps: int = 0              # isolated stalls left out of the shares (views.py)
    step_inference: dict | None = None  # how steps were inferred (stepfinder.py), if they were
    tracer_cost: dict | None = None     # the tracer's own launch time, left out of the class
    class_by_tracer_cost: dict[str, str] | None = None  # ns per call -> class, where they differ
    close_to: list[str] | None = None   # the other classes of a close call (close_call())
    close_call_gains: dict[str, float] | None = None  # class -> expected speed-up (settle_by_gain)
    compute_headroom: dict | None = None  # what bf16 + channels_last can remove (headroom.py)
    loader_wait: dict | None = None     # the DataLoader wait timed without a tracer (loader_wait_of)
    judged_step_ms: float | None = None  # the step class_shares are of (judged_class_shares)


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
    tracer_cost: dict | None = None
    class_by_tracer_cost: dict[str, str] | None = None
    close_to: list[str] | None = None
    close_call_gains: dict[str, float] | None = None
    compute_headroom: dict | None = None
    loader_wait: dict | None = None
    judged_step_ms: float | None = None
    # the class whose findings are ranked first (set by analysis: leading_class, kept only where
    # a finding of that class fired); None for balanced and unknown
    findings_lead: str | None = None
    # the what-if model's figures for the primary trace (whatif.for_trace; set by analysis)
    whatif: dict | None = None


def class_shares(shares: dict[str, float]) -> dict[str, float]:
    return {"io": shares["data"] + shares["host"], "compute": shares["compute"],
            "memory": shares["copy"] + shares["sync"] + shares["comm"],
            "launch": shares["launch"]}


def decide(cls: dict[str, float], has_gpu: bool, steps: int, loader_binds: bool = False
           ) -> tuple[str, float]:
    """The class of a step from its class shares (docs/verdict.md, "Policy").

    On a GPU run the question is why the GPU is not computing: when a cause of GPU idle time
    (io, memory, launch) owns CAUSE_SHARE of the step or more, the run is bound by the largest
    such cause, even if the GPU computes for longer than that (a V100 ResNet-50 computing 56%
    of the step and waiting 33% on its DataLoader is I/O-bound: more workers are what speeds it
    up); two causes within MIN_MARGIN of each other are `balanced`. Only when no cause reaches
    CAUSE_SHARE is the run compute-bound (if the GPU computes MIN_TOP_SHARE of the step).
    Without a GPU timeline the classes are compared as they are.
    `loader_binds`: the GPU's wait for DataLoader batches, timed without a tracer, is
    LOADER_WAIT_BINDS of the step or more: io then binds a step that no cause reaching
    CAUSE_SHARE binds (loader_wait_of)."""
    if not has_gpu:
        return _by_largest(cls, steps, has_gpu)
    causes = sorted(((c, cls[c]) for c in CAUSES), key=lambda kv: -kv[1])
    (top, top_share), (_, second_share) = causes[0], causes[1]
    if top_share >= CAUSE_SHARE:
        margin = top_share - second_share
        if margin < MIN_MARGIN and second_share >= CAUSE_SHARE:   # two causes, neither leads
            return "balanced", _penalise(_tie_confidence(margin), steps, has_gpu)
        return top, _penalise(_lead_confidence(margin, top_share, 0.5), steps, has_gpu)
    if loader_binds:    # (under the line: sure by how far it leads and how near the line it is)
        lead = max(0.0, cls["io"] - max(cls[c] for c in CAUSES if c != "io"))
        return "io", _penalise(_lead_confidence(lead, cls["io"], CAUSE_SHARE), steps, has_gpu)
    compute = cls["compute"]
    if compute >= MIN_TOP_SHARE:
        return "compute", _penalise(_lead_confidence(compute - top_share, compute, 0.7),
                                    steps, has_gpu)
    if top_share <= 0 and compute <= 0:
        return "unknown", 0.0
    return "balanced", _penalise(0.3, steps, has_gpu)


def _by_largest(cls: dict[str, float], steps: int, has_gpu: bool) -> tuple[str, float]:
    ranked = sorted(cls.items(), key=lambda kv: -kv[1])
    (top, top_share), (_, second_share) = ranked[0], ranked[1]
    if top_share <= 0:
        return "unknown", 0.0
    margin = top_share - second_share
    if top_share < MIN_TOP_SHARE or margin < MIN_MARGIN:
        confidence = _tie_confidence(margin) if margin < MIN_MARGIN else 0.3
        return "balanced", _penalise(confidence, steps, has_gpu)
    return top, _penalise(_lead_confidence(margin, top_share, 0.7), steps, has_gpu)


def _lead_confidence(margin: float, share: float, full_share: float) -> float:
    """Half from how far the class leads (full at 40 points), half from how much of the step
    it owns (full at full_share)."""
    return 0.5 * min(1.0, margin / 0.4) + 0.5 * min(1.0, share / full_share)


def _tie_confidence(margin: float) -> float:
    """How sure `balanced` is: sure when nothing stands out at all."""
    return max(0.0, 1.0 - margin / MIN_MARGIN) * 0.6


def _penalise(confidence: float, steps: int, has_gpu: bool) -> float:
    if not has_gpu:
        confidence *= 0.7          # no GPU timeline: copy, sync and launch cannot be seen
    if steps < 3:
        confidence *= 0.8          # one window: no evidence the pattern repeats
    return round(min(1.0, max(0.0, confidence)), 3)


def compute_verdict(con: duckdb.DuckDBPyConnection) -> Verdict:
    """Each trace's class (judge_trace), then the run's from the primary trace, with the
    notes that explain it (_verdict_notes)."""
    rows = con.execute("""
        SELECT trace_id, source, steps, step_ms, has_gpu, step_origin, stall_steps,
               compute_share, comm_share, copy_share, data_share, sync_share, launch_share,
               host_share, idle_share
        FROM trace_summary ORDER BY trace_id""").fetchall()
    inferred = _step_inferences(con)
    headroom = _compute_headroom(con)
    per_trace = []
    missing: dict[int, str | None] = {}   # why a trace without a GPU gets no class
    for row in rows:
        tid = row[0]
        trace, missing[tid] = judge_trace(con, row, inferred.get(tid), headroom.get(tid))
        per_trace.append(trace)
    if not per_trace:
        return Verdict("unknown", 0.0, {}, {}, None, 0,
                       notes=["no steps and no activity in the inputs: nothing to classify"])

    primary = pick_primary(per_trace)
    shares = dict(primary.shares)
    cls = primary.class_shares
    bound, conf = primary.bound, primary.confidence
    verdict = Verdict(bound, conf, shares, {k: round(v, 4) for k, v in cls.items()},
                      primary.step_ms, primary.steps, per_trace, primary.trace_id,
                      tracer_cost=primary.tracer_cost,
                      class_by_tracer_cost=primary.class_by_tracer_cost, close_to=primary.close_to,
                      close_call_gains=primary.close_call_gains,
                      compute_headroom=primary.compute_headroom, loader_wait=primary.loader_wait,
                      judged_step_ms=primary.judged_step_ms)
    _verdict_notes(con, verdict, per_trace, primary, missing[primary.trace_id])
    return verdict


def judge_trace(con: duckdb.DuckDBPyConnection, row: tuple, inference: dict | None,
                headroom: dict | None) -> tuple[TraceVerdict, str | None]:
    """One trace's class from its trace_summary row: the class shares (the tracer's cost and
    the measured loader wait taken out), the decision, close calls and what settles them.
    Also why a trace with no GPU timeline gets no class (None where it has one)."""
    (tid, source, steps, step_ms, has_gpu, origin, stalls, *vals) = row
    shares = dict(zip(BUCKETS, (round(float(v or 0.0), 4) for v in vals)))
    loader = loader_wait_of(con, tid) if has_gpu else None
    cost = _tracer_cost(con, tid, source, shares, step_ms) if has_gpu else None
    cls, judged_ms = judged_class_shares(shares, float(step_ms or 0.0), cost, loader)
    binds = loader_binds(loader)
    bound, conf = decide(cls, bool(has_gpu), steps, binds)
    by_cost = _class_by_tracer_cost(shares, float(step_ms), cost, bound, steps, loader) if cost else None
    close = close_call(cls, bound, bool(has_gpu), by_cost, near_line=share_line_checked(loader, bound))
    by_run = classes_by_run(con, tid, shares, float(step_ms or 0.0), cost, loader, bool(has_gpu), steps)
    other_runs = by_run - {bound, "balanced", "unknown"}
    if len(by_run) > 1 and bound in CLASSES and other_runs:   # timing runs that disagree
        loader["edge"] = True
        close = sorted({*(close or []), *other_runs})
    if close or by_cost:      # once, whichever check fired (a flip to balanced names no class)
        conf = round(conf * CLOSE_CALL_FACTOR, 3)
    gains = None
    room = headroom_of(headroom, judged_ms) if has_gpu else None
    if close and room:
        bound, close, gains = settle_by_gain(bound, close, cls, compute_speedup_expected(room, loader))
        if by_cost:   # the class at the assumed tracer cost is the verdict's, settled or not
            by_cost[str(cost["ns_per_call"])] = bound
            by_cost = by_cost if len(set(by_cost.values())) > 1 else None
    # after the gains settled any other close call: io named by the trace's own wait is no
    # candidate for the class (its share in the class is the measured wait's, which does
    # not bind), only the other side of a close call
    if bound in CLASSES and bound != "io" and binds_traced(shares, float(step_ms or 0.0), cost, loader,
                                                           bool(has_gpu), steps):
        loader["traced_binds"] = True       # the trace's own wait and the timing runs disagree
        if not (close or by_cost):
            conf = round(conf * CLOSE_CALL_FACTOR, 3)
        close = sorted({*(close or []), "io"})
    missing = None if has_gpu else _missing_timeline(con, tid)
    if missing:
        bound, conf, close = "unknown", 0.0, None     # a GPU job seen without its GPU: no class
    return TraceVerdict(tid, source, bound, conf, shares, cls, steps,
                        round(float(step_ms or 0.0), 3), bool(has_gpu), origin,
                        int(stalls or 0), inference, cost, by_cost, close,
                        gains, room, loader, judged_ms), missing


def _verdict_notes(con: duckdb.DuckDBPyConnection, verdict: Verdict, per_trace: list[TraceVerdict],
                   primary: TraceVerdict, missing: str | None) -> None:
    """The notes (and confidence cuts) that explain the verdict: disagreements between traces,
    what was left out, the tracers' cost, loader waits and close calls."""
    bound, cls = verdict.bound, primary.class_shares
    if len(per_trace) > 1:
        verdict.notes.append(f"verdict from trace {primary.trace_id} ({primary.source}); "
                             "the others corroborate (see per_trace)")
    verdict.disagreements = _disagreements(per_trace)
    if verdict.disagreements:
        verdict.confidence = round(verdict.confidence * 0.8, 3)
    if missing:
        verdict.bound, verdict.confidence = "unknown", 0.0
        verdict.notes.append(missing)
    elif not primary.has_gpu:
        verdict.notes.append("CPU-only trace: GPU compute, copies and launch overhead are not "
                             "visible; the verdict weighs CPU op time against data loading and host collectives")
    if primary.stall_steps:
        verdict.notes.append(f"{primary.stall_steps} isolated stall step(s) (over "
                             f"{STALL_FACTOR}x the median step) left out of the shares and the step "
                             f"time: a one-off wait is not the steady state (see step_breakdown)")
    if bound in ("launch", "balanced") and primary.source == "kineto" and not primary.tracer_cost \
            and heavy_profiler(con, primary.trace_id):
        # the class rests on a share the capture's own settings inflate: less sure, and the
        # what-if model's figures use its prior for such traces, with wider ranges
        verdict.confidence = round(verdict.confidence * CLOSE_CALL_FACTOR, 3)
        verdict.notes.append(
            "this torch.profiler trace records shapes or Python stacks, which add host time to "
            "every op (an H200 ResNet-50 step: 31.6 ms under nsys, 43.7 ms under torch.profiler "
            "with shapes, memory and stacks): part of the launch share is the profiler's own, so "
            "the confidence is lowered and the expected speed-ups assume the profiler's typical "
            "share (wider ranges); a trace without record_shapes/with_stack, an nsys capture, or "
            "the step timed without a tracer (analyze --unprofiled-step-ms) tells how much")
    cost = primary.tracer_cost
    measured = bool(cost) and "unprofiled_step_ms" in cost   # the cost measured, not assumed
    if cost and cost["launch_share_traced"] - cost["launch_share"] >= 0.05:
        basis = (f"measured: the traced step {primary.step_ms:.1f} ms against "
                 f"{cost['unprofiled_step_ms']:.1f} ms unprofiled"
                 if measured else "under what a call cost in measured runs")
        verdict.notes.append(
            f"{cost['cuda_calls_per_step']:.0f} CUDA calls per step under "
            f"{'Nsight Systems' if primary.source == 'nsys' else 'torch.profiler'}: at "
            f"{cost['ns_per_call'] / 1000:.1f} us each ({basis}) "
            f"{cost['ms_per_step']:.1f} ms of the step's launch time is the tracer's own; the "
            f"class is judged on the step without it (launch {cost['launch_share']:.0%} of "
            f"{cost['step_ms']:.1f} ms instead of {cost['launch_share_traced']:.0%} of {primary.step_ms:.1f} ms)")
    if measured:
        _check_unprofiled(verdict, primary, cost)
    _loader_notes(verdict, primary, con)
    if primary.class_by_tracer_cost and not missing:
        alt = ", ".join(f"{c} at {int(ns) / 1000:g} us" for ns, c in primary.class_by_tracer_cost.items())
        verdict.notes.append(
            f"the class depends on what the tracing cost per CUDA call ({alt}; "
            + (f"measured, and {TIMING_NOISE:.0%} either way of the unprofiled step" if measured else
               "the cost measured on real runs varies, docs/accuracy.md, 'Tracer cost'")
            + "): less sure; "
            + ("" if measured else
               "the step timed without a tracer (`diagnose` does it; `analyze "
               "--unprofiled-step-ms`) measures it; ")
            + "`navdoctor verify` of both classes' remedies settles it")
    if (primary.close_to and share_line_checked(primary.loader_wait, primary.bound)
            and _top_cause_near_line(cls) and not missing):
        top = max(CAUSES, key=lambda c: cls[c])
        verdict.notes.append(
            f"a close call: {top} owns {cls[top]:.0%} of the step, within {CLOSE_BAND * 100:.0f} "
            f"points of the {CAUSE_SHARE:.0%} at which a cause of GPU idle time binds the step; near that line "
            f"the measured best remedy was sometimes {top}'s and sometimes compute's "
            f"(docs/accuracy.md, 'Close calls'): `navdoctor verify` of both settles it")
    if primary.close_call_gains and not missing:
        gains = primary.close_call_gains
        alt = ", ".join(f"{c} ~{g:.2f}x" for c, g in sorted(gains.items(), key=lambda kv: -kv[1]))
        why = ("none from compute while the GPU waits on the loader" if loader_binds(primary.loader_wait) else
               "compute's from the kernels bf16 and channels_last speed up, docs/verdict.md, "
               "'Compute headroom'")
        verdict.notes.append(
            f"the close call is named by what each class's remedies are expected to give ({alt}; {why})")
    if primary.step_origin == "whole-trace":
        verdict.notes.append("no step markers (ProfilerStep#N or NVTX navdoctor.step#N) and no "
                             "repeating structure in the trace: its whole span was treated as one step")
    elif primary.step_inference:
        verdict.notes.append(primary.step_inference["note"])


def _tracer_cost(con: duckdb.DuckDBPyConnection, trace_id: int, source: str,
                 shares: dict[str, float], step_ms: float | None) -> dict | None:
    """How much of an Nsight Systems trace's launch share is the tracer's own cost: the CUDA
    calls per steady step times the cost per call (views.tracer_cost: NSYS_NS_PER_CUDA_CALL,
    or measured where the step was also timed without a tracer), at most the launch time
    itself. The tracer slows the host's CUDA calls; where the GPU waits for them, that cost
    lengthens the step as launch time, and where the GPU is busy it is hidden, so only launch
    time can hold it. A compute-bound training step (an H200, torchvision train.py, 38.2 ms unprofiled with
    31.5 ms of kernels) read 23% launch under nsys, 52 ms a step. Kineto traces get a note
    instead (torch.profiler's cost per op varies with what it records)."""
    if not step_ms:
        return None
    row = con.execute("""SELECT cuda_calls_per_step, ns_per_call, unprofiled_step_ns
                         FROM tracer_cost WHERE trace_id = $t""", {"t": trace_id}).fetchall()
    # (a Kineto trace has a row only where its cost is measured)
    if not row or not row[0][0] or (source != "nsys" and row[0][2] is None):
        return None
    per_step, ns_per_call, unprofiled_ns = row[0]
    cost = cost_at(shares, float(step_ms), float(per_step), int(ns_per_call))
    if unprofiled_ns is not None:   # measured: the same run timed without a tracer
        cost["unprofiled_step_ms"] = round(unprofiled_ns / 1e6, 3)
    return cost


def share_line_checked(loader: dict | None, bound: str) -> bool:
    """Whether the share line's close call is checked: not for a run the measured loader wait
    binds to io (the GPU waits on the host's loop; computing faster does not help)."""
    return not (loader_binds(loader) and bound == "io")


def loader_binds(loader: dict | None) -> bool:
    """The DataLoader wait timed without a tracer binds the run to io (loader_wait_of)."""
    return bool(loader and loader["binds"])


def compute_speedup_expected(headroom: dict | None, loader: dict | None) -> float | None:
    """What compute's remedies are expected to give the step: the compute headroom's figure,
    or nothing (1.0) while the GPU waits on the loader unprofiled (computing faster does not
    shorten such a step: docs/verdict.md, "Loader wait"). Where timing runs disagree (a loader
    edge) the runs' mean decides this too: on the corpus's 18 data points where the workers
    helped, bf16 + channels_last gave less than they did on every one."""
    if loader_binds(loader):
        return 1.0
    return (headroom or {}).get("speedup_expected")


def _loader_notes(verdict: "Verdict", primary: "TraceVerdict", con: duckdb.DuckDBPyConnection) -> None:
    """What the DataLoader wait timed without a tracer changed: the tracer's part of the
    trace's data wait, taken out; a wait that binds the run to io under CAUSE_SHARE; a
    measured wait the trace gives no DataLoader fetch to compare with (not used)."""
    w = primary.loader_wait
    if not w:
        unused = con.execute("SELECT loader_wait_ns FROM unprofiled_step WHERE trace_id = $t",
                             {"t": primary.trace_id}).fetchone()
        if primary.has_gpu and unused and unused[0] is not None:
            verdict.notes.append(
                f"the DataLoader wait timed without a tracer ({unused[0] / 1e6:.1f} ms a step) is "
                "not used: this trace shows no DataLoader fetch in its steps (a figure of "
                "another run?)")
        return
    by = "diagnose's timing pass" if w["origin"] == "timing pass" else "the figure given"
    if w["tracer_ms"] >= 0.01 * primary.step_ms:
        verdict.notes.append(
            f"without a tracer the GPU waited {w['unprofiled_ms']:.1f} ms a step for DataLoader "
            f"batches ({by}), against {w['traced_ms']:.1f} ms in the trace: "
            f"{w['tracer_ms']:.1f} ms of the traced wait is the tracer's own (it slows the "
            "loader's host work) and is left out of the class")
    if w["edge"] and primary.close_to:
        low, high = w["runs_ms"]
        verdict.notes.append(
            f"a close call: without a tracer the GPU waited {low:.1f} ms a step for DataLoader "
            f"batches in one timing run and {high:.1f} ms in another ({by}; {w['unprofiled_ms']:.1f} "
            "ms on average), and the two give different classes: whether the loader hides "
            "behind the GPU changes from one process to the next (docs/accuracy.md, 'Loader "
            "wait'); `navdoctor verify` of num_workers, over several processes, settles it")
    if w.get("traced_binds") and not w["edge"]:      # (the runs' note says as much)
        verdict.notes.append(
            f"a close call: the trace's own DataLoader wait ({w['traced_ms']:.1f} ms a step) makes "
            f"the run io-bound, but without a tracer the GPU waited {w['unprofiled_ms']:.1f} ms "
            f"({by}): the loader's host work hides behind the GPU only while the host is not "
            "slowed as the tracer slows it, and a busier host can make it wait (docs/verdict.md, "
            "'Loader wait'); `navdoctor verify` of num_workers, over several processes, settles it")
    if w["binds"] and primary.bound == "io" and primary.class_shares["io"] < CAUSE_SHARE:
        verdict.notes.append(
            f"io under the {CAUSE_SHARE:.0%} line: the GPU waits for DataLoader batches "
            f"{w['share']:.1%} of the step without a tracer ({by}), over the "
            f"{LOADER_WAIT_BINDS:.2%} at which the loader binds it (docs/verdict.md, 'Loader "
            f"wait'): without the wait the step would be ~{speedup_without_share(w['share']):.2f}x "
            "faster, and faster GPU work is not expected to shorten a step whose GPU waits "
            "on the loader")


def loader_wait_of(con: duckdb.DuckDBPyConnection, trace_id: int) -> dict | None:
    """The GPU's wait for DataLoader batches as timed without a tracer, against the trace's
    (the loader_wait view: diagnose's timing pass, or `analyze --unprofiled-loader-wait-ms`).
    A tracer slows the loader's host work (every op of the transforms is recorded) and so
    lengthens the wait it shows: the traced wait beyond the measured one is the tracer's (at
    most the traced step's excess over the unprofiled one), and judged_class_shares takes it
    out of the data bucket and of the step, as the tracer's launch time is (tracer_cost).
    None where it was not measured or the trace shows no DataLoader fetch in its steps (a
    figure that does not fit the trace; _loader_notes says so). Else, in ms: unprofiled_ms,
    traced_ms, tracer_ms (taken out); share (the shorter wait over the unprofiled step: a
    longer measured wait only says the runs differ), binds (share >= LOADER_WAIT_BINDS),
    origin; where the wait was timed in several runs (processes), runs_ms (their least and
    most wait) and edge: one run's share on each side of the line, so whether the loader hides
    behind the GPU changed from one process to the next (a close call, compute_verdict)."""
    row = con.execute("""SELECT unprofiled_wait_ns, traced_wait_ns, tracer_ns, share, origin,
                                unprofiled_low_ns, unprofiled_high_ns
                         FROM loader_wait WHERE trace_id = $t""", {"t": trace_id}).fetchone()
    if not row:
        return None
    wait, traced, extra, share, origin, low, high = row
    several = low is not None and high is not None
    return {**_loader_figures(wait, traced, extra, share), "origin": origin,
            "runs_ms": [round(low / 1e6, 3), round(high / 1e6, 3)] if several else None,
            "edge": False,      # set by compute_verdict: the runs' waits give different classes
            "traced_binds": False}   # ... and: the trace's own wait gives io, the runs' do not


def _loader_figures(wait_ns: float, traced_ns: float, tracer_ns: float, share: float | None) -> dict:
    """A loader_wait row's figures (one timing run's, or their mean), in ms."""
    share = float(share or 0.0)
    return {"unprofiled_ms": round(wait_ns / 1e6, 3), "traced_ms": round(traced_ns / 1e6, 3),
            "tracer_ms": round(tracer_ns / 1e6, 3), "share": round(share, 4),
            "binds": share >= LOADER_WAIT_BINDS}


def classes_by_run(con: duckdb.DuckDBPyConnection, trace_id: int, shares: dict[str, float],
                   step_ms: float, cost: dict | None, loader: dict | None, has_gpu: bool,
                   steps: int) -> set[str]:
    """The classes the least- and the most-waiting timing run would each give on their own
    (the loader_wait view's low_/high_ figures; empty for a wait timed once): where they
    differ, whether the loader hides behind the GPU decides the class, and that changes from
    one process to the next."""
    if not loader or not loader["runs_ms"]:
        return set()
    row = con.execute("""SELECT unprofiled_low_ns, traced_wait_ns, low_tracer_ns, low_share,
                                unprofiled_high_ns, high_tracer_ns, high_share
                         FROM loader_wait WHERE trace_id = $t""", {"t": trace_id}).fetchone()
    low, traced, low_extra, low_share, high, high_extra, high_share = row
    return {class_with_loader(shares, step_ms, cost, _loader_figures(wait, traced, extra, share),
                              has_gpu, steps)
            for wait, extra, share in ((low, low_extra, low_share), (high, high_extra, high_share))}


def class_with_loader(shares: dict[str, float], step_ms: float, cost: dict | None,
                      loader: dict | None, has_gpu: bool, steps: int) -> str:
    """The class the trace gives with this DataLoader wait (loader_wait_of's figures, one
    timing run's, or None: the trace's own wait), by the verdict's own formulas."""
    return decide(judged_class_shares(shares, step_ms, cost, loader)[0], has_gpu, steps,
                  loader_binds(loader))[0]


def binds_traced(shares: dict[str, float], step_ms: float, cost: dict | None, loader: dict | None,
                 has_gpu: bool, steps: int) -> bool:
    """Whether the trace's own DataLoader wait makes the run io-bound where the timing runs'
    measured wait does not: judged as `analyze` judges a trace without the measurement (only
    the tracer's per-call launch cost out). The loader's host work then hides behind the GPU
    only while the host is not slowed as the tracer slows it, and a plain run can wait: on the
    corpus's 39 data points with a measured wait, two read so: one labelled io (its plain run
    waited, its two timing runs did not), one where no remedy helped (docs/accuracy.md,
    "Loader wait"). A close call, so that verify settles it."""
    if not loader or loader_binds(loader):
        return False
    return class_with_loader(shares, step_ms, cost, None, has_gpu, steps) == "io"


def judged_class_shares(shares: dict[str, float], step_ms: float, cost: dict | None,
                        loader: dict | None) -> tuple[dict[str, float], float]:
    """The class shares the verdict judges, and the step they are of: the traced shares
    without the tracer's launch time (cost) and without its part of the loader's wait
    (loader's tracer_ms, out of the data bucket)."""
    out = without_tracer(shares, cost)
    step = cost["step_ms"] if cost else step_ms
    extra = loader["tracer_ms"] if loader else 0.0
    if extra and step > extra:
        data_ms = out["data"] * step
        out = {k: v * step / (step - extra) for k, v in out.items()}
        out["data"] = max(0.0, data_ms - extra) / (step - extra)
        step -= extra
    return class_shares(out), round(step, 3)


def _check_unprofiled(verdict: "Verdict", primary: "TraceVerdict", cost: dict) -> None:
    """Notes where the step timed without a tracer does not fit the trace: longer than the
    traced step (nothing is taken out), or shorter than the GPU's own work in it (kernels,
    copies and collectives, which the tracers barely slow) by more than the timing's noise:
    a figure of another run, or a run whose steps vary."""
    unprofiled, traced = cost["unprofiled_step_ms"], primary.step_ms
    gpu_ms = traced * sum(primary.shares.get(b, 0.0) for b in ("compute", "copy", "comm"))
    if unprofiled > traced:
        verdict.notes.append(
            f"the step timed without a tracer ({unprofiled:.1f} ms) is longer than the traced one "
            f"({traced:.1f} ms): no tracer cost is taken out; a figure of another run, or a run "
            "whose steps vary, gives this")
    elif unprofiled < gpu_ms * (1 - TIMING_NOISE):
        verdict.notes.append(
            f"the step timed without a tracer ({unprofiled:.1f} ms) is shorter than the GPU's own "
            f"work in the traced step ({gpu_ms:.1f} ms), which a tracer barely slows: is it of "
            "the same run and the same steps? The tracer cost taken out may be too large")


def cost_at(shares: dict[str, float], step_ms: float, per_step: float, ns_per_call: int) -> dict:
    """The tracer_cost dict of a trace whose CUDA calls cost ns_per_call each."""
    step_ns = step_ms * 1e6
    removed = min(shares["launch"], per_step * ns_per_call / step_ns)
    launch = (shares["launch"] - removed) / (1.0 - removed) if removed < 1.0 else 0.0
    return {"ns_per_call": int(ns_per_call), "cuda_calls_per_step": round(per_step, 1),
            "ms_per_step": round(removed * step_ns / 1e6, 3),
            "step_ms": round((1.0 - removed) * step_ns / 1e6, 3), "share": round(removed, 4),
            "launch_share_traced": shares["launch"], "launch_share": round(launch, 4)}


def _class_by_tracer_cost(shares: dict[str, float], step_ms: float, cost: dict, bound: str,
                          steps: int, loader: dict | None = None) -> dict[str, str] | None:
    """ns per call -> class at the cost in use (assumed, or measured) and at TRACER_CHECK_FACTORS
    times it (none, twice); where it is measured, also at the costs the unprofiled step implies
    TIMING_NOISE higher and lower (a tiny measured cost leaves 0 and 2x close together). Where
    any of them differs from `bound`; else None."""
    out = {}
    in_use = int(cost["ns_per_call"])
    costs = {f * in_use for f in (1, *TRACER_CHECK_FACTORS)}
    if "unprofiled_step_ms" in cost:     # measured: the timing's own noise too
        calls = max(cost["cuda_calls_per_step"], 1e-9)
        costs |= {int(max(0.0, (step_ms - cost["unprofiled_step_ms"] * f) * 1e6 / calls))
                  for f in (1 + TIMING_NOISE, 1 - TIMING_NOISE)}
    for ns in sorted(costs):
        alt = cost_at(shares, step_ms, cost["cuda_calls_per_step"], ns)   # at 0: nothing out
        out[str(ns)] = bound if ns == in_use else decide(
            judged_class_shares(shares, step_ms, alt, loader)[0], True, steps, loader_binds(loader))[0]
    return out if len(set(out.values())) > 1 else None


def close_call(cls: dict[str, float], bound: str, has_gpu: bool,
               by_cost: dict[str, str] | None, near_line: bool = True) -> list[str] | None:
    """The other classes a GPU run's evidence nearly gives: those at another tracer cost per
    CUDA call, and, where the largest cause is near the line (_near_line; unless near_line is
    False), compute for a cause's verdict or that cause for a compute verdict. None when the
    verdict is not a close call."""
    if not has_gpu or bound not in CLASSES:
        return None
    others = set(by_cost.values()) if by_cost else set()
    if near_line and _near_line(cls, bound):
        others.add(max(CAUSES, key=lambda c: cls[c]) if bound == "compute" else "compute")
    others -= {bound, "balanced", "unknown"}
    return sorted(others) or None


def class_speedup_expected(cls: str, share: float, compute_speedup: float | None = None) -> float:
    """A class's expected speed-up, as the report's estimated_gain gives it (gains.py,
    speedup_expected): the step without the class's share, nothing else changed; compute's at
    most the compute headroom's figure (compute_speedup: what bf16 and channels_last are
    expected to remove)."""
    without = speedup_without_share(share) if share > 0 else 1.0
    return min(compute_speedup, without) if cls == "compute" and compute_speedup else without


def _lead_gains(v: "Verdict") -> tuple[float, float] | None:
    """(compute's expected figure, the verdict's cause's) where the verdict's class is a cause
    and the trace gives a compute headroom; None otherwise (nothing to compare)."""
    headroom = compute_speedup_expected(v.compute_headroom, v.loader_wait)
    if v.bound not in CAUSES or not headroom:
        return None
    return (class_speedup_expected("compute", v.class_shares.get("compute", 0.0), headroom),
            class_speedup_expected(v.bound, v.class_shares.get(v.bound, 0.0)))


def leading_class(v: "Verdict") -> str | None:
    """The class whose findings lead the report (issue #20: findings ranked by their estimated
    gain). The verdict's class, unless it is a cause of GPU idle time and the compute headroom
    expects compute's remedies to give the step more than that cause's removal would (the
    expected figures of verdict.estimated_gain): then compute's, while the class stays the
    cause. On the mixed corpus this moved one of 118 first findings, to the remedy that
    measured best (ConvNeXt-Tiny, a copy owning 29%: bf16 + channels_last 1.97x, pinned
    copies 1.27x). None for balanced and unknown."""
    if v.bound not in CLASSES:
        return None
    gains = _lead_gains(v)
    return "compute" if gains and gains[0] > gains[1] else v.bound


def leading_note(v: "Verdict") -> str:
    """The note of a report whose compute findings lead a cause's class (leading_class)."""
    compute, cause = _lead_gains(v)
    return (f"compute's remedies are expected to give more than removing the {v.bound} cause "
            f"(~{compute:.2f}x by kernel names against ~{cause:.2f}x), so the compute "
            f"finding is ranked first; the class stays {v.bound}, the cause of the GPU's idle "
            f"time (docs/verdict.md, 'Predicted speed-ups'): `navdoctor verify` of both remedies "
            f"measures the order")


def settle_by_gain(bound: str, close: list[str], cls: dict[str, float], compute_speedup: float
                   ) -> tuple[str, list[str] | None, dict[str, float]]:
    """A close call's class: of the verdict's class and the classes it is close to, the one
    whose remedies are expected to speed the step up most (docs/verdict.md, "Close calls").
    Near the line the shares cannot tell a cause of GPU idle time from compute, and what
    decides which remedy wins is how much of the GPU's time the compute remedies would remove:
    on the mixed corpus, nothing on an LR-ASPP (its close calls were all the cause's), up to
    1.26x on a ResNet-50 with TF32 convolutions. A cause's expected gain is the step without its
    share, at the tracer cost the verdict assumes (the step's shares at no tracer cost make
    launch win where the tracer's own time was most of it: on the corpus that named three
    points right and three wrong); compute's is the step without the compute headroom's
    saved_ns (compute_speedup). A tie keeps the verdict's class.
    Returns (class, the other classes, class -> expected speed-up)."""
    gains = {c: compute_speedup if c == "compute" else speedup_without_share(cls.get(c, 0.0))
             for c in (bound, *close)}
    best = max(gains, key=lambda c: (gains[c], c == bound))
    rest = sorted(set(gains) - {best})
    return best, rest or None, gains


def _compute_headroom(con: duckdb.DuckDBPyConnection) -> dict[int, tuple]:
    """trace_id -> the compute_headroom row (navdoctor/headroom.py), per step in ns."""
    try:
        rows = con.execute(f"SELECT trace_id, {', '.join(HEADROOM_COLUMNS)} FROM compute_headroom").fetchall()
    except duckdb.CatalogException:
        return {}
    return {r[0]: r[1:] for r in rows}


def headroom_of(row: tuple | None, step_ms: float) -> dict | None:
    """The verdict's compute_headroom: ms per step of each family, what the remedies are
    expected to save, and the step's expected speed-up (of step_ms: the step the class
    shares are of, without the tracer's cost). None without kernels."""
    if not row or not row[0] or step_ms <= 0:
        return None
    out = {c.replace("_ns", "_ms"): round(float(v or 0.0) / 1e6, 3) for c, v in zip(HEADROOM_COLUMNS, row)}
    out["speedup_expected"] = expected_speedup(float(row[-1] or 0.0), step_ms * 1e6)
    return out


def _top_cause_near_line(cls: dict[str, float]) -> bool:
    """The largest cause of GPU idle time is within CLOSE_BAND of CAUSE_SHARE, either side."""
    return abs(max(cls[c] for c in CAUSES) - CAUSE_SHARE) < CLOSE_BAND


def _near_line(cls: dict[str, float], bound: str) -> bool:
    """The largest cause of GPU idle time is within CLOSE_BAND of CAUSE_SHARE, on the side that
    gave the verdict (a cause's share above the line, or below it for compute)."""
    top = max(cls[c] for c in CAUSES)
    if bound == "compute":
        return CAUSE_SHARE - CLOSE_BAND <= top < CAUSE_SHARE
    return bound in CAUSES and cls[bound] == top and top < CAUSE_SHARE + CLOSE_BAND \
        and cls["compute"] >= MIN_TOP_SHARE


def without_tracer(shares: dict[str, float], cost: dict | None) -> dict[str, float]:
    """The shares of the step with the tracer's own launch time taken out."""
    if not cost or cost["share"] <= 0 or cost["share"] >= 1:
        return shares
    rest = 1.0 - cost["share"]
    out = {k: v / rest for k, v in shares.items()}
    out["launch"] = cost["launch_share"]
    return out


def _missing_timeline(con: duckdb.DuckDBPyConnection, trace_id: int) -> str | None:
    """Why a trace without GPU activity cannot be classified, or None when it is a CPU-only
    run (judged in CPU terms). A GPU job whose GPU timeline is missing shows itself by CUDA API
    calls or by GPU-side ops on the host (NCCL collectives, cuDNN/cuBLAS calls); a capture with
    neither CPU ops nor a GPU timeline holds only OS calls. Either way the step's time cannot be
    split between the GPU and the host, so no class is given (docs/verdict.md, "Policy")."""
    cuda_calls, gpu_ops, cpu_ops = con.execute("""
        SELECT (SELECT count(*) FROM runtime_calls WHERE trace_id = $t),
               -- ops, not Python frames: a CPU run's stack holds torch's _get_cudnn_enabled
               (SELECT count(*) FROM (SELECT name FROM cpu_ops WHERE trace_id = $t
                                        AND category IS DISTINCT FROM 'python_function'
                                      UNION ALL SELECT name FROM nvtx_ranges WHERE trace_id = $t)
                  WHERE regexp_matches(lower(name),
                                       '^nccl:|^(aten::_?)?cudnn|^cublas|^cuda[a-z]|^c10d::.*nccl')),
               (SELECT count(*) FROM cpu_ops WHERE trace_id = $t)""", {"t": trace_id}).fetchone()
    if cuda_calls or gpu_ops:
        what = (f"{cuda_calls} CUDA API calls" if cuda_calls else f"{gpu_ops} GPU-side ops "
                "on the host (NCCL collectives, cuDNN/cuBLAS)")
        return (f"a GPU job without its GPU timeline ({what}, but no kernel or copy): the step "
                "cannot be split between GPU and host, so no class is given; capture with CUDA "
                "activities (torch.profiler activities=[CPU, CUDA]; nsys -t cuda)")
    if not cpu_ops:
        return ("no GPU timeline and no CPU ops (only OS or runtime events): nothing to weigh "
                "the step against, so no class is given; capture with torch.profiler or nsys -t cuda")
    return None


def heavy_profiler(con: duckdb.DuckDBPyConnection, trace_id: int) -> bool:
    """The Kineto trace was recorded with record_shapes or with_stack."""
    return bool(con.execute("""
        SELECT count(*) > 0 FROM (SELECT 1 FROM cpu_ops WHERE trace_id = ?
            AND (category = 'python_function' OR input_shapes IS NOT NULL) LIMIT 1)""",
        [trace_id]).fetchone()[0])


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
