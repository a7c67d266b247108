"""Per-step time breakdown: where each step's wall time went, as shares that sum to 1.

Every instant of a step is given to exactly one bucket, by what the GPU and the host were
doing then, in this order of precedence:
  compute  a kernel runs on the GPU (not a communication kernel)
  comm     only communication kernels run (NCCL/RCCL collectives, send/receive): exposed
           communication, not hidden behind compute
  copy     a host<->device copy or memset runs (and no kernel)
  data     the GPU is idle while the host waits in DataLoader.__next__, or, in a trace
           with no such ranges and no host ops (a hand-made nsys capture), while the process
           fetches its input between CUDA calls (see _input_gaps)
  sync     the GPU is idle because the host blocked on it (a synchronising call, or the
           drained queue after one until the GPU gets work again: the cost of .item()/.cpu())
  host     the GPU is idle while the host works without launching anything: a stretch of
           HOST_WORK_GAP_NS or more in which no launching thread makes a CUDA call (decode,
           pre/post-processing on the CPU, Python between frames)
  launch   the GPU is idle while the host issues work: CUDA API calls and the dispatch and
           Python between them (launch/CPU overhead)
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

import re

import duckdb

from . import LOOP_END_MARK   # where navdoctor's collector saw a DataLoader run out
from .profiling import phase
from .stepjoin import bins_fit, small_store, step_bins_ctes, steps_overlap

BUCKETS = ("compute", "comm", "copy", "data", "sync", "launch", "host", "idle")
# Interval kinds of the sweep (k kernel, n communication kernel, c copy, d data wait, y sync,
# p host busy, w OS wait, g a stretch without CUDA calls) and the bits each one's running count
# gets in the packed sum (see compute_breakdown). 8 x 16 bits fill the 128 of a HUGEINT; 'g'
# (never more than one at a time) takes the top field, whose top bit is the sign.
_KINDS = ("k", "n", "c", "d", "y", "p", "w", "g")
_COUNT_BITS = 16
# A stretch at least this long without a CUDA call from any launching thread is host work, not
# launch overhead: an eager op's dispatch and the Python around it take 5-50 us (median gaps
# between the launching thread's CUDA calls in the launch-bound H200 fixtures: 3-22 us; gaps
# over 200 us make at most 2% of their steps), while decoding a frame, a CPU resize or CPU
# post-processing take milliseconds (docs/verdict.md, "Host work").
HOST_WORK_GAP_NS = 200_000
LAUNCHER_SHARE = 0.05
# Collectives run by the host (gloo, MPI, UCC backends of torch.distributed): communication.
HOST_COLLECTIVE = "regexp_matches(lower(name), '^(gloo|mpi|ucc):')"
MAX_LAUNCHES_BETWEEN_SYNCS = 4
# OS calls in which a thread waits rather than works.
OS_WAIT_CALLS = ("poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait", "futex",
                 "pthread_cond_wait", "pthread_cond_timedwait", "pthread_mutex_lock", "sem_wait",
                 "sem_timedwait", "sem_clockwait", "nanosleep", "clock_nanosleep", "usleep", "sleep", "pthread_join",
                 "waitpid", "wait4", "accept", "recv", "recvfrom", "recvmsg")
# Opening a file: what a loop does to fetch its next input (a JPEG, a frame, a shard).
INPUT_OPEN_CALLS = ("open", "open64", "openat", "openat64", "fopen", "fopen64", "creat")
# OS waits in which a thread waits for a producer: I/O multiplexing and receives (a DataLoader
# worker's pipe), and POSIX semaphores, which Python's Lock and Queue block on. Not condition
# variables or mutexes: CPython's GIL waits in pthread_cond_timedwait (5 ms switch interval),
# which is contention between the process's own threads, not input (seen on an H200 in
# train.py --workers 12: the main thread waited there ~6 times per step while its meters
# showed 0.4% of the time in data waits).
PRODUCER_WAIT_CALLS = ("poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait",
                       "recv", "recvfrom", "recvmsg", "sem_wait", "sem_timedwait", "sem_clockwait")

BREAKDOWN_DDL = """
CREATE OR REPLACE TABLE step_breakdown (
    trace_id INTEGER, source VARCHAR, step_num INTEGER, start_ns BIGINT, end_ns BIGINT,
    step_ns BIGINT, compute_ns BIGINT, comm_ns BIGINT, copy_ns BIGINT, data_ns BIGINT,
    sync_ns BIGINT, launch_ns BIGINT, host_ns BIGINT, idle_ns BIGINT, has_gpu BOOLEAN)
"""


def drop_loop_tails(con: duckdb.DuckDBPyConnection) -> int:
    """Take out the marked steps that hold a LOOP_END_MARK: the step a fetch that found the
    DataLoader exhausted opened (or the one after the last optimizer step) runs over the code
    after the loop (evaluation, saving, the script's end) until the profiler stops; as a step
    it read 522 ms beside 109-121 ms ones (a 7-batch loop, 0.5 s after it) and made the
    verdict's step its own. Called before any step is inferred (prepare_store), so the steps
    it sees are the loaders' marked ones. Returns how many."""
    return con.execute(f"""
        DELETE FROM steps s
        WHERE EXISTS (SELECT 1 FROM nvtx_ranges m
                      WHERE m.trace_id = s.trace_id AND m.name = '{LOOP_END_MARK}'
                        AND m.start_ns >= s.cpu_start_ns AND m.start_ns < s.cpu_end_ns)""").fetchall()[0][0]


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
    # Each GPU activity with the call that launched it (same correlation id, the activity
    # starting no earlier), given the steps whose host window holds the call's start: every
    # window containing it (a range join), made a hash join on time bins
    # (stepjoin.step_bins_sql). When the windows do not fit bins: where no two windows of a trace
    # overlap (the rule), a call's only candidate is the last window starting at or before it
    # (an ASOF join); otherwise the range join itself. The activities meet their calls before
    # the steps: DuckDB then builds its hash table on the activities (5 M on a 5 M-kernel
    # export) rather than on the calls in steps (10 M), whose number it cannot foresee (1.1
    # against 0.66 CPU s). A small store (stepjoin.small_store) whose windows do not overlap
    # takes the ASOF join without trying the bins, whose three queries cost more there.
    overlap = steps_overlap(con, "cpu_start_ns", "cpu_end_ns") if small_store(con) else None
    if overlap is not False and bins_fit(con, "steps", "cpu_start_ns", "cpu_end_ns"):
        bins = step_bins_ctes("steps", "cpu_start_ns", "cpu_end_ns") + ","
        launched = """
            SELECT sb.trace_id, sb.step_num, p.launch_end, p.start_ns, p.end_ns
            FROM (SELECT p.*, (p.call_start - b.origin) // b.w AS bin
                  FROM pairs p JOIN bin_width b ON p.trace_id = b.trace_id) p
            JOIN step_bins sb ON sb.trace_id = p.trace_id AND sb.bin = p.bin
            WHERE p.call_start >= sb.start_ns AND p.call_start < sb.end_ns"""
    elif overlap or (overlap is None and steps_overlap(con, "cpu_start_ns", "cpu_end_ns")):
        bins = ""
        launched = """
            SELECT st.trace_id, st.step_num, p.launch_end, p.start_ns, p.end_ns
            FROM steps st
            JOIN pairs p ON p.trace_id = st.trace_id
                 AND p.call_start >= st.cpu_start_ns AND p.call_start < st.cpu_end_ns"""
    else:
        bins = ""
        launched = """
            SELECT st.trace_id, st.step_num, p.launch_end, p.start_ns, p.end_ns
            FROM pairs p
            ASOF JOIN (SELECT trace_id, step_num, cpu_start_ns, cpu_end_ns FROM steps
                       WHERE cpu_start_ns IS NOT NULL AND cpu_end_ns IS NOT NULL) st
              ON st.trace_id = p.trace_id AND st.cpu_start_ns <= p.call_start
            WHERE p.call_start < st.cpu_end_ns"""
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _step_gpu AS
        WITH {bins}
        gpu AS (
            SELECT trace_id, correlation_id, start_ns, end_ns FROM kernels
            UNION ALL SELECT trace_id, correlation_id, start_ns, end_ns FROM memcpy
            UNION ALL SELECT trace_id, correlation_id, start_ns, end_ns FROM memset),
        pairs AS (
            SELECT r.trace_id, r.start_ns AS call_start, r.end_ns AS launch_end, g.start_ns, g.end_ns
            FROM runtime_calls r
            JOIN gpu g ON g.trace_id = r.trace_id AND g.correlation_id = r.correlation_id
             AND g.start_ns >= r.start_ns),
        launched AS ({launched})
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
            WHERE st.origin NOT IN ('whole-trace', 'gpu-window'))
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


def _calls_after_previous(callers: str, by_thread: bool) -> str:
    """SQL: the CUDA calls of the processes (with by_thread, the threads) that the CTE
    `callers` lists (trace_id, pid[, tid]), each with prev_end, the latest end of any earlier
    one of them: [prev_end, start_ns) is a stretch in which none of them made a CUDA call."""
    tid = " AND l.tid IS NOT DISTINCT FROM r.tid" if by_thread else ""
    return f"""
            SELECT r.trace_id, r.tid, r.start_ns,
                   max(r.end_ns) OVER (PARTITION BY r.trace_id ORDER BY r.start_ns, r.end_ns
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
            FROM runtime_calls r JOIN {callers} l
              ON l.trace_id = r.trace_id AND l.pid IS NOT DISTINCT FROM r.pid{tid}
            WHERE r.start_ns IS NOT NULL AND r.end_ns IS NOT NULL"""


def _input_gaps(con: duckdb.DuckDBPyConnection) -> None:
    """Input fetching seen from the OS side, for traces that have no DataLoader ranges and no
    host ops, but OS-runtime calls (`nsys profile -t cuda,osrt` of a script navdoctor did not
    run). Such a trace shows the host only as CUDA calls and OS calls; without this, the time a
    training loop spends decoding its next batch reads as launch overhead, or as the shadow
    of the last sync (seen on an H200: torchvision's train.py with --workers 0, 90% waiting for
    data by its own meters, came out memory-bound 1.0).

    A gap is a stretch in which no thread of the launching process makes a CUDA call. It is
    input fetching, the temp table `_input_gaps`, when in it
      - a thread of that process opens a file (the next JPEG, frame or shard), or
      - the thread that ends the gap (its next CUDA call) spent at least half of it waiting
        for a producer (PRODUCER_WAIT_CALLS: DataLoader workers, a reader thread), since it
        was not waiting for the GPU (that would be a CUDA call).
    A sleep paces a loop (a camera rate), a GIL wait is the process's own contention: both
    stay what they were. Where the GPU is busy meanwhile, the sweep gives the time to the GPU
    as always; only the GPU-idle part becomes data."""
    opens = ", ".join(f"'{c}'" for c in INPUT_OPEN_CALLS)
    waits = ", ".join(f"'{c}'" for c in PRODUCER_WAIT_CALLS)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _input_gaps AS
        WITH eligible AS (
            SELECT DISTINCT trace_id FROM os_calls
            WHERE trace_id NOT IN (SELECT DISTINCT trace_id FROM cpu_ops)
              AND trace_id NOT IN (SELECT DISTINCT trace_id FROM dataloader_waits)),
        launcher AS (
            SELECT trace_id, arg_max(pid, n) AS pid FROM (
                SELECT trace_id, pid, count(*) AS n FROM runtime_calls
                WHERE is_launch AND trace_id IN (SELECT trace_id FROM eligible) GROUP BY ALL)
            GROUP BY trace_id),
        calls AS ({_calls_after_previous("launcher", by_thread=False)}),
        gaps AS (
            SELECT trace_id, tid AS closer, prev_end AS s, start_ns AS e FROM calls
            WHERE start_ns > prev_end),
        os AS (
            SELECT o.trace_id, o.tid, o.name, o.start_ns, o.end_ns FROM os_calls o
            JOIN launcher l ON o.trace_id = l.trace_id AND o.pid IS NOT DISTINCT FROM l.pid
            WHERE o.name IN ({opens}) OR o.name IN ({waits})),
        inside AS (   -- each OS call in the gap it starts in (gaps do not overlap)
            SELECT g.trace_id, g.s, g.e, g.closer, os.tid, os.name, os.start_ns, os.end_ns
            FROM os ASOF JOIN gaps g ON g.trace_id = os.trace_id AND g.s <= os.start_ns
            WHERE os.start_ns < g.e)
        SELECT trace_id, s, e FROM inside
        GROUP BY trace_id, s, e
        HAVING bool_or(name IN ({opens}))
            OR 2 * COALESCE(sum(least(end_ns, e) - start_ns)
                            FILTER (tid IS NOT DISTINCT FROM closer AND name IN ({waits})), 0)
               >= e - s""")


def _launchers_cte() -> str:
    """SQL CTE `launchers(trace_id, pid, tid)`: the threads that make at least LAUNCHER_SHARE
    of their process's kernel launches."""
    return f"""per_thread AS (
            SELECT trace_id, pid, tid, count(*) AS n FROM runtime_calls WHERE is_launch
            GROUP BY trace_id, pid, tid),
        launchers AS (
            SELECT trace_id, pid, tid FROM per_thread
            QUALIFY n >= {LAUNCHER_SHARE} * sum(n) OVER (PARTITION BY trace_id, pid))"""


def host_work_gaps_sql() -> str:
    """SQL: the stretches (trace_id, s, e) of _host_work_gaps, from the launching threads'
    calls grouped by time bins of HOST_WORK_GAP_NS (valid when no call ends before it starts;
    see _host_work_gaps)."""
    return f"""
        WITH {_launchers_cte()},
        calls AS (
            SELECT r.trace_id, r.start_ns, r.end_ns
            FROM runtime_calls r JOIN launchers l
              ON l.trace_id = r.trace_id AND l.pid IS NOT DISTINCT FROM r.pid
             AND l.tid IS NOT DISTINCT FROM r.tid
            WHERE r.start_ns IS NOT NULL AND r.end_ns IS NOT NULL),
        origin AS (SELECT trace_id, min(start_ns) AS o FROM calls GROUP BY trace_id),
        bins AS (
            SELECT c.trace_id, min(c.start_ns) AS first_start, max(c.end_ns) AS last_end
            FROM calls c JOIN origin USING (trace_id)
            GROUP BY c.trace_id, (c.start_ns - origin.o) // {HOST_WORK_GAP_NS}),
        after AS (
            SELECT trace_id, first_start,
                   max(last_end) OVER (PARTITION BY trace_id ORDER BY first_start
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
            FROM bins)
        SELECT trace_id, prev_end AS s, first_start AS e FROM after
        WHERE prev_end IS NOT NULL AND first_start - prev_end >= {HOST_WORK_GAP_NS}"""


def host_work_gaps_by_call_sql() -> str:
    """SQL: the same stretches from every call in time order (each call's gap to the latest
    end of the calls before it): the definition, for traces with a call that ends before it
    starts."""
    return f"""
        WITH {_launchers_cte()},
        calls AS ({_calls_after_previous("launchers", by_thread=True)})
        SELECT trace_id, prev_end AS s, start_ns AS e FROM calls
        WHERE prev_end IS NOT NULL AND start_ns - prev_end >= {HOST_WORK_GAP_NS}"""


def _host_work_gaps(con: duckdb.DuckDBPyConnection) -> None:
    """_host_work_gaps(trace_id, s, e): stretches of HOST_WORK_GAP_NS or more in which no
    launching thread makes a CUDA call. A launching thread makes at least LAUNCHER_SHARE of
    its process's kernel launches: the main thread, and the autograd engine's thread, which
    launches the backward pass (on an H200 ResNet-50 step, 450 kernels in 25 ms that the main
    thread did not launch). A thread that only copies (pin memory) does not end a stretch.

    By definition, a stretch runs from the latest end of the calls before a call (in order of
    start, then end) to that call's start. Sorting every call (20 M on a 10 M-kernel export)
    is not needed for it: in a bin of HOST_WORK_GAP_NS (counted from the trace's first call)
    only the call that starts first can open a stretch, since every later call of the bin
    starts less than HOST_WORK_GAP_NS after that one's end (when no call ends before it
    starts). So the calls are grouped by bin (first start, last end), and the bins, far fewer,
    are sorted instead: the stretches are the same. A trace with a call that ends before it
    starts takes the definition itself."""
    backwards = con.execute("SELECT count(*) FROM runtime_calls WHERE end_ns < start_ns").fetchone()[0]
    sql = host_work_gaps_by_call_sql() if backwards else host_work_gaps_sql()
    con.execute(f"CREATE OR REPLACE TEMP TABLE _host_work_gaps AS {sql}")


def _launchers_waiting(con: duckdb.DuckDBPyConnection) -> None:
    """_launchers_waiting(trace_id, s, e): stretches in which every launching thread (as in
    _host_work_gaps) waits in the OS. One thread's wait is not enough: a training step has two
    launching threads, the main thread and the autograd engine's, and each waits while the
    other works (on an H200, the engine thread's wait for the next backward spanned the main
    thread's 13 ms of CPU post-processing, which then read as idle instead of host work).
    A thread's own nested or overlapping waits are merged first, so that each thread counts once."""
    waits = ", ".join(f"'{c}'" for c in OS_WAIT_CALLS)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _launchers_waiting AS
        WITH {_launchers_cte()},
        counted AS (SELECT trace_id, count(*) AS threads FROM launchers GROUP BY trace_id),
        waits AS (
            SELECT o.trace_id, o.pid, o.tid, o.start_ns AS s, o.end_ns AS e,
                   max(o.end_ns) OVER (PARTITION BY o.trace_id, o.pid, o.tid ORDER BY o.start_ns, o.end_ns
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_e
            FROM os_calls o JOIN launchers l
              ON l.trace_id = o.trace_id AND l.pid IS NOT DISTINCT FROM o.pid
             AND l.tid IS NOT DISTINCT FROM o.tid
            WHERE o.name IN ({waits}) AND o.start_ns IS NOT NULL AND o.end_ns > o.start_ns),
        islands AS (
            SELECT *, sum(CASE WHEN prev_e IS NULL OR s > prev_e THEN 1 ELSE 0 END)
                          OVER (PARTITION BY trace_id, pid, tid ORDER BY s, e) AS island
            FROM waits),
        merged AS (
            SELECT trace_id, min(s) AS s, max(e) AS e FROM islands
            GROUP BY trace_id, pid, tid, island),
        edges AS (
            SELECT trace_id, s AS ts, 1 AS d FROM merged
            UNION ALL SELECT trace_id, e, -1 FROM merged),
        points AS (SELECT trace_id, ts, sum(d) AS d FROM edges GROUP BY trace_id, ts),
        running AS (
            SELECT trace_id, ts, lead(ts) OVER w AS next_ts, sum(d) OVER w AS waiting
            FROM points
            WINDOW w AS (PARTITION BY trace_id ORDER BY ts ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))
        SELECT r.trace_id, r.ts AS s, r.next_ts AS e FROM running r JOIN counted c USING (trace_id)
        WHERE r.waiting >= c.threads AND r.next_ts > r.ts""")


# Per trace: whether it has a GPU timeline (kernels or copies), which decides what a segment
# where nothing ran is (bucket_case): the breakdown and the HTML report's segments use it.
HAS_GPU_SQL = """
    SELECT trace_id, bool_or(n > 0) AS has_gpu FROM (
        SELECT trace_id, 0 AS n FROM inputs
        UNION ALL SELECT trace_id, count(*) FROM kernels GROUP BY trace_id
        UNION ALL SELECT trace_id, count(*) FROM memcpy GROUP BY trace_id)
    GROUP BY trace_id"""


def bucket_case(has_gpu: str) -> str:
    """The bucket of one sweep segment (its kind flags k, n, c, d, y, p, w, g), as SQL;
    `has_gpu` is the SQL expression that says whether its trace has a GPU timeline."""
    return f"""
                CASE WHEN {has_gpu} THEN
                    -- A sync's drained-queue shadow ends where a stretch without CUDA calls
                    -- begins: the host then works (or sleeps) on something else, and the GPU
                    -- waits for that, not for the round trip (a frame read after a read-back).
                    CASE WHEN k THEN 'compute' WHEN n THEN 'comm' WHEN c THEN 'copy'
                         WHEN d THEN 'data' WHEN y AND NOT g THEN 'sync' WHEN w THEN 'idle'
                         WHEN p AND g THEN 'host' WHEN p THEN 'launch' ELSE 'idle' END
                ELSE CASE WHEN d THEN 'data' WHEN n THEN 'comm' WHEN p THEN 'compute' ELSE 'idle' END
                END"""


def sync_cycles_sql(streaming: bool = False) -> str:
    """SQL: the sync cycles (trace_id, s, e) whose stretch counts as sync (see compute_breakdown).
    With streaming (where streaming_windows holds), the running count is one streaming pass
    over the marks sorted by thread and time, not a window partitioned by thread (1.6 against
    0.66 CPU s on a 5 M-kernel export): it is never reset between threads, which changes
    nothing, since a cycle's two marks are of one thread and only their difference counts."""
    # Sync cycles: from a sync's end to the same thread's next sync, when the host queued at
    # most MAX_LAUNCHES_BETWEEN_SYNCS operations in between. The operations before each of the
    # two times are counted in one sorted pass over the thread's operations and the cycles'
    # ends (an end sorts before an operation at the same time: "before" is strict), not by
    # joining every sync to every call of its thread, which grows with the square of the
    # trace's length. Threads are partitions: a NULL pid or tid is one thread, as in
    # IS NOT DISTINCT FROM.
    counted = ("""
            SELECT cycle, at_next,
                   sum(op) OVER (ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS ops_before
            FROM (SELECT * FROM marks ORDER BY trace_id, pid, tid, ts, op)""" if streaming else """
            SELECT cycle, at_next,
                   sum(op) OVER (PARTITION BY trace_id, pid, tid ORDER BY ts, op
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS ops_before
            FROM marks""")
    return f"""
        WITH y AS (
            SELECT trace_id, pid, tid, start_ns, end_ns,
                   lead(start_ns) OVER (PARTITION BY trace_id, pid, tid ORDER BY start_ns) AS next_sync
            FROM sync_events),
        cycles AS (
            SELECT row_number() OVER () AS cycle, trace_id, pid, tid, end_ns, next_sync
            FROM y WHERE next_sync > end_ns),
        marks AS (
            SELECT trace_id, pid, tid, start_ns AS ts, 1 AS op, NULL::BIGINT AS cycle,
                   NULL::BOOLEAN AS at_next
            FROM runtime_calls
            WHERE start_ns IS NOT NULL
              AND (is_launch OR name ILIKE '%memcpy%' OR name ILIKE '%memset%')
            UNION ALL SELECT trace_id, pid, tid, end_ns, 0, cycle, false FROM cycles
            UNION ALL SELECT trace_id, pid, tid, next_sync, 0, cycle, true FROM cycles),
        counted AS ({counted}),
        per_cycle AS (
            SELECT c.trace_id, c.end_ns, c.next_sync,
                   max(n.ops_before) FILTER (n.at_next) - max(n.ops_before) FILTER (NOT n.at_next) AS n
            FROM cycles c JOIN counted n ON n.cycle = c.cycle
            GROUP BY c.cycle, c.trace_id, c.end_ns, c.next_sync)
        SELECT trace_id, end_ns AS s, next_sync AS e
        FROM per_cycle
        GROUP BY trace_id, end_ns, next_sync
        HAVING sum(n) <= {MAX_LAUNCHES_BETWEEN_SYNCS}"""


# Codes of the sweep's edges besides the kinds' (+/- 1 + the kind's place in _KINDS): the
# start of a step that has an end (after its start: _STEP_START, else _EMPTY_STEP_START) and
# the end of a step that has a start before it (_STEP_END); other step edges are code 0.
_STEP_START, _STEP_END, _EMPTY_STEP_START = 9, 10, 11


def _sweep_edges(where: str) -> tuple[str, str]:
    """(edges SQL (trace_id, ts, code) of _iv and steps, the running count vector's delta
    expression): see sweep_sql."""
    codes = ("CASE kind " + " ".join(f"WHEN '{k}' THEN {i + 1}" for i, k in enumerate(_KINDS))
             + " ELSE 0 END")
    delta = ("CASE code " + " ".join(
        f"WHEN {i + 1} THEN CAST(1 AS HUGEINT) << {_COUNT_BITS * i} "
        f"WHEN {-(i + 1)} THEN -(CAST(1 AS HUGEINT) << {_COUNT_BITS * i})"
        for i in range(len(_KINDS))) + " ELSE CAST(0 AS HUGEINT) END")
    edges = f"""
            SELECT trace_id, s AS ts, ({codes})::TINYINT AS code FROM _iv {where}
            UNION ALL SELECT trace_id, e, (-({codes}))::TINYINT FROM _iv {where}
            UNION ALL SELECT trace_id, start_ns,
                             (CASE WHEN end_ns > start_ns THEN {_STEP_START}
                                   WHEN end_ns IS NOT NULL THEN {_EMPTY_STEP_START} ELSE 0 END)::TINYINT
            FROM steps {where}
            UNION ALL SELECT trace_id, end_ns,
                             (CASE WHEN end_ns > start_ns THEN {_STEP_END} ELSE 0 END)::TINYINT
            FROM steps {where}"""
    return edges, delta


def _flags(n: str = "n") -> str:
    mask = (1 << _COUNT_BITS) - 1
    return ", ".join(f"(({n} >> {_COUNT_BITS * i}) & {mask}) > 0 AS {k}" for i, k in enumerate(_KINDS))


def sweep_sql(traces: list[int] | None = None) -> str:
    """SQL: the sweep's segments (trace_id, ts, next_ts, len, the kind flags k, n, c, d, y, p,
    w, g, step_start) from the intervals in _iv (trace_id, kind, s, e; none empty) and the
    steps: with `traces`, each of those traces' edges sorted once and summed in one streaming
    pass (see below); without, one window ordered by time, partitioned by trace.

    Elementary segments between consecutive boundaries, with how many intervals of each kind
    cover them (running sums of +1/-1 at starts/ends). Step edges are boundaries too, so no
    segment straddles a step edge; step_start is the start of the last step started (a
    running max over the starts of steps that have an end). The kinds' counts travel packed
    in one HUGEINT (_COUNT_BITS bits each), so that one running sum does the work of eight:
    every prefix sum is a vector of non-negative counts below 2**_COUNT_BITS, so the fields
    never carry, and partial sums stay far inside HUGEINT's range (at most 2**26 edges times
    2**100). An edge carries only a one-byte code (its kind's, or a step edge's): the HUGEINT
    and the step start are made from it and its time inside the running aggregates, so the
    rows sorted are narrow (9 bytes).

    Edges at the same time are not grouped first: of the edges at one time, only the last in
    the sort has a later next edge (lead), and its running sums already hold all of them, so
    it alone makes the segment that starts there (the others are zero-length and dropped).
    Grouping by time took a third of the sweep, for nothing: nearly every edge has a time of
    its own.

    The streaming pass: `OVER ()` with a running frame over rows sorted by time is DuckDB's
    streaming window, which takes the rows one after the other in the order the sort gives
    them; an ordered window over the same rows builds a segment tree for each running
    aggregate and took twice the time (3.2 against 1.5 CPU s on a 5 M-kernel export). A
    window without an order has no order of its own in SQL: compute_breakdown uses this form
    only where DuckDB plans such windows as its streaming window (streaming_windows)."""
    step_mark = f"CASE WHEN code IN ({_STEP_START}, {_EMPTY_STEP_START}) THEN ts END"

    def segments(running: str) -> str:
        return f"""
            SELECT trace_id, ts, next_ts, next_ts - ts AS len, {_flags()}, step_start
            FROM ({running}) WHERE next_ts IS NOT NULL AND next_ts > ts"""

    if traces is None:
        edges, delta = _sweep_edges("")
        return segments(f"""
            SELECT trace_id, ts, lead(ts) OVER w AS next_ts,
                   sum({delta}) OVER w AS n, max({step_mark}) OVER w AS step_start
            FROM ({edges})
            WINDOW w AS (PARTITION BY trace_id ORDER BY ts
                         ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)""")
    if not traces:
        return segments("""
            SELECT NULL::INTEGER AS trace_id, NULL::BIGINT AS ts, NULL::BIGINT AS next_ts,
                   NULL::HUGEINT AS n, NULL::BIGINT AS step_start WHERE false""")
    parts = []
    for t in traces:
        edges, delta = _sweep_edges(f"WHERE trace_id = {int(t)}")
        parts.append(segments(f"""
            SELECT {int(t)} AS trace_id, ts, lead(ts) OVER () AS next_ts,
                   sum({delta}) OVER w AS n, max({step_mark}) OVER w AS step_start
            FROM (SELECT ts, code FROM ({edges}) ORDER BY ts)
            WINDOW w AS (ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"""))
    return "\n            UNION ALL ".join(parts)


def step_time_sql(traces: list[int]) -> str:
    """SQL: (trace_id, step_start, n, len): how long, inside each step, each vector of kind
    counts held (n as in sweep_sql), for traces whose steps do not overlap, from each trace's
    edges streamed in time order (streaming_windows must hold).

    The same sweep as sweep_sql, summed while it streams rather than written segment by
    segment: each segment is inside the step whose start is the last step edge before it
    (steps do not overlap), else in no step; its time is added to that step's total for its
    count vector (a few dozen per step), and only those totals are bucketed. The last step
    edge travels as a running max of 2 * time (+ 1 for a start: a start wins over an end at the
    same time, where one step ends and the next begins). Empty steps and steps without a start
    or an end hold no segment and leave no mark, as in sweep_sql (where a segment counts in
    the step of step_start when it ends by that step's end)."""
    mark = f"CASE code WHEN {_STEP_START} THEN 2 * ts + 1 WHEN {_STEP_END} THEN 2 * ts END"
    parts = []
    for t in traces:
        edges, delta = _sweep_edges(f"WHERE trace_id = {int(t)}")
        parts.append(f"""
            SELECT {int(t)} AS trace_id, (m - 1) // 2 AS step_start, n, sum(next_ts - ts) AS len
            FROM (SELECT ts, lead(ts) OVER () AS next_ts, sum({delta}) OVER w AS n,
                         max({mark}) OVER w AS m
                  FROM (SELECT ts, code FROM ({edges}) ORDER BY ts)
                  WINDOW w AS (ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))
            WHERE next_ts > ts AND m % 2 <> 0
            GROUP BY ALL""")
    return "\n            UNION ALL ".join(parts) if parts else """
            SELECT NULL::INTEGER AS trace_id, NULL::BIGINT AS step_start, NULL::HUGEINT AS n,
                   NULL::HUGEINT AS len WHERE false"""


def streaming_windows(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether this DuckDB runs LEAD and running sums and maxima `OVER ()` over rows sorted
    in a subquery as its streaming window, which takes the rows one after the other in the
    order the sort gives them (and keeps the order of rows: preserve_insertion_order). The
    sweep and the sync cycles then sum their sorted rows in one pass instead of building a
    segment tree per running aggregate; otherwise they use windows ordered by time."""
    global _streaming_plan
    if not con.execute("SELECT current_setting('preserve_insertion_order')").fetchone()[0]:
        return False
    if _streaming_plan is None:   # the plan is the DuckDB library's: asked once per process
        plan = "".join(r[1] for r in con.execute("""
            EXPLAIN SELECT lead(x) OVER (), sum(x) OVER w, max(x) OVER w
            FROM (SELECT x FROM range(10) t(x) ORDER BY x)
            WINDOW w AS (ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)""").fetchall())
        plan = re.sub(r"[^A-Z]", "", plan.upper())
        _streaming_plan = "STREAMINGWINDOW" in plan and plan.count("WINDOW") == plan.count("STREAMINGWINDOW")
    return _streaming_plan


_streaming_plan: bool | None = None


# The host's busy intervals (kind 'p' of the sweep; the rows of _iv from them).
# (Without host ops, the steps below already make every instant of every step busy: the CUDA
# calls would only add boundaries, and millions of rows to the sweep.)
_HOST_INTERVALS = """
        SELECT trace_id, 'p' AS kind, start_ns AS s, end_ns AS e FROM runtime_calls
            WHERE trace_id IN (SELECT DISTINCT trace_id FROM cpu_ops)
        UNION ALL SELECT trace_id, 'p', start_ns, end_ns FROM cpu_ops
        -- No host ops traced (nsys): the launching threads are busy through the steps...
        UNION ALL SELECT trace_id, 'p', start_ns, end_ns FROM steps
            WHERE trace_id NOT IN (SELECT DISTINCT trace_id FROM cpu_ops)
        -- ... except while they wait in the OS ('w' in _iv)
        """


def _drop_nested(con: duckdb.DuckDBPyConnection) -> None:
    """Into _iv, the host's intervals (_HOST_INTERVALS, none empty) but for those that lie
    inside another of the same trace, for step_time_sql only (streaming_windows must hold).
    Its per-step totals read a count vector only through its flags (`> 0`, bucket_case), and
    where a nested interval counts, the one holding it counts too, so every flag, and every
    step's time per bucket, is the same without it; only the count vectors' values (which
    step_time_sql groups by and never shows) and the number of edges change. Host intervals
    nest deeply (every CPU op, Python function and CUDA call): on the 1 GB trace 2.47 M of
    the 2.63 M intervals (4.9 M of the sweep's 5.3 M edges), of which 1035 are left.

    An interval is kept when it ends at or after every interval of its trace sorted before it
    by start (a running max of the ends): one that ends before lies inside one that started
    no later and ends later. Which of several equal intervals stay does not matter. The rows
    are taken in start order by DuckDB's streaming window, as step_time_sql's."""
    host = f"SELECT * FROM ({_HOST_INTERVALS}) WHERE s IS NOT NULL AND e IS NOT NULL AND e > s"
    traces = [r[0] for r in con.execute(f"""
        SELECT DISTINCT trace_id FROM ({host}) WHERE trace_id IS NOT NULL ORDER BY 1""").fetchall()]
    # (rows without a trace, which the sweep of each trace never reads, stay as they are)
    kept = [f"SELECT * FROM ({host}) WHERE trace_id IS NULL"] + [f"""
            SELECT {int(t)}, 'p', s, e FROM (
                SELECT s, e, max(e) OVER (ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS last_end
                FROM (SELECT s, e FROM ({host}) WHERE trace_id = {int(t)} ORDER BY s))
            WHERE e >= last_end""" for t in traces]
    con.execute("INSERT INTO _iv " + "\n            UNION ALL ".join(kept))


def compute_breakdown(con: duckdb.DuckDBPyConnection, keep_segments: bool = False) -> None:
    """Fill step_breakdown. With keep_segments, the sweep's segments stay in the temp table
    _seg (trace_id, ts, next_ts, len, the kind flags, step_start) for the caller to read
    (the HTML report's step timelines) and drop."""
    con.execute(BREAKDOWN_DDL)
    _gap_tables(con)
    # Where the per-step totals are summed as the sweep streams (below), the host's intervals
    # that lie inside another are left out of it (_drop_nested): they go into _iv after
    # the others, without those.
    overlapping = steps_overlap(con, "start_ns", "end_ns")
    streaming = streaming_windows(con)
    drop_nested = streaming and not keep_segments and not overlapping
    _intervals(con, drop_nested)
    per_step, segments = _per_step_sql(con, keep_segments, overlapping, streaming, drop_nested)
    _insert_breakdown(con, per_step, segments)
    con.execute("DROP TABLE _iv")
    for t in ("_gpu_starts", "_sync_cycles", "_host_work_gaps") + (
            () if keep_segments or not overlapping else ("_seg",)):
        con.execute(f"DROP TABLE {t}")


def _gap_tables(con: duckdb.DuckDBPyConnection) -> None:
    """The derived intervals the sweep reads besides the activity tables: GPU starts, sync
    cycles, input gaps, host-work gaps and launchers waiting."""
    # Intervals by kind. k=kernel, c=copy, d=data wait, y=sync (+ its drained-queue shadow),
    # p=host busy. The shadow runs from a sync's end to the GPU's next start (an ASOF join).
    with phase("breakdown.gpu_starts"):
        con.execute("""
        CREATE OR REPLACE TEMP TABLE _gpu_starts AS
        SELECT trace_id, start_ns FROM kernels
        UNION ALL SELECT trace_id, start_ns FROM memcpy
        UNION ALL SELECT trace_id, start_ns FROM memset""")
    with phase("breakdown.sync_cycles"):
        con.execute("CREATE OR REPLACE TEMP TABLE _sync_cycles AS "
                    + sync_cycles_sql(streaming_windows(con)))
    with phase("breakdown.input_gaps"):
        _input_gaps(con)
    with phase("breakdown.host_work_gaps"):
        _host_work_gaps(con)
    with phase("breakdown.launchers_waiting"):
        _launchers_waiting(con)


def _intervals(con: duckdb.DuckDBPyConnection, drop_nested: bool) -> None:
    """_iv: every interval by kind, the sweep's input (nested host intervals left out where
    drop_nested)."""
    with phase("breakdown.intervals"):
        con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _iv AS
        SELECT trace_id, 'k' AS kind, start_ns AS s, end_ns AS e FROM kernels
            WHERE NOT COALESCE(is_communication, FALSE)
        UNION ALL SELECT trace_id, 'n', start_ns, end_ns FROM kernels WHERE is_communication
        -- host-side collectives (gloo, MPI): the host is blocked exchanging data
        UNION ALL SELECT trace_id, 'n', start_ns, end_ns FROM cpu_ops WHERE {HOST_COLLECTIVE}
        UNION ALL SELECT trace_id, 'n', start_ns, end_ns FROM nvtx_ranges WHERE {HOST_COLLECTIVE}
        UNION ALL SELECT trace_id, 'g', s, e FROM _host_work_gaps
        UNION ALL SELECT trace_id, 'c', start_ns, end_ns FROM memcpy
        UNION ALL SELECT trace_id, 'c', start_ns, end_ns FROM memset
        UNION ALL SELECT trace_id, 'd', start_ns, end_ns FROM dataloader_waits
        UNION ALL SELECT trace_id, 'd', s, e FROM _input_gaps
        UNION ALL SELECT trace_id, 'y', start_ns, end_ns FROM sync_events
        UNION ALL SELECT y.trace_id, 'y', y.end_ns, g.start_ns
            FROM sync_events y ASOF JOIN _gpu_starts g
            ON y.trace_id = g.trace_id AND g.start_ns >= y.end_ns
        UNION ALL SELECT trace_id, 'y', s, e FROM _sync_cycles
        UNION ALL SELECT trace_id, 'w', s, e FROM _launchers_waiting
        {"" if drop_nested else "UNION ALL " + _HOST_INTERVALS}
    """)
    con.execute("DROP TABLE _input_gaps")
    con.execute("DROP TABLE _launchers_waiting")
    con.execute("DELETE FROM _iv WHERE s IS NULL OR e IS NULL OR e <= s")
    if drop_nested:
        with phase("breakdown.host_intervals"):
            _drop_nested(con)


def _per_step_sql(con: duckdb.DuckDBPyConnection, keep_segments: bool, overlapping: bool,
                  streaming: bool, drop_nested: bool) -> tuple[str, str | None]:
    """The per-step totals' query, and where its segments are ('_seg', a subquery, or None
    where they are summed as the sweep streams)."""
    # Each segment counts in every step that contains it. When a trace's steps do not overlap
    # (the rule), the only candidate is the last step starting at or before the segment: the
    # sweep carries it along (a running max of the step starts passed), and the segment is
    # counted when it also ends inside that step. Traces whose steps overlap keep the general
    # range join.
    traces = [r[0] for r in con.execute("""
        SELECT DISTINCT trace_id FROM (SELECT trace_id FROM _iv UNION ALL SELECT trace_id FROM steps)
        WHERE trace_id IS NOT NULL ORDER BY trace_id""").fetchall()]
    sums = ", ".join(f"sum(len) FILTER (bucket = '{b}') AS {b}_ns" for b in BUCKETS)
    if drop_nested:
        # The usual case: each step's time per count vector, summed as the sweep streams;
        # no segment is written (21 M segments at 10 M kernels).
        segments = None
        per_step = f"""
            SELECT st.trace_id, st.start_ns, st.end_ns, {sums}
            FROM (SELECT v.trace_id, v.step_start, v.len, {bucket_case('g.has_gpu')} AS bucket
                  FROM (SELECT trace_id, step_start, len, {_flags()}
                        FROM ({step_time_sql(traces)})) v
                  JOIN gpu g USING (trace_id)) b
            JOIN steps st ON st.trace_id = b.trace_id AND st.start_ns = b.step_start
            GROUP BY st.trace_id, st.start_ns, st.end_ns"""
    else:
        # The segments become a table where something reads them twice or more: the HTML
        # report's timelines, or the range join of overlapping steps.
        sweep = sweep_sql(traces if streaming else None)
        if keep_segments or overlapping:
            with phase("breakdown.sweep"):
                con.execute(f"CREATE OR REPLACE TEMP TABLE _seg AS {sweep}")
            segments = "_seg"
        else:
            segments = f"({sweep})"
        bucketed = f"""(
            SELECT s.trace_id, s.ts, s.next_ts, s.len, s.step_start,
                   {bucket_case('g.has_gpu')} AS bucket
            FROM {segments} s JOIN gpu g USING (trace_id))"""
        if overlapping:
            per_step = f"""
            SELECT st.trace_id, st.start_ns, st.end_ns, {sums}
            FROM (SELECT DISTINCT trace_id, start_ns, end_ns FROM steps) st
            JOIN {bucketed} b ON b.trace_id = st.trace_id AND b.ts >= st.start_ns
                           AND b.next_ts <= st.end_ns
            GROUP BY st.trace_id, st.start_ns, st.end_ns"""
        else:
            per_step = f"""
            SELECT st.trace_id, st.start_ns, st.end_ns, {sums}
            FROM {bucketed} b JOIN (SELECT trace_id, start_ns, end_ns FROM steps
                                    WHERE start_ns IS NOT NULL AND end_ns IS NOT NULL) st
              ON st.trace_id = b.trace_id AND st.start_ns = b.step_start
            WHERE b.next_ts <= st.end_ns
            GROUP BY st.trace_id, st.start_ns, st.end_ns"""
    return per_step, segments


def _insert_breakdown(con: duckdb.DuckDBPyConnection, per_step: str, segments: str | None) -> None:
    # Like the range join over steps always did, a step listed twice gets its segments twice.
    with phase("breakdown.per_step" if segments == "_seg" else "breakdown.sweep_and_per_step"):
        con.execute(f"""
        INSERT INTO step_breakdown
        WITH gpu AS ({HAS_GPU_SQL}),
        per_step AS ({per_step})
        SELECT st.trace_id, st.source, st.step_num, st.start_ns, st.end_ns, st.dur_ns,
            COALESCE(sum(ps.compute_ns), 0),
            COALESCE(sum(ps.comm_ns), 0),
            COALESCE(sum(ps.copy_ns), 0),
            COALESCE(sum(ps.data_ns), 0),
            COALESCE(sum(ps.sync_ns), 0),
            COALESCE(sum(ps.launch_ns), 0),
            COALESCE(sum(ps.host_ns), 0),
            COALESCE(sum(ps.idle_ns), 0),
            any_value(g.has_gpu)
        FROM steps st JOIN gpu g USING (trace_id)
        LEFT JOIN per_step ps ON ps.trace_id = st.trace_id AND ps.start_ns = st.start_ns
                             AND ps.end_ns = st.end_ns
        GROUP BY st.trace_id, st.source, st.step_num, st.start_ns, st.end_ns, st.dur_ns""")
