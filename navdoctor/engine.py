"""Runs rules over the trace store and turns the rows that meet a condition into findings.

Rules are untrusted input: only one read-only SELECT per rule is run, with DuckDB's external
access disabled and its configuration locked, under a time limit. A rule that fails is
reported as an error naming it; the other rules still run.
"""
from __future__ import annotations

import datetime
import decimal
import math
import threading
from dataclasses import dataclass, field
from typing import Any

import duckdb

from .rules import SEVERITY_RANK, Rule, evaluate, render_message, sql_params
from .errors import RuleError

RULE_TIME_LIMIT_S = 20.0


@dataclass
class Finding:
    rule: Rule
    metrics: dict[str, Any]
    message: str
    at_stake_ns: float | None
    step_ns: float | None
    trace_ids: list[int] = field(default_factory=list)

    @property
    def at_stake_share(self) -> float:
        if not self.at_stake_ns or not self.step_ns:
            return 0.0
        return self.at_stake_ns / self.step_ns


@dataclass
class RuleFailure:
    rule_id: str
    file: str
    error: str


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """After loading: no more file, network or extension access, and no way to undo that."""
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _plain(v: Any) -> Any:
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    return v


def check_read_only(rule: Rule) -> None:
    try:
        statements = duckdb.extract_statements(rule.query)
    except duckdb.Error as e:
        raise RuleError(rule.source_file or "?", rule.id, "query",
                        "invalid SQL: " + str(e).strip().splitlines()[0]) from None
    if len(statements) != 1:
        raise RuleError(rule.source_file or "?", rule.id, "query",
                        f"must be exactly one statement (found {len(statements)})")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise RuleError(rule.source_file or "?", rule.id, "query",
                        f"must be a read-only SELECT (found {statements[0].type.name})")


def run_query(con: duckdb.DuckDBPyConnection, rule: Rule,
              time_limit_s: float = RULE_TIME_LIMIT_S) -> list[dict[str, Any]]:
    check_read_only(rule)
    cur = con.cursor()
    timer = threading.Timer(time_limit_s, cur.interrupt)
    timer.start()
    try:
        res = cur.execute(rule.query, sql_params(rule))
        names = [d[0] for d in res.description]
        rows = res.fetchall()
    except duckdb.InterruptException:
        raise RuleError(rule.source_file or "?", rule.id, "query",
                        f"stopped after the {time_limit_s:g} s time limit") from None
    except duckdb.Error as e:
        raise RuleError(rule.source_file or "?", rule.id, "query",
                        str(e).strip().splitlines()[0]) from None
    finally:
        timer.cancel()
        cur.close()
    return [{n: _plain(v) for n, v in zip(names, row)} for row in rows]


@dataclass
class Evaluation:
    findings: list[Finding]           # every row that met its condition, not yet merged
    failures: list[RuleFailure]
    evaluated: set[tuple[str, int]]   # (rule id, trace id) pairs that produced a row


def evaluate_rules(con: duckdb.DuckDBPyConnection, rules: list[Rule],
                   time_limit_s: float = RULE_TIME_LIMIT_S) -> Evaluation:
    findings: list[Finding] = []
    failures: list[RuleFailure] = []
    evaluated: set[tuple[str, int]] = set()
    for rule in rules:
        try:
            rows = run_query(con, rule, time_limit_s)
            for row in rows:
                if row.get("trace_id") is not None:
                    evaluated.add((rule.id, row["trace_id"]))
                names = {**rule.params, **row}
                try:
                    fired = bool(evaluate(rule.condition, names))
                except KeyError as e:
                    raise RuleError(rule.source_file or "?", rule.id, "condition",
                                    f"names {e.args[0]!r}, which is neither a metric of the query nor a param") from None
                except (TypeError, ZeroDivisionError, ValueError) as e:
                    raise RuleError(rule.source_file or "?", rule.id, "condition", str(e)) from None
                if not fired:
                    continue
                at_stake = row.get(rule.at_stake) if rule.at_stake else None
                trace_ids = [row["trace_id"]] if row.get("trace_id") is not None else []
                findings.append(Finding(rule=rule, metrics=row, message=render_message(rule, names),
                                        at_stake_ns=at_stake, step_ns=row.get("step_ns"),
                                        trace_ids=trace_ids))
        except RuleError as e:
            failures.append(RuleFailure(rule.id, rule.source_file or "?", str(e)))
    return Evaluation(findings, failures, evaluated)


def merge_by_rule(ev: Evaluation, primary_trace: int | None) -> list[Finding]:
    """One finding per rule. Where the traces of one run disagree, the primary trace (the
    one the verdict trusts) decides: a rule that held no row there can still fire from
    another trace (it measures what only that trace records), but a rule the primary trace
    evaluated and did not fire on is dropped. Otherwise the row with the most time at stake
    is kept, naming every trace that fired."""
    by_rule: dict[str, list[Finding]] = {}
    for f in ev.findings:
        by_rule.setdefault(f.rule.id, []).append(f)
    merged = []
    for rule_id, fired in by_rule.items():
        candidates = [f for f in fired if primary_trace in f.trace_ids]
        if not candidates:
            if primary_trace is not None and (rule_id, primary_trace) in ev.evaluated:
                continue  # the trusted trace measured it and it did not hold
            candidates = fired
        chosen = max(candidates, key=lambda f: f.at_stake_share)
        chosen.trace_ids = sorted({t for f in fired for t in f.trace_ids})
        merged.append(chosen)
    return rank(merged)


def rank(findings: list[Finding]) -> list[Finding]:
    """Most time at stake first; severity breaks ties (and orders findings with no time)."""
    return sorted(findings, key=lambda f: (-round(f.at_stake_share, 3),
                                           -SEVERITY_RANK[f.rule.severity], f.rule.id))
