"""`navdoctor rules test DIR` and `navdoctor rules explain ID`: rules carry their own examples.

A rule's `examples` name the traces of a run (trace files, or a `navdoctor diagnose` run
directory) where it must fire or must stay quiet, with bounds on the metrics it finds there
(docs/rules.md, "Examples"). Each distinct set of traces is loaded once; every example on it
runs its rule over that store exactly as `analyze` would (the same views, the same merge of
a run's traces by the verdict's trusted trace).
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import duckdb

from .errors import NavdoctorError, RuleError
from .rules import Example, Rule, _coerce_like


@dataclass
class CaseResult:
    rule_id: str
    index: int                 # the example's position in the rule's list, from 1
    example: Example
    passed: bool
    reason: str                # why it failed, or what it found when it passed

    def line(self) -> str:
        where = ", ".join(self.example.trace_list)
        verb = "fires on" if self.example.expect == "fire" else "quiet on"
        status = "ok  " if self.passed else "FAIL"
        return f"{status} {self.rule_id} #{self.index} {verb} {where}: {self.reason}"


def example_paths(rule: Rule, example: Example) -> list[str]:
    """The trace files of an example; its paths are relative to the rule's file."""
    from .compare import resolve
    base = Path(rule.source_file).parent if rule.source_file else Path(".")
    files: list[str] = []
    for p in example.trace_list:
        path = Path(p) if Path(p).is_absolute() else base / p
        if not path.exists():
            raise NavdoctorError(f"{p}: no such file or directory (relative to {base})")
        files.extend(resolve(str(path)) if path.is_dir() else [str(path)])
    return files


def with_params(rule: Rule, params: dict[str, Any]) -> Rule:
    if not params:
        return rule
    unknown = sorted(set(params) - set(rule.params))
    if unknown:
        raise NavdoctorError(f"sets '{unknown[0]}', which is not a parameter of the rule "
                             f"(has: {', '.join(rule.params) or 'none'})")
    copy = rule.model_copy(deep=True)
    copy.source_file = rule.source_file
    for k, v in params.items():
        copy.params[k] = _coerce_like(rule.params[k], str(v)) if not isinstance(v, bool) else v
    return copy


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def check_bounds(example: Example, metrics: dict[str, Any]) -> str | None:
    """The first metric outside its bounds, as a reason; None when all are inside."""
    for name, b in example.metrics.items():
        if name not in metrics:
            return f"metric '{name}' is not a column of the rule's query"
        v = metrics[name]
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
            return f"{name} is {v!r}, expected a number"
        if b.min is not None and v < b.min:
            return f"{name} = {_fmt(v)}, below the expected minimum {_fmt(b.min)}"
        if b.max is not None and v > b.max:
            return f"{name} = {_fmt(v)}, above the expected maximum {_fmt(b.max)}"
    return None


def run_case(con: duckdb.DuckDBPyConnection, rule: Rule, example: Example,
             primary_trace: int | None) -> tuple[bool, str]:
    """Run one rule on a prepared store: (passed, reason)."""
    from . import engine
    rule = with_params(rule, example.params)
    ev = engine.evaluate_rules(con, [rule])
    if ev.failures:
        return False, f"the rule failed: {ev.failures[0].error}"
    merged = engine.merge_by_rule(ev, primary_trace)
    finding = merged[0] if merged else None
    if example.expect == "fire" and finding is None:
        return False, "did not fire" + _closest(con, rule, primary_trace)
    if example.expect == "quiet" and finding is not None:
        return False, f"fired: {finding.message}"
    if finding is not None:
        metrics = finding.metrics
    else:
        rows = engine.run_query(con, rule)
        row = next((r for r in rows if r.get("trace_id") == primary_trace), rows[0] if rows else None)
        if row is None:
            if example.metrics:
                return False, "the query returned no row, so no metric can be checked"
            return True, "no row"
        metrics = row
    bad = check_bounds(example, metrics)
    if bad:
        return False, bad
    names = list(example.metrics) or _condition_metrics(rule, metrics)
    return True, ", ".join(f"{k}={_fmt(metrics.get(k))}" for k in names) or (
        "fired" if finding else "quiet")


def _condition_metrics(rule: Rule, row: dict[str, Any]) -> list[str]:
    """The metrics of a row that the rule's condition names, in its order."""
    import ast
    from .rule_expr import check_expression
    names = [n.id for n in ast.walk(check_expression(rule.condition)) if isinstance(n, ast.Name)]
    return [n for n in dict.fromkeys(names) if n in row]


def _closest(con, rule: Rule, primary_trace: int | None) -> str:
    """What the rule measured where it did not fire: the metrics its condition names."""
    from . import engine
    try:
        rows = engine.run_query(con, rule)
    except RuleError:
        return ""
    if not rows:
        return " (the query returned no row)"
    row = next((r for r in rows if r.get("trace_id") == primary_trace), rows[0])
    shown = [f"{n}={_fmt(row[n])}" for n in _condition_metrics(rule, row)]
    return f" ({', '.join(shown)})" if shown else ""


def run_examples(rules: list[Rule], progress: Callable[[str], None] = lambda m: None
               ) -> tuple[list[CaseResult], list[str]]:
    """Every example of every rule. Returns the results and the ids of rules without examples."""
    from . import analysis, verdict as verdict_mod
    from .ranks.detect import job_ranks
    from .ranks.executor import run_ranks
    from .ranks.job import prepare_job_store
    all_rules = rules
    results: list[CaseResult] = []
    # Group the examples by the traces they load, so each run is loaded once.
    by_traces: dict[tuple[str, ...], list[tuple[Rule, int, Example]]] = {}
    for rule in rules:
        for i, ex in enumerate(rule.examples, start=1):
            try:
                files = tuple(example_paths(rule, ex))
            except NavdoctorError as e:
                results.append(CaseResult(rule.id, i, ex, False, str(e)))
                continue
            by_traces.setdefault(files, []).append((rule, i, ex))
    for files, cases in by_traces.items():
        progress(f"loading {', '.join(files)}")
        con = duckdb.connect(":memory:")
        try:
            try:
                ranks = job_ranks(list(files))
                if ranks is None:
                    analysis.prepare_store(con, list(files))
                    primary = verdict_mod.compute_verdict(con).primary_trace
                else:   # the ranks of one job: each rank as analyze does, then the job's store
                    prepare_job_store(con, run_ranks(ranks, all_rules, workers=1))
                    primary = None
            except NavdoctorError as e:
                for rule, i, ex in cases:
                    results.append(CaseResult(rule.id, i, ex, False, f"cannot load: {e}"))
                continue
            for rule, i, ex in cases:
                try:
                    ok, reason = run_case(con, rule, ex, primary)
                except NavdoctorError as e:
                    ok, reason = False, str(e)
                results.append(CaseResult(rule.id, i, ex, ok, reason))
        finally:
            con.close()
    order = {r.id: n for n, r in enumerate(rules)}
    results.sort(key=lambda c: (order.get(c.rule_id, 0), c.index))
    return results, [r.id for r in rules if not r.examples]


def explain(rule: Rule) -> str:
    """A rule's documentation as text: what it measures, when it fires, parameters, remedies,
    examples (as `ruff rule CODE`)."""
    def para(text: str, indent: str = "  ") -> str:
        return textwrap.fill(" ".join(text.split()), width=96, initial_indent=indent,
                             subsequent_indent=indent)
    out = [f"{rule.id}: {rule.title}",
           f"  category {rule.category}, severity {rule.severity}"
           + (f", from {rule.source_file}" if rule.source_file else ""), ""]
    if rule.description:
        out += ["What it measures:", para(rule.description), ""]
    out += ["Fires when:", f"  {' '.join(rule.condition.split())}", ""]
    if rule.params:
        out.append("Parameters (--set " + rule.id + ".NAME=VALUE):")
        out += [f"  {k} = {v}" for k, v in rule.params.items()]
        out.append("")
    if rule.at_stake:
        out += [f"Time at stake: the metric '{rule.at_stake}' (ns per step); findings rank by it.", ""]
    out += ["Message:", para(rule.message), ""]
    if rule.remedies:
        out.append("Remedies:")
        for r in rule.remedies:
            out.append(f"  - {r.title}" + (f"  [navdoctor verify --remedy {r.verify}]" if r.verify else ""))
            if r.text:
                out.append(para(r.text, "      "))
            if r.code:
                out += ["      " + line for line in r.code.rstrip().splitlines()]
            if r.link:
                out.append(f"      {r.link}")
        out.append("")
    if rule.examples:
        out.append("Examples (navdoctor rules test):")
        for ex in rule.examples:
            bounds = ", ".join(
                f"{k} in [{'' if b.min is None else _fmt(b.min)}, {'' if b.max is None else _fmt(b.max)}]"
                for k, b in ex.metrics.items())
            sets = ", ".join(f"{k}={v}" for k, v in ex.params.items())
            out.append(f"  {ex.expect:5} on {', '.join(ex.trace_list)}"
                       + (f"  with {sets}" if sets else "") + (f"  ({bounds})" if bounds else ""))
            if ex.note:
                out.append(para(ex.note, "        "))
    else:
        out.append("Examples: none")
    out.append("")
    out += ["Query:"] + ["  " + line for line in rule.query.rstrip().splitlines()]
    return "\n".join(out) + "\n"
