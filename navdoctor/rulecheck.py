"""Check rules before any trace is loaded: one read-only SELECT each, whose SQL binds
against the trace-store schema (tables, derived views, macros, functions), and a condition
whose every name is a column of that SELECT or a param.

`navdoctor rules check` reports every problem. `analyze` and `diagnose` stop only on
invalid SQL (syntax errors, unknown tables or columns) and on a condition naming what neither
the query nor the params hold: a usage error, exit 2, naming file, rule and field. Rules that try what the sandbox forbids are left to run time, where they
fail alone and the other rules still report (docs/reliability.md).

What `analyze` checks is remembered across runs (`CheckCache`): a rule found sound (its
read-only checks passed and its SQL binds) is not checked again while its text, the
navdoctor code that defines the store and the checks, and the DuckDB version stay the same.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import duckdb

from . import __version__, breakdown, engine, store, views
from .engine import check_read_only, lock_down
from .errors import RuleError
from .rules import CACHE_DIR_ENV, Rule, cache_dir, sql_params, write_cache_file  # noqa: F401 (its names here too)

_INVALID_SQL = (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException)


def empty_store(functions: bool = True) -> duckdb.DuckDBPyConnection:
    """An empty store as rules see it; `functions`: with the Python functions
    (store.FUNCTIONS), which only rules that name one need."""
    con = duckdb.connect()
    store.create_schema(con, functions)
    con.execute(breakdown.BREAKDOWN_DDL)
    views.create_views(con)
    lock_down(con, functions)
    return con


def check_rules(rules: list[Rule], only_invalid_sql: bool = False,
                sound: list[Rule] | None = None) -> list[RuleError]:
    """The problems found, one RuleError per rule at most; `sound` (when given) receives the
    rules that passed every check."""
    con = empty_store(engine.rules_use_functions(rules))
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
                # binds: valid SQL (EXPLAIN, ~10x slower, would only confirm it)
                try:
                    check_condition_names(con, rule)
                except RuleError as e:
                    problems.append(e)
                    continue
                if sound is not None:
                    sound.append(rule)
                continue
            try:
                con.execute("EXPLAIN " + rule.query, sql_params(rule))
                check_condition_names(con, rule)
                if sound is not None:
                    sound.append(rule)
            except RuleError as e:
                problems.append(e)
            except duckdb.Error as e:
                if not only_invalid_sql or isinstance(e, _INVALID_SQL):
                    problems.append(RuleError(rule.source_file or "?", rule.id, "query",
                                              "invalid SQL: " + str(e).strip().splitlines()[0]))
    finally:
        con.close()
    return problems


def condition_names(condition: str) -> set[str]:
    """The names a condition reads (its functions, abs/min/max, aside)."""
    import ast
    tree = ast.parse(condition, mode="eval")
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in called}


def check_condition_names(con: duckdb.DuckDBPyConnection, rule: Rule) -> None:
    """Every name of the condition is a column of the query's result or a param: a misspelt
    one (min_sharee) would otherwise fail only once the rule runs on a trace. The columns come
    from DESCRIBE of the query on the empty store (nothing is run)."""
    import difflib
    try:
        names = condition_names(rule.condition)
    except SyntaxError:
        return      # check_condition reports it
    if not names:
        return
    try:
        columns = [row[0] for row in con.execute("DESCRIBE " + rule.query, sql_params(rule)).fetchall()]
    except duckdb.Error:
        return      # the query's own error is reported by the SQL checks
    known = set(columns) | set(rule.params)
    unknown = sorted(names - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        raise RuleError(rule.source_file or "?", rule.id, "condition",
                        f"names {unknown[0]!r}, which is neither a column of the query "
                        f"({', '.join(columns) or 'none'}) nor a param"
                        + (f" (did you mean {close[0]!r}?)" if close else ""))


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
    """Stop on the first rule whose SQL is invalid (a usage error). Rules the cache knows
    to be sound are not checked again; those found sound now are added to it."""
    cache = CheckCache()
    keys = [cache.rule_key(rule) for rule in rules]
    known = cache.load()
    todo = [rule for rule, key in zip(rules, keys) if key not in known]
    for rule, key in zip(rules, keys):
        if key in known:  # what check_read_only found before, in an earlier run
            engine.mark_checked(rule)
    if not todo:
        return
    passed: list[Rule] = []
    problems = check_rules(todo, only_invalid_sql=True, sound=passed)
    if problems:
        raise problems[0]
    # Only rules that passed every read-only check and bind: a rule left to fail at run
    # time (what the sandbox forbids, an error EXPLAIN raised) is never recorded as sound.
    if passed:
        cache.add(known | {cache.rule_key(rule) for rule in passed})


# The code whose changes can make a sound rule unsound: the store's schema (tables, macros,
# functions), the derived views and the breakdown's tables, and the checks themselves.
_CHECK_SOURCES = ("store.py", "views/__init__.py", "views/steps.py", "views/summary.py",
                  "views/launch.py", "views/job.py", "stepjoin.py", "steady.py", "breakdown.py",
                  "engine.py", "rulecheck.py", "rules.py", "rule_expr.py", "kernelnames.py",
                  "headroom.py")


# The check cache's bounds: a digest per sound rule (65 bytes), at most this many.
MAX_SOUND_RULES = 16384
MAX_CACHE_FILE_BYTES = 4 << 20


class CheckCache:
    """The rules found sound, in one small JSON file per (navdoctor version, DuckDB version,
    digest of _CHECK_SOURCES): a change to any of them starts a new, empty file. A rule is
    known by the digest of what the checks read (query, message, condition, and the params
    its SQL binds). Any error reading or writing the cache (no home directory, a read-only
    or full disk, a corrupt file) only means the rules are checked as without it."""

    def __init__(self, directory: Path | None = None):
        self.directory = cache_dir() if directory is None else directory
        code = hashlib.sha256(f"{__version__}\0{duckdb.__version__}".encode())
        here = Path(__file__).resolve().parent
        for name in _CHECK_SOURCES:
            try:
                code.update(name.encode() + b"\0" + (here / name).read_bytes() + b"\0")
            except OSError:
                code.update(name.encode() + b"\0?\0")
        self.path = None if self.directory is None else \
            self.directory / f"rulecheck-{code.hexdigest()[:32]}.json"

    @staticmethod
    def rule_key(rule: Rule) -> str:
        try:
            params = sql_params(rule)
        except RuleError:
            params = None
        text = json.dumps([rule.query, rule.message, rule.condition,
                           None if params is None else sorted((k, repr(v)) for k, v in params.items())])
        return hashlib.sha256(text.encode()).hexdigest()

    def load(self) -> set[str]:
        try:
            if self.path is None or os.path.getsize(self.path) > MAX_CACHE_FILE_BYTES:
                return set()
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError, RecursionError):
            return set()
        keys = doc.get("sound") if isinstance(doc, dict) else None
        return {k for k in keys if isinstance(k, str)} if isinstance(keys, list) else set()

    def add(self, keys: set[str]) -> None:
        if len(keys) > MAX_SOUND_RULES:   # (the newest are not known: keep it small instead)
            keys = set(sorted(keys)[:MAX_SOUND_RULES])
        write_cache_file(self.directory, self.path, ".rulecheck-", {"sound": sorted(keys)})
