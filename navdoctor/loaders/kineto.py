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
import json
import os
import re
import shutil
import tempfile
import threading
import zlib

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
        except (OSError, EOFError, zlib.error) as e:
            raise TraceError(path, f"gzip data is corrupt ({e})") from None
        start = inner.lstrip(b" \t\r\n\xef\xbb\xbf")
        return {b"{": "gzip", b"[": "gzip-array"}.get(start[:1])
    with open(path, "rb") as f:
        start = f.read(4096).lstrip(b" \t\r\n\xef\xbb\xbf")
    return {b"{": "json", b"[": "json-array"}.get(start[:1])


# Larger µs values (year 2096 on) are unusable: NULL, so the event is skipped with a warning
# rather than overflowing DECIMAL or BIGINT arithmetic (ts + dur stays within BIGINT).
_MAX_ABS_US = 4_000_000_000_000_000


# ns from a µs value held as JSON number or string; exact to the ns the trace carries.
# The common text, at most 13 integer digits and 3 decimals ('5381300149300.03'), takes
# integer arithmetic; anything else goes through DECIMAL (same result, 3x the time).
def _us_to_ns(expr: str) -> str:
    us = f"TRY_CAST({expr} AS DECIMAL(38,6))"
    exact = f"CASE WHEN abs({us}) < {_MAX_ABS_US} THEN CAST(round({us} * 1000) AS BIGINT) END"
    return (f"CASE WHEN regexp_full_match({expr}, '-?[0-9]{{1,13}}(\\.[0-9]{{0,3}})?') "
            f"THEN CAST(replace({expr}, '.', '') AS BIGINT) * CASE WHEN strpos({expr}, '.') = 0 "
            f"THEN 1000 ELSE [1000, 100, 10, 1][strlen({expr}) - strpos({expr}, '.') + 1] END "
            f"ELSE {exact} END")


def _int_of(expr: str) -> str:
    """An integer from an int, or from the digits in a string like 'stream 7'."""
    # CASE, not COALESCE: only the rows that are not plain integers pay for the regexp.
    as_int = f"TRY_CAST({expr} AS BIGINT)"
    return (f"CASE WHEN {as_int} IS NOT NULL THEN {as_int} ELSE "
            f"TRY_CAST(NULLIF(regexp_extract(CAST({expr} AS VARCHAR), '(-?[0-9]+)', 1), '') AS BIGINT) END")


# Event categories whose args no insert reads, once their CPU ops' 'Input Dims' and 'Input type' are kept on their
# own: their args (most of a trace's bytes: Python ids, op attributes) are not stored in _ev.
# Memory instants ('[memory]') and thread names read args whatever their category.
_ARGS_UNUSED = ("('cpu_op', 'operator', 'python_function', 'ac2g', 'user_annotation', "
                "'gpu_user_annotation', 'cpu_instant_event', 'trace')")


def _event_args(args: str, ph: str, cat: str, name: str) -> str:
    """The args, input_dims and input_types columns of _ev, from the event's fields as SQL
    expressions (record_shapes=True: 'Input Dims' and 'Input type' of CPU ops)."""
    return (f"CASE WHEN lower({cat}) IN {_ARGS_UNUSED} AND NOT ({ph} IN ('i', 'I') AND {name} = '[memory]') "
            f"AND NOT ({ph} = 'M' AND {name} = 'thread_name') THEN NULL ELSE {args} END AS args, "
            f"CASE WHEN lower({cat}) IN {CAT_CPU_OP} THEN CAST({args}->'Input Dims' AS VARCHAR) END "
            "AS input_dims, "
            f"CASE WHEN lower({cat}) IN {CAT_CPU_OP} THEN CAST({args}->'Input type' AS VARCHAR) END "
            "AS input_types")


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
    skipped = 0
    if not _read_streaming(con, path, compression) and not _read_typed(con, path, compression):
        skipped = _read_generic(con, path, compression)
    total, bad_ts, bad_dur = con.execute("""
        SELECT count(*), count(*) FILTER (ts_ns IS NULL),
               count(*) FILTER (ph = 'X' AND (dur_ns IS NULL OR dur_ns < 0))
        FROM _ev""").fetchall()[0]
    if total == 0:
        raise TraceError(path, "trace is empty: 'traceEvents' holds no event objects")
    if skipped:
        result.warnings.append(f"{skipped} entries of 'traceEvents' that are not event objects "
                               "were skipped")
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
    # The whole document is one JSON value here; DuckDB's limit is an unsigned 32-bit number.
    return (f"read_json(?, format='unstructured', compression='{compression}', "
            f"maximum_object_size={min(max(size * 40, 1 << 24), (1 << 32) - 1)}, "
            f"columns={{traceEvents: '{events_type}', {_DOC_COLUMNS}}})")


# --- the streaming path -------------------------------------------------------------------
# A Kineto trace is one JSON object whose 'traceEvents' array is nearly all of it. Read as one
# JSON value, the whole document (and DuckDB's parse tree of it) must fit in memory at once.
# Instead, the small keys around the array are parsed here, and the array's bytes alone are
# streamed through a named pipe into DuckDB's read_json(format='array'), which parses them
# event by event in bounded buffers, straight into typed columns (gzip is inflated on the way).
# Any surprise (odd layout, odd event, truncated file) falls back to the whole-document path,
# whose checks and messages then apply unchanged.

_STREAM_CHUNK = 1 << 22
_HEAD_LIMIT = 64 << 20   # the keys before 'traceEvents' must fit in this many bytes
_TAIL_KEEP = 1 << 20     # ... and the keys after it in this many
_EVENT_COLUMNS = ("{ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'JSON', tid: 'JSON', "
                  "ts: 'JSON', dur: 'JSON', args: 'JSON', id: 'JSON'}")
_DOC_KEYS = ("deviceProperties", "distributedInfo", "schemaVersion", "displayTimeUnit")
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _NotStreamable(Exception):
    pass


def _skip_ws(s: str, i: int) -> int:
    return _WS.match(s, i).end()


def _parse_head(buf: bytes) -> tuple[dict, int] | None:
    """The top-level keys before 'traceEvents' and the byte offset of its '['; None when
    more bytes are needed."""
    s = buf.decode("utf-8", "surrogateescape")
    i = _skip_ws(s, 1 if s.startswith("\ufeff") else 0)
    if i >= len(s):
        return None
    if s[i] != "{":
        raise _NotStreamable
    i += 1
    keys: dict = {}
    try:
        while True:
            i = _skip_ws(s, i)
            if i >= len(s):
                return None
            if s[i] != '"':
                raise _NotStreamable
            key, i = _DECODER.raw_decode(s, i)
            i = _skip_ws(s, i)
            if i >= len(s):
                return None
            if s[i] != ":":
                raise _NotStreamable
            i = _skip_ws(s, i + 1)
            if i >= len(s):
                return None
            if key == "traceEvents":
                if s[i] != "[" or key in keys:
                    raise _NotStreamable
                return keys, len(s[:i].encode("utf-8", "surrogateescape"))
            value, i = _DECODER.raw_decode(s, i)
            keys[key] = value
            i = _skip_ws(s, i)
            if i >= len(s):
                return None
            if s[i] != ",":
                raise _NotStreamable  # the object ends without 'traceEvents'
            i += 1
    except json.JSONDecodeError:
        if len(buf) < _HEAD_LIMIT:
            return None  # a value cut by the end of the buffer, maybe
        raise _NotStreamable from None


def _parse_tail(tail: bytes) -> tuple[int, dict] | None:
    """Where the events array ends in `tail` (the offset just after its ']') and the keys
    after it, or None. The array's ']' is the first ']' after which the rest of the text is
    exactly the rest of the top-level object: an earlier ']' (inside the last event) leaves
    unbalanced closers behind it, and a later one is inside a trailing key's value."""
    s = tail.decode("utf-8", "surrogateescape")
    end = len(s)
    p = s.find("]")
    while p >= 0:
        found = _rest_of_object(s, p + 1)
        if found is not None:
            return len(s[:p + 1].encode("utf-8", "surrogateescape")), found
        p = s.find("]", p + 1)
    return None


def _rest_of_object(s: str, i: int) -> dict | None:
    keys: dict = {}
    try:
        i = _skip_ws(s, i)
        while i < len(s) and s[i] == ",":
            i = _skip_ws(s, i + 1)
            if i >= len(s) or s[i] != '"':
                return None
            key, i = _DECODER.raw_decode(s, i)
            i = _skip_ws(s, i)
            if i >= len(s) or s[i] != ":":
                return None
            value, i = _DECODER.raw_decode(s, _skip_ws(s, i + 1))
            keys[key] = value
            i = _skip_ws(s, i)
        if i >= len(s) or s[i] != "}" or _skip_ws(s, i + 1) != len(s):
            return None
    except json.JSONDecodeError:
        return None
    return keys


# DuckDB keeps the buffers it read from a pipe until it is done with that pipe (the whole
# array, were it one pipe: as much memory as the file), and reads one pipe on one thread:
# so the array goes through several pipes, read by several threads, each a JSON array of consecutive events (~_SEGMENT
# bytes), cut where one top-level event ends and the next begins. A cut is only ever made at '}' ws ',' ws '{'; one made inside a
# string or an event's nested value leaves some piece malformed (the first piece starts at
# depth 1, and each piece is whole only if it ends there too), DuckDB rejects it, and the
# trace goes to the whole-document path.
_SEGMENT = 32 << 20
_MAX_SEGMENTS = 256
_CUT = re.compile(rb"\}[ \t\n\r]*,[ \t\n\r]*\{")
_CARRY = 64  # bytes held back so that a cut can be found across two reads


class _Writer(threading.Thread):
    """Runs write(stop) (which writes into some of `fifos`, in order) on its own thread."""

    def __init__(self, fifos: list[str], write):
        super().__init__(daemon=True)
        self.fifos, self.write = fifos, write
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.done = False

    def run(self) -> None:
        try:
            self.write(self.stop)
            self.done = True
        except BaseException as e:  # reported to the reader; the pipes close either way
            self.error = e

    def drain(self) -> None:
        """Unblock the writer whatever DuckDB did (it may never have opened a pipe)."""
        self.stop.set()
        fds = []
        try:
            while self.is_alive():
                if len(fds) < len(self.fifos):
                    fds.append(os.open(self.fifos[len(fds)], os.O_RDONLY | os.O_NONBLOCK))
                for fd in fds:
                    try:
                        while os.read(fd, 1 << 20):
                            pass
                    except BlockingIOError:
                        pass
                self.join(0.01)
        finally:
            for fd in fds:
                os.close(fd)
        self.join()


def _plain_writer(path: str, fifo: str, a: int, b: int, prefix: bytes, suffix: bytes):
    def write(stop: threading.Event) -> None:
        with open(fifo, "wb") as out, open(path, "rb") as f:
            f.seek(a)
            out.write(prefix)
            left = b - a
            while left and not stop.is_set():
                chunk = f.read(min(left, _STREAM_CHUNK))
                if not chunk:
                    raise _NotStreamable("the file shrank while being read")
                out.write(chunk)
                left -= len(chunk)
            out.write(suffix)
    return write


def _plain_pieces(path: str, start: int, fifo_of) -> tuple[list[_Writer], dict] | None:
    """An uncompressed trace: where its array ends (and the keys after it), the cuts, and
    one writer per piece, each reading its own byte range. None when the end is not found."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        tail_at = max(start, size - _TAIL_KEEP - _STREAM_CHUNK)
        f.seek(tail_at)
        found = _parse_tail(f.read())
        if found is None:
            return None
        end = tail_at + found[0]
        n = max(1, min(_MAX_SEGMENTS, round((end - start) / _SEGMENT)))
        ranges = [[start, None]]
        for i in range(1, n):
            target = start + (end - start) * i // n
            if target <= ranges[-1][0]:
                continue
            f.seek(target)
            m = _CUT.search(f.read(min(1 << 20, end - target)))
            if m is None or target + m.end() - 1 >= end - 1:
                continue
            ranges[-1][1] = target + m.start() + 1
            ranges.append([target + m.end() - 1, None])
        ranges[-1][1] = end
    last = len(ranges) - 1
    writers = []
    for i, (a, b) in enumerate(ranges):
        fifo = fifo_of(i)
        writers.append(_Writer([fifo], _plain_writer(path, fifo, a, b, b"[" if i else b"",
                                                      b"]" if i < last else b"")))
    return writers, found[1]


def _gzip_size(path: str) -> int:
    """The uncompressed size a gzip file records (modulo 2**32: only a hint)."""
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little")


class _StreamPieces:
    """A compressed trace: one writer inflates the stream and writes the array into the
    pipes one after the other, cutting after about `target` bytes each (the number of pipes
    comes from the size the gzip trailer records; spare pipes get an empty array)."""

    def __init__(self, stream, pending: bytes, fifos: list[str], target: int):
        self.stream, self.pending, self.fifos, self.target = stream, pending, fifos, target
        self.tail_keys: dict | None = None
        self.writer = _Writer(fifos, self.write)

    def write(self, stop: threading.Event) -> None:
        k = 0
        out = open(self.fifos[0], "wb")
        try:
            seg_len = 0
            carry = b""

            def emit(data: bytes, final: bool) -> None:
                nonlocal k, out, seg_len, carry
                data = carry + data
                pos = 0
                while k < len(self.fifos) - 1:
                    look = min(len(data), pos + max(self.target - seg_len, 0))
                    m = _CUT.search(data, look)
                    if m is None:
                        break
                    out.write(data[pos:m.start() + 1])
                    out.write(b"]")
                    out.close()
                    k += 1
                    out = open(self.fifos[k], "wb")
                    out.write(b"[")
                    pos, seg_len = m.end() - 1, 0
                keep = 0 if final or k == len(self.fifos) - 1 else _CARRY
                stop_at = max(pos, len(data) - keep)
                out.write(data[pos:stop_at])
                seg_len += stop_at - pos
                carry = data[stop_at:]

            held = self.pending
            while not stop.is_set():
                chunk = self.stream.read(_STREAM_CHUNK)
                if not chunk:
                    break
                held += chunk
                if len(held) > _TAIL_KEEP:
                    emit(held[:-_TAIL_KEEP], False)
                    held = held[-_TAIL_KEEP:]
            if stop.is_set():
                return
            found = _parse_tail(held)
            if found is None:
                raise _NotStreamable("the end of the events array was not found")
            emit(held[:found[0]], True)
            self.tail_keys = found[1]
        finally:
            out.close()
        for fifo in self.fifos[k + 1:]:
            if stop.is_set():
                return
            with open(fifo, "wb") as spare:
                spare.write(b"[]")


def _read_streaming(con: duckdb.DuckDBPyConnection, path: str, compression: str) -> bool:
    """The fast path for well-formed traces: _ev and _kineto_doc made without ever holding the
    document. False (nothing made) when the trace needs the whole-document path."""
    opener = gzip.open if compression == "gzip" else open
    tmpdir = None
    writers: list[_Writer] = []
    try:
        with opener(path, "rb") as stream:
            buf = b""
            head = None
            while head is None:
                chunk = stream.read(1 << 16 if len(buf) < (1 << 20) else _STREAM_CHUNK)
                if not chunk or len(buf) > _HEAD_LIMIT:
                    return False
                buf += chunk
                head = _parse_head(buf)
            keys, start = head
            tmpdir = tempfile.mkdtemp(prefix="navdoctor-kineto-")

            def fifo_of(i: int) -> str:
                fifo = os.path.join(tmpdir, f"events{i:04d}.json")
                os.mkfifo(fifo)
                return fifo

            if compression == "gzip":
                expected = max(_gzip_size(path) - start, 1)
                n = max(1, min(_MAX_SEGMENTS, round(expected / _SEGMENT)))
                pieces = _StreamPieces(stream, buf[start:], [fifo_of(i) for i in range(n)],
                                       -(-expected // n))
                writers = [pieces.writer]
            else:
                plain = _plain_pieces(path, start, fifo_of)
                if plain is None:
                    return False
                writers, tail_keys = plain
            fifos = [f for w in writers for f in w.fifos]
            for w in writers:
                w.start()
            try:
                # One statement reads all the pipes, several at a time (one thread each). The
                # rows of different pipes interleave: like DuckDB's JSON reader itself (which
                # may emit an event cut by its buffer boundaries after later ones), the load
                # promises no row order; every table is defined by its content.
                con.execute(f"""
                    CREATE OR REPLACE TEMP TABLE _ev AS
                    SELECT ph, lower(cat) AS cat, name,
                           {_int_of("pid->>'$'")} AS pid, {_int_of("tid->>'$'")} AS tid,
                           {_us_to_ns("ts->>'$'")} AS ts_ns, {_us_to_ns("dur->>'$'")} AS dur_ns,
                           {_event_args("args", "ph", "cat", "name")}, id->>'$' AS flow_id
                    FROM read_json(?, format='array', columns={_EVENT_COLUMNS})""", [fifos])
            except duckdb.Error:
                return _discard(con)
            finally:
                for w in writers:  # before the stream closes: a writer may be reading it
                    w.drain()
        if compression == "gzip":
            tail_keys = pieces.tail_keys
        if any(w.error is not None or not w.done for w in writers) or tail_keys is None:
            return _discard(con)
        # A null in the array is no event (the whole-document path skips it), but reads as
        # an all-NULL row here, like an empty object would: leave such traces to that path.
        odd, total = con.execute("""
            SELECT count(*) FILTER (ph IS NULL AND cat IS NULL AND name IS NULL AND pid IS NULL
                                    AND tid IS NULL AND ts_ns IS NULL AND dur_ns IS NULL
                                    AND args IS NULL AND flow_id IS NULL), count(*)
            FROM _ev""").fetchone()
        if odd or not total or "traceEvents" in tail_keys:
            return _discard(con)
        keys.update(tail_keys)
        doc = [None if keys.get(k) is None else json.dumps(keys[k]) for k in _DOC_KEYS]
        con.execute("CREATE OR REPLACE TEMP TABLE _kineto_doc AS SELECT "
                    + ", ".join(f"CAST(? AS JSON) AS {k}" for k in _DOC_KEYS), doc)
        return True
    except (OSError, EOFError, zlib.error, _NotStreamable, UnicodeError, ValueError):
        return _discard(con)
    finally:
        for w in writers:
            w.drain()
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)


def _discard(con: duckdb.DuckDBPyConnection) -> bool:
    con.execute("DROP TABLE IF EXISTS _ev")
    con.execute("DROP TABLE IF EXISTS _kineto_doc")
    return False


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
               {_event_args("e.args", "e.ph", "e.cat", "e.name")}, e.id->>'$' AS flow_id
        FROM (SELECT unnest(traceEvents) AS e FROM _kineto_doc)
        WHERE e IS NOT NULL""")
    return True


def _read_generic(con: duckdb.DuckDBPyConnection, path: str, compression: str) -> int:
    """The tolerant path: each event stays JSON and non-object events are skipped (their
    number is returned)."""
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _kineto_doc AS SELECT * FROM "
                    + _reader(path, compression, "JSON"), [path])
    except duckdb.Error as e:
        raise TraceError(path, "truncated or malformed JSON: " + _first_line(e)) from None
    _check_document(con, path)
    if con.execute("SELECT any_value(json_type(traceEvents)) FROM _kineto_doc").fetchone()[0] != "ARRAY":
        raise TraceError(path, "'traceEvents' is not a list: not a torch.profiler/Kineto trace")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _ev AS
        SELECT e->>'ph' AS ph, lower(e->>'cat') AS cat, e->>'name' AS name,
               {_int_of("e->>'pid'")} AS pid, {_int_of("e->>'tid'")} AS tid,
               {_us_to_ns("e->>'ts'")} AS ts_ns, {_us_to_ns("e->>'dur'")} AS dur_ns,
               {_event_args("(e->'args')", "(e->>'ph')", "(e->>'cat')", "(e->>'name')")},
               e->>'id' AS flow_id
        FROM (SELECT unnest(CAST(traceEvents AS JSON[])) AS e FROM _kineto_doc)
        WHERE json_type(e) = 'OBJECT'""")
    return con.execute("SELECT json_array_length(traceEvents) FROM _kineto_doc").fetchone()[0] \
        - con.execute("SELECT count(*) FROM _ev").fetchone()[0]


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
               NULL, NULL
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
               ts_ns, ts_ns + dur_ns, dur_ns, input_dims, input_types
        FROM _ev WHERE ph = 'X' AND cat IN {CAT_CPU_OP}
          AND name NOT LIKE 'ProfilerStep#%'""")
    con.execute(f"""
        INSERT INTO nvtx_ranges
        SELECT {t}, 'kineto', pid, tid, name, cat, ts_ns, ts_ns + dur_ns, dur_ns
        FROM _ev WHERE ph = 'X' AND cat IN {CAT_ANNOTATION}""")
    # Steps: torch's ProfilerStep#N (a scheduled profiler), else the navdoctor.step#N ranges
    # navdoctor's collector marks when it profiles a whole run (no schedule, so no ProfilerStep).
    for pattern, origin in (("^ProfilerStep#[0-9]+$", "ProfilerStep"),
                            ("^navdoctor\\.step#[0-9]+$", "navdoctor.step")):
        con.execute(f"""
            INSERT INTO steps
            SELECT {t}, 'kineto', CAST(regexp_extract(name, '#([0-9]+)', 1) AS INTEGER),
                   min(ts_ns), max(ts_ns + dur_ns), max(ts_ns + dur_ns) - min(ts_ns), '{origin}',
                   min(ts_ns), max(ts_ns + dur_ns)
            FROM _ev WHERE ph = 'X' AND regexp_matches(name, '{pattern}')
              AND cat NOT IN ('gpu_user_annotation')
            GROUP BY 3""")
        if con.execute(f"SELECT count(*) FROM steps WHERE trace_id = {t}").fetchone()[0]:
            break
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
