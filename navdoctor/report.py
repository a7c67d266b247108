"""Reporters: the versioned JSON report (a pydantic model, its JSON Schema in docs/) and the
terminal report (verdict first, then findings ranked by time at stake)."""
from __future__ import annotations

import json
import math
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any, get_args

import click

from . import __version__
from .analysis import Analysis
from .gains import finding_bound, upper_bound_speedup, verdict_gains
from .verdict import loader_binds
from .headroom import depthwise_limited
from .report_fields import REPORT_SCHEMA_VERSION
from .whatif import VERIFY_TO_WHATIF
from .rule_expr import Category, Severity
from .textsafe import (markdown_block, markdown_code, markdown_inline, markdown_text, terminal_lines,
                       terminal_text)

_MODEL_NAMES = ("RemedyOut", "FindingOut", "TraceVerdictOut", "VerdictOut", "InputOut",
                "FirstRemedyOut", "RuleFailureOut", "CommunicationOut", "StragglerOut", "RankOut", "JobOut", "Report")


def _models():
    from . import report_models
    return report_models


def __getattr__(name: str):
    # the pydantic models live in report_models.py (imported only where needed); their
    # names stay importable from here
    if name in _MODEL_NAMES:
        return getattr(_models(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- the report without pydantic ---------------------------------------------------------
# `navdoctor analyze` on one input builds its report with build_report_lite: the models'
# fields (LITE_FIELDS: name, annotation as written in report_models.py, default) are checked
# here, and where every value already has its field's type (a str for str, an int for int, a
# finite float for float (or an int, which pydantic turns into the same float), JSON's own
# values for Any) pydantic's validation would give them back unchanged and its
# model_dump(mode="json") the same values: so the dump is made here and pydantic is not
# imported (~60 ms). Any other value (a Decimal, a tuple, inf or nan, a job) and the report
# is made by the pydantic models, as before. tests/test_perf_paths.py checks LITE_FIELDS
# against the models.

_REQUIRED = object()
_NEW_DICT = object()   # default_factory=dict
LITE_FIELDS: dict[str, list[tuple[str, str, Any]]] = {
    "RemedyOut": [("title", "str", _REQUIRED), ("text", "str", ""), ("code", "str | None", None),
                  ("link", "str | None", None), ("verify", "str | None", None),
                  ("whatif", "str | None", None), ("speedup_expected", "float | None", None),
                  ("speedup_range", "list[float] | None", None),
                  ("step_ms_expected", "float | None", None), ("figure_note", "str | None", None)],
    "FindingOut": [
        ("rule", "str", _REQUIRED), ("title", "str", _REQUIRED), ("category", "Category", _REQUIRED),
        ("severity", "Severity", _REQUIRED), ("message", "str", _REQUIRED),
        ("evidence", "dict[str, Any]", _REQUIRED), ("at_stake_ms_per_step", "float | None", None),
        ("at_stake_share", "float", _REQUIRED), ("speedup_expected", "float | None", None),
        ("speedup_range", "list[float] | None", None), ("speedup_if_removed", "float | None", None),
        ("speedup_up_to", "float | None", None), ("traces", "list[int]", _REQUIRED),
        ("remedies", "list[RemedyOut]", _REQUIRED)],
    "TraceVerdictOut": [
        ("trace_id", "int", _REQUIRED), ("source", "str", _REQUIRED), ("bound", "str", _REQUIRED),
        ("confidence", "float", _REQUIRED), ("shares", "dict[str, float]", _REQUIRED),
        ("steps", "int", _REQUIRED), ("step_ms", "float", _REQUIRED), ("has_gpu", "bool", _REQUIRED),
        ("step_origin", "str | None", _REQUIRED), ("stall_steps", "int", 0),
        ("step_inference", "dict[str, Any] | None", None),
        ("tracer_cost", "dict[str, float] | None", None),
        ("class_by_tracer_cost", "dict[str, str] | None", None),
        ("close_to", "list[str] | None", None), ("close_call_gains", "dict[str, float] | None", None),
        ("compute_headroom", "dict[str, float] | None", None),
        ("loader_wait", "dict[str, Any] | None", None)],
    "VerdictOut": [
        ("bound", "str", _REQUIRED), ("confidence", "float", _REQUIRED),
        ("shares", "dict[str, float]", _REQUIRED), ("class_shares", "dict[str, float]", _REQUIRED),
        ("estimated_gain", "dict[str, dict[str, float]]", _NEW_DICT),
        ("step_ms", "float | None", _REQUIRED), ("steps", "int", _REQUIRED),
        ("step_source", "str | None", None), ("has_gpu", "bool", _REQUIRED),
        ("primary_trace", "int | None", _REQUIRED), ("per_trace", "list[TraceVerdictOut]", _REQUIRED),
        ("disagreements", "list[str]", _REQUIRED), ("notes", "list[str]", _REQUIRED),
        ("tracer_cost", "dict[str, float] | None", None),
        ("class_by_tracer_cost", "dict[str, str] | None", None),
        ("close_to", "list[str] | None", None), ("close_call_gains", "dict[str, float] | None", None),
        ("compute_headroom", "dict[str, float] | None", None),
        ("loader_wait", "dict[str, Any] | None", None),
        ("settle_command", "str | None", None), ("findings_lead", "str | None", None),
        ("whatif", "dict[str, Any] | None", None)],
    "InputOut": [("trace_id", "int", _REQUIRED), ("path", "str", _REQUIRED),
                 ("format", "str", _REQUIRED), ("source", "str", _REQUIRED),
                 ("producer", "str", _REQUIRED), ("events", "int", _REQUIRED),
                 ("warnings", "list[str]", _REQUIRED)],
    "RuleFailureOut": [("rule", "str", _REQUIRED), ("file", "str", _REQUIRED),
                       ("error", "str", _REQUIRED)],
    "Report": [
        ("schema_version", "str", REPORT_SCHEMA_VERSION), ("tool", "str", f"navdoctor {__version__}"),
        ("verdict", "VerdictOut", _REQUIRED), ("findings", "list[FindingOut]", _REQUIRED),
        ("inputs", "list[InputOut]", _REQUIRED), ("rules_run", "int", _REQUIRED),
        ("rule_errors", "list[RuleFailureOut]", _REQUIRED), ("warnings", "list[str]", _REQUIRED),
        ("database", "str | None", None), ("run", "dict[str, Any] | None", None),
        ("first_remedy", "FirstRemedyOut | None", None),
        ("job", "None", None)],   # (JobOut | None: a job's report is made by pydantic)
    "FirstRemedyOut": [("rule", "str", _REQUIRED), ("title", "str", _REQUIRED),
                       ("whatif", "str | None", None), ("verify", "str | None", None),
                       ("speedup_expected", "float", _REQUIRED),
                       ("speedup_range", "list[float] | None", None),
                       ("step_ms_expected", "float | None", None), ("code", "str | None", None),
                       ("verify_command", "str | None", None)],
}
# Field constraints (pydantic's ge/le): outside them pydantic raises, so the models decide.
_LITE_RANGES = {("VerdictOut", "confidence"): (0.0, 1.0)}
_LITERALS = {"Category": frozenset(get_args(Category)), "Severity": frozenset(get_args(Severity))}


class _NotLite(Exception):
    """A value the lite path does not take: the pydantic models make the report."""


def _lite_any(v: Any) -> Any:
    t = type(v)
    if t is str or t is int or t is bool or v is None:
        return v
    if t is float:
        if math.isfinite(v):
            return v
        raise _NotLite
    if t is dict:
        out = {}
        for k, x in v.items():
            if type(k) is not str:
                raise _NotLite
            out[k] = _lite_any(x)
        return out
    if t is list:
        return [_lite_any(x) for x in v]
    raise _NotLite


def _lite_value(ann: str, v: Any) -> Any:
    if ann.endswith(" | None"):
        return None if v is None else _lite_value(ann[:-7], v)
    t = type(v)
    if ann == "str":
        if t is str:
            return v
    elif ann == "float":
        if t is float and math.isfinite(v):
            return v
        if t is int and abs(v) <= 2 ** 53:
            return float(v)
    elif ann == "int":
        if t is int:
            return v
    elif ann == "bool":
        if t is bool:
            return v
    elif ann == "Any":
        return _lite_any(v)
    elif ann == "None":
        if v is None:
            return v
    elif ann in _LITERALS:
        if t is str and v in _LITERALS[ann]:
            return v
    elif ann.startswith("list["):
        if t is list:
            inner = ann[5:-1]
            return [_lite_value(inner, x) for x in v]
    elif ann.startswith("dict[str, "):
        if t is dict:
            inner = ann[10:-1]
            out = {}
            for k, x in v.items():
                if type(k) is not str:
                    raise _NotLite
                out[k] = _lite_value(inner, x)
            return out
    elif ann in LITE_FIELDS:
        if t is dict:
            return _lite_model(ann, v)
    raise _NotLite


def _lite_model(name: str, data: dict) -> dict:
    fields = LITE_FIELDS[name]
    if not data.keys() <= {f[0] for f in fields}:
        raise _NotLite
    out = {}
    for field, ann, default in fields:
        if field in data:
            value = _lite_value(ann, data[field])
            bounds = _LITE_RANGES.get((name, field))
            if bounds is not None and not bounds[0] <= value <= bounds[1]:
                raise _NotLite
        elif default is _REQUIRED:
            raise _NotLite
        else:
            value = {} if default is _NEW_DICT else default
        out[field] = value
    return out


class LiteModel:
    """A model's fields as attributes, made from its dump (LITE_FIELDS' order): what the
    terminal, Markdown and HTML reporters read of a pydantic model."""

    def __init__(self, name: str, dump: dict):
        self._name = name
        self._dump = dump
        for field, ann, _ in LITE_FIELDS[name]:
            value = dump[field]
            base = ann[:-7] if ann.endswith(" | None") else ann
            if value is not None and base in LITE_FIELDS:
                value = LiteModel(base, value)
            elif base.startswith("list[") and base[5:-1] in LITE_FIELDS:
                value = [LiteModel(base[5:-1], x) for x in value]
            setattr(self, field, value)

    def model_dump(self, mode: str = "python") -> dict:
        """pydantic's model_dump (either mode: the lite path's values are JSON's own)."""
        return _lite_any(self._dump)

    def to_model(self):
        """The pydantic model of these values."""
        return getattr(_models(), self._name).model_validate(self._dump)

    def model_dump_json(self, **kwargs: Any) -> str:
        return self.to_model().model_dump_json(**kwargs)


def _applicable_remedies(findings: "list[FindingOut]", classes,
                         loader_wait: dict | None = None) -> list[tuple[str, str]]:
    """(class, remedy id) of the remedies navdoctor can apply (verify.remedies.REMEDIES) that
    the findings of these classes suggest, in the findings' order; and the DataLoader's workers
    for io where the trace's own wait names it (loader_wait's traced_binds), which no finding
    suggests: the measured wait is under io-dataloader-wait's line."""
    from .verify.remedies import REMEDIES
    out = [(f.category, r.verify) for f in findings
           if f.category in classes and f.severity != "info"
           for r in f.remedies if r.verify in REMEDIES]
    if (loader_wait or {}).get("traced_binds") and "io" in classes and ("io", "num_workers") not in out:
        out.append(("io", "num_workers"))
    return out


def settle_command(bound: str, close_to: list[str] | None, findings: "list[FindingOut]",
                   run: dict[str, Any] | None, loader_wait: dict | None = None) -> str | None:
    """For a close call, the `navdoctor verify` command that measures the remedies navdoctor
    can apply from the findings of both classes, in the findings' order (docs/verdict.md,
    "Close calls"); None when it is not a close call or no such remedy is suggested."""
    if not close_to:
        return None
    ids = list(dict.fromkeys(i for _, i in _applicable_remedies(findings, (bound, *close_to), loader_wait)))
    if not ids:
        return None
    return verify_command(",".join(ids), run)


def settle_text(report: "Report", code=lambda c: c) -> str | None:
    """The close call's line in the terminal and Markdown reports: the verify command, and the
    classes whose remedies navdoctor cannot apply (code changes, listed in their findings)."""
    v = report.verdict
    if not v.close_to:
        return None
    classes = (v.bound, *v.close_to)
    measured = {c for c, _ in _applicable_remedies(report.findings, classes, v.loader_wait)}
    manual = [c for c in classes if c not in measured]
    gap = (f"{' and '.join(manual)}: no remedy navdoctor can apply, try the code changes in "
           f"{'its' if len(manual) == 1 else 'their'} findings") if manual else ""
    if v.settle_command:
        return code(v.settle_command) + (f" ({gap})" if gap else "")
    return gap or None


def _remedy_data(r, whatif_out: dict | None) -> dict[str, Any] | None:
    """A rule's remedy with the what-if model's figure for it (whatif.for_trace), or None where
    the trace shows it already on or gives it nothing to change (it does not fit the code).
    Autocast is worded for the GPU's half type (fp16 with GradScaler below Ampere)."""
    d = r.model_dump()
    d.pop("only_for", None)
    traits = (whatif_out or {}).get("workload")
    if r.only_for and traits and not all(
            {"training": traits.get("training"), "inference": not traits.get("training"),
             "vision": traits.get("vision"), "single_gpu": not traits.get("multi_gpu")}[k]
            for k in r.only_for):
        return None     # worded for another kind of job
    rid = r.whatif or VERIFY_TO_WHATIF.get(r.verify)
    low = (whatif_out or {}).get("low_precision", "amp_bf16")
    if rid in ("amp_bf16", "amp_fp16"):
        rid = low
        if low == "amp_fp16":
            d["code"] = (d.get("code") or "").replace("torch.bfloat16", "torch.float16") or None
            d["text"] = (d.get("text") or "") + (" This GPU has no bf16 arithmetic: use fp16 "
                                                  "autocast, with torch.amp.GradScaler when training.")
            d["verify"] = "amp_fp16" if d.get("verify") == "amp_bf16" else d.get("verify")
    if "TF32" in (r.title or "") and (whatif_out or {}).get("tf32") is False:
        return None     # TF32 does not exist on this GPU (Volta, Turing)
    p = ((whatif_out or {}).get("remedies") or {}).get(rid) if rid else None
    if p and not p.get("expected") and (p.get("why_not") or "").startswith(("already on", "nothing in the trace")):
        return None
    d.update(whatif=rid)
    if p and p.get("expected"):
        d.update(speedup_expected=round(p["expected"], 2),
                 speedup_range=[round(p["low"], 2), round(p["high"], 2)],
                 step_ms_expected=round(p["step_ms"], 3) if p.get("step_ms") else None)
    elif p:
        d.update(figure_note=p.get("why_not"))
    return d


def _finding_figures(remedies: list[dict]) -> dict[str, Any]:
    """A finding's expectation: its best remedy's figure and range."""
    best = max((r for r in remedies if r.get("speedup_expected")), key=lambda r: r["speedup_expected"],
               default=None)
    return dict(speedup_expected=best["speedup_expected"] if best else None,
                speedup_range=best["speedup_range"] if best else None)


def first_remedy(findings: list[dict], run: dict[str, Any] | None) -> dict[str, Any] | None:
    """The remedy with the largest expected speed-up of all the findings' remedies, where it is
    expected to give at least 1.05x (verify's margin): what a report opens with."""
    cands = [(f, r) for f in findings for r in f["remedies"] if (r.get("speedup_expected") or 0) >= 1.05]
    if not cands:
        return None
    f, r = max(cands, key=lambda fr: fr[1]["speedup_expected"])
    from .verify.remedies import REMEDIES
    return dict(rule=f["rule"], title=r["title"], whatif=r.get("whatif"), verify=r.get("verify"),
                speedup_expected=r["speedup_expected"], speedup_range=r.get("speedup_range"),
                step_ms_expected=r.get("step_ms_expected"), code=r.get("code"),
                verify_command=verify_command(r["verify"], run) if r.get("verify") in REMEDIES else None)


def verify_command(remedies: str, run: dict[str, Any] | None) -> str:
    """`navdoctor verify --remedy ID[,ID] SCRIPT [ARGS]`: the script and its arguments as
    diagnose ran them, else a placeholder."""
    script = (shlex.join([run["script"], *run.get("args", [])]) if run and run.get("script")
              else "SCRIPT [ARGS...]")
    return shlex.join(["navdoctor", "verify", "--remedy", remedies]) + " " + script


# ---- the answer: what every form of the report opens with ---------------------------------


class Answer:
    """What to do first, from the report's own figures (terminal, Markdown and HTML open with it
    after the verdict): the report's first_remedy (the what-if model's largest expectation), else
    the first remedy of the first finding that has one, a class's before an `other` one; its
    expected speed-up, range and its finding's bound, the remedy's code, and the command that
    measures it: `navdoctor verify` where navdoctor can apply the remedy
    (verify.remedies.REMEDIES), the close call's settle command where there is one, else none
    and what to do instead."""

    def __init__(self, report: "Report"):
        from .verify.remedies import REMEDIES
        # the remedy the what-if model expects to give most (first_remedy), else the first
        # remedy of a class's finding before one of `other`, whose first remedy may only point
        # back at the others (realtime-frame-budget's)
        acting = [f for f in report.findings if f.severity != "info" and f.remedies]
        fr = report.first_remedy
        self.finding = next((f for f in acting if fr and f.rule == fr.rule), None) or next(
            (f for f in acting if f.category != "other"), acting[0] if acting else None)
        self.remedy = None
        if self.finding is not None:
            self.remedy = next((r for r in self.finding.remedies if fr and r.title == fr.title),
                               self.finding.remedies[0])
        r = self.remedy
        self.expected = ""
        if r is not None and r.speedup_expected:
            self.expected = expected_text(r.speedup_expected, r.speedup_range)
            if self.finding.speedup_up_to and self.finding.speedup_up_to > r.speedup_expected:
                self.expected += f"; bound {self.finding.speedup_up_to:.2f}x"
        # the command that checks it, and the words before it where it is no `verify`
        self.command: str | None = None
        self.lead = ""
        if self.remedy is None:
            return
        if self.remedy.verify in REMEDIES:
            self.command = verify_command(self.remedy.verify, report.run)
        elif report.verdict.settle_command:
            self.command = report.verdict.settle_command
        else:
            self.lead = ("a code change navdoctor cannot apply for you: make it, capture again, "
                         "then")
            self.command = "navdoctor compare BEFORE AFTER"

    def check(self, code=lambda c: c) -> str:
        """'navdoctor verify --remedy ...', or the words and command for a code change."""
        return (self.lead + " " if self.lead else "") + code(self.command)

    @property
    def title(self) -> str:
        r = self.remedy
        return r.title + (f": {r.text}" if r.text else "") if r else ""

    @property
    def source(self) -> str:
        """Which finding it comes from."""
        f = self.finding
        return f"{f.category}: {f.title}" if f else ""


def step_words(v: "VerdictOut") -> str:
    """The step time and count, worded once for every form: the mean of the recorded steady
    steps (docs/report.md, "One step, one statistic")."""
    if not v.step_ms:
        return "no steps"
    return f"mean {v.step_ms:.2f} ms/step over {v.steps} step{'s' if v.steps != 1 else ''}"


def bucket_rows(v: "VerdictOut") -> list[tuple[str, float, float | None]]:
    """(label, share, ms per step) of each bucket that holds 0.5% of the step or more."""
    rows = []
    for key, label in _BUCKET_LABEL:
        share = v.shares.get(key, 0.0)
        if key == "compute" and not v.has_gpu:
            label = "CPU ops"
        if share >= 0.005:
            rows.append((label, share, share * v.step_ms if v.step_ms else None))
    return rows


def gains_words(v: "VerdictOut") -> list[str]:
    """'memory 4.95x' per class of 5% or more of the step: the bound were its cause gone
    entirely (a bound, not an expectation: docs/verdict.md, "Predicted speed-ups")."""
    return [f"{c} {g['speedup_up_to']:.2f}x" for c, g in v.estimated_gain.items()
            if c != "compute" and v.class_shares.get(c, 0) >= 0.05]


def _report_data(a: Analysis, run: dict[str, Any] | None, finding) -> dict[str, Any]:
    """The report's fields (the models' as dicts); finding(dict) makes a finding's model,
    which the close call's settle command reads."""
    v = a.verdict
    has_gpu = any(t.has_gpu for t in v.per_trace if t.trace_id == v.primary_trace)
    gains = verdict_gains(v, has_gpu)
    findings = []
    for f in a.findings:
        remedies = [d for d in (_remedy_data(r, v.whatif) for r in f.rule.remedies) if d is not None]
        remedies.sort(key=lambda d: -(d.get("speedup_expected") or 0.0))  # (stable: rule order else)
        findings.append(dict(
            rule=f.rule.id, title=f.rule.title, category=f.rule.category,
            severity=f.rule.severity, message=f.message, evidence=f.metrics,
            at_stake_ms_per_step=None if f.at_stake_ns is None else round(f.at_stake_ns / 1e6, 4),
            at_stake_share=round(f.at_stake_share, 4),
            **_finding_figures(remedies),
            speedup_if_removed=upper_bound_speedup(f.at_stake_share),
            speedup_up_to=finding_bound(f.rule.category, f.at_stake_share, gains),
            traces=f.trace_ids, remedies=remedies))
    return dict(
        verdict=dict(
            bound=v.bound, confidence=v.confidence, shares=v.shares, class_shares=v.class_shares,
            # the class shares are of the step without the tracer cost: so is the step they divide
            estimated_gain=gains,
            step_ms=v.step_ms, steps=v.steps, disagreements=v.disagreements, notes=v.notes,
            has_gpu=has_gpu,
            step_source=next((t.step_origin for t in v.per_trace
                              if t.trace_id == v.primary_trace), None),
            primary_trace=v.primary_trace,
            per_trace=[dict(trace_id=t.trace_id, source=t.source, bound=t.bound,
                            confidence=t.confidence, shares=t.shares, steps=t.steps,
                            step_ms=t.step_ms, has_gpu=t.has_gpu,
                            step_origin=t.step_origin, stall_steps=t.stall_steps,
                            step_inference=t.step_inference,
                            tracer_cost=t.tracer_cost,
                            class_by_tracer_cost=t.class_by_tracer_cost,
                            close_to=t.close_to,
                            close_call_gains=t.close_call_gains,
                            compute_headroom=t.compute_headroom, loader_wait=t.loader_wait)
                       for t in v.per_trace],
            tracer_cost=v.tracer_cost, class_by_tracer_cost=v.class_by_tracer_cost,
            close_to=v.close_to, close_call_gains=v.close_call_gains,
            compute_headroom=v.compute_headroom, loader_wait=v.loader_wait,
            settle_command=settle_command(v.bound, v.close_to, [finding(f) for f in findings],
                                          run, v.loader_wait),
            findings_lead=v.findings_lead, whatif=v.whatif),
        findings=findings, first_remedy=first_remedy(findings, run),
        inputs=[dict(trace_id=i, path=r.path, format=r.format, source=r.source,
                     producer=r.producer, events=r.events, warnings=r.warnings)
                for i, r in enumerate(a.inputs, start=1)],
        rules_run=a.rules_run,
        rule_errors=[dict(rule=x.rule_id, file=x.file, error=x.error) for x in a.rule_failures],
        warnings=a.warnings, database=a.db_path, run=run)


def build_report(a: Analysis, run: dict[str, Any] | None = None) -> "Report":
    """The report as the pydantic model."""
    models = _models()
    return models.Report.model_validate(_report_data(a, run, models.FindingOut.model_validate))


def build_report_lite(a: Analysis, run: dict[str, Any] | None = None):
    """The report as build_report makes it, as a LiteModel where every value already has
    its field's type (no pydantic imported), else as the pydantic model."""
    try:
        data = _report_data(a, run, lambda f: LiteModel("FindingOut", _lite_model("FindingOut", f)))
        return LiteModel("Report", _lite_model("Report", data))
    except _NotLite:
        return build_report(a, run)


def report_json_schema() -> dict:
    return _models().Report.model_json_schema()


def write_atomic(path: str, text: str) -> None:
    """Write through a temp file and rename, so a crash never leaves half a report: the
    path holds the old content or the new one, never a part (the data is synced before the
    rename). The file gets the permissions a plain open() would give it."""
    from .errors import NavdoctorError
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".navdoctor-", dir=directory)
    except OSError as e:
        raise NavdoctorError(f"{path}: cannot write: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(f.fileno(), 0o666 & ~umask)  # mkstemp's 0600 would hide the report
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):   # a full disk, a quota: the report was not written
            raise NavdoctorError(f"{path}: cannot write: {e.strerror or e} (the file is as it "
                                 "was)") from None
        raise


def report_to_json(report: "Report") -> str:
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


def expected_text(expected: float | None, rng: list[float] | None) -> str:
    """'expected 1.52x (1.31-1.70x)': a replayed expectation and its range."""
    if not expected:
        return ""
    return f"expected {expected:.2f}x" + (f" ({rng[0]:.2f}-{rng[1]:.2f}x)" if rng else "")


def stake_text(f: "FindingOut", share_of: str = "") -> str:
    """'7.00 ms/step, 32%; expected 1.47x (1.30-1.62x); bound 1.60x': a finding's time at
    stake (of the traced step), its best remedy's expected speed-up and the bound on what
    removing its cause can give. share_of: words after the share (' of the step')."""
    if not f.at_stake_ms_per_step:
        return ""
    text = f"{f.at_stake_ms_per_step:.2f} ms/step, {f.at_stake_share:.0%}{share_of}"
    if f.speedup_expected:
        text += "; " + expected_text(f.speedup_expected, f.speedup_range)
    if f.speedup_up_to and f.speedup_up_to > (f.speedup_expected or 1.0):
        text += f"; bound {f.speedup_up_to:.2f}x"
    return text


def headroom_text(v: "VerdictOut") -> str | None:
    """What bf16 and channels_last are expected to give where the GPU computes a good part of
    the step: by the kernels' names (docs/verdict.md, "Compute headroom"), and the step as the
    what-if model replays it with autocast's host cost (bf16 alone where depthwise
    convolutions make channels_last a risk); else None."""
    h = v.compute_headroom
    if not h or not v.has_gpu or v.class_shares.get("compute", 0.0) < 0.3:
        return None
    parts = [f"{label} {h[key]:.2f} ms" for key, label in
             (("layout_ms", "layout conversions"), ("fp32_tensor_core_ms", "TF32 math"),
              ("fp32_cuda_core_ms", "fp32 CUDA-core math")) if h.get(key, 0.0) >= 0.005]
    where = f" ({', '.join(parts)} per step)" if parts else " (no fp32 math or layout conversions in the kernels)"
    depthwise = depthwise_limited(h.get("depthwise_ms", 0.0), h.get("kernel_ms") or 0.0)
    if depthwise:
        where = (f" (depthwise convolutions take {h['depthwise_ms'] / h['kernel_ms']:.0%} of the kernel "
                 "time: on such networks bf16 + channels_last gave 0.72-1.12x, channels_last "
                 "slowing them; try bf16 alone and measure)")
    # the kernels' gain alone; the replay adds what autocast costs the host, which can turn it
    # into a slowdown on a step the host sets: both are said, so the two never read as one figure
    low = (v.whatif or {}).get("low_precision") or "amp_bf16"
    rid = low if depthwise else "amp_channels_last"
    replay = ((v.whatif or {}).get("remedies") or {}).get(rid) or {}
    replayed = ""
    if replay.get("expected"):
        rng = [replay["low"], replay["high"]] if replay.get("low") and replay.get("high") else None
        which = "both" if rid == "amp_channels_last" else f"{'bf16' if rid == 'amp_bf16' else 'fp16'} alone"
        replayed = (f"; the step replayed with autocast's host cost ({which}): "
                    f"{expected_text(replay['expected'], rng)}")
    if loader_binds(v.loader_wait) and h["speedup_expected"] > 1.0:
        return (f"compute remedies (bf16/fp16 autocast, channels_last): ~1.00x while the GPU waits "
                f"on the DataLoader (by kernel names ~{h['speedup_expected']:.2f}x once it does not){where}"
                f"{replayed}")
    return (f"compute remedies (bf16/fp16 autocast, channels_last): ~{h['speedup_expected']:.2f}x "
            f"expected by kernel names{where}{replayed}")


def class_text(bound: str | None, detail: dict | None) -> str:
    """A class as the diagnosis gives it: with the other classes of a close call (the timed
    runs' loader edge among its sources), worded as the report words them."""
    close = (detail or {}).get("close_to")
    return f"{bound} (close call with {' and '.join(close)})" if close else str(bound)


def bound_text(v: "VerdictOut") -> str:
    """The verdict in words (what a trace without a GPU timeline can be bound by differs)."""
    if not v.has_gpu and v.bound == "compute":
        return "compute-bound: CPU ops fill the step (no GPU activity in the trace)"
    if not v.has_gpu and v.bound == "memory":
        return "memory-bound: communication fills the step (no GPU activity in the trace)"
    return _BOUND_TEXT.get(v.bound, v.bound)


def render_terminal(report: "Report", color: bool | None = None, max_remedies: int = 3) -> str:
    out = _TerminalLines()
    # every text is made safe before it is styled: names and rule texts are data
    s = lambda text, **kw: click.style(terminal_text(text), **kw) if color else terminal_text(text)  # noqa: E731
    v = report.verdict
    text = bound_text(v)
    close = f"; close call with {' and '.join(v.close_to)}" if v.close_to else ""
    out.append(s(f"VERDICT  {text}", bold=True)
               + terminal_text(f"  (confidence {v.confidence:.2f}{close}; {step_words(v)})"), styled=True)
    answer = Answer(report)
    if answer.remedy is not None:
        out.append(s("  DO THIS FIRST: ", bold=True)
                   + terminal_text(answer.title + (f" [{answer.expected}]" if answer.expected else "")),
                   styled=True)
        if answer.remedy.code:
            out.extend("        " + c for c in terminal_lines(answer.remedy.code.rstrip()))
        out.append(f"  from finding 1, {answer.source}" if answer.finding is report.findings[0]
                   else f"  from {answer.source}")
        out.append(f"  check it: {answer.check()}")
    if v.shares:
        out.append("  step time: " + " | ".join(f"{label} {share:.0%}" for label, share, _ in bucket_rows(v)))
    if gains := gains_words(v):
        out.append("  bound, each cause gone alone (a remedy may remove several): " + " | ".join(gains))
    headroom = headroom_text(v)
    if headroom:
        out.append("  " + headroom)
    if report.job:
        out.extend(render_job(report.job))
    for t in v.per_trace if len(v.per_trace) > 1 and not report.job else []:
        out.append(f"  trace {t.trace_id} ({t.source}): {t.bound} "
                   f"(confidence {t.confidence:.2f}, mean {t.step_ms:.2f} ms/step, {t.steps} steps)")
    for d in v.disagreements:
        out.append(s(f"  disagreement: {d}", fg="yellow"), styled=True)
    for n in v.notes:
        out.append(f"  note: {n}")
    if settle := settle_text(report):
        out.append(f"  settle the close call: {settle}")
    out.append("")
    if not report.findings:
        out.append(NO_FINDINGS)
    for i, f in enumerate(report.findings, start=1):
        stake = f" [{stake_text(f)}]" if f.at_stake_ms_per_step else ""
        out.append(s(f"{i}. [{f.severity.upper()}] {f.category}: {f.title}",
                     fg=_SEV_COLOR[f.severity], bold=True) + terminal_text(stake), styled=True)
        out.append(f"   {f.message}")
        for r in f.remedies[:max_remedies]:
            line = f"   -> {r.title}"
            if r.speedup_expected:
                line += f" [{expected_text(r.speedup_expected, r.speedup_range)}]"
            if r.text:
                line += f": {r.text}"
            out.append(line)
            if r.code:
                out.extend("        " + c for c in terminal_lines(r.code.rstrip()))
        if len(f.remedies) > max_remedies:
            out.append(f"   (+{len(f.remedies) - max_remedies} more remedies in the JSON report)")
        out.append(f"   rule {f.rule} ({f.severity})")
    for e in report.rule_errors:
        out.append(s(f"rule error: {e.error}", fg="red"), styled=True)
    for w in report.warnings:
        out.append(s(f"warning: {w}", fg="yellow"), styled=True)
    names = ", ".join(f"{i.trace_id}={i.path}" for i in report.inputs)
    out.append(f"inputs: {names}; {report.rules_run} rules"
               + (f"; database: {report.database}" if report.database else ""))
    return "\n".join(out)


NO_FINDINGS = "No rule fired: nothing stands out in these traces."


class _TerminalLines(list):
    """render_terminal's lines: what is appended unstyled is made safe here (terminal_text);
    styled text is made safe before click.style adds its own escape sequences."""

    def append(self, line: str, styled: bool = False) -> None:
        super().append(line if styled else terminal_text(line))

    def extend(self, lines) -> None:
        for line in lines:
            self.append(line)


def render_job(j: "JobOut") -> list[str]:
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


def render_markdown(report: "Report", max_findings: int = 5, max_remedies: int = 2) -> str:
    """A short summary for CI step summaries and pull-request comments: the verdict and what to
    do first (the terminal's words: bound_text, step_words, Answer), the step's buckets, the top
    findings with their remedies."""
    v = report.verdict
    # names, rule texts and file names are shown as text, never markup (a `quoted` part as code)
    md = markdown_inline
    text = bound_text(v)
    head, _, rest = text.partition(": ")
    out = [f"{MARKDOWN_MARK} {report.schema_version} -->",
           f"### navdoctor: **{head}** (confidence {v.confidence:.2f}"
           + (f", close call with {' and '.join(v.close_to)}" if v.close_to else "")
           + f", {step_words(v)})", ""]
    if rest:
        out += [rest[0].upper() + rest[1:] + ".", ""]
    answer = Answer(report)
    if answer.remedy is not None:
        out.append(f"**Do this first:** {md(answer.title)}"
                   + (f" — {answer.expected}" if answer.expected else "") + f"; from {md(answer.source)}.")
        out.append("")
        if answer.remedy.code:
            out += [*markdown_block(answer.remedy.code, "python"), ""]
        out += [f"Check it: {answer.check(markdown_code)}", ""]
    if v.shares:
        out += ["| where the step goes | share | ms/step |", "|---|---:|---:|"]
        out += [f"| {label} | {share:.0%} | {'' if ms is None else f'{ms:.2f}'} |"
                for label, share, ms in bucket_rows(v)]
        out.append("")
    if gains := gains_words(v):
        out += ["Bound, each cause gone alone (a remedy may remove several): " + " | ".join(gains) + ".", ""]
    headroom = headroom_text(v)
    if headroom:
        out += [headroom[0].upper() + headroom[1:] + ".", ""]
    if report.findings:
        out.append("**Findings**, the class expected to give most first, then most time at stake:")
        out.append("")
        for i, f in enumerate(report.findings[:max_findings], start=1):
            stake = f" — {stake_text(f, ' of the step')}" if f.at_stake_ms_per_step else ""
            out.append(f"{i}. **[{f.severity.upper()}] {f.category}: {md(f.title)}**{stake}  ")
            out.append(f"   {md(f.message)}")
            for r in f.remedies[:max_remedies]:
                line = (f"   - {md(r.title)}"
                        + (f" [{expected_text(r.speedup_expected, r.speedup_range)}]" if r.speedup_expected else "")
                        + (f": {md(r.text)}" if r.text else ""))
                if r.code and r.code.strip():
                    line += f" ({markdown_code(r.code.strip().splitlines()[0])})"
                out.append(line)
        if len(report.findings) > max_findings:
            out.append(f"\n{len(report.findings) - max_findings} more in the JSON report.")
        out.append("")
    else:
        out += [NO_FINDINGS, ""]
    for d in v.disagreements:
        out.append(f"> disagreement: {md(d)}")
    for n in v.notes:
        out.append(f"> {md(n)}")
    if settle := settle_text(report, code=markdown_code):
        out.append(f"> settle the close call: {settle}")
    inputs = ", ".join(markdown_text(Path(i.path).name, line_start=False) for i in report.inputs)
    out += ["", f"<sub>{report.tool}, report schema {report.schema_version}; inputs: {inputs}</sub>", ""]
    return "\n".join(out)
