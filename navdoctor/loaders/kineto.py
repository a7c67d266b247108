"""Load torch.profiler / Kineto Chrome traces (.json, .json.gz) into the trace store.

The JSON is parsed by DuckDB itself, never into one Python object per event, and every
field is pulled out with SQL. Formats handled (checked against traces of torch 1.8 to 2.x):
 - categories changed case and name over the years: 'Kernel'/'kernel', 'Memcpy'/'gpu_memcpy',
   'Runtime'/'cuda_runtime', 'Operator'/'cpu_op', plus 'cuda_driver', 'user_annotation',
   'gpu_user_annotation', 'python_function', 'cpu_instant_event', 'cuda_sync', 'ac2g' flows;
 - pid/tid are ints or strings ('stream 7'); ts/dur are µs as ints, floats or strings, and the
   float's decimals are nanoseconds, so they are read as DECIMAL, never through a double;
 - ProfilerStep#N is a 'cpu_op' in old releases and a 'user_annotation' in new ones.
"""
from __future__ import annotations

import gzip
import os

import duckdb

from ..errors import TraceError
from .base import LoadResult

GZIP_MAGIC = b"\x1f\x8b"


def sniff_kineto(path: str) -> str | None:
    """'json' or 'gzip' when the file looks like a JSON document (maybe gzipped), else None."""
    with open(path, "rb") as f:
        head = f.read(2)
    if head == GZIP_MAGIC:
        try:
            with gzip.open(path, "rb") as g:
                inner = g.read(64)
        except (OSError, EOFError) as e:
            raise TraceError(path, f"gzip data is corrupt ({e})") from None
        start = inner.lstrip(b" \t\r\n\xef\xbb\xbf")
        return {b"{": "gzip", b"[": "gzip-array"}.get(start[:1])
    with open(path, "rb") as f:
        start = f.read(4096).lstrip(b" \t\r\n\xef\xbb\xbf")
    return {b"{": "json", b"[": "json-array"}.get(start[:1])


# ns from a µs value held as JSON number or string; exact to the ns the trace carries.
def _us_to_ns(expr: str) -> str:
    return f"CAST(round(TRY_CAST({expr} AS DECIMAL(38,6)) * 1000) AS BIGINT)"


def _int_of(expr: str) -> str:
    """An integer from an int, or from the digits in a string like 'stream 7'."""
    return (f"COALESCE(TRY_CAST({expr} AS BIGINT), "
            f"TRY_CAST(NULLIF(regexp_extract(CAST({expr} AS VARCHAR), '(-?[0-9]+)', 1), '') AS BIGINT))")


def load_kineto(con: duckdb.DuckDBPyConnection, path: str, trace_id: int) -> LoadResult:
    kind = sniff_kineto(path)
    if kind is None:
        raise TraceError(path, "not a trace: neither JSON nor gzip-compressed JSON")
    if kind.endswith("array"):
        raise TraceError(path, "JSON has no 'traceEvents' list (top level is an array): "
                               "not a torch.profiler/Kineto trace")
    compression = "gzip" if kind == "gzip" else "none"
    result = LoadResult(path=path, format="kineto-json.gz" if kind == "gzip" else "kineto-json",
                        source="kineto")
    if not _read_typed(con, path, compression):
        _read_generic(con, path, compression)
    total, bad_ts, bad_dur = con.execute("""
        SELECT count(*), count(*) FILTER (ts_ns IS NULL),
               count(*) FILTER (ph = 'X' AND (dur_ns IS NULL OR dur_ns < 0))
        FROM _ev""").fetchall()[0]
    if total == 0:
        raise TraceError(path, "trace is empty: 'traceEvents' holds no event objects")
    if bad_ts:
        result.warnings.append(f"{bad_ts} events without a usable 'ts' were skipped")
    if bad_dur:
        result.warnings.append(f"{bad_dur} complete events with a missing or negative 'dur' were skipped")
    con.execute("DELETE FROM _ev WHERE ts_ns IS NULL OR (ph = 'X' AND (dur_ns IS NULL OR dur_ns < 0))")

    _insert_all(con, trace_id)
    _fill_correlation_from_flows(con, trace_id)
    _load_device_properties(con, trace_id)

    result.events = total - bad_ts - bad_dur
    span = con.execute("SELECT min(ts_ns), max(ts_ns + COALESCE(dur_ns, 0)) FROM _ev "
                       "WHERE ph IN ('X', 'i', 'I')").fetchall()[0]
    result.start_ns, result.end_ns = span
    gpu = con.execute("SELECT count(*) FROM _ev WHERE cat IN ('kernel', 'gpu_memcpy', 'memcpy', "
                      "'gpu_memset', 'memset')").fetchall()[0][0]
    if gpu == 0:
        result.warnings.append("no GPU activity in this trace (CPU-only profile): "
                               "the verdict can only weigh CPU time and data loading")
    meta = con.execute("SELECT CAST(schemaVersion AS VARCHAR) FROM _kineto_doc").fetchall()[0][0]
    result.producer = f"torch.profiler (Kineto schemaVersion {meta})" if meta else "torch.profiler"
    con.execute("DROP TABLE _ev")
    con.execute("DROP TABLE _kineto_doc")
    return result


# The fields of an event that navdoctor reads, typed so that DuckDB parses each event once.
# ts/dur/pid/tid/id stay JSON: their text keeps every digit, and they can be numbers or strings.
_EVENT_STRUCT = ("STRUCT(ph VARCHAR, cat VARCHAR, name VARCHAR, pid JSON, tid JSON, ts JSON, "
                 "dur JSON, args JSON, id JSON)[]")
_DOC_COLUMNS = ("deviceProperties: 'JSON', distributedInfo: 'JSON', schemaVersion: 'JSON', "
                "displayTimeUnit: 'JSON'")


def _reader(path: str, compression: str, events_type: str) -> str:
    size = os.path.getsize(path)
    return (f"read_json(?, format='unstructured', compression='{compression}', "
            f"maximum_object_size={max(size * 40, 1 << 24)}, "
            f"columns={{traceEvents: '{events_type}', {_DOC_COLUMNS}}})")


def _read_typed(con: duckdb.DuckDBPyConnection, path: str, compression: str) -> bool:
    """The fast path: events parsed straight into typed rows. False when the trace has
    events of an odd shape (a non-object event, a name that is an object...)."""
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _kineto_doc AS SELECT * FROM "
                    + _reader(path, compression, _EVENT_STRUCT), [path])
    except duckdb.Error:
        return False
    _check_document(con, path)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ev AS
        SELECT e.ph, lower(e.cat) AS cat, e.name,
               {_int_of("e.pid->>'$'")} AS pid, {_int_of("e.tid->>'$'")} AS tid,
               {_us_to_ns("e.ts->>'$'")} AS ts_ns, {_us_to_ns("e.dur->>'$'")} AS dur_ns,
               e.args, e.id->>'$' AS flow_id
        FROM (SELECT unnest(traceEvents) AS e FROM _kineto_doc)
        WHERE e IS NOT NULL""")
    return True


def _read_generic(con: duckdb.DuckDBPyConnection, path: str, compression: str) -> None:
    """The tolerant path: each event stays JSON and non-object events are skipped."""
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _kineto_doc AS SELECT * FROM "
                    + _reader(path, compression, "JSON"), [path])
    except duckdb.Error as e:
        raise TraceError(path, "truncated or malformed JSON: " + _first_line(e)) from None
    _check_document(con, path)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ev AS
        SELECT e->>'ph' AS ph, lower(e->>'cat') AS cat, e->>'name' AS name,
               {_int_of("e->>'pid'")} AS pid, {_int_of("e->>'tid'")} AS tid,
               {_us_to_ns("e->>'ts'")} AS ts_ns, {_us_to_ns("e->>'dur'")} AS dur_ns,
               e->'args' AS args, e->>'id' AS flow_id
        FROM (SELECT unnest(CAST(traceEvents AS JSON[])) AS e FROM _kineto_doc)
        WHERE json_type(e) = 'OBJECT'""")


def _check_document(con: duckdb.DuckDBPyConnection, path: str) -> None:
    doc = con.execute("SELECT count(*), any_value(traceEvents IS NOT NULL), "
                      "any_value(len(traceEvents)) FROM _kineto_doc").fetchall()[0]
    if doc[0] != 1 or not doc[1]:
        raise TraceError(path, "JSON has no 'traceEvents' list: not a torch.profiler/Kineto trace")
    if not doc[2]:
        raise TraceError(path, "trace is empty: 'traceEvents' has no events")


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


CAT_KERNEL = "('kernel')"
CAT_MEMCPY = "('gpu_memcpy', 'memcpy')"
CAT_MEMSET = "('gpu_memset', 'memset')"
CAT_RUNTIME = "('cuda_runtime', 'runtime', 'cuda_driver')"
CAT_CPU_OP = "('cpu_op', 'operator', 'python_function')"
CAT_ANNOTATION = "('user_annotation', 'gpu_user_annotation')"
DATALOADER_NAME = "(name LIKE '%DataLoader%__next__%' OR name = 'navdoctor.dataloader_next')"


def _insert_all(con: duckdb.DuckDBPyConnection, trace_id: int) -> None:
    t = int(trace_id)
    a = "args"
    corr = _int_of(f"{a}->>'correlation'")
    device_arg = _int_of("args->>'device'")
    stream_arg = _int_of("args->>'stream'")
    device = f"CAST(COALESCE({device_arg}, pid) AS INTEGER)"
    stream = f"COALESCE({stream_arg}, tid)"
    con.execute(f"""
        INSERT INTO kernels
        SELECT {t}, 'kineto', {device}, {stream}, {corr}, name, ts_ns, ts_ns + dur_ns, dur_ns,
               TRY_CAST({a}->'grid'->>0 AS INTEGER), TRY_CAST({a}->'grid'->>1 AS INTEGER),
               TRY_CAST({a}->'grid'->>2 AS INTEGER), TRY_CAST({a}->'block'->>0 AS INTEGER),
               TRY_CAST({a}->'block'->>1 AS INTEGER), TRY_CAST({a}->'block'->>2 AS INTEGER),
               TRY_CAST({a}->>'registers per thread' AS INTEGER),
               TRY_CAST({a}->>'shared memory' AS BIGINT),
               TRY_CAST({a}->>'est. achieved occupancy %' AS DOUBLE) / 100.0,
               NULL
        FROM _ev WHERE ph = 'X' AND cat IN {CAT_KERNEL}""")
    # 'Memcpy HtoD (Pageable -> Device)': kind and memory types are in the name.
    con.execute(f"""
        INSERT INTO memcpy
        SELECT {t}, 'kineto', {device}, {stream}, {corr},
               NULLIF(regexp_extract(name, 'Memcpy ([A-Za-z]+)', 1), ''),
               lower(NULLIF(regexp_extract(name, '\\(([A-Za-z]+) *-> *([A-Za-z]+)\\)', 1), '')),
               lower(NULLIF(regexp_extract(name, '\\(([A-Za-z]+) *-> *([A-Za-z]+)\\)', 2), '')),
               TRY_CAST({a}->>'bytes' AS BIGINT), ts_ns, ts_ns + dur_ns, dur_ns
        FROM _ev WHERE ph = 'X' AND cat IN {CAT_MEMCPY}""")
    con.execute(f"""
        INSERT INTO memset
        SELECT {t}, 'kineto', {device}, {stream}, {corr}, TRY_CAST({a}->>'bytes' AS BIGINT),
               ts_ns, ts_ns + dur_ns, dur_ns
        FROM _ev WHERE ph = 'X' AND cat IN {CAT_MEMSET}""")
    con.execute(f"""
        INSERT INTO runtime_calls
        SELECT {t}, 'kineto', pid, tid, {corr},
               CASE WHEN cat = 'cuda_driver' THEN 'driver' ELSE 'runtime' END,
               name, ts_ns, ts_ns + dur_ns, dur_ns, is_launch_api(name), is_sync_api(name)
        FROM _ev WHERE ph = 'X' AND cat IN {CAT_RUNTIME}""")
    con.execute(f"""
        INSERT INTO cpu_ops
        SELECT {t}, 'kineto', pid, tid, name,
               CASE WHEN cat = 'operator' THEN 'cpu_op' ELSE cat END,
               ts_ns, ts_ns + dur_ns, dur_ns, CAST({a}->'Input Dims' AS VARCHAR)
        FROM _ev WHERE ph = 'X' AND cat IN {CAT_CPU_OP}
          AND name NOT LIKE 'ProfilerStep#%'""")
    con.execute(f"""
        INSERT INTO nvtx_ranges
        SELECT {t}, 'kineto', pid, tid, name, cat, ts_ns, ts_ns + dur_ns, dur_ns
        FROM _ev WHERE ph = 'X' AND cat IN {CAT_ANNOTATION}""")
    con.execute(f"""
        INSERT INTO steps
        SELECT {t}, 'kineto', CAST(regexp_extract(name, '#([0-9]+)', 1) AS INTEGER),
               min(ts_ns), max(ts_ns + dur_ns), max(ts_ns + dur_ns) - min(ts_ns), 'ProfilerStep',
               min(ts_ns), max(ts_ns + dur_ns)
        FROM _ev WHERE ph = 'X' AND regexp_matches(name, '^ProfilerStep#[0-9]+$')
          AND cat NOT IN ('gpu_user_annotation')
        GROUP BY 3""")
    con.execute(f"""
        INSERT INTO dataloader_waits
        SELECT {t}, 'kineto', pid, tid, name, ts_ns, ts_ns + dur_ns, dur_ns
        FROM _ev WHERE ph = 'X' AND cat NOT IN ('gpu_user_annotation') AND {DATALOADER_NAME}""")
    # Blocking waits: the sync events of newer Kineto, and blocking runtime calls.
    con.execute(f"""
        INSERT INTO sync_events
        SELECT {t}, 'kineto', pid, tid,
               CASE WHEN name ILIKE '%stream%' THEN 'stream' WHEN name ILIKE '%event%' THEN 'event'
                    WHEN name ILIKE '%context%' THEN 'context' ELSE 'device' END,
               name, {corr}, ts_ns, ts_ns + dur_ns, dur_ns
        FROM _ev WHERE ph = 'X' AND cat = 'cuda_sync'""")
    con.execute(f"""
        INSERT INTO sync_events
        SELECT {t}, 'kineto', pid, tid, sync_kind_of_api(name), name, {corr},
               ts_ns, ts_ns + dur_ns, dur_ns
        FROM _ev WHERE ph = 'X' AND cat IN {CAT_RUNTIME} AND is_sync_api(name)
          AND NOT EXISTS (SELECT 1 FROM _ev s WHERE s.cat = 'cuda_sync')""")
    con.execute(f"""
        INSERT INTO memory_events
        SELECT {t}, 'kineto',
               CASE TRY_CAST({a}->>'Device Type' AS INTEGER) WHEN 0 THEN 'cpu' WHEN 1 THEN 'cuda'
                    ELSE CAST({a}->>'Device Type' AS VARCHAR) END,
               TRY_CAST({a}->>'Device Id' AS INTEGER), ts_ns, TRY_CAST({a}->>'Bytes' AS BIGINT),
               TRY_CAST({a}->>'Total Allocated' AS BIGINT), TRY_CAST({a}->>'Total Reserved' AS BIGINT)
        FROM _ev WHERE ph IN ('i', 'I') AND name = '[memory]'""")
    con.execute(f"""
        INSERT INTO threads
        SELECT DISTINCT {t}, 'kineto', pid, tid, {a}->>'name'
        FROM _ev WHERE ph = 'M' AND name = 'thread_name' AND {a}->>'name' IS NOT NULL""")


def _fill_correlation_from_flows(con: duckdb.DuckDBPyConnection, trace_id: int) -> None:
    """Old traces link a launch to its kernel only by an 'ac2g' flow (s at the launch, f at
    the kernel, same id); give such kernels the flow id as their correlation id."""
    con.execute(f"""
        UPDATE kernels k SET correlation_id = TRY_CAST(f.flow_id AS BIGINT)
        FROM _ev f
        WHERE k.trace_id = {int(trace_id)} AND k.correlation_id IS NULL
          AND f.ph = 'f' AND f.cat = 'ac2g' AND f.ts_ns = k.start_ns""")
    con.execute(f"""
        UPDATE runtime_calls r SET correlation_id = TRY_CAST(s.flow_id AS BIGINT)
        FROM _ev s
        WHERE r.trace_id = {int(trace_id)} AND r.correlation_id IS NULL
          AND s.ph = 's' AND s.cat = 'ac2g' AND s.ts_ns = r.start_ns AND s.tid = r.tid""")


def _load_device_properties(con: duckdb.DuckDBPyConnection, trace_id: int) -> None:
    con.execute(f"""
        INSERT INTO device_info
        SELECT {int(trace_id)}, 'kineto', TRY_CAST(d->>'id' AS INTEGER), d->>'name',
               TRY_CAST(d->>'totalGlobalMem' AS BIGINT), TRY_CAST(d->>'numSms' AS INTEGER),
               TRY_CAST(d->>'computeMajor' AS INTEGER), TRY_CAST(d->>'computeMinor' AS INTEGER),
               TRY_CAST(d->>'maxThreadsPerMultiprocessor' AS INTEGER)
        FROM (SELECT unnest(CAST(deviceProperties AS JSON[])) AS d FROM _kineto_doc
              WHERE json_type(deviceProperties) = 'ARRAY')
        WHERE json_type(d) = 'OBJECT'""")
