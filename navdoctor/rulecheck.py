"""Check rules before any trace is loaded: one read-only SELECT each, whose SQL binds
against the trace-store schema (tables, derived views, macros, functions).

`navdoctor rules check` reports every problem. `analyze` and `diagnose` stop only on
invalid SQL (syntax errors, unknown tables or columns): a usage error, exit 2, naming file,
rule and field. Rules that try what the sandbox forbids are left to run time, where they
fail alone and the other rules still report (docs/reliability.md).
"""
from __future__ import annotations

import duckdb

from . import breakdown, store, views
from .engine import check_read_only, lock_down
from .errors import RuleError
from .rules import Rule, sql_params

_INVALID_SQL = (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException)


def empty_store() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    store.create_schema(con)
    con.execute(breakdown.BREAKDOWN_DDL)
    views.create_views(con)
    lock_down(con)
    return con


def check_rules(rules: list[Rule], only_invalid_sql: bool = False) -> list[RuleError]:
    """The problems found, one RuleError per rule at most."""
    con = empty_store()
    problems = []
    try:
        for rule in rules:
            try:
                check_read_only(rule)
            except RuleError as e:
                if not only_invalid_sql or e.reason.startswith("invalid SQL"):
                    problems.append(e)
                continue
            if only_invalid_sql and _prepares(con, rule):
                continue  # binds: valid SQL (EXPLAIN, ~10x slower, would only confirm it)
            try:
                con.execute("EXPLAIN " + rule.query, sql_params(rule))
            except RuleError as e:
                problems.append(e)
            except duckdb.Error as e:
                if not only_invalid_sql or isinstance(e, _INVALID_SQL):
                    problems.append(RuleError(rule.source_file or "?", rule.id, "query",
                                              "invalid SQL: " + str(e).strip().splitlines()[0]))
    finally:
        con.close()
    return problems


def _prepares(con: duckdb.DuckDBPyConnection, rule: Rule) -> bool:
    """Whether the query parses and binds as a prepared statement (not run). A failure is
    left to EXPLAIN, which reports it as before."""
    try:
        con.execute("PREPARE _navdoctor_rule_check AS " + rule.query)
    except duckdb.Error:
        return False
    try:
        con.execute("DEALLOCATE _navdoctor_rule_check")
    except duckdb.Error:
        pass
    return True


def require_valid_sql(rules: list[Rule]) -> None:
    problems = check_rules(rules, only_invalid_sql=True)
    if problems:
        raise problems[0]
