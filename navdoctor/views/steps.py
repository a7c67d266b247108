"""The steps rules see, and the activity inside them: steady_steps (an isolated stall left
out) and one *_in_steps view per activity table, each row with the step it starts in."""
from __future__ import annotations

import duckdb

from ..steady import STALL_FACTOR, STALL_MIN_STEPS
from ..stepjoin import bins_fit, few_steps, small_store, step_bins_sql, steps_overlap

# Activity tables whose rows are given the step they start in (step_num), as *_in_steps views.
_STEP_SCOPED = {
    "kernels": "start_ns", "memcpy": "start_ns", "memset": "start_ns",
    "runtime_calls": "start_ns", "sync_events": "start_ns", "cpu_ops": "start_ns",
    "os_calls": "start_ns", "dataloader_waits": "start_ns", "nvtx_ranges": "start_ns",
    "um_events": "start_ns",
}


def _in_steps_sql(table: str, ts: str, form: str) -> str:
    """SELECT x.*, step_num for the rows of `table` inside a kept step, by the join form
    create_step_views chose ('bins', 'range' or 'asof')."""
    if form == "bins":
        return f"""{step_bins_sql()}
            SELECT x.* EXCLUDE (_bin), sb.step_num
            FROM (SELECT x.*, (x.{ts} - b.origin) // b.w AS _bin
                  FROM {table} x JOIN bin_width b ON x.trace_id = b.trace_id) x
            JOIN step_bins sb ON sb.trace_id = x.trace_id AND sb.bin = x._bin
            WHERE x.{ts} >= sb.start_ns AND x.{ts} < sb.end_ns"""
    if form == "range":
        return f"""
            SELECT x.*, st.step_num FROM {table} x JOIN steady_steps st
              ON x.trace_id = st.trace_id AND x.{ts} >= st.start_ns AND x.{ts} < st.end_ns"""
    return f"""
        SELECT x.*, st.step_num FROM {table} x
        ASOF JOIN (SELECT trace_id, step_num, start_ns, end_ns FROM steady_steps
                   WHERE start_ns IS NOT NULL AND end_ns IS NOT NULL) st
          ON x.trace_id = st.trace_id AND x.{ts} >= st.start_ns
        WHERE x.{ts} < st.end_ns"""


def _in_steps_form(con: duckdb.DuckDBPyConnection) -> str:
    """How the *_in_steps views find a row's steps, decided once for all of them: the bins
    where the steps spread over them (bins_fit), except in a small store whose steps do not
    overlap; else the range join itself where steps overlap (or, in a small store, where its
    traces keep few steps: RANGE_MAX_STEPS); else an ASOF join (a row is then in at most the
    last step starting at or before it). All three give the same rows."""
    small = small_store(con)
    overlap = steps_overlap(con, "start_ns", "end_ns") if small else None
    if overlap is not False and bins_fit(con):
        return "bins"
    if overlap is None:
        overlap = steps_overlap(con, "start_ns", "end_ns")
    return "range" if overlap or (small and few_steps(con)) else "asof"


def create_step_views(con: duckdb.DuckDBPyConnection) -> None:
    # An isolated stall (the only step of a trace of STALL_MIN_STEPS or more steps that is
    # over STALL_FACTOR x the median step) is left out of what rules see: a one-off wait (the
    # first batch, a recompile, a GC pause) in a short capture would otherwise decide the class
    # of a run whose every other step looks different, and quote its numbers as if each step
    # had them. Two or more stay in, however far apart: a DataLoader whose workers cannot keep
    # up stalls once per round of workers (every 12th step with 12 workers), and that is the
    # steady state. steady_steps holds the steps kept (a table: rules join it often).
    con.execute(f"""
        CREATE OR REPLACE TABLE steady_steps AS
        WITH b AS (
            SELECT trace_id, step_num, step_ns FROM step_breakdown WHERE step_ns > 0),
        flagged AS (
            SELECT *, count(*) OVER w AS steps_seen,
                   count(*) OVER w >= {STALL_MIN_STEPS}
                       AND step_ns > {STALL_FACTOR} * median(step_ns) OVER w AS stall
            FROM b WINDOW w AS (PARTITION BY trace_id)),
        counted AS (
            SELECT *, stall AND count(*) FILTER (WHERE stall) OVER (PARTITION BY trace_id) = 1
                   AS left_out
            FROM flagged)
        SELECT st.*, c.steps_seen FROM steps st JOIN counted c USING (trace_id, step_num)
        WHERE NOT c.left_out""")
    # A row belongs to every kept step whose [start_ns, end_ns) holds its time: a range join.
    # Rules query these views many times, on millions of rows, so the join is made cheap:
    # each trace's span is cut into STEP_BINS_PER_STEP bins per step, each step is listed in
    # the bins it covers, and a row meets only the steps of its own bin (a hash join on the
    # bin number, then the exact range test). The bins are computed from steady_steps inside
    # the view (a few thousand rows), so the store has no table more.
    # A small store where no two steps overlap takes the ASOF join, or the range join where
    # its traces keep few steps (see ASOF_MAX_EVENTS, RANGE_MAX_STEPS): the same rows.
    form = _in_steps_form(con)
    for table, ts in _STEP_SCOPED.items():
        con.execute(f"CREATE OR REPLACE VIEW {table}_in_steps AS " + _in_steps_sql(table, ts, form))
