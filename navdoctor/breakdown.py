"""Per-step time breakdown: where each step's wall time went, as shares that sum to 1.

Every instant of a step is given to exactly one bucket, by what the GPU and the host were
doing then, in this order of precedence:
  compute  a kernel runs on the GPU
  copy     a host<->device copy or memset runs (and no kernel)
  data     the GPU is idle while the host waits in DataLoader.__next__
  sync     the GPU is idle because the host blocked on it (a synchronising call, or the
           drained queue after one until the GPU gets work again: the cost of .item()/.cpu())
  launch   the GPU is idle while the host runs ops, Python or CUDA API calls (launch/CPU overhead)
  idle     the GPU is idle and nothing was recorded on the host, or the launching thread is
           blocked in an OS wait (sleep, poll, futex...)
A sync's shadow covers the whole stretch to the next sync when the host queued at most
MAX_LAUNCHES_BETWEEN_SYNCS operations in between: the queue never filled, so every idle gap
of such a stretch is the price of the round trips (the `.item()`-in-a-loop pattern).
Nsight Systems does not trace PyTorch ops, so in a trace without cpu_ops the launching threads
count as busy through every step, except while in an OS wait.
On a CPU-only trace there is no GPU: host ops count as compute, data waits as data.
The result is the derived table `step_breakdown` (documented in docs/schema.md).
"""
from __future__ import annotations

import duckdb

BUCKETS = ("compute", "copy", "data", "sync", "launch", "idle")
MAX_LAUNCHES_BETWEEN_SYNCS = 4
# OS calls in which a thread waits rather than works.
OS_WAIT_CALLS = ("poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait", "futex",
                 "pthread_cond_wait", "pthread_cond_timedwait", "pthread_mutex_lock", "sem_wait",
                 "sem_timedwait", "nanosleep", "clock_nanosleep", "usleep", "sleep", "pthread_join",
                 "waitpid", "wait4", "accept", "recv", "recvfrom", "recvmsg")

BREAKDOWN_DDL = """
CREATE OR REPLACE TABLE step_breakdown (
    trace_id INTEGER, source VARCHAR, step_num INTEGER, start_ns BIGINT, end_ns BIGINT,
    step_ns BIGINT, compute_ns BIGINT, copy_ns BIGINT, data_ns BIGINT, sync_ns BIGINT,
    launch_ns BIGINT, idle_ns BIGINT, has_gpu BOOLEAN)
"""


def ensure_steps(con: duckdb.DuckDBPyConnection) -> list[int]:
    """Give each trace without steps one step spanning its activity; return those trace ids."""
    missing = [r[0] for r in con.execute("""
        SELECT trace_id FROM inputs WHERE trace_id NOT IN (SELECT DISTINCT trace_id FROM steps)
        ORDER BY trace_id""").fetchall()]
    for trace_id in missing:
        con.execute("""
            INSERT INTO steps
            SELECT $t, any_value(source), 0, min(s), max(e), max(e) - min(s), 'whole-trace',
                   min(s), max(e)
            FROM (SELECT source, start_ns s, end_ns e FROM kernels WHERE trace_id = $t
                  UNION ALL SELECT source, start_ns, end_ns FROM memcpy WHERE trace_id = $t
                  UNION ALL SELECT source, start_ns, end_ns FROM runtime_calls WHERE trace_id = $t
                  UNION ALL SELECT source, start_ns, end_ns FROM cpu_ops WHERE trace_id = $t
                  UNION ALL SELECT source, start_ns, end_ns FROM dataloader_waits WHERE trace_id = $t)
            HAVING count(*) > 0""", {"t": trace_id})
    return missing


# A step's GPU work "lags" when its first kernel or copy starts this long after the call
# that launched it: the GPU was still busy with earlier steps (launching on an idle GPU
# takes a few microseconds).
GPU_LAG_NS = 50_000


def align_steps_to_gpu(con: duckdb.DuckDBPyConnection) -> None:
    """Move step windows to where the GPU does each step's work.

    Step markers are host events. When the GPU is the bottleneck the host runs ahead and
    queues several steps of work, so host windows are short and the GPU work of step N runs
    inside later windows (seen on an H200: host windows of 3.2 ms for an fp32 step that takes
    260 ms on the GPU). A step whose first GPU activity lags its launch starts where that
    activity starts; other steps keep their host start. The last window runs to the end of
    the GPU work its steps launched. The host-side marker stays in cpu_start_ns/cpu_end_ns.
    """
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _step_gpu AS
        WITH gpu AS (
            SELECT trace_id, correlation_id, start_ns, end_ns FROM kernels
            UNION ALL SELECT trace_id, correlation_id, start_ns, end_ns FROM memcpy
            UNION ALL SELECT trace_id, correlation_id, start_ns, end_ns FROM memset),
        launched AS (
            SELECT st.trace_id, st.step_num, r.end_ns AS launch_end, g.start_ns, g.end_ns
            FROM steps st
            JOIN runtime_calls r ON r.trace_id = st.trace_id AND r.correlation_id IS NOT NULL
                 AND r.start_ns >= st.cpu_start_ns AND r.start_ns < st.cpu_end_ns
            JOIN gpu g ON g.trace_id = r.trace_id AND g.correlation_id = r.correlation_id
                 AND g.start_ns >= r.start_ns)
        SELECT trace_id, step_num, arg_min(start_ns - launch_end, start_ns) AS first_lag,
               min(start_ns) AS first_gpu, max(end_ns) AS last_gpu
        FROM launched GROUP BY trace_id, step_num""")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _aligned AS
        WITH b AS (
            SELECT st.trace_id, st.step_num, st.cpu_start_ns, st.cpu_end_ns, g.last_gpu,
                   CASE WHEN g.first_lag > {GPU_LAG_NS} THEN greatest(st.cpu_start_ns, g.first_gpu)
                        ELSE st.cpu_start_ns END AS start_ns
            FROM steps st LEFT JOIN _step_gpu g USING (trace_id, step_num)
            WHERE st.origin <> 'whole-trace')
        SELECT trace_id, step_num, start_ns,
               COALESCE(lead(start_ns) OVER w,
                        greatest(cpu_end_ns, COALESCE(max(last_gpu) OVER w_all, cpu_end_ns))) AS end_ns
        FROM b
        WINDOW w AS (PARTITION BY trace_id ORDER BY cpu_start_ns),
               w_all AS (PARTITION BY trace_id)""")
    con.execute("""
        UPDATE steps SET start_ns = a.start_ns, end_ns = a.end_ns, dur_ns = a.end_ns - a.start_ns
        FROM _aligned a
        WHERE steps.trace_id = a.trace_id AND steps.step_num = a.step_num
          AND a.end_ns > a.start_ns""")
    con.execute("DROP TABLE _step_gpu")
    con.execute("DROP TABLE _aligned")


def compute_breakdown(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(BREAKDOWN_DDL)
    # Intervals by kind. k=kernel, c=copy, d=data wait, y=sync (+ its drained-queue shadow),
    # p=host busy. The shadow runs from a sync's end to the GPU's next start (an ASOF join).
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _gpu_starts AS
        SELECT trace_id, start_ns FROM kernels
        UNION ALL SELECT trace_id, start_ns FROM memcpy
        UNION ALL SELECT trace_id, start_ns FROM memset""")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _sync_cycles AS
        WITH y AS (
            SELECT trace_id, pid, tid, start_ns, end_ns,
                   lead(start_ns) OVER (PARTITION BY trace_id, pid, tid ORDER BY start_ns) AS next_sync
            FROM sync_events)
        SELECT y.trace_id, y.end_ns AS s, y.next_sync AS e
        FROM y LEFT JOIN runtime_calls r
          ON r.trace_id = y.trace_id AND r.pid IS NOT DISTINCT FROM y.pid
         AND r.tid IS NOT DISTINCT FROM y.tid AND r.start_ns >= y.end_ns AND r.start_ns < y.next_sync
         AND (r.is_launch OR r.name ILIKE '%memcpy%' OR r.name ILIKE '%memset%')
        WHERE y.next_sync > y.end_ns
        GROUP BY y.trace_id, y.end_ns, y.next_sync
        HAVING count(r.start_ns) <= {MAX_LAUNCHES_BETWEEN_SYNCS}""")
    waits = ", ".join(f"'{c}'" for c in OS_WAIT_CALLS)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _iv AS
        SELECT trace_id, 'k' AS kind, start_ns AS s, end_ns AS e FROM kernels
        UNION ALL SELECT trace_id, 'c', start_ns, end_ns FROM memcpy
        UNION ALL SELECT trace_id, 'c', start_ns, end_ns FROM memset
        UNION ALL SELECT trace_id, 'd', start_ns, end_ns FROM dataloader_waits
        UNION ALL SELECT trace_id, 'y', start_ns, end_ns FROM sync_events
        UNION ALL SELECT y.trace_id, 'y', y.end_ns, g.start_ns
            FROM sync_events y ASOF JOIN _gpu_starts g
            ON y.trace_id = g.trace_id AND g.start_ns >= y.end_ns
        UNION ALL SELECT trace_id, 'y', s, e FROM _sync_cycles
        UNION ALL SELECT trace_id, 'p', start_ns, end_ns FROM runtime_calls
        UNION ALL SELECT trace_id, 'p', start_ns, end_ns FROM cpu_ops
        -- No host ops traced (nsys): the launching threads are busy through the steps...
        UNION ALL SELECT trace_id, 'p', start_ns, end_ns FROM steps
            WHERE trace_id NOT IN (SELECT DISTINCT trace_id FROM cpu_ops)
        -- ... except while they wait in the OS.
        UNION ALL SELECT o.trace_id, 'w', o.start_ns, o.end_ns FROM os_calls o
            WHERE o.name IN ({waits})
              AND (o.trace_id, o.pid, o.tid) IN (
                  -- the thread that launches most kernels (helper threads such as the
                  -- pin-memory thread make a few CUDA calls too, and wait the rest of the time)
                  SELECT trace_id, arg_max(pid, n), arg_max(tid, n) FROM (
                      SELECT trace_id, pid, tid, count(*) AS n FROM runtime_calls
                      WHERE is_launch GROUP BY ALL) GROUP BY trace_id)
    """)
    con.execute("DELETE FROM _iv WHERE s IS NULL OR e IS NULL OR e <= s")
    # Elementary segments between consecutive boundaries, with how many intervals of each
    # kind cover them (running sums of +1/-1 at starts/ends). Step edges are boundaries too,
    # so no segment straddles a step edge.
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _seg AS
        WITH edges AS (
            SELECT trace_id, s AS ts, kind, 1 AS delta FROM _iv
            UNION ALL SELECT trace_id, e, kind, -1 FROM _iv
            UNION ALL SELECT trace_id, start_ns, '-', 0 FROM steps
            UNION ALL SELECT trace_id, end_ns, '-', 0 FROM steps),
        points AS (
            SELECT trace_id, ts,
                   sum(delta) FILTER (kind = 'k') AS dk, sum(delta) FILTER (kind = 'c') AS dc,
                   sum(delta) FILTER (kind = 'd') AS dd, sum(delta) FILTER (kind = 'y') AS dy,
                   sum(delta) FILTER (kind = 'p') AS dp, sum(delta) FILTER (kind = 'w') AS dw
            FROM edges GROUP BY trace_id, ts),
        running AS (
            SELECT trace_id, ts,
                   lead(ts) OVER (PARTITION BY trace_id ORDER BY ts) AS next_ts,
                   sum(COALESCE(dk, 0)) OVER w AS nk, sum(COALESCE(dc, 0)) OVER w AS nc,
                   sum(COALESCE(dd, 0)) OVER w AS nd, sum(COALESCE(dy, 0)) OVER w AS ny,
                   sum(COALESCE(dp, 0)) OVER w AS np, sum(COALESCE(dw, 0)) OVER w AS nw
            FROM points
            WINDOW w AS (PARTITION BY trace_id ORDER BY ts ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))
        SELECT trace_id, ts, next_ts, next_ts - ts AS len, nk > 0 AS k, nc > 0 AS c,
               nd > 0 AS d, ny > 0 AS y, np > 0 AS p, nw > 0 AS w
        FROM running WHERE next_ts IS NOT NULL AND next_ts > ts""")
    con.execute("""
        INSERT INTO step_breakdown
        WITH gpu AS (
            SELECT trace_id, bool_or(n > 0) AS has_gpu FROM (
                SELECT trace_id, 0 AS n FROM inputs
                UNION ALL SELECT trace_id, count(*) FROM kernels GROUP BY trace_id
                UNION ALL SELECT trace_id, count(*) FROM memcpy GROUP BY trace_id)
            GROUP BY trace_id),
        bucketed AS (
            SELECT s.trace_id, s.ts, s.next_ts, s.len,
                CASE WHEN g.has_gpu THEN
                    CASE WHEN k THEN 'compute' WHEN c THEN 'copy' WHEN d THEN 'data'
                         WHEN y THEN 'sync' WHEN w THEN 'idle' WHEN p THEN 'launch' ELSE 'idle' END
                ELSE CASE WHEN d THEN 'data' WHEN p THEN 'compute' ELSE 'idle' END
                END AS bucket
            FROM _seg s JOIN gpu g USING (trace_id))
        SELECT st.trace_id, st.source, st.step_num, st.start_ns, st.end_ns, st.dur_ns,
            COALESCE(sum(len) FILTER (bucket = 'compute'), 0),
            COALESCE(sum(len) FILTER (bucket = 'copy'), 0),
            COALESCE(sum(len) FILTER (bucket = 'data'), 0),
            COALESCE(sum(len) FILTER (bucket = 'sync'), 0),
            COALESCE(sum(len) FILTER (bucket = 'launch'), 0),
            COALESCE(sum(len) FILTER (bucket = 'idle'), 0),
            any_value(g.has_gpu)
        FROM steps st JOIN gpu g USING (trace_id)
        LEFT JOIN bucketed b ON b.trace_id = st.trace_id AND b.ts >= st.start_ns
                            AND b.next_ts <= st.end_ns
        GROUP BY st.trace_id, st.source, st.step_num, st.start_ns, st.end_ns, st.dur_ns""")
    for t in ("_gpu_starts", "_sync_cycles", "_iv", "_seg"):
        con.execute(f"DROP TABLE {t}")
