"""Reporters: the versioned JSON report (a pydantic model, its JSON Schema in docs/) and the
terminal report (verdict first, then findings ranked by time at stake)."""
from __future__ import annotations

import json
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel, Field

from . import __version__
from .analysis import Analysis
from .verdict import class_shares as verdict_class_shares
from .rules import Category, Severity

REPORT_SCHEMA_VERSION = "2.5"   # 2.5: verdict.compute_headroom, verdict.close_call_gains (and per_trace[]), estimated_gain.compute.speedup_expected from the compute headroom; 2.4: verdict.close_to, per_trace[].close_to; 2.3: verdict.class_by_tracer_cost, estimated_gain[].speedup_expected/step_ms_at_least, speedup_up_to a bound from the GPU's own work, findings[].speedup_expected; 2.2: job (multi-rank jobs, optional); 2.1: verdict.tracer_cost, per_trace[].tracer_cost; 1.1: verdict.per_trace[].stall_steps; 1.2: step_source, per_trace[].step_inference; 2.0: buckets comm and host (launch no longer holds host work), memory includes communication, the verdict policy of docs/verdict.md, estimated_gain, findings[].speedup_up_to


COMPUTE_HEADROOM_DOC = (
    "what the standard compute remedies (bf16 autocast, channels_last) are expected to remove "
    "from a step, from the kernels' names (docs/verdict.md, 'Compute headroom'): per step, "
    "kernel_ms, layout_ms (cuDNN layout conversions), fp32_tensor_core_ms (TF32 math), "
    "fp32_cuda_core_ms (fp32 math without tensor cores), half_ms, saved_ms, and "
    "speedup_expected, the step's speed-up if saved_ms went away; absent without kernels")
CLOSE_CALL_GAINS_DOC = (
    "a close call named by expected gain: class -> the speed-up its remedies are expected to "
    "give (a cause's: the step without its share; compute's: compute_headroom's); the verdict "
    "is the largest (docs/verdict.md, 'Close calls')")
CLASS_BY_TRACER_COST_DOC = ("Nsight Systems traces whose class depends on the tracer's cost per "
                            "CUDA call: ns per call -> class (at none, the assumed and twice the "
                            "assumed cost); absent where all agree (docs/verdict.md, 'Tracer cost')")
CLOSE_TO_DOC = ("a close call: the other classes the evidence nearly gives (at another tracer "
                "cost per CUDA call, or with the largest cause of GPU idle time within 7 points of "
                "the 20% line); the confidence is lower and `navdoctor verify` of both classes' "
                "remedies settles it; absent when the verdict is not a close call "
                "(docs/verdict.md, 'Close calls')")
TRACER_COST_DOC = ("Nsight Systems traces: the tracer's own launch time, left out of the class "
                   "(docs/verdict.md, 'Tracer cost'): ns_per_call, cuda_calls_per_step, ms_per_step, "
                   "share (of the traced step), step_ms (the step without it), launch_share_traced, "
                   "launch_share (of the step without it)")


class RemedyOut(BaseModel):
    title: str
    text: str = ""
    code: str | None = None
    link: str | None = None
    verify: str | None = None


class FindingOut(BaseModel):
    rule: str
    title: str
    category: Category
    severity: Severity
    message: str
    evidence: dict[str, Any]
    at_stake_ms_per_step: float | None = Field(None, description="time per step this finding costs")
    at_stake_share: float = Field(description="at_stake as a share of the step time")
    speedup_expected: float | None = Field(
        None, description="1 / (1 - at_stake_share): the step's speed-up if this time were "
                          "removed and nothing else changed (an estimate, not a promise)")
    speedup_up_to: float | None = Field(
        None, description="an upper bound on what removing this finding's cause can give: its "
                          "class's verdict.estimated_gain speedup_up_to for findings of a class, "
                          "else speedup_expected (docs/verdict.md, 'Estimated gains')")
    traces: list[int] = Field(description="trace_id of the inputs the rule fired on")
    remedies: list[RemedyOut]


class TraceVerdictOut(BaseModel):
    trace_id: int
    source: str
    bound: str
    confidence: float
    shares: dict[str, float]
    steps: int
    step_ms: float
    has_gpu: bool
    step_origin: str | None = Field(description="ProfilerStep | nvtx | navdoctor.step | "
                                    "inferred:<method> | gpu-window | whole-trace")
    stall_steps: int = 0
    step_inference: dict[str, Any] | None = Field(
        None, description="how the steps were inferred when the trace had no step markers "
                          "(the step_inference table, docs/schema.md)")
    tracer_cost: dict[str, float] | None = Field(None, description=TRACER_COST_DOC)
    class_by_tracer_cost: dict[str, str] | None = Field(None, description=CLASS_BY_TRACER_COST_DOC)
    close_to: list[str] | None = Field(None, description=CLOSE_TO_DOC)
    close_call_gains: dict[str, float] | None = Field(None, description=CLOSE_CALL_GAINS_DOC)
    compute_headroom: dict[str, float] | None = Field(None, description=COMPUTE_HEADROOM_DOC)


class VerdictOut(BaseModel):
    bound: str = Field(description="io | compute | memory | launch | balanced | unknown")
    confidence: float = Field(ge=0, le=1)
    shares: dict[str, float] = Field(description="per-step buckets, summing to 1: compute, comm, "
                                                 "copy, data, sync, launch, host, idle")
    class_shares: dict[str, float] = Field(description="io, compute, memory, launch: the shares "
                                           "the class is judged on (without tracer_cost)")
    estimated_gain: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="per class: step_ms_without and speedup_expected (the step if that "
                    "class's own time were removed and nothing else changed), step_ms_at_least "
                    "and speedup_up_to (an upper bound: a remedy for a cause of GPU idle time "
                    "cannot make the step shorter than the GPU's own work); docs/verdict.md, "
                    "'Estimated gains'; `verify` measures what a remedy really gives")
    step_ms: float | None
    steps: int
    step_source: str | None = Field(None, description="step_origin of the verdict's trace: "
                                    "where its steps came from")
    has_gpu: bool = Field(description="the verdict's trace has a GPU timeline")
    primary_trace: int | None = Field(description="trace_id of the trace the verdict trusts")
    per_trace: list[TraceVerdictOut]
    disagreements: list[str]
    notes: list[str]
    tracer_cost: dict[str, float] | None = Field(None, description=TRACER_COST_DOC)
    class_by_tracer_cost: dict[str, str] | None = Field(None, description=CLASS_BY_TRACER_COST_DOC)
    close_to: list[str] | None = Field(None, description=CLOSE_TO_DOC)
    close_call_gains: dict[str, float] | None = Field(None, description=CLOSE_CALL_GAINS_DOC)
    compute_headroom: dict[str, float] | None = Field(None, description=COMPUTE_HEADROOM_DOC)
    settle_command: str | None = Field(
        None, description="a close call only: the `navdoctor verify` command that measures the "
                          "remedies of both classes' findings (the script is diagnose's, else a "
                          "placeholder)")


class InputOut(BaseModel):
    trace_id: int
    path: str
    format: str
    source: str
    producer: str
    events: int
    warnings: list[str]


class RuleFailureOut(BaseModel):
    rule: str
    file: str
    error: str


class CommunicationOut(BaseModel):
    total_ms: float | None = Field(None, description="collectives per step, overlapped or not (mean over ranks)")
    exposed_ms: float | None = Field(None, description="the part with no compute beside it (bucket comm)")
    exposed_share: float | None = None
    overlapped_share: float | None = Field(None, description="share of total_ms that overlaps compute")
    waiting_ms: float | None = Field(None, description="exposed time spent waiting for later ranks")
    transfer_ms: float | None = Field(None, description="exposed time that is not waiting")


class StragglerOut(BaseModel):
    rank: int
    trace_id: int
    last_share: float | None = Field(None, description="share of the matched collectives it arrived at last")
    cost_ms_per_step: float | None = Field(None, description="what the other ranks wait for it, where exposed")
    cost_share: float | None = None
    cause: str | None = Field(None, description="the bucket of its step that exceeds the other ranks' most")
    cause_class: str | None = None
    cause_ms: float | None = None
    others_cause_ms: float | None = None
    cause_excess_ms: float | None = None
    bound: str = Field(description="the straggler's own verdict, as one trace")
    findings: list[str] = Field(description="its own findings of the cause's class (else all)")
    remedies: list[RemedyOut]
    excess_ms: dict[str, float | None] = Field(description="per bucket: its ms per step minus the other ranks' median")


class RankOut(BaseModel):
    rank: int
    trace_id: int
    path: str
    bound: str | None
    steps: int
    step_ms: float | None
    work_ms: float | None = Field(None, description="step minus exposed waiting for later ranks")
    comm_total_ms: float | None
    comm_exposed_ms: float | None
    comm_overlapped_ms: float | None
    wait_ms: float | None
    last_share: float | None
    findings: list[str]


class JobOut(BaseModel):
    ranks: int = Field(description="ranks analysed")
    world_size: int
    backend: str | None
    steps_matched_by: str = Field(description="'step number', 'collective sequence' or 'none'")
    steps: int
    step_ms: float | None = Field(None, description="the job's step: the slowest rank's, per matched step")
    step_spread: float | None = Field(None, description="(max - min) / median of the ranks' step times")
    work_spread: float | None = Field(None, description="(max - min) of the ranks' work / step")
    collectives_per_step: float | None
    communication: CommunicationOut | None
    bound: str
    balanced: bool = Field(description="no straggler and work spread under job-load-imbalance.min_spread")
    straggler: StragglerOut | None
    per_rank: list[RankOut]


class Report(BaseModel):
    schema_version: str = REPORT_SCHEMA_VERSION
    tool: str = f"navdoctor {__version__}"
    verdict: VerdictOut
    findings: list[FindingOut]
    inputs: list[InputOut]
    rules_run: int
    rule_errors: list[RuleFailureOut]
    warnings: list[str]
    database: str | None = None
    run: dict[str, Any] | None = Field(None, description="set by `navdoctor diagnose`")
    job: JobOut | None = Field(None, description="multi-rank jobs only (docs/distributed.md); "
                               "then verdict is the job's and per_trace holds the ranks")


def upper_bound_speedup(share: float | None) -> float | None:
    """The speed-up if a share of the step were removed and nothing else changed."""
    if share is None or share <= 0:
        return None
    return round(1.0 / max(1.0 - share, 0.01), 2)


# What the GPU still has to do once a class's cause is gone: its kernels always, its copies
# unless the class is memory (whose remedies take copies off the critical path).
_GPU_WORK_LEFT = {"io": ("compute", "comm", "copy"), "launch": ("compute", "comm", "copy"),
                  "memory": ("compute", "comm")}


def estimated_gain(class_shares: dict[str, float], step_ms: float | None,
                   shares: dict[str, float] | None = None,
                   traced_step_ms: float | None = None,
                   compute_speedup: float | None = None) -> dict[str, dict[str, float]]:
    """Per class, two numbers (docs/verdict.md, "Estimated gains"):
    - expected: the step without that class's own time (class_shares are of the step without
      the tracer's cost, step_ms is that step);
    - up to: a bound. A remedy for a cause of GPU idle time (io, memory, launch) cannot make
      the step shorter than the GPU's own work, so the bound is the traced step over the
      time the GPU works in it (the traced `shares`: the tracer's cost is host time, so the
      traced ratio is at least the unprofiled one). A remedy often removes more than its
      class's buckets (a sync also drains the queue the host must refill, pinned copies drop
      the host's staging), so the expected figure under-shoots it; the bound does not. For
      compute the bound is the step without any kernel time.
    compute_speedup, where the trace's kernels tell it (the compute headroom), is compute's
    expected figure instead: what bf16 and channels_last are expected to remove, not the
    step without its kernels.
    step_ms is the step the class shares are of; traced_step_ms the one `shares` are of
    (the same where no tracer cost was taken out)."""
    if not step_ms:
        return {}
    traced_step_ms = traced_step_ms or step_ms
    traced = verdict_class_shares(shares) if shares else {}
    out = {}
    for cls, share in class_shares.items():
        expected = upper_bound_speedup(share)
        # a class with time in the traced step keeps its bound even where the tracer's
        # correction leaves it none (its launch time may be the tracer's, or may not)
        if not expected and traced.get(cls, 0.0) < 0.005:
            continue
        expected = expected or 1.0
        bound, at_least = expected, step_ms / expected
        if cls == "compute" and compute_speedup:
            expected = min(compute_speedup, expected)   # the bound stays the kernel-free step
        without = step_ms / expected
        if shares and cls in _GPU_WORK_LEFT:
            # (at most 100x, as the expected figure: a GPU that works 0.02% of a step bounds
            # nothing a user can act on)
            work = max(sum(shares.get(b, 0.0) for b in _GPU_WORK_LEFT[cls]), 0.01)
            if 1.0 / work > expected:
                bound, at_least = round(1.0 / work, 2), traced_step_ms * work
        if bound <= 1.0:
            continue
        out[cls] = {"step_ms_without": round(without, 3), "speedup_expected": expected,
                    "step_ms_at_least": round(at_least, 3), "speedup_up_to": bound}
    return out


def finding_bound(category: str, share: float, gains: dict[str, dict[str, float]]) -> float | None:
    """A finding's upper bound: for a cause of GPU idle time (io, memory, launch), its class's
    (removing one such cause cannot give more than the GPU's own work allows), else the
    finding's own expected figure."""
    expected = upper_bound_speedup(share)
    if not expected:
        return None
    # (compute's class figure, the step without any kernel, bounds nothing a finding can do)
    g = gains.get(category) if category in _GPU_WORK_LEFT else None
    return max(expected, g["speedup_up_to"]) if g else expected


def _applicable_remedies(findings: list[FindingOut], classes) -> list[tuple[str, str]]:
    """(class, remedy id) of the remedies navdoctor can apply (verify.remedies.REMEDIES) that
    the findings of these classes suggest, in the findings' order."""
    from .verify.remedies import REMEDIES
    return [(f.category, r.verify) for f in findings
            if f.category in classes and f.severity != "info"
            for r in f.remedies if r.verify in REMEDIES]


def settle_command(bound: str, close_to: list[str] | None, findings: list[FindingOut],
                   run: dict[str, Any] | None) -> str | None:
    """For a close call, the `navdoctor verify` command that measures the remedies navdoctor
    can apply from the findings of both classes, in the findings' order (docs/verdict.md,
    "Close calls"); None when it is not a close call or no such remedy is suggested."""
    if not close_to:
        return None
    ids = list(dict.fromkeys(i for _, i in _applicable_remedies(findings, (bound, *close_to))))
    if not ids:
        return None
    script = (shlex.join([run["script"], *run.get("args", [])]) if run and run.get("script")
              else "SCRIPT [ARGS...]")
    return shlex.join(["navdoctor", "verify", "--remedy", ",".join(ids)]) + " " + script


def settle_text(report: "Report", code=lambda c: c) -> str | None:
    """The close call's line in the terminal and Markdown reports: the verify command, and the
    classes whose remedies navdoctor cannot apply (code changes, listed in their findings)."""
    v = report.verdict
    if not v.close_to:
        return None
    classes = (v.bound, *v.close_to)
    measured = {c for c, _ in _applicable_remedies(report.findings, classes)}
    manual = [c for c in classes if c not in measured]
    gap = (f"{' and '.join(manual)}: no remedy navdoctor can apply, try the code changes in "
           f"{'its' if len(manual) == 1 else 'their'} findings") if manual else ""
    if v.settle_command:
        return code(v.settle_command) + (f" ({gap})" if gap else "")
    return gap or None


def build_report(a: Analysis, run: dict[str, Any] | None = None) -> Report:
    v = a.verdict
    has_gpu = any(t.has_gpu for t in v.per_trace if t.trace_id == v.primary_trace)
    gains = estimated_gain(v.class_shares, (v.tracer_cost or {}).get("step_ms") or v.step_ms,
                           v.shares if has_gpu else None, v.step_ms,
                           (v.compute_headroom or {}).get("speedup_expected"))
    findings = [FindingOut(
        rule=f.rule.id, title=f.rule.title, category=f.rule.category,
        severity=f.rule.severity, message=f.message, evidence=f.metrics,
        at_stake_ms_per_step=None if f.at_stake_ns is None else round(f.at_stake_ns / 1e6, 4),
        at_stake_share=round(f.at_stake_share, 4),
        speedup_expected=upper_bound_speedup(f.at_stake_share),
        speedup_up_to=finding_bound(f.rule.category, f.at_stake_share, gains),
        traces=f.trace_ids,
        remedies=[RemedyOut(**r.model_dump()) for r in f.rule.remedies]) for f in a.findings]
    return Report(
        verdict=VerdictOut(
            bound=v.bound, confidence=v.confidence, shares=v.shares, class_shares=v.class_shares,
            # the class shares are of the step without the tracer cost: so is the step they divide
            estimated_gain=gains,
            step_ms=v.step_ms, steps=v.steps, disagreements=v.disagreements, notes=v.notes,
            has_gpu=has_gpu,
            step_source=next((t.step_origin for t in v.per_trace
                              if t.trace_id == v.primary_trace), None),
            primary_trace=v.primary_trace,
            per_trace=[TraceVerdictOut(trace_id=t.trace_id, source=t.source, bound=t.bound,
                                       confidence=t.confidence, shares=t.shares, steps=t.steps,
                                       step_ms=t.step_ms, has_gpu=t.has_gpu,
                                       step_origin=t.step_origin, stall_steps=t.stall_steps,
                                       step_inference=t.step_inference,
                                       tracer_cost=t.tracer_cost,
                                       class_by_tracer_cost=t.class_by_tracer_cost,
                                       close_to=t.close_to,
                                       close_call_gains=t.close_call_gains,
                                       compute_headroom=t.compute_headroom)
                      for t in v.per_trace],
            tracer_cost=v.tracer_cost, class_by_tracer_cost=v.class_by_tracer_cost,
            close_to=v.close_to, close_call_gains=v.close_call_gains,
            compute_headroom=v.compute_headroom, settle_command=settle_command(v.bound, v.close_to, findings, run)),
        findings=findings,
        inputs=[InputOut(trace_id=i, path=r.path, format=r.format, source=r.source,
                         producer=r.producer, events=r.events, warnings=r.warnings)
                for i, r in enumerate(a.inputs, start=1)],
        rules_run=a.rules_run,
        rule_errors=[RuleFailureOut(rule=x.rule_id, file=x.file, error=x.error)
                     for x in a.rule_failures],
        warnings=a.warnings, database=a.db_path, run=run)


def report_json_schema() -> dict:
    return Report.model_json_schema()


def write_atomic(path: str, text: str) -> None:
    """Write through a temp file and rename, so a crash never leaves half a report: the
    path holds the old content or the new one, never a part (the data is synced before the
    rename). The file gets the permissions a plain open() would give it."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".navdoctor-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(f.fileno(), 0o666 & ~umask)  # mkstemp's 0600 would hide the report
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def report_to_json(report: Report) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=2) + "\n"


# ---- terminal ----------------------------------------------------------------------------

_BOUND_TEXT = {
    "io": "I/O-bound: the GPU waits for data or for CPU work between its kernels",
    "compute": "compute-bound: GPU kernels fill the step",
    "memory": "memory-bound: host<->device copies, syncs or communication stall the GPU",
    "launch": "launch-bound: the GPU idles while the CPU launches work",
    "balanced": "balanced: no single bottleneck dominates",
    "unknown": "unknown: the traces hold too little to say",
}
_SEV_COLOR = {"critical": "red", "high": "red", "medium": "yellow", "low": "cyan", "info": "white"}
_BUCKET_LABEL = [("compute", "GPU compute"), ("comm", "exposed communication"),
                 ("copy", "host<->device copy"), ("sync", "sync stalls"),
                 ("data", "waiting for data"), ("host", "CPU work (no launches)"),
                 ("launch", "launch/CPU overhead"), ("idle", "other idle")]


def speedup_text(expected: float | None, up_to: float | None) -> str:
    """', ~1.25x (up to 1.60x)': the estimate, and the bound where it is higher."""
    if not expected:
        return ""
    return f", ~{expected:.2f}x" + (f" (up to {up_to:.2f}x)" if up_to and up_to > expected else "")


def headroom_text(v: VerdictOut) -> str | None:
    """What bf16 and channels_last are expected to give, by the kernels' names, where the GPU
    computes a good part of the step (docs/verdict.md, "Compute headroom"); else None."""
    h = v.compute_headroom
    if not h or not v.has_gpu or v.class_shares.get("compute", 0.0) < 0.3:
        return None
    parts = [f"{label} {h[key]:.2f} ms" for key, label in
             (("layout_ms", "layout conversions"), ("fp32_tensor_core_ms", "TF32 math"),
              ("fp32_cuda_core_ms", "fp32 CUDA-core math")) if h.get(key, 0.0) >= 0.005]
    where = f" ({', '.join(parts)} per step)" if parts else " (no fp32 math or layout conversions in the kernels)"
    return f"compute remedies (bf16/fp16 autocast, channels_last): ~{h['speedup_expected']:.2f}x expected by kernel names{where}"


def bound_text(v: VerdictOut) -> str:
    """The verdict in words (what a trace without a GPU timeline can be bound by differs)."""
    if not v.has_gpu and v.bound == "compute":
        return "compute-bound: CPU ops fill the step (no GPU activity in the trace)"
    if not v.has_gpu and v.bound == "memory":
        return "memory-bound: communication fills the step (no GPU activity in the trace)"
    return _BOUND_TEXT.get(v.bound, v.bound)


def render_terminal(report: Report, color: bool | None = None, max_remedies: int = 3) -> str:
    out: list[str] = []
    s = lambda text, **kw: click.style(text, **kw) if color else text  # noqa: E731
    v = report.verdict
    step = (f"{v.step_ms:.2f} ms/step over {v.steps} step{'s' if v.steps != 1 else ''}"
            if v.step_ms else "no steps")
    text = bound_text(v)
    close = f"; close call with {' and '.join(v.close_to)}" if v.close_to else ""
    out.append(s(f"VERDICT  {text}", bold=True)
               + f"  (confidence {v.confidence:.2f}{close}; {step})")
    if v.shares:
        bars = []
        for key, label in _BUCKET_LABEL:
            share = v.shares.get(key, 0.0)
            if key == "compute" and not v.has_gpu:
                label = "CPU ops"
            if share >= 0.005:
                bars.append(f"{label} {share:.0%}")
        out.append("  step time: " + " | ".join(bars))
    gains = [f"{c} {speedup_text(g['speedup_expected'], g['speedup_up_to'])[2:]}"
             for c, g in v.estimated_gain.items()
             if c != "compute" and v.class_shares.get(c, 0) >= 0.05]
    if gains:
        out.append("  without the cause: " + " | ".join(gains))
    if headroom_text(v):
        out.append("  " + headroom_text(v))
    if report.job:
        out.extend(render_job(report.job))
    for t in v.per_trace if len(v.per_trace) > 1 and not report.job else []:
        out.append(f"  trace {t.trace_id} ({t.source}): {t.bound} "
                   f"(confidence {t.confidence:.2f}, {t.step_ms:.2f} ms/step, {t.steps} steps)")
    for d in v.disagreements:
        out.append(s(f"  disagreement: {d}", fg="yellow"))
    for n in v.notes:
        out.append(f"  note: {n}")
    if settle := settle_text(report):
        out.append(f"  settle the close call: {settle}")
    out.append("")
    if not report.findings:
        out.append("No rule fired: nothing stands out in these traces.")
    for i, f in enumerate(report.findings, start=1):
        stake = (f" [{f.at_stake_ms_per_step:.2f} ms/step, {f.at_stake_share:.0%}"
                 + speedup_text(f.speedup_expected, f.speedup_up_to) + "]"
                 if f.at_stake_ms_per_step else "")
        out.append(s(f"{i}. [{f.severity.upper()}] {f.category}: {f.title}",
                     fg=_SEV_COLOR[f.severity], bold=True) + stake)
        out.append(f"   {f.message}")
        for r in f.remedies[:max_remedies]:
            line = f"   -> {r.title}"
            if r.text:
                line += f": {r.text}"
            out.append(line)
            if r.code:
                out.extend("        " + c for c in r.code.rstrip().splitlines())
        if len(f.remedies) > max_remedies:
            out.append(f"   (+{len(f.remedies) - max_remedies} more remedies in the JSON report)")
        out.append(f"   rule {f.rule} ({f.severity})")
    for e in report.rule_errors:
        out.append(s(f"rule error: {e.error}", fg="red"))
    for w in report.warnings:
        out.append(s(f"warning: {w}", fg="yellow"))
    names = ", ".join(f"{i.trace_id}={i.path}" for i in report.inputs)
    out.append(f"inputs: {names}; {report.rules_run} rules"
               + (f"; database: {report.database}" if report.database else ""))
    return "\n".join(out)


def render_job(j: JobOut) -> list[str]:
    out = [f"  JOB  {j.ranks} of {j.world_size} ranks ({j.backend or '?'}), {j.steps} steps "
           f"matched by {j.steps_matched_by}"
           + (f", step {j.step_ms:.2f} ms, spread across ranks {j.step_spread:.1%}"
              if j.step_ms and j.step_spread is not None else "")]
    if j.straggler:
        s = j.straggler
        out.append(f"  STRAGGLER  rank {s.rank}: last at {s.last_share:.0%} of the collectives, "
                   f"costs {s.cost_ms_per_step:.2f} ms/step ({s.cost_share:.0%}); cause: "
                   f"{s.cause} {s.cause_ms:.2f} ms/step vs {s.others_cause_ms:.2f} ms on the others")
        for r in s.remedies[:2]:
            out.append(f"    -> {r.title}" + (f": {r.text}" if r.text else ""))
    elif j.balanced:
        out.append("  balanced: no straggler, the ranks do the same work per step")
    c = j.communication
    if c and c.total_ms:
        out.append(f"  communication/step: {c.total_ms:.2f} ms, exposed {c.exposed_ms:.2f} ms "
                   f"(waiting {c.waiting_ms or 0:.2f}, transfer {c.transfer_ms or 0:.2f}), "
                   f"overlapped {c.overlapped_share or 0:.0%}")
    for r in j.per_rank:
        out.append(f"  rank {r.rank}: {r.bound}, {r.step_ms:.2f} ms/step, work {r.work_ms:.2f}, "
                   f"comm {r.comm_total_ms:.2f} (exposed {r.comm_exposed_ms:.2f}, waiting "
                   f"{r.wait_ms:.2f}), last at {r.last_share:.0%}")
    return out


MARKDOWN_MARK = "<!-- navdoctor report"


def is_navdoctor_report(path: str | Path) -> bool:
    """Whether the file is a navdoctor JSON document (a report, or a compare result): its
    head has navdoctor's schema_version and tool fields."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and b'"schema_version"' in head and b'"navdoctor' in head


def is_navdoctor_summary(path: str | Path) -> bool:
    """Whether the file is a Markdown summary navdoctor wrote."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(len(MARKDOWN_MARK)) == MARKDOWN_MARK
    except OSError:
        return False


def render_markdown(report: Report, max_findings: int = 5, max_remedies: int = 2) -> str:
    """A short summary for CI step summaries and pull-request comments: the verdict, the
    step's buckets, the top findings with their remedies."""
    v = report.verdict
    text = _BOUND_TEXT.get(v.bound, v.bound)
    head, _, rest = text.partition(": ")
    step = f"{v.step_ms:.2f} ms/step over {v.steps} steps" if v.step_ms else "no steps"
    out = [f"{MARKDOWN_MARK} {report.schema_version} -->",
           f"### navdoctor: **{head}** (confidence {v.confidence:.2f}"
           + (f", close call with {' and '.join(v.close_to)}" if v.close_to else "") + f", {step})", ""]
    if rest:
        out += [rest[0].upper() + rest[1:] + ".", ""]
    if v.shares:
        out += ["| where the step goes | share | ms/step |", "|---|---:|---:|"]
        for key, label in _BUCKET_LABEL:
            share = v.shares.get(key, 0.0)
            if share >= 0.005:
                ms = f"{share * v.step_ms:.2f}" if v.step_ms else ""
                out.append(f"| {label} | {share:.0%} | {ms} |")
        out.append("")
    if headroom_text(v):
        out += [headroom_text(v)[0].upper() + headroom_text(v)[1:] + ".", ""]
    if report.findings:
        out.append("**Findings**, most time at stake first:")
        out.append("")
        for i, f in enumerate(report.findings[:max_findings], start=1):
            stake = (f" — {f.at_stake_share:.0%} of the step"
                     + speedup_text(f.speedup_expected, f.speedup_up_to)
                     if f.at_stake_ms_per_step else "")
            out.append(f"{i}. **[{f.severity.upper()}] {f.category}: {f.title}**{stake}  ")
            out.append(f"   {f.message}")
            for r in f.remedies[:max_remedies]:
                line = f"   - {r.title}" + (f": {r.text}" if r.text else "")
                if r.code:
                    line += f" (`{r.code.strip().splitlines()[0]}`)"
                out.append(line)
        if len(report.findings) > max_findings:
            out.append(f"\n{len(report.findings) - max_findings} more in the JSON report.")
        out.append("")
    else:
        out += ["No rule fired: nothing stands out in these traces.", ""]
    for n in v.notes:
        out.append(f"> {n}")
    if settle := settle_text(report, code=lambda c: f"`{c}`"):
        out.append(f"> settle the close call: {settle}")
    inputs = ", ".join(Path(i.path).name for i in report.inputs)
    out += ["", f"<sub>{report.tool}, report schema {report.schema_version}; inputs: {inputs}</sub>", ""]
    return "\n".join(out)
