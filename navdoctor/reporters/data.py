"""What the HTML report draws, gathered from the trace store while analysis still has it open.

Summaries only, never raw events: the per-step buckets, two step timelines (a typical step and
the slowest one) downsampled to at most TIMELINE_MAX_ITEMS drawn items each, the top kernels and
operators, GPU memory per step. All times stay in nanoseconds (the store's unit); the renderer
converts them for display.

`capture_step_segments` runs right after the breakdown (its sweep segments are dropped then);
`gather` after the verdict: HtmlViews passes them to the analysis as its store reader
(analysis.StoreReader), given only where an HTML report was asked for.
"""
from __future__ import annotations

from typing import Any

import duckdb

from .. import breakdown, store

TIMELINE_MAX_ITEMS = 2500   # drawn boxes per timeline, all lanes together
TIMELINE_RESOLUTION = 2000  # a step is cut into this many bins for merging tiny events
TOP_N = 30                  # rows of the kernel and operator tables
MEMORY_MAX_STEPS = 2000     # memory points (one per step) at most
STEP_BARS_MAX = 3000        # steps drawn per trace at most (the slowest are always kept)
BUDGET_RULE = "realtime-frame-budget"

# Event kinds of the timelines and the bucket whose colour each one takes.
KIND_BUCKET = {"kernel": "compute", "comm kernel": "comm", "memcpy": "copy", "memset": "copy",
               "CUDA call": "launch", "sync call": "sync", "DataLoader wait": "data"}


class HtmlViews:
    """The analysis's store reader (analysis.StoreReader) for the HTML report: `data` holds
    what the page draws once the analysis is done."""
    keep_segments = True

    def __init__(self) -> None:
        self.data: dict | None = None

    def after_breakdown(self, con: duckdb.DuckDBPyConnection) -> None:
        capture_step_segments(con)

    def after_verdict(self, con: duckdb.DuckDBPyConnection, rules: list, verdict,
                      progress=lambda m: None) -> None:
        progress("gathering the HTML report's views")
        self.data = gather(con, rules, verdict.primary_trace)


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: Any = None) -> list[dict]:
    cur = con.execute(sql, params) if params is not None else con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def _chosen_steps(con: duckdb.DuckDBPyConnection) -> list[dict]:
    """Per trace, the typical step (the middle one by duration) and the slowest."""
    return _rows(con, """
        WITH b AS (
            SELECT trace_id, step_num, start_ns, end_ns, step_ns,
                   row_number() OVER (PARTITION BY trace_id ORDER BY step_ns, step_num) AS r,
                   count(*) OVER (PARTITION BY trace_id) AS n
            FROM step_breakdown WHERE step_ns > 0 AND start_ns IS NOT NULL AND end_ns IS NOT NULL)
        SELECT trace_id, 'typical' AS which, step_num, start_ns, end_ns, step_ns FROM b
            WHERE r = (n + 1) // 2
        UNION ALL
        SELECT trace_id, 'slowest', step_num, start_ns, end_ns, step_ns FROM b WHERE r = n
        ORDER BY trace_id, which DESC""")


def capture_step_segments(con: duckdb.DuckDBPyConnection) -> None:
    """Keep the bucketed sweep segments of the typical and the slowest step of every trace
    (adjacent segments of one bucket joined) in _report_segments, and drop the sweep's _seg."""
    chosen = _chosen_steps(con)
    con.execute("CREATE OR REPLACE TEMP TABLE _report_steps (trace_id INTEGER, which VARCHAR, "
                "step_num INTEGER, start_ns BIGINT, end_ns BIGINT, step_ns BIGINT)")
    store.insert_rows(con, "_report_steps",
                      [[c[k] for k in ("trace_id", "which", "step_num", "start_ns", "end_ns",
                                       "step_ns")] for c in chosen])
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _report_segments AS
        WITH gpu AS ({breakdown.HAS_GPU_SQL}),
        seg AS (
            SELECT st.which, s.trace_id, s.ts, s.next_ts, {breakdown.bucket_case('g.has_gpu')} AS bucket
            FROM _seg s JOIN gpu g USING (trace_id)
            JOIN _report_steps st ON st.trace_id = s.trace_id AND s.ts >= st.start_ns
                                 AND s.next_ts <= st.end_ns),
        runs AS (
            SELECT *, sum(CASE WHEN bucket IS DISTINCT FROM prev_bucket OR ts <> prev_end
                               THEN 1 ELSE 0 END)
                          OVER (PARTITION BY trace_id, which ORDER BY ts) AS island
            FROM (SELECT *, lag(bucket) OVER w AS prev_bucket, lag(next_ts) OVER w AS prev_end
                  FROM seg WINDOW w AS (PARTITION BY trace_id, which ORDER BY ts)))
        SELECT trace_id, which, bucket, min(ts) AS s, max(next_ts) AS e
        FROM runs GROUP BY trace_id, which, bucket, island""")
    con.execute("DROP TABLE IF EXISTS _seg")


# ---- downsampling --------------------------------------------------------------------------

def _downsample(con: duckdb.DuckDBPyConnection, source_sql: str, start: int, end: int,
                params: dict) -> tuple[list[dict], int, int]:
    """Boxes to draw for the intervals of `source_sql` (lane, kind, name, s, e) within
    [start, end): each interval at least one bin long (the step / TIMELINE_RESOLUTION) is drawn
    as itself; shorter ones are merged per lane and bin into one box that says how many it
    holds and takes the kind of its longest one (so that a lane whose intervals do not overlap
    gets boxes that do not overlap either). When that still exceeds TIMELINE_MAX_ITEMS, the bins double. Returns the boxes,
    the number of intervals and the bin width."""
    span = max(end - start, 1)
    width = max(span // TIMELINE_RESOLUTION, 1)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _tl AS
        SELECT lane, kind, name, greatest(s, $start) AS s, least(e, $end) AS e
        FROM ({source_sql}) WHERE e > $start AND s < $end AND e >= s""",
                dict(params, start=start, end=end))
    total = con.execute("SELECT count(*) FROM _tl").fetchone()[0]
    while True:
        boxes = _rows(con, """
            WITH big AS (SELECT lane, kind, name, s, e, 1 AS n, e - s AS busy FROM _tl
                         WHERE e - s >= $w),
            small AS (SELECT lane, arg_max(kind, e - s) AS kind, (s - $start) // $w AS bin,
                             min(s) AS s, max(e) AS e, count(*) AS n, sum(e - s) AS busy,
                             any_value(name) AS one
                      FROM _tl WHERE e - s < $w GROUP BY lane, bin)
            SELECT lane, kind, name, s, e, n, busy FROM big
            UNION ALL SELECT lane, kind, CASE WHEN n = 1 THEN one END, s, e, n, busy FROM small
            ORDER BY lane, s""", {"w": width, "start": start})
        if len(boxes) <= TIMELINE_MAX_ITEMS or width >= span:
            break
        width *= 2
    con.execute("DROP TABLE _tl")
    for b in boxes:
        if b["name"] is None:
            b["name"] = f"{b['n']} events merged (the longest: {b['kind']})"
        elif len(b["name"]) > 160:
            b["name"] = b["name"][:157] + "..."
    return boxes, total, width


def _timeline(con: duckdb.DuckDBPyConnection, trace_id: int, step: dict) -> dict:
    start, end = step["start_ns"], step["end_ns"]
    # The launching thread: the one that makes most launch calls (or most CUDA calls).
    launcher = con.execute("""
        SELECT pid, tid FROM runtime_calls WHERE trace_id = $t
        GROUP BY pid, tid ORDER BY count(*) FILTER (WHERE is_launch) DESC, count(*) DESC, pid, tid
        LIMIT 1""", {"t": trace_id}).fetchone()
    gpu_sql = """
        SELECT 'GPU ' || COALESCE(device_id, 0) || ' stream ' || COALESCE(stream_id, 0) AS lane,
               CASE WHEN is_communication THEN 'comm kernel' ELSE 'kernel' END AS kind, name,
               start_ns AS s, end_ns AS e
        FROM kernels WHERE trace_id = $t
        UNION ALL SELECT 'GPU ' || COALESCE(device_id, 0) || ' stream ' || COALESCE(stream_id, 0),
               'memcpy', 'memcpy ' || COALESCE(kind, '?') || ' ' || COALESCE(bytes, 0) || ' B',
               start_ns, end_ns FROM memcpy WHERE trace_id = $t
        UNION ALL SELECT 'GPU ' || COALESCE(device_id, 0) || ' stream ' || COALESCE(stream_id, 0),
               'memset', 'memset ' || COALESCE(bytes, 0) || ' B', start_ns, end_ns
        FROM memset WHERE trace_id = $t"""
    params: dict[str, Any] = {"t": trace_id}
    host_sql = ""
    if launcher is not None:
        params.update(pid=launcher[0], tid=launcher[1])
        thread = "$pid IS NOT DISTINCT FROM pid AND $tid IS NOT DISTINCT FROM tid"
        host_sql = f"""
            UNION ALL SELECT 'host: CUDA calls', 'CUDA call', name, start_ns, end_ns
            FROM runtime_calls WHERE trace_id = $t AND {thread} AND NOT COALESCE(is_sync, FALSE)
            UNION ALL SELECT 'host: syncs and waits', 'sync call', COALESCE(name, kind), start_ns, end_ns
            FROM sync_events WHERE trace_id = $t AND {thread}
            UNION ALL SELECT 'host: syncs and waits', 'DataLoader wait', name, start_ns, end_ns
            FROM dataloader_waits WHERE trace_id = $t AND {thread}"""
    else:
        host_sql = """
            UNION ALL SELECT 'host: DataLoader waits', 'DataLoader wait', name, start_ns, end_ns
            FROM dataloader_waits WHERE trace_id = $t"""
    bucket_sql = """
        UNION ALL SELECT 'step time charged to', bucket, bucket, s, e
        FROM _report_segments WHERE trace_id = $t AND which = $which"""
    params["which"] = step["which"]
    boxes, total, width = _downsample(con, gpu_sql + host_sql + bucket_sql, start, end, params)
    for b in boxes:
        b["s"] -= start
        b["e"] -= start
    lanes = sorted({b["lane"] for b in boxes},
                   key=lambda x: (x != "step time charged to", x.startswith("GPU"), x))
    return {"which": step["which"], "step_num": step["step_num"], "step_ns": step["step_ns"],
            "start_ns": start, "events": total, "drawn": len(boxes), "merge_below_ns": width,
            "lanes": lanes, "boxes": [[b["lane"], b["kind"], b["name"], b["s"], b["e"], b["n"], b["busy"]]
                                      for b in boxes],
            "launcher": None if launcher is None else {"pid": launcher[0], "tid": launcher[1]}}


# ---- the rest ------------------------------------------------------------------------------

def _steps(con: duckdb.DuckDBPyConnection) -> dict[int, dict]:
    cols = ", ".join(f"b.{b}_ns" for b in breakdown.BUCKETS)
    rows = _rows(con, f"""
        SELECT b.trace_id, b.step_num, b.step_ns, {cols},
               st.step_num IS NULL AS stall
        FROM step_breakdown b LEFT JOIN steady_steps st USING (trace_id, step_num)
        WHERE b.step_ns > 0 ORDER BY b.trace_id, b.start_ns, b.step_num""")
    out: dict[int, dict] = {}
    for r in rows:
        t = out.setdefault(r["trace_id"], {"step_num": [], "step_ns": [], "stall": [],
                                           "buckets": {b: [] for b in breakdown.BUCKETS}})
        t["step_num"].append(r["step_num"])
        t["step_ns"].append(r["step_ns"])
        t["stall"].append(bool(r["stall"]))
        for b in breakdown.BUCKETS:
            t["buckets"][b].append(int(r[f"{b}_ns"] or 0))
    for t in out.values():
        n = len(t["step_num"])
        t["steps_total"] = n
        if n > STEP_BARS_MAX:  # keep an even sample, and every stall and the slowest steps
            keep = set(range(0, n, -(-n // STEP_BARS_MAX)))
            keep |= {i for i in range(n) if t["stall"][i]}
            keep |= set(sorted(range(n), key=lambda i: -t["step_ns"][i])[:50])
            idx = sorted(keep)
            for k in ("step_num", "step_ns", "stall"):
                t[k] = [t[k][i] for i in idx]
            t["buckets"] = {b: [v[i] for i in idx] for b, v in t["buckets"].items()}
    return out


def _budget(con: duckdb.DuckDBPyConnection, rules: list, trace_id: int) -> dict | None:
    """The frame budget line: when the budget rule is loaded and the trace is an inference run
    by the rule's own test (no optimizer step, few training kernels)."""
    rule = next((r for r in rules if r.id == BUDGET_RULE), None)
    if rule is None or "budget_ms" not in rule.params:
        return None
    max_training = float(rule.params.get("max_training_share", 0.05))
    row = con.execute("""
        SELECT (SELECT count(*) FROM nvtx_ranges WHERE trace_id = $t AND name LIKE 'Optimizer.step#%'),
               (SELECT COALESCE(sum(n) FILTER (WHERE training_kernel(name)), 0) / nullif(sum(n), 0)
                FROM (SELECT name, count(*) AS n FROM kernels WHERE trace_id = $t GROUP BY name))
        """, {"t": trace_id}).fetchone()
    if row[0] or (row[1] or 0) >= max_training:
        return None
    return {"rule": rule.id, "budget_ns": int(float(rule.params["budget_ms"]) * 1e6)}


def _top_kernels(con: duckdb.DuckDBPyConnection, trace_id: int) -> dict:
    """The kernels with most GPU time in the steady steps. Occupancy where the trace has it;
    else from another trace of the same run that has it for the same kernel name (Kineto
    records it, an nsys export does not), and `occupancy_from` says which."""
    rows = _rows(con, """
        WITH top AS (
            SELECT name, sum(dur_ns) AS total_ns, count(*) AS calls, avg(dur_ns) AS mean_ns,
                   bool_or(uses_tensor_cores) AS tensor_cores, avg(est_occupancy) AS occupancy,
                   bool_or(is_communication) AS communication
            FROM kernels_in_steps WHERE trace_id = $t GROUP BY name
            ORDER BY total_ns DESC, name LIMIT $n),
        other AS (
            SELECT k.name, avg(k.est_occupancy) AS occupancy, min(k.trace_id) AS from_trace
            FROM kernels k WHERE k.trace_id <> $t AND k.est_occupancy IS NOT NULL
              AND k.name IN (SELECT name FROM top WHERE occupancy IS NULL)
            GROUP BY k.name)
        SELECT top.name, total_ns, calls, mean_ns, tensor_cores, communication,
               COALESCE(top.occupancy, other.occupancy) AS occupancy,
               CASE WHEN top.occupancy IS NULL THEN other.from_trace END AS occupancy_from
        FROM top LEFT JOIN other USING (name)
        ORDER BY total_ns DESC, name""", {"t": trace_id, "n": TOP_N})
    tot = con.execute("SELECT sum(dur_ns), count(DISTINCT name) FROM kernels_in_steps "
                      "WHERE trace_id = $t", {"t": trace_id}).fetchone()
    steps = con.execute("SELECT count(*) FROM steady_steps WHERE trace_id = $t",
                        {"t": trace_id}).fetchone()[0]
    return {"trace_id": trace_id, "rows": rows, "total_ns": int(tot[0] or 0), "distinct": tot[1],
            "steps": steps}


def _top_ops(con: duckdb.DuckDBPyConnection, trace_id: int) -> dict:
    rows = _rows(con, """
        SELECT name, sum(dur_ns) AS total_ns, count(*) AS calls, avg(dur_ns) AS mean_ns
        FROM cpu_ops_in_steps WHERE trace_id = $t AND category = 'cpu_op' GROUP BY name
        ORDER BY total_ns DESC, name LIMIT $n""", {"t": trace_id, "n": TOP_N})
    return {"trace_id": trace_id, "rows": rows}


def _memory(con: duckdb.DuckDBPyConnection, trace_id: int) -> dict | None:
    """GPU memory per step: the peak and the low of the allocated bytes, the peak reserved
    (the level a step starts at counts: the last event before it). None when no allocator
    event of the trace falls in a step."""
    rows = _rows(con, """
        WITH st AS (SELECT step_num, start_ns, end_ns FROM step_breakdown
                    WHERE trace_id = $t AND step_ns > 0),
        m AS (SELECT ts_ns, total_allocated, total_reserved FROM memory_events
              WHERE trace_id = $t AND lower(device_type) IN ('cuda', 'gpu')
                AND total_allocated IS NOT NULL AND ts_ns IS NOT NULL),
        inside AS (
            SELECT st.step_num, max(m.total_allocated) AS pa, min(m.total_allocated) AS la,
                   max(m.total_reserved) AS pr
            FROM m JOIN st ON m.ts_ns >= st.start_ns AND m.ts_ns < st.end_ns
            GROUP BY st.step_num),
        carried AS (
            SELECT st.step_num, m.total_allocated AS a, m.total_reserved AS r
            FROM st ASOF JOIN m ON m.ts_ns <= st.start_ns)
        SELECT i.step_num, greatest(i.pa, COALESCE(c.a, i.pa)) AS peak_allocated,
               least(i.la, COALESCE(c.a, i.la)) AS low_allocated,
               greatest(i.pr, c.r) AS peak_reserved
        FROM inside i LEFT JOIN carried c USING (step_num)
        ORDER BY i.step_num LIMIT $n""", {"t": trace_id, "n": MEMORY_MAX_STEPS})
    if not rows:
        return None
    total = con.execute("SELECT max(total_memory_bytes) FROM device_info WHERE trace_id = $t",
                        {"t": trace_id}).fetchone()[0]
    return {"trace_id": trace_id, "steps": [r["step_num"] for r in rows],
            "peak_allocated": [r["peak_allocated"] for r in rows],
            "low_allocated": [r["low_allocated"] for r in rows],
            "peak_reserved": [r["peak_reserved"] for r in rows], "device_total": total}


def _device(con: duckdb.DuckDBPyConnection) -> dict[int, str]:
    return {r[0]: r[1] for r in con.execute(
        "SELECT trace_id, string_agg(DISTINCT name, ', ') FROM device_info "
        "WHERE name IS NOT NULL GROUP BY trace_id").fetchall()}


def gather(con: duckdb.DuckDBPyConnection, rules: list, primary_trace: int | None) -> dict:
    """Everything the HTML report draws, from the open store (after the verdict)."""
    data: dict[str, Any] = {"primary_trace": primary_trace, "errors": []}

    def section(name: str, fn, *args):
        try:
            data[name] = fn(*args)
        except duckdb.Error as e:  # the report is still written, and says what is missing
            from ..errors import interrupted
            if interrupted(e):
                raise
            data[name] = None
            data["errors"].append(f"{name}: {str(e).strip().splitlines()[0][:200]}")

    section("steps", _steps, con)
    traces = sorted(data["steps"] or {})
    data["budget"] = {}
    for t in traces:
        try:
            b = _budget(con, rules, t)
        except duckdb.Error:
            b = None
        if b:
            data["budget"][t] = b
    section("devices", _device, con)
    tid = primary_trace if primary_trace is not None else (traces[0] if traces else None)
    data["timelines"] = []
    if tid is not None:
        steps = _rows(con, "SELECT * FROM _report_steps WHERE trace_id = $t ORDER BY which DESC",
                      {"t": tid})
        for st in steps:
            if st["which"] == "slowest" and any(x["step_num"] == st["step_num"] for x in steps
                                                if x["which"] == "typical"):
                continue  # one step only: the typical one is the slowest
            try:
                tl = _timeline(con, tid, st)
                tl["trace_id"] = tid
                data["timelines"].append(tl)
            except duckdb.Error as e:
                data["errors"].append(f"timeline: {str(e).strip().splitlines()[0][:200]}")
        section("kernels", _top_kernels, con, tid)
        # Operators exist in Kineto traces only: the primary one if it has them, else the first.
        with_ops = [r[0] for r in con.execute(
            "SELECT DISTINCT trace_id FROM cpu_ops WHERE category = 'cpu_op' ORDER BY trace_id").fetchall()]
        ops_tid = tid if tid in with_ops else (with_ops[0] if with_ops else None)
        data["operators"] = None
        if ops_tid is not None:
            section("operators", _top_ops, con, ops_tid)
        with_mem = [r[0] for r in con.execute(
            "SELECT DISTINCT trace_id FROM memory_events WHERE lower(device_type) IN ('cuda', 'gpu') "
            "ORDER BY trace_id").fetchall()]
        data["memory"] = None
        for mem_tid in sorted(with_mem, key=lambda t: t != tid):  # the primary trace first
            section("memory", _memory, con, mem_tid)
            if data["memory"]:
                break
    return data
