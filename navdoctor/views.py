"""Derived views that rules query: activity inside steps, and one summary row per trace.

Created after the loaders and the breakdown ran; documented in docs/schema.md.
"""
from __future__ import annotations

import duckdb

# Activity tables whose rows are given the step they start in (step_num), as *_in_steps views.
_STEP_SCOPED = {
    "kernels": "start_ns", "memcpy": "start_ns", "memset": "start_ns",
    "runtime_calls": "start_ns", "sync_events": "start_ns", "cpu_ops": "start_ns",
    "os_calls": "start_ns", "dataloader_waits": "start_ns", "nvtx_ranges": "start_ns",
    "um_events": "start_ns",
}


STALL_FACTOR = 3          # an isolated stall: the one step of its trace this many times the median ...
STALL_MIN_STEPS = 5       # ... in a trace of at least this many steps
GRAPHED_MAX_EAGER_LAUNCHES = 20   # a step replayed from CUDA graphs: >= 1 graph launch and
                                  # at most this many other launches per step


def _steady_mean(step_samples: list[float], values: list[float]) -> float:
    """The mean of values (one per step) over the steps that are not isolated stalls (over
    STALL_FACTOR x the median step), as trace_summary leaves them out."""
    import statistics
    mid = statistics.median(step_samples)
    return round(statistics.fmean([v for s, v in zip(step_samples, values) if s <= STALL_FACTOR * mid]), 4)


def steady_step_ms(samples: list[float]) -> float | None:
    """A step time from per-step times timed without a tracer, summarised as a trace's step
    is (trace_summary: the mean, stalls over STALL_FACTOR x the median left out), so that the
    two compare (tracer_cost). None without samples."""
    return _steady_mean(samples, samples) if samples else None


def steady_loader_wait_ms(step_samples: list[float], wait_samples: list[float] | None) -> float | None:
    """The GPU's wait for DataLoader batches per step, timed without a tracer (the timing
    runner's LoaderWait), over the steps steady_step_ms keeps; None without samples."""
    if not step_samples or not wait_samples or len(wait_samples) != len(step_samples):
        return None
    return _steady_mean(step_samples, wait_samples)


def steady_run_ms(step_samples: list[float], wait_samples: list[float] | None) -> tuple[float | None, float | None]:
    """One timed run's figures without a tracer, over the same steps: its step (steady_step_ms)
    and its GPU's wait for DataLoader batches (steady_loader_wait_ms), as diagnose's timing
    runs, verify's timed runs and the bench scripts summarise a run."""
    return steady_step_ms(step_samples), steady_loader_wait_ms(step_samples, wait_samples)


# What Nsight Systems' CUDA API tracing costs the host per recorded CUDA call, at least: the
# traced step minus the unprofiled step (the script's own meters, same machine and day),
# divided by the CUDA calls per step, was 7.0 us (torchvision train.py, ResNet-50, 12 workers:
# 48.3 vs 38.2 ms, 1443 calls) and 12.4 us (ultralytics YOLO stream: 16.4 vs 8.2 ms, 657
# calls) on the H200 host with nsys 2025.3.1; 5 us stays under both, so that the correction
# removes less than the tracer cost there (docs/verdict.md, "Tracer cost"; the mixed corpus
# of docs/accuracy.md shows how much it varies).
NSYS_NS_PER_CUDA_CALL = 5_000
# Bins per step of a trace's span (see create_views), and the most steps one bin may hold
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


def _in_steps_sql(table: str, ts: str, form: str) -> str:
    """SELECT x.*, step_num for the rows of `table` inside a kept step, by the join form
    create_views chose ('bins', 'range' or 'asof')."""
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
    from .breakdown import steps_overlap
    small = small_store(con)
    overlap = steps_overlap(con, "start_ns", "end_ns") if small else None
    if overlap is not False and bins_fit(con):
        return "bins"
    if overlap is None:
        overlap = steps_overlap(con, "start_ns", "end_ns")
    return "range" if overlap or (small and few_steps(con)) else "asof"


def create_views(con: duckdb.DuckDBPyConnection) -> None:
    from .ranks.views import create_or_empty_job_views
    create_or_empty_job_views(con)   # over the rank tables: empty unless this is a job analysis
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
    con.execute("""
        CREATE OR REPLACE VIEW trace_summary AS
        SELECT b.trace_id, any_value(b.source) AS source, count(*) AS steps,
               avg(b.step_ns) AS step_ns, avg(b.step_ns) / 1e6 AS step_ms,
               bool_or(b.has_gpu) AS has_gpu,
               any_value(st.origin) AS step_origin,
               avg(compute_ns) AS compute_ns, avg(comm_ns) AS comm_ns, avg(copy_ns) AS copy_ns,
               avg(data_ns) AS data_ns, avg(sync_ns) AS sync_ns, avg(launch_ns) AS launch_ns,
               avg(host_ns) AS host_ns, avg(idle_ns) AS idle_ns,
               sum(compute_ns) / sum(b.step_ns) AS compute_share,
               sum(comm_ns) / sum(b.step_ns) AS comm_share,
               sum(copy_ns) / sum(b.step_ns) AS copy_share,
               sum(data_ns) / sum(b.step_ns) AS data_share,
               sum(sync_ns) / sum(b.step_ns) AS sync_share,
               sum(launch_ns) / sum(b.step_ns) AS launch_share,
               sum(host_ns) / sum(b.step_ns) AS host_share,
               sum(idle_ns) / sum(b.step_ns) AS idle_share,
               any_value(st.steps_seen) - count(*) AS stall_steps
        FROM step_breakdown b JOIN steady_steps st USING (trace_id, step_num)
        GROUP BY b.trace_id""")
    # The step (and DataLoader wait) timed without a tracer, one row per trace where given
    # (unprofiled_steps has one row per input; were there several, one whole row is taken, one
    # with a wait first).
    con.execute("""
        CREATE OR REPLACE VIEW unprofiled_step AS
        SELECT DISTINCT ON (trace_id) trace_id, step_ns, loader_wait_ns, origin,
               loader_wait_low_ns, loader_wait_high_ns
        FROM unprofiled_steps ORDER BY trace_id, loader_wait_ns IS NULL""")
    # The DataLoader wait timed without a tracer, against the trace's (docs/verdict.md, "Loader
    # wait"), where it was measured and the trace shows DataLoader fetches in its steps: the
    # traced wait beyond the measured one is the tracer's (tracer_ns), at most all of the
    # traced step's excess over the unprofiled one; share is the shorter of the two waits
    # over the unprofiled step (store macros loader_tracer_ns, loader_wait_share; low_/high_:
    # the same for the least and the most of several timing runs, NULL for one run). The
    # verdict, tracer_cost and the rules (io-dataloader-wait, compute-gpu-bound,
    # gpu-idle-gaps) read this one formula.
    con.execute("""
        CREATE OR REPLACE VIEW loader_wait AS
        SELECT s.trace_id, u.loader_wait_ns AS unprofiled_wait_ns,
               u.step_ns AS unprofiled_step_ns, u.origin, s.data_ns AS traced_wait_ns,
               loader_tracer_ns(u.loader_wait_ns, s.data_ns, s.step_ns, u.step_ns) AS tracer_ns,
               loader_wait_share(u.loader_wait_ns, s.data_ns, u.step_ns) AS share,
               u.loader_wait_low_ns AS unprofiled_low_ns, u.loader_wait_high_ns AS unprofiled_high_ns,
               loader_tracer_ns(u.loader_wait_low_ns, s.data_ns, s.step_ns, u.step_ns) AS low_tracer_ns,
               loader_wait_share(u.loader_wait_low_ns, s.data_ns, u.step_ns) AS low_share,
               loader_tracer_ns(u.loader_wait_high_ns, s.data_ns, s.step_ns, u.step_ns) AS high_tracer_ns,
               loader_wait_share(u.loader_wait_high_ns, s.data_ns, u.step_ns) AS high_share
        FROM trace_summary s JOIN unprofiled_step u USING (trace_id)
        WHERE s.has_gpu AND s.steps > 0 AND u.loader_wait_ns IS NOT NULL
          AND s.trace_id IN (SELECT DISTINCT trace_id FROM dataloader_waits_in_steps)""")
    # The Nsight Systems tracer's own cost per steady step (docs/verdict.md, "Tracer cost"):
    # the verdict and the compute-gpu-bound rule take the same time out of the same step.
    # tracer_ns is the calls' cost, at most the launch time (the only time that can hold it:
    # where the GPU is busy the tracer's cost is hidden).
    # The cost per call is NSYS_NS_PER_CUDA_CALL unless the step was also timed without a
    # tracer (unprofiled_steps): then it is measured, (traced step - unprofiled step) / calls
    # per step, at least 0, and Kineto traces get a row too (torch.profiler's cost, measured;
    # never assumed: it varies with what the profiler records). The tracer's part of the
    # loader's wait (loader_wait.tracer_ns, loader_tracer_ns here) is left out of that
    # difference: it is the loader's, not the calls'.
    con.execute(f"""
        CREATE OR REPLACE VIEW tracer_cost AS
        WITH calls AS (SELECT trace_id, count(*) AS n FROM runtime_calls_in_steps
                       GROUP BY trace_id),
        costs AS (
            SELECT s.trace_id, s.launch_ns, c.n / s.steps AS cuda_calls_per_step,
                   u.step_ns AS unprofiled_step_ns, coalesce(l.tracer_ns, 0) AS loader_tracer_ns,
                   CAST(CASE WHEN u.step_ns IS NULL THEN {NSYS_NS_PER_CUDA_CALL}
                             ELSE greatest(0, (s.step_ns - u.step_ns - coalesce(l.tracer_ns, 0))
                                              / (c.n / s.steps)) END
                        AS BIGINT) AS ns_per_call
            FROM trace_summary s JOIN calls c USING (trace_id)
            LEFT JOIN unprofiled_step u USING (trace_id)
            LEFT JOIN loader_wait l USING (trace_id)
            WHERE (s.source = 'nsys' OR u.step_ns IS NOT NULL) AND s.steps > 0)
        SELECT trace_id, cuda_calls_per_step, ns_per_call,
               least(launch_ns, cuda_calls_per_step * ns_per_call) AS tracer_ns,
               unprofiled_step_ns, loader_tracer_ns
        FROM costs""")
    # How each trace's steps launch GPU work: graph replays vs eager launches, and whether its
    # steps count as replayed from CUDA graphs (`graphed`), decided here once for every rule
    # that must tell such a step from one launched kernel by kernel. A table (one row per
    # trace), not a view: three launch rules read it, and it goes through every launch call.
    # is_graph_launch_api() (a regular expression) runs once per distinct name, not per call.
    con.execute(f"""
        CREATE OR REPLACE TABLE launch_calls AS
        WITH names AS (
            SELECT name, is_graph_launch_api(name) AS is_graph
            FROM (SELECT DISTINCT name FROM runtime_calls WHERE is_launch)),
        r AS (
            SELECT c.trace_id, c.dur_ns, n.is_graph
            FROM runtime_calls_in_steps c JOIN names n ON c.name IS NOT DISTINCT FROM n.name
            WHERE c.is_launch),
        counted AS (
            SELECT s.trace_id,
                   count(r.dur_ns) FILTER (WHERE r.is_graph) / s.steps AS graph_launches_per_step,
                   count(r.dur_ns) FILTER (WHERE NOT r.is_graph) / s.steps AS eager_launches_per_step,
                   avg(r.dur_ns) FILTER (WHERE r.is_graph) / 1e3 AS graph_launch_us,
                   avg(r.dur_ns) FILTER (WHERE NOT r.is_graph) / 1e3 AS eager_launch_us
            FROM trace_summary s LEFT JOIN r USING (trace_id)
            GROUP BY s.trace_id, s.steps)
        SELECT *, graph_launches_per_step >= 1
                  AND eager_launches_per_step <= {GRAPHED_MAX_EAGER_LAUNCHES} AS graphed
        FROM counted""")
    from .headroom import create_compute_headroom
    create_compute_headroom(con)   # what bf16 + channels_last can remove (headroom.py)
