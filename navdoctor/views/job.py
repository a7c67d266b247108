"""The job views rules query (docs/schema.md, "Multi-rank jobs"), over the tables `ranks`,
`rank_steps` and `rank_collectives` that a job analysis fills (empty in a one-trace analysis,
where these views are empty too).

Who waits for whom is read from collective *durations*, not start times: a collective ends on
every rank at about the same moment (when the last rank's data is in), so the rank that
arrived last spends the least time in it, and every other rank's extra time in it is waiting.
Durations need no common clock: ranks on different hosts have clocks apart by more than a
collective lasts.
"""
from __future__ import annotations

import duckdb


def create_job_views(con: duckdb.DuckDBPyConnection) -> None:
    """The job views, each over the rank tables and the ones before it."""
    for create in (_collective_waits, _rank_summary, _rank_excess, _job_summary):
        create(con)


def _collective_waits(con: duckdb.DuckDBPyConnection) -> None:
    # Collectives are matched across ranks by their position in each rank's sequence (NCCL
    # and gloo run a group's collectives in the same order on every rank), as far as every
    # rank has one there and all agree on its kind: past the first disagreement (a capture
    # window that cut one rank's sequence elsewhere) positions no longer pair the same call.
    con.execute("""
        CREATE OR REPLACE VIEW collective_waits AS
        WITH n AS (SELECT count(*) AS ranks FROM ranks),
        per_seq AS (
            SELECT seq, count(*) AS ranks_seen, min(name) = max(name) AS same_kind,
                   min(dur_ns) AS transfer_ns,
                   list_sort(list(dur_ns))[2] AS second_ns,
                   arg_min(rank, dur_ns) AS last_rank
            FROM rank_collectives GROUP BY seq),
        matched AS (
            SELECT p.* FROM per_seq p, n
            WHERE n.ranks >= 2 AND p.seq < COALESCE(
                (SELECT min(seq) FROM per_seq, n WHERE ranks_seen <> n.ranks OR NOT same_kind),
                2147483647))
        SELECT c.trace_id, c.rank, c.seq, c.name, c.kind, c.step_num, s.job_step,
               c.dur_ns, m.transfer_ns,
               c.dur_ns - m.transfer_ns AS wait_ns,        -- in the collective, for later ranks
               c.rank = m.last_rank AND m.second_ns > m.transfer_ns AS arrived_last,  -- a tie: nobody
               -- what the others would save had this rank arrived with the next-to-last one
               CASE WHEN c.rank = m.last_rank THEN m.second_ns - m.transfer_ns ELSE 0 END
                   AS held_others_ns
        FROM rank_collectives c JOIN matched m USING (seq)
        LEFT JOIN rank_steps s ON s.trace_id = c.trace_id AND s.step_num = c.step_num""")


def _rank_summary(con: duckdb.DuckDBPyConnection) -> None:
    # One row per rank over its matched steady steps: the means of its breakdown, its
    # communication (all of it, the exposed part, the overlapped rest), how long it waited
    # inside collectives for later ranks, and how often it was the last to arrive.
    con.execute("""
        CREATE OR REPLACE VIEW rank_summary AS
        WITH st AS (
            SELECT trace_id, rank, count(*) AS steps, avg(step_ns) AS step_ns,
                   avg(compute_ns) AS compute_ns, avg(comm_ns) AS comm_ns, avg(copy_ns) AS copy_ns,
                   avg(data_ns) AS data_ns, avg(sync_ns) AS sync_ns, avg(launch_ns) AS launch_ns,
                   avg(host_ns) AS host_ns, avg(idle_ns) AS idle_ns,
                   avg(comm_total_ns) AS comm_total_ns
            FROM rank_steps WHERE steady AND job_step IS NOT NULL GROUP BY trace_id, rank),
        cw AS (
            SELECT trace_id, count(*) AS collectives,
                   sum(wait_ns) AS wait_sum, sum(held_others_ns) AS held_sum,
                   avg(CASE WHEN arrived_last THEN 1.0 ELSE 0.0 END) AS last_share
            FROM collective_waits WHERE job_step IS NOT NULL GROUP BY trace_id)
        SELECT st.*, r.bound, r.path,
               greatest(st.comm_total_ns - st.comm_ns, 0) AS comm_overlapped_ns,
               COALESCE(cw.collectives, 0) / st.steps AS collectives_per_step,
               COALESCE(cw.wait_sum, 0) / st.steps AS wait_ns,
               -- waiting counts against the step only where it is exposed
               least(COALESCE(cw.wait_sum, 0) / st.steps, st.comm_ns) AS exposed_wait_ns,
               st.step_ns - least(COALESCE(cw.wait_sum, 0) / st.steps, st.comm_ns) AS work_ns,
               COALESCE(cw.held_sum, 0) / st.steps AS held_others_ns,
               COALESCE(cw.last_share, 0.0) AS last_share
        FROM st JOIN ranks r USING (trace_id) LEFT JOIN cw USING (trace_id)""")


def _rank_excess(con: duckdb.DuckDBPyConnection) -> None:
    # The straggler candidate's own time, bucket by bucket, against the median of the other
    # ranks: where its extra time goes is its cause (data loading, compute, host work...).
    con.execute("""
        CREATE OR REPLACE VIEW rank_excess AS
        WITH top AS (SELECT rank FROM rank_summary
                     ORDER BY last_share DESC, work_ns DESC, rank LIMIT 1),
        long AS (
            UNPIVOT (SELECT rank, compute_ns, copy_ns, data_ns, sync_ns, launch_ns, host_ns,
                            idle_ns FROM rank_summary)
            ON compute_ns, copy_ns, data_ns, sync_ns, launch_ns, host_ns, idle_ns
            INTO NAME bucket VALUE ns)
        SELECT l.rank, replace(l.bucket, '_ns', '') AS bucket, l.ns,
               (SELECT median(o.ns) FROM long o WHERE o.bucket = l.bucket AND o.rank <> l.rank)
                   AS others_ns,
               l.ns - (SELECT median(o.ns) FROM long o
                       WHERE o.bucket = l.bucket AND o.rank <> l.rank) AS excess_ns
        FROM long l JOIN top USING (rank)""")


def _job_summary(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("""
        CREATE OR REPLACE VIEW job_summary AS
        WITH rs AS (SELECT * FROM rank_summary),
        job_steps AS (
            SELECT job_step, max(step_ns) AS step_ns FROM rank_steps
            WHERE steady AND job_step IS NOT NULL GROUP BY job_step
            HAVING count(*) = (SELECT count(*) FROM ranks)),
        top AS (SELECT * FROM rs ORDER BY last_share DESC, work_ns DESC, rank LIMIT 1),
        cause AS (SELECT bucket, excess_ns, ns, others_ns FROM rank_excess
                  ORDER BY excess_ns DESC LIMIT 1),
        works AS (SELECT list_sort(list(work_ns), 'DESC') AS w FROM rs)
        SELECT (SELECT count(*) FROM ranks) AS ranks,
               (SELECT max(world_size) FROM ranks) AS world_size,
               (SELECT any_value(backend) FROM ranks) AS backend,
               (SELECT count(*) FROM job_steps) AS steps,
               (SELECT avg(step_ns) FROM job_steps) AS step_ns,
               (SELECT avg(step_ns) FROM job_steps) / 1e6 AS step_ms,
               (SELECT count(DISTINCT seq) FROM collective_waits WHERE job_step IS NOT NULL)
                   / greatest((SELECT count(*) FROM job_steps), 1) AS collectives_per_step,
               (max(rs.step_ns) - min(rs.step_ns)) / median(rs.step_ns) AS step_spread,
               avg(rs.comm_total_ns) / 1e6 AS comm_total_ms,
               avg(rs.comm_ns) / 1e6 AS comm_exposed_ms,
               avg(rs.comm_ns / rs.step_ns) AS exposed_share,
               avg(rs.comm_overlapped_ns) / nullif(avg(rs.comm_total_ns), 0) AS overlapped_share,
               avg(rs.exposed_wait_ns) / 1e6 AS exposed_wait_ms,
               -- exposed communication that is not waiting for a later rank: the transfers
               avg(greatest(rs.comm_ns - rs.exposed_wait_ns, 0) / rs.step_ns) AS transfer_share,
               avg(greatest(rs.comm_ns - rs.exposed_wait_ns, 0)) AS transfer_ns,
               avg(greatest(rs.comm_ns - rs.exposed_wait_ns, 0)) / 1e6 AS transfer_ms,
               (max(rs.work_ns) - min(rs.work_ns)) / avg(rs.step_ns) AS work_spread,
               -- the same spread with the busiest rank left out: an imbalance of several
               -- ranks, not of one straggler
               (any_value(works.w)[2] - min(rs.work_ns)) / avg(rs.step_ns) AS work_spread_rest,
               arg_max(rs.rank, rs.work_ns) AS busiest_rank,
               arg_min(rs.rank, rs.work_ns) AS idlest_rank,
               max(rs.work_ns) / 1e6 AS busiest_work_ms, min(rs.work_ns) / 1e6 AS idlest_work_ms,
               any_value(top.rank) AS straggler_rank,
               any_value(top.last_share) AS straggler_last_share,
               any_value(top.bound) AS straggler_bound,
               -- the job loses at most what the other ranks wait where it is exposed
               least(any_value(top.held_others_ns),
                     (SELECT median(o.exposed_wait_ns) FROM rs o
                      WHERE o.rank <> any_value(top.rank))) AS straggler_cost_ns,
               least(any_value(top.held_others_ns),
                     (SELECT median(o.exposed_wait_ns) FROM rs o
                      WHERE o.rank <> any_value(top.rank))) / 1e6 AS straggler_cost_ms,
               (SELECT bucket FROM cause) AS straggler_cause,
               (SELECT excess_ns FROM cause) / 1e6 AS straggler_cause_excess_ms,
               (SELECT ns FROM cause) / 1e6 AS straggler_cause_ms,
               (SELECT others_ns FROM cause) / 1e6 AS others_cause_ms
        FROM rs, works, top
        HAVING count(*) >= 2""")


JOB_VIEWS = ("collective_waits", "rank_summary", "rank_excess", "job_summary")

# The columns of each job view (DESCRIBE of the views above), which _empty_views gives the
# views of no rows without binding the real ones (~20 ms of a small trace's fixed cost).
# tests/test_perf_paths.py checks them against the real views: change both together.
JOB_VIEW_COLUMNS = {
    "collective_waits": """trace_id INTEGER, rank INTEGER, seq INTEGER, name VARCHAR,
        kind VARCHAR, step_num INTEGER, job_step INTEGER, dur_ns BIGINT, transfer_ns BIGINT,
        wait_ns BIGINT, arrived_last BOOLEAN, held_others_ns BIGINT""",
    "rank_summary": """trace_id INTEGER, rank INTEGER, steps BIGINT, step_ns DOUBLE,
        compute_ns DOUBLE, comm_ns DOUBLE, copy_ns DOUBLE, data_ns DOUBLE, sync_ns DOUBLE,
        launch_ns DOUBLE, host_ns DOUBLE, idle_ns DOUBLE, comm_total_ns DOUBLE, bound VARCHAR,
        path VARCHAR, comm_overlapped_ns DOUBLE, collectives_per_step DOUBLE, wait_ns DOUBLE,
        exposed_wait_ns DOUBLE, work_ns DOUBLE, held_others_ns DOUBLE, last_share DOUBLE""",
    "rank_excess": """rank INTEGER, bucket VARCHAR, ns DOUBLE, others_ns DOUBLE,
        excess_ns DOUBLE""",
    "job_summary": """ranks BIGINT, world_size INTEGER, backend VARCHAR, steps BIGINT,
        step_ns DOUBLE, step_ms DOUBLE, collectives_per_step DOUBLE, step_spread DOUBLE,
        comm_total_ms DOUBLE, comm_exposed_ms DOUBLE, exposed_share DOUBLE,
        overlapped_share DOUBLE, exposed_wait_ms DOUBLE, transfer_share DOUBLE,
        transfer_ns DOUBLE, transfer_ms DOUBLE, work_spread DOUBLE, work_spread_rest DOUBLE,
        busiest_rank INTEGER, idlest_rank INTEGER, busiest_work_ms DOUBLE,
        idlest_work_ms DOUBLE, straggler_rank INTEGER, straggler_last_share DOUBLE,
        straggler_bound VARCHAR, straggler_cost_ns DOUBLE, straggler_cost_ms DOUBLE,
        straggler_cause VARCHAR, straggler_cause_excess_ms DOUBLE, straggler_cause_ms DOUBLE,
        others_cause_ms DOUBLE""",
}


def job_view_columns(view: str) -> list[tuple[str, str]]:
    """(name, type) of each column of a job view, as DESCRIBE gives them."""
    return [tuple(part.split()) for part in JOB_VIEW_COLUMNS[view].split(",")]


def is_job_store(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the rank tables hold any row (a job analysis)."""
    return bool(con.execute(
        "SELECT (SELECT count(*) FROM ranks) + (SELECT count(*) FROM rank_steps) "
        "+ (SELECT count(*) FROM rank_collectives)").fetchone()[0])


def create_or_empty_job_views(con: duckdb.DuckDBPyConnection) -> None:
    """The job views over the rank tables in a job analysis. Outside one (no ranks) every job
    view is empty whatever its definition: they become views of no rows with the same columns
    (JOB_VIEW_COLUMNS), made without binding the real ones first. A rule over job_summary then
    costs what a query over an empty table costs (planning the nested views took ~30 ms a
    rule, a third of a small trace's rules)."""
    if is_job_store(con):
        create_job_views(con)
    else:
        _empty_views(con)


def _empty_views(con: duckdb.DuckDBPyConnection) -> None:
    for view in reversed(JOB_VIEWS):   # job_summary first: nothing else reads it
        cols = ", ".join(f'CAST(NULL AS {t}) AS "{n}"' for n, t in job_view_columns(view))
        con.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT {cols} WHERE false")
