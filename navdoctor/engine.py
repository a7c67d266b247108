"""Runs rules over the trace store and turns the rows that meet a condition into findings.

Rules are untrusted input: only one read-only SELECT per rule is run, with DuckDB's external
access disabled and its configuration locked, under a time limit. A rule that fails is
reported as an error naming it; the other rules still run.
"""
from __future__ import annotations

import ast
import datetime
import decimal
import json
import math
import os
import re
import string
import threading
from dataclasses import dataclass, field
from typing import Any

import duckdb

from .rule_expr import SEVERITY_RANK, check_expression, evaluate
from .rules import Rule, render_message, sql_params
from . import store
from .errors import RuleError
from .profiling import phase

# Seconds a rule's query may run before it is interrupted; NAVDOCTOR_RULE_TIME_LIMIT_S
# overrides it (tests use a short limit).
RULE_TIME_LIMIT_S = 20.0
# Rows a rule's query may return (rules return one row per trace or per step).
RULE_MAX_ROWS = 100_000
# Table functions a rule may call: generators only, nothing that reads a file, a URL, another
# database or the configuration.
ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest", "repeat", "repeat_row",
                                     "json_each", "json_tree"})


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


def rules_use_functions(rules: list[Rule]) -> bool:
    """Whether any of the rules may call one of the store's Python functions
    (store.FUNCTIONS): their store needs them registered (numpy imported)."""
    from .store import uses_functions
    return any(uses_functions(rule.query) for rule in rules)


def rule_time_limit() -> float:
    """RULE_TIME_LIMIT_S, or NAVDOCTOR_RULE_TIME_LIMIT_S when that is a positive number."""
    try:
        limit = float(os.environ.get("NAVDOCTOR_RULE_TIME_LIMIT_S", ""))
    except ValueError:
        return RULE_TIME_LIMIT_S
    return limit if limit > 0 and math.isfinite(limit) else RULE_TIME_LIMIT_S


def lock_down(con: duckdb.DuckDBPyConnection, functions: bool = True) -> None:
    """After loading: no more file, network or extension access, and no way to undo that.
    `functions`: the store has the Python functions (store.create_schema), which rules get
    bounded (store.register_functions)."""
    if functions:
        store.register_functions(con, bounded=True)
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET python_enable_replacements = false")  # no scans of Python variables
    con.execute("SET lock_configuration = true")


def _plain(v: Any) -> Any:
    """A metric as plain data (bool, int, float, str, None, lists and dicts of them): a rule's
    message is a format template, and a Python object there (uuid.UUID...) would let it reach
    module globals ('{u.__init__.__globals__[os].environ}')."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return None if math.isnan(v) or math.isinf(v) else v
    if isinstance(v, decimal.Decimal):
        return _plain(float(v))
    if isinstance(v, (datetime.date, datetime.datetime, datetime.time)):
        return v.isoformat()
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return str(v)  # uuid.UUID and anything else


_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SPEC_NUMBERS = re.compile(r"[0-9]+")
MAX_FORMAT_WIDTH = 1000
MAX_POW_EXPONENT = 64


def check_message(rule: Rule) -> None:
    """The message template may name metrics and params and format them, nothing more: no
    attribute or index access ('{x.__class__}', '{x[0]}'), no widths that build huge strings."""
    def bad(reason: str) -> RuleError:
        return RuleError(rule.source_file or "?", rule.id, "message", reason)
    try:
        parts = list(string.Formatter().parse(rule.message))
    except ValueError as e:
        raise bad(f"invalid template: {e}") from None
    for _text, name, spec, _conv in parts:
        if name is None:
            continue
        if not _FIELD_NAME.match(name):
            raise bad(f"'{{{name}}}' is not allowed: name a metric or param, without '.', "
                      "'[' or positional fields")
        if spec and "{" in spec:
            raise bad(f"'{{{name}:{spec}}}': nested fields in a format spec are not allowed")
        if spec and any(int(n) > MAX_FORMAT_WIDTH for n in _SPEC_NUMBERS.findall(spec)):
            raise bad(f"'{{{name}:{spec}}}': widths and precisions above {MAX_FORMAT_WIDTH} "
                      "are not allowed")


def check_condition(rule: Rule) -> None:
    """Only small constant exponents: 'x ** y' on metrics, or 9 ** 9 ** 9, would compute
    numbers of billions of digits, in C code that no time limit can interrupt."""
    try:
        tree = check_expression(rule.condition)
    except ValueError as e:
        raise RuleError(rule.source_file or "?", rule.id, "condition", str(e)) from None
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exp = node.right
            if isinstance(exp, ast.UnaryOp) and isinstance(exp.op, ast.USub):
                exp = exp.operand
            if not (isinstance(exp, ast.Constant) and isinstance(exp.value, (int, float))
                    and not isinstance(exp.value, bool) and abs(exp.value) <= MAX_POW_EXPONENT):
                raise RuleError(rule.source_file or "?", rule.id, "condition",
                                f"'**' needs a constant exponent of at most {MAX_POW_EXPONENT}")
        if isinstance(node, ast.BinOp):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and isinstance(side.value, (str, bytes)):
                    raise RuleError(rule.source_file or "?", rule.id, "condition",
                                    "no arithmetic on strings ('x' * 10**9, '%0999999999d' % 1)")


class _Text(str):
    """A metric string in a condition: compared, never repeated or %-formatted."""
    def _refuse(self, *_):
        raise TypeError("no arithmetic on strings in a condition")
    __mul__ = __rmul__ = __mod__ = __rmod__ = _refuse


class _Seq(tuple):
    """A LIST metric in a condition: compared, never repeated."""
    def _refuse(self, *_):
        raise TypeError("no arithmetic on lists in a condition")
    __mul__ = __rmul__ = _refuse


def _condition_value(v: Any) -> Any:
    if isinstance(v, str):
        return _Text(v)
    if isinstance(v, (list, tuple)):
        return _Seq(_condition_value(x) for x in v)
    return v


# A connection that only parses (json_serialize_sql), shared: connecting costs ~50 ms.
_PARSER: duckdb.DuckDBPyConnection | None = None
_PARSER_LOCK = threading.Lock()


def check_sql_sources(rule: Rule) -> None:
    """What the query reads, from its parse tree, before anything binds it (binding
    read_csv() already opens the file): tables and views, and the table functions in
    ALLOWED_TABLE_FUNCTIONS; no file names (FROM 'x.csv'), no other table functions."""
    def bad(reason: str) -> RuleError:
        return RuleError(rule.source_file or "?", rule.id, "query", reason)
    try:
        with _PARSER_LOCK:
            global _PARSER
            if _PARSER is None:
                _PARSER = duckdb.connect(":memory:", config={
                    "enable_external_access": False, "autoinstall_known_extensions": False,
                    "autoload_known_extensions": False, "lock_configuration": True})
            text = _PARSER.execute("SELECT json_serialize_sql(?)", [rule.query]).fetchone()[0]
    except duckdb.Error as e:
        raise bad("cannot be checked: " + str(e).strip().splitlines()[0]) from None
    try:
        tree = json.loads(text)
    except RecursionError:
        # (Python's JSON reader recurses once per level: a query of hundreds of nested calls
        # goes past its limit.) The rule fails alone, at run time; the others run.
        raise bad("cannot be checked: nested too deeply (hundreds of levels of calls or "
                  "subqueries)") from None
    if tree.get("error"):
        raise bad("cannot be checked: " + str(tree.get("error_message", "?")).splitlines()[0])
    for node in _nodes(tree):
        kind = node.get("type")
        if kind == "TABLE_FUNCTION":
            fn = node.get("function") or {}
            name = str(fn.get("function_name", "?"))
            if name.lower() not in ALLOWED_TABLE_FUNCTIONS or fn.get("schema") or fn.get("catalog"):
                raise bad(f"table function {name}() is not allowed in rules (allowed: "
                          f"{', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))})")
        elif kind in ("BASE_TABLE", "SHOW_REF"):
            name = str(node.get("table_name") or "")
            if any(c in name for c in "./\\:*?"):
                raise bad(f"'{name}' is not a table of the trace store (files cannot be read)")


def _nodes(tree: Any):
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


# Rules already found sound, by (query, message, condition): what check_read_only reads.
# Rules are checked before the traces load and again when they run.
_CHECKED: set[tuple[str, str, str]] = set()


def check_read_only(rule: Rule) -> None:
    """Everything that can be checked before a rule runs: one read-only SELECT that reads only
    the trace store (check_sql_sources), a safe message template and condition."""
    key = (rule.query, rule.message, rule.condition)
    if key in _CHECKED:
        return
    _check_read_only(rule)
    _CHECKED.add(key)


def mark_checked(rule: Rule) -> None:
    """check_read_only passed on this rule's text before (rulecheck.CheckCache)."""
    _CHECKED.add((rule.query, rule.message, rule.condition))


def _check_read_only(rule: Rule) -> None:
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
    check_sql_sources(rule)
    check_message(rule)
    check_condition(rule)


def run_query(con: duckdb.DuckDBPyConnection, rule: Rule,
              time_limit_s: float | None = None,
              cursor: duckdb.DuckDBPyConnection | None = None) -> list[dict[str, Any]]:
    """The rule's rows, on a cursor of its own (or on `cursor`, which stays open)."""
    check_read_only(rule)
    time_limit_s = rule_time_limit() if time_limit_s is None else time_limit_s
    cur = con.cursor() if cursor is None else cursor
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        cur.interrupt()

    timer = threading.Timer(time_limit_s, stop)
    timer.daemon = True
    timer.start()
    try:
        res = cur.execute(rule.query, sql_params(rule))
        names = [d[0] for d in res.description]
        rows = res.fetchmany(RULE_MAX_ROWS + 1)
        if len(rows) > RULE_MAX_ROWS:
            raise RuleError(rule.source_file or "?", rule.id, "query",
                            f"returned more than {RULE_MAX_ROWS} rows (aggregate per trace or step)")
    except duckdb.InterruptException:
        if not fired.is_set():  # not our timer: the user pressed Ctrl-C
            raise KeyboardInterrupt from None
        raise RuleError(rule.source_file or "?", rule.id, "query",
                        f"stopped after the {time_limit_s:g} s time limit") from None
    except duckdb.Error as e:
        raise RuleError(rule.source_file or "?", rule.id, "query",
                        str(e).strip().splitlines()[0]) from None
    finally:
        timer.cancel()
        if cursor is None:
            cur.close()
    return [{n: _plain(v) for n, v in zip(names, row)} for row in rows]


# Rules run two at a time on stores of up to this many rows: there a rule's time is mostly
# DuckDB planning it, on one thread. On larger stores each query already keeps the cores
# busy, and two at once would only share them (and DuckDB's memory), which can push a
# heavy rule past its time limit.
PARALLEL_RULES_MAX_ROWS = 5_000_000


def rule_workers(con: duckdb.DuckDBPyConnection | None = None) -> int:
    """Rules run at once: NAVDOCTOR_RULE_WORKERS, else 2 (where there are 2 cores or more)
    for a store of at most PARALLEL_RULES_MAX_ROWS rows, else 1."""
    try:
        return max(1, int(os.environ.get("NAVDOCTOR_RULE_WORKERS", "")))
    except ValueError:
        pass
    if con is not None:
        rows = con.execute("SELECT COALESCE(sum(estimated_size), 0) FROM duckdb_tables() "
                           "WHERE NOT temporary").fetchone()[0]
        if rows > PARALLEL_RULES_MAX_ROWS:
            return 1
    return max(1, min(2, os.cpu_count() or 1))


# Views that nearly every rule reads and that hold one row per trace. Each cursor the rules
# run on gets a temporary table of the same name and the same rows (the store is final once
# the rules run), which the rules' queries then read instead of binding and optimising the
# view's joins and aggregates again: 32 of the 36 built-in rules read trace_summary, ~1.4 ms
# of planning each. A temporary table belongs to its cursor and takes precedence over the
# view there; the store itself (--db) is unchanged.
SNAPSHOT_VIEWS = ("trace_summary",)


def rule_cursor(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A cursor for rules, with its SNAPSHOT_VIEWS (left to the views where they cannot be
    made: the rules then read the views, with the same rows)."""
    cur = con.cursor()
    try:
        return add_snapshots(cur)
    except KeyboardInterrupt:
        cur.close()
        raise


def add_snapshots(cur: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """cur given its SNAPSHOT_VIEWS (see rule_cursor)."""
    for view in SNAPSHOT_VIEWS:
        try:
            cur.execute(f"CREATE TEMP TABLE {view} AS SELECT * FROM main.{view}")
        except duckdb.InterruptException:    # Ctrl-C: DuckDB's is a duckdb.Error, not ignored
            raise KeyboardInterrupt from None
        except duckdb.Error:
            pass
    return cur


def _run_all(con: duckdb.DuckDBPyConnection, rules: list[Rule],
             time_limit_s: float | None) -> list:
    """Each rule's rows (or the RuleError it raised), in the order of `rules`. The queries
    run on rule_workers() threads, each with its own cursor (DuckDB runs them at once, and
    on a small trace a rule's time is mostly planning, which one query does on one thread);
    the results do not depend on the order they finish in."""
    def one(rule: Rule, cursor) -> object:
        try:
            with phase(f"rule.{rule.id}"):
                return run_query(con, rule, time_limit_s, cursor)
        except RuleError as e:
            return e

    workers = min(rule_workers(con), len(rules))
    if workers <= 1:
        cursor = rule_cursor(con)
        try:
            return [one(rule, cursor) for rule in rules]
        finally:
            cursor.close()
    # each worker makes its cursor's snapshots itself: the two run at once (~3.5 ms each)
    cursors = [con.cursor() for _ in range(workers)]
    results: list = [None] * len(rules)
    errors: list[BaseException] = []
    todo = iter(range(len(rules)))
    lock = threading.Lock()
    stop = threading.Event()
    # Waited on through Events: a join() that Ctrl-C interrupts can leave a thread that
    # still runs reported as finished (CPython before 3.13), and its cursor busy.
    finished = [threading.Event() for _ in cursors]

    def work(cursor, done: threading.Event) -> None:
        try:
            try:
                add_snapshots(cursor)
            except BaseException as e:  # Ctrl-C: raised in the caller, as a rule's would be
                errors.append(e)
                stop.set()
                return
            while not stop.is_set():
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                try:
                    results[i] = one(rules[i], cursor)
                except BaseException as e:  # KeyboardInterrupt, a bug: stop, raise it in the caller
                    errors.append(e)
                    stop.set()
        finally:
            done.set()

    try:
        for c, done in zip(cursors, finished):
            threading.Thread(target=work, args=(c, done), daemon=True).start()
        for done in finished:
            while not done.wait(0.1):
                pass
    except BaseException:  # Ctrl-C in this thread: stop the queries that run
        stop.set()
        for c, done in zip(cursors, finished):
            while not done.wait(0.05):   # again: a query may start just after an interrupt
                c.interrupt()
        raise
    finally:
        for c in cursors:
            c.close()
    if errors:
        raise errors[0]
    return results


@dataclass
class Evaluation:
    findings: list[Finding]           # every row that met its condition, not yet merged
    failures: list[RuleFailure]
    evaluated: set[tuple[str, int]]   # (rule id, trace id) pairs that produced a row


def evaluate_rules(con: duckdb.DuckDBPyConnection, rules: list[Rule],
                   time_limit_s: float | None = None) -> Evaluation:
    findings: list[Finding] = []
    failures: list[RuleFailure] = []
    evaluated: set[tuple[str, int]] = set()
    for rule, rows in zip(rules, _run_all(con, rules, time_limit_s)):
        try:
            if isinstance(rows, RuleError):
                raise rows
            for row in rows:
                if row.get("trace_id") is not None:
                    evaluated.add((rule.id, row["trace_id"]))
                names = {**rule.params, **row}
                try:
                    fired = bool(evaluate(rule.condition,
                                          {k: _condition_value(v) for k, v in names.items()}))
                except KeyError as e:
                    raise RuleError(rule.source_file or "?", rule.id, "condition",
                                    f"names {e.args[0]!r}, which is neither a metric of the query nor a param") from None
                except (TypeError, ZeroDivisionError, ValueError, OverflowError, MemoryError,
                        RecursionError) as e:
                    raise RuleError(rule.source_file or "?", rule.id, "condition",
                                    str(e) or type(e).__name__) from None
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
    is kept, naming every trace that fired. Ranked by rank() with no lead (analysis.order_findings
    ranks them again, led by the verdict's class)."""
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


def rank(findings: list[Finding], lead: str | None = None) -> list[Finding]:
    """Most time at stake first; severity breaks ties (and orders findings with no time).
    With lead (verdict.leading_class: the verdict's class, or compute's where its remedies are
    expected to give more), that class's findings come first: a cause of idle time that binds
    the step is the remedy to apply first, even where the compute finding puts more time at
    stake (on the H200 mixed corpus a sync-bound step computing 73% of the time: removing the
    syncs gave 1.26x, the compute remedy 1.19x; docs/verdict.md, "Predicted speed-ups")."""
    return sorted(findings, key=lambda f: (lead is not None and str(f.rule.category) != lead,
                                           -round(f.at_stake_share, 3),
                                           -SEVERITY_RANK[f.rule.severity], f.rule.id))
