"""How each trace's steps launch GPU work: launch_calls (graph replays against eager launches,
and whether a step counts as replayed from CUDA graphs)."""
from __future__ import annotations

import duckdb

GRAPHED_MAX_EAGER_LAUNCHES = 20   # a step replayed from CUDA graphs: >= 1 graph launch and
                                  # at most this many other launches per step


def create_launch_views(con: duckdb.DuckDBPyConnection) -> None:
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
