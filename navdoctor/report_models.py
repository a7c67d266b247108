"""The JSON report's pydantic models (their JSON Schema is docs/report.schema.json). Imported
where a report is validated by them: `navdoctor analyze` on one input writes its report
through report.build_report_lite, which needs them only when a value is not already of its
field's type (report.py says how)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from . import __version__
from .report_fields import (CLASS_BY_TRACER_COST_DOC, CLOSE_CALL_GAINS_DOC, CLOSE_TO_DOC,
                            COMPUTE_HEADROOM_DOC, LOADER_WAIT_DOC, REPORT_SCHEMA_VERSION,
                            TRACER_COST_DOC)
from .rule_expr import Category, Severity


class RemedyOut(BaseModel):
    title: str
    text: str = ""
    code: str | None = None
    link: str | None = None
    verify: str | None = None
    whatif: str | None = Field(None, description="the what-if model's remedy this one is "
                               "(verdict.whatif.remedies), where it has one")
    speedup_expected: float | None = Field(
        None, description="the step's expected speed-up with this remedy: the what-if model's "
                          "replay of the step with the remedy applied (docs/verdict.md, "
                          "'Predicted speed-ups'); null where it has no figure (see figure_note)")
    speedup_range: list[float] | None = Field(
        None, description="[low, high]: where the measured speed-up fell against the replay's "
                          "figure on the calibration corpus (10th to 90th percentile)")
    step_ms_expected: float | None = Field(None, description="the step expected with the remedy")
    figure_note: str | None = Field(None, description="why the remedy has no figure (not "
                                    "applicable, already on, an unknown GPU...)")


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
        None, description="the expected speed-up of the finding's best remedy (the largest of "
                          "its remedies' speedup_expected, from the what-if model's replay); null "
                          "where none of its remedies has a figure")
    speedup_range: list[float] | None = Field(None, description="that remedy's speedup_range")
    speedup_if_removed: float | None = Field(
        None, description="1 / (1 - at_stake_share): the step's speed-up if this finding's whole "
                          "time went away and nothing else changed; a bound, not an expectation")
    speedup_up_to: float | None = Field(
        None, description="an upper bound on what removing this finding's cause can give: its "
                          "class's verdict.estimated_gain speedup_up_to for findings of a class, "
                          "else speedup_expected (docs/verdict.md, 'Predicted speed-ups')")
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
    loader_wait: dict[str, Any] | None = Field(None, description=LOADER_WAIT_DOC)


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
                    "'Predicted speed-ups'; `verify` measures what a remedy really gives")
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
    loader_wait: dict[str, Any] | None = Field(None, description=LOADER_WAIT_DOC)
    settle_command: str | None = Field(
        None, description="a close call only: the `navdoctor verify` command that measures the "
                          "remedies of both classes' findings (the script is diagnose's, else a "
                          "placeholder)")
    findings_lead: str | None = Field(
        None, description="the class whose findings are ranked first: the verdict's, or compute "
                          "where the compute headroom expects its remedies to give more than "
                          "removing the verdict's cause and a compute finding fired; null for "
                          "balanced and unknown (docs/verdict.md, 'Predicted speed-ups')")
    whatif: dict[str, Any] | None = Field(
        None, description="the what-if model of the primary trace (docs/verdict.md, 'Predicted "
                          "speed-ups'): inputs (the replay's: steps replayed, traced and replayed "
                          "step, host_scale and how it was fixed, the calibration's version), "
                          "remedies (id -> expected, low, high, step_ms or why_not), low_precision "
                          "(amp_bf16, or amp_fp16 on a GPU without bf16)")


class FirstRemedyOut(BaseModel):
    """The remedy expected to give most: the answer a report opens with."""
    rule: str = Field(description="the finding it belongs to")
    title: str
    whatif: str | None = None
    verify: str | None = None
    speedup_expected: float
    speedup_range: list[float] | None = None
    step_ms_expected: float | None = None
    code: str | None = None
    verify_command: str | None = Field(None, description="the `navdoctor verify` command that "
                                       "measures it, where navdoctor can apply it")


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
    first_remedy: FirstRemedyOut | None = Field(
        None, description="the remedy with the largest expected speed-up of all the findings' "
                          "remedies, where one is expected to give at least 1.05x")
    job: JobOut | None = Field(None, description="multi-rank jobs only (docs/distributed.md); "
                               "then verdict is the job's and per_trace holds the ranks")
