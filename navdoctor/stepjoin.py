"""How rows are joined to the steps whose [start, end) window holds them: the step bins (a
hash join on time bins, then the exact range test), and the tests that pick between the bins,
a plain range join and an ASOF join. Used by the breakdown (align_steps_to_gpu) and by the
*_in_steps views (views/steps.py); all forms give the same rows."""
from __future__ import annotations

import duckdb

# Bins per step of a trace's span (see views/steps.py), and the most steps one bin may hold
# before the bins are given up for a sort-based join (steps that nest or overlap a lot).
STEP_BINS_PER_STEP = 4
MAX_STEPS_PER_BIN = 64
# A store of at most this many events (inputs.events, all traces) takes the ASOF form of the
# *_in_steps views (when no two steps overlap) without trying the bins: there a rule's time is
# mostly DuckDB planning it, and the bins' two CTEs, planned again in every view a rule reads,
# cost more than the join saves (the 36 rules on one thread: synthetic fixtures ~0.165 ->
# 0.125 s, 2 MB fixture, 74 k events, 0.214 -> 0.202 s; about even at 120 k rows of ops,
# kernels and calls). Above it the bins' hash join runs faster (250 MB trace: 0.61 s against
# 0.80 s).
ASOF_MAX_EVENTS = 100_000
# ... and where no trace of it keeps more than this many steps, the range join itself (a hash
# join on trace_id, each row tested against its trace's few steps) instead of the ASOF join,
# which sorts every row: cheaper to plan and to run there (the 36 rules on one thread, 2 MB
# fixture, 5 steps: 0.197 -> 0.172 s; per view of its 50 k ops, 2.9 -> 1.7 ms at 5 steps,
# 2.9 -> 2.1 at 10, even at 20, 2.7 -> 4.1 at 40: the pairs grow with the steps).
RANGE_MAX_STEPS = 8


def step_bins_sql(steps: str = "steady_steps", start: str = "start_ns", end: str = "end_ns") -> str:
    """WITH bin_width(trace_id, origin, w), step_bins(trace_id, step_num, start_ns, end_ns,
    bin): each trace's span of steps cut into STEP_BINS_PER_STEP bins per step, and each
    step (its [start, end) window) listed in every bin it covers. A row at time ts meets only
    the steps of bin (ts - origin) // w: an equi-join, then the exact range test."""
    return "\n    WITH " + step_bins_ctes(steps, start, end)


def step_bins_ctes(steps: str = "steady_steps", start: str = "start_ns", end: str = "end_ns") -> str:
    """The two common table expressions of step_bins_sql, without WITH (to list more)."""
    return f"""
    bin_width AS (
        SELECT trace_id, min({start}) AS origin,
               greatest(1, (max({end}) - min({start})) // ({STEP_BINS_PER_STEP} * count(*))) AS w
        FROM {steps} WHERE {start} IS NOT NULL AND {end} IS NOT NULL GROUP BY trace_id),
    step_bins AS (
        SELECT s.trace_id, s.step_num, s.{start} AS start_ns, s.{end} AS end_ns,
               unnest(range((s.{start} - b.origin) // b.w,
                            (s.{end} - 1 - b.origin) // b.w + 1)) AS bin
        FROM {steps} s JOIN bin_width b USING (trace_id)
        WHERE s.{start} IS NOT NULL AND s.{end} IS NOT NULL AND s.{end} > s.{start})"""


def small_store(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store holds at most ASOF_MAX_EVENTS events (inputs.events: the tables'
    own count(*)s, in one statement, took 16 ms to plan)."""
    return con.execute("SELECT COALESCE(sum(events), 0) FROM inputs").fetchone()[0] <= ASOF_MAX_EVENTS


def few_steps(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether no trace keeps more than RANGE_MAX_STEPS steps (steady_steps)."""
    return con.execute("SELECT COALESCE(max(n), 0) FROM (SELECT count(*) AS n FROM steady_steps "
                       "GROUP BY trace_id)").fetchone()[0] <= RANGE_MAX_STEPS


def bins_fit(con: duckdb.DuckDBPyConnection, steps: str = "steady_steps",
             start: str = "start_ns", end: str = "end_ns") -> bool:
    """Whether the steps spread over the bins: few steps per bin, and not many more bins
    than steps (steps that nest or overlap much would list one step in very many bins)."""
    # How many (step, bin) entries there would be, counted without listing them: steps that
    # all span the trace would list steps x bins of them.
    listed = con.execute(f"""
        {step_bins_sql(steps, start, end)}
        SELECT COALESCE(sum((s.{end} - 1 - b.origin) // b.w - (s.{start} - b.origin) // b.w + 1), 0)
        FROM {steps} s JOIN bin_width b USING (trace_id)
        WHERE s.{start} IS NOT NULL AND s.{end} IS NOT NULL AND s.{end} > s.{start}""").fetchone()[0]
    count = con.execute(f"SELECT count(*) FROM {steps}").fetchone()[0]
    if listed > 16 * count + 1024:
        return False
    most_in_one = con.execute(
        step_bins_sql(steps, start, end) + " SELECT max(n) FROM (SELECT count(*) AS n "
        "FROM step_bins GROUP BY trace_id, bin)").fetchone()[0]
    return (most_in_one or 0) <= MAX_STEPS_PER_BIN


def steps_overlap(con: duckdb.DuckDBPyConnection, start: str, end: str) -> bool:
    """Whether two steps of a trace share a start or overlap, as [start, end) windows."""
    return con.execute(f"""
        SELECT count(*) FROM (
            SELECT {start} AS s,
                   lag({start}) OVER (PARTITION BY trace_id ORDER BY {start}, {end}) AS prev_start,
                   lag({end}) OVER (PARTITION BY trace_id ORDER BY {start}, {end}) AS prev_end
            FROM steps WHERE {start} IS NOT NULL AND {end} IS NOT NULL)
        WHERE prev_start = s OR prev_end > s""").fetchone()[0] > 0
