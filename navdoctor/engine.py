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


def evaluate_rules(con: duckdb.DuckDBPyConnection, rules: list[Rule],
                   time_limit_s: float = RULE_TIME_LIMIT_S) -> tuple[list[Finding], list[RuleFailure]]:
    findings: list[Finding] = []
    failures: list[RuleFailure] = []
    for rule in rules:
        try:
            rows = run_query(con, rule, time_limit_s)
            for row in rows:
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
    return rank(merge_by_rule(findings)), failures


def merge_by_rule(findings: list[Finding]) -> list[Finding]:
    """One finding per rule: a rule that fires on several traces (the Kineto and the nsys
    capture of one run) keeps the row with the most time at stake and names every trace."""
    best: dict[str, Finding] = {}
    for f in findings:
        kept = best.get(f.rule.id)
        if kept is None:
            best[f.rule.id] = f
            continue
        ids = sorted(set(kept.trace_ids) | set(f.trace_ids))
        if f.at_stake_share > kept.at_stake_share:
            best[f.rule.id] = f
        best[f.rule.id].trace_ids = ids
    return list(best.values())


def rank(findings: list[Finding]) -> list[Finding]:
    """Most time at stake first; severity breaks ties (and orders findings with no time)."""
    return sorted(findings, key=lambda f: (-round(f.at_stake_share, 3),
                                           -SEVERITY_RANK[f.rule.severity], f.rule.id))
