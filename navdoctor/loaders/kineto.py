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

import errno
import gzip
import io
import json
import os
import re
import shutil
import tempfile
import threading
import zlib

import duckdb

from ..errors import TraceError
from ..kernelnames import communication_kernel, tensor_core_kernel
from ..profiling import Timer, phase
from ..store import memory_limit_bytes, needs_checkpoint
from .base import LoadResult, gzip_trailer_size, inflate_limit, too_large_text

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


# ns from a µs value held as JSON number or string; exact to the ns the trace carries: the
# text as DECIMAL(38,6), times 1000, rounded (NULL where it is no number or out of range).
# Where the text's value has at most 3 decimals and 15 integer digits (nearly every event:
# '5381300149300.03'), the same number comes out of DECIMAL(18,3), whose 64-bit integer is
# the ns: the value is taken from there when both casts agree (then DECIMAL(38,6) holds no
# more decimals, so its rounding changes nothing), the integer by 64-bit arithmetic (its
# whole µs and its 3 decimals; `* 1000` on the DECIMAL itself would overflow DECIMAL(18)).
# Per 250 MB of events (ts and dur, one thread): 0.138 -> 0.069 CPU s against the regular
# expression this replaces (docs/performance.md, "Why it is built this way").
def _us_to_ns(expr: str) -> str:
    us = f"TRY_CAST({expr} AS DECIMAL(38,6))"
    exact = f"CASE WHEN abs({us}) < {_MAX_ABS_US} THEN CAST(round({us} * 1000) AS BIGINT) END"
    us3 = f"TRY_CAST({expr} AS DECIMAL(18,3))"
    ns3 = (f"CAST(trunc({us3}) AS BIGINT) * 1000 "
           f"+ CAST(CAST({us3} - trunc({us3}) AS DECIMAL(4,3)) * 1000 AS BIGINT)")
    return f"CASE WHEN {us3} = {us} THEN {ns3} ELSE {exact} END"


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


# The kind of a complete ('X') event, from its lowered category: a one-byte column of _ev
# (kind), so that the inserts' filters compare one small integer per event rather than ph and
# the category's text (each of the ~10 statements scanned every event's strings: ~0.3 CPU s
# per GB of events). 0: not a complete event, or no category; _K_OTHER: any other category.
_K_KERNEL, _K_MEMCPY, _K_MEMSET, _K_RUNTIME, _K_CPU_OP, _K_ANNOTATION, _K_GPU_ANNOTATION, \
    _K_SYNC, _K_OTHER = range(1, 10)
# kind -> the (lowered) categories of the complete events it holds: the one list of them, from
# which _KIND_OF_CAT and the inserts' CAT_* filters are made
_CATEGORIES = {_K_KERNEL: ("kernel",), _K_MEMCPY: ("gpu_memcpy", "memcpy"),
               _K_MEMSET: ("gpu_memset", "memset"),
               _K_RUNTIME: ("cuda_runtime", "runtime", "cuda_driver"),
               _K_CPU_OP: ("cpu_op", "operator", "python_function"),
               _K_ANNOTATION: ("user_annotation",), _K_GPU_ANNOTATION: ("gpu_user_annotation",),
               _K_SYNC: ("cuda_sync",)}
_KIND_OF_CAT = {c: k for k, cats in _CATEGORIES.items() for c in cats}


def _sql_list(*kinds: int) -> str:
    """The categories of these kinds as an SQL list: ('a', 'b')."""
    return "(" + ", ".join(f"'{c}'" for k in kinds for c in _CATEGORIES[k]) + ")"


def _kind_of(ph: str, cat: str) -> str:
    """The kind column of _ev, from SQL expressions of ph and of the lowered category."""
    whens = " ".join(f"WHEN '{c}' THEN {k}" for c, k in _KIND_OF_CAT.items())
    return (f"CAST(CASE WHEN {ph} = 'X' AND {cat} IS NOT NULL THEN CASE {cat} {whens} "
            f"ELSE {_K_OTHER} END ELSE 0 END AS TINYINT) AS kind")


# A batch of events (_EV) is a table of an in-memory database attached for the load, not a
# temporary table: temporary tables are seen only by their own connection, and the batch's
# inserts into the store's tables run on two connections at once (_insert_rows). The store's
# own database (--db) never holds it.
_SCRATCH = "_navdoctor_scratch"
_EV = f"{_SCRATCH}._ev"
_KERNEL_NAMES = f"{_SCRATCH}._kernel_names"   # a batch's kernel names, classified


class EarlyInflate:
    """A small gzip-compressed trace (its trailer's size, and the file, at most _INFLATE_MAX)
    inflated on a thread of its own from the start of an analysis, while the store is made
    (connecting to DuckDB and creating the schema hold the GIL for ~30 ms; zlib lets go of
    it). One zlib call inflates the whole file; anything unusual (not gzip, corrupt, several
    gzip members, larger than it said) leaves it to the load's own paths: result() None."""

    def __init__(self, path: str):
        self.path = path
        self._data: bytes | None = None
        self._thread = threading.Thread(target=self._run, name="navdoctor-inflate", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with open(self.path, "rb") as f:
                raw = f.read(_INFLATE_MAX + 1)
            d = zlib.decompressobj(31)
            data = d.decompress(raw, _INFLATE_MAX + 1)
            if d.eof and not d.unused_data and len(data) <= _INFLATE_MAX:
                self._data = data
        except (OSError, zlib.error, ValueError, MemoryError):
            pass

    def result(self) -> bytes | None:
        self._thread.join()
        data, self._data = self._data, None   # taken once: the load holds it from here
        return data


def inflate_early(path: str) -> EarlyInflate | None:
    """An EarlyInflate of path when it is a small gzipped JSON document (see there), else
    None (anything else is left to the analysis, which tells what it is)."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > _INFLATE_MAX \
                or sniff_kineto(path) != "gzip" or gzip_trailer_size(path) > _INFLATE_MAX:
            return None
    except (OSError, TraceError):
        return None
    return EarlyInflate(path)


def load_kineto(con: duckdb.DuckDBPyConnection, path: str, trace_id: int,
                early: EarlyInflate | None = None) -> LoadResult:
    """`early`: the trace already being inflated (inflate_early), if it was started."""
    con.execute(f"ATTACH IF NOT EXISTS ':memory:' AS {_SCRATCH}")
    try:
        return _load_kineto(con, path, trace_id, early)
    finally:
        con.execute(f"DETACH DATABASE IF EXISTS {_SCRATCH}")


def _load_kineto(con: duckdb.DuckDBPyConnection, path: str, trace_id: int,
                 early: EarlyInflate | None = None) -> LoadResult:
    kind = sniff_kineto(path)
    if kind is None:
        raise TraceError(path, "not a trace: neither JSON nor gzip-compressed JSON")
    if kind.endswith("array"):
        raise TraceError(path, "JSON has no 'traceEvents' list (top level is an array): "
                               "not a torch.profiler/Kineto trace")
    compression = "gzip" if kind == "gzip" else "none"
    result = LoadResult(path=path, format="kineto-json.gz" if kind == "gzip" else "kineto-json",
                        source="kineto")
    rows = _Rows(con, trace_id)
    skipped = 0
    try:
        inflated = early.result() if early is not None and compression == "gzip" else None
        if not _read_streaming(con, path, compression, rows, inflated):
            with rows.read_time.part():
                if not _read_typed(con, path, compression):
                    skipped = _read_generic(con, path, compression)
            rows.batch(streamed=False)
        if rows.total == 0:
            raise TraceError(path, "trace is empty: 'traceEvents' holds no event objects")
        if skipped:
            result.warnings.append(f"{skipped} entries of 'traceEvents' that are not event objects "
                                   "were skipped")
        if rows.bad_ts:
            result.warnings.append(f"{rows.bad_ts} events without a usable 'ts' were skipped")
        if rows.bad_dur:
            result.warnings.append(f"{rows.bad_dur} complete events with a missing or negative "
                                   "'dur' were skipped")
        with phase("load.kineto.whole_trace"):
            rows.finish()
            _load_device_properties(con, trace_id)
    finally:
        rows.read_time.record()
        rows.insert_time.record()
        rows.drop()

    result.events = rows.total - rows.bad_ts - rows.bad_dur
    result.start_ns, result.end_ns = rows.start_ns, rows.end_ns
    if rows.gpu == 0:
        result.warnings.append("no GPU activity in this trace (CPU-only profile): "
                               "the verdict can only weigh CPU time and data loading")
    meta = con.execute("SELECT CAST(schemaVersion AS VARCHAR) FROM _kineto_doc").fetchall()[0][0]
    result.producer = f"torch.profiler (Kineto schemaVersion {meta})" if meta else "torch.profiler"
    con.execute("DROP TABLE _kineto_doc")
    return result


# The fields of an event that navdoctor reads, typed so that DuckDB parses each event once.
# ts/dur/pid/tid/id stay JSON: their text keeps every digit, and they can be numbers or strings.
_EVENT_STRUCT = ("STRUCT(ph VARCHAR, cat VARCHAR, name VARCHAR, pid JSON, tid JSON, ts JSON, "
                 "dur JSON, args JSON, id JSON)[]")
_DOC_COLUMNS = ("deviceProperties: 'JSON', distributedInfo: 'JSON', schemaVersion: 'JSON', "
                "displayTimeUnit: 'JSON'")


def _reader(path: str, compression: str, events_type: str) -> str:
    return (f"read_json(?, format='unstructured', compression='{compression}', "
            f"maximum_object_size={_document_bytes(path, compression)}, "
            f"columns={{traceEvents: '{events_type}', {_DOC_COLUMNS}}})")


def _document_bytes(path: str, compression: str) -> int:
    """DuckDB's maximum_object_size for the whole document as one JSON value (its limit is an
    unsigned 32-bit number; DuckDB sets aside about twice this much before it reads):
    a plain file's size (a run of whitespace of any length parses: the document is all
    there is); a gzip file's inflated size, from its trailer where that says more than 40x
    its size, within the inflate bound (loaders/base.inflate_limit)."""
    size = os.path.getsize(path)
    if compression != "gzip":
        need = size + (1 << 20)
    else:
        need = min(max(size * 40, gzip_trailer_size(path) + (1 << 20)), inflate_limit(path))
    return min(max(need, 1 << 24), (1 << 32) - 1)


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
    except RecursionError:   # a value nested thousands deep: DuckDB's parser reads it
        raise _NotStreamable from None


def _parse_tail(tail: bytes) -> tuple[int, dict] | None:
    """Where the events array ends in `tail` (the offset just after its ']') and the keys
    after it, or None. The array's ']' is the first ']' after which the rest of the text is
    exactly the rest of the top-level object: an earlier ']' (inside the last event) leaves
    unbalanced closers behind it, and a later one is inside a trailing key's value."""
    s = tail.decode("utf-8", "surrogateescape")
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
    except (json.JSONDecodeError, RecursionError):
        return None
    return keys


# DuckDB keeps the buffers it read from a pipe until it is done with that pipe (the whole
# array, were it one pipe: as much memory as the file), and reads one pipe on one thread:
# so the array goes through several pipes, each a JSON array of consecutive events (~_SEGMENT
# bytes), cut where one top-level event ends and the next begins. A cut is only ever made at
# '}' ws ',' ws '{'; one made inside a string or an event's nested value leaves some piece
# malformed (the first piece starts at depth 1, and each piece is whole only if it ends there
# too), DuckDB rejects it, and the trace goes to the whole-document path.
# The pipes are read _BATCH_PIPES at a time, by one read_json each (several pipes at once,
# one thread each): each batch of events is counted, inserted into the store and dropped
# before the next is read, so that memory holds one batch, whatever the size of the trace.
_SEGMENT = 32 << 20
_BATCH_PIPES = 8
# A trace of a few segments or less is still cut into one piece per core (of at least
# _MIN_PIECE bytes), so that DuckDB reads it on every core: the 24 MB of the nav_default
# fixture took 0.12 s through one pipe, 0.09 s through two (inflating included). A
# compressed trace that small (by the size its gzip trailer records) is inflated into
# memory first, so that its pieces can be written at once rather than one after the other.
_MIN_PIECE = 4 << 20
_INFLATE_MAX = 64 << 20
_CUT = re.compile(rb"\}[ \t\n\r]*,[ \t\n\r]*\{")
_CARRY = 64  # bytes held back so that a cut can be found across two reads
_PIPE_BYTES = 1 << 20  # a pipe's buffer (Linux: up to /proc/sys/fs/pipe-max-size): fewer, larger reads
_F_SETPIPE_SZ = 1031


def _widen(fd: int) -> None:
    try:
        import fcntl
        fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_BYTES)
    except (ImportError, OSError):
        pass


class _Stopped(Exception):
    """The reader gave up: the writer stops quietly."""


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
        except _Stopped:
            pass
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
    """Bytes a..b of the file into the pipe, by sendfile (no copy through Python)."""
    def write(stop: threading.Event) -> None:
        with open(fifo, "wb", buffering=0) as out, open(path, "rb", buffering=0) as f:
            _widen(out.fileno())
            out.write(prefix)
            pos = a
            while pos < b and not stop.is_set():
                try:
                    sent = os.sendfile(out.fileno(), f.fileno(), pos, min(b - pos, _STREAM_CHUNK))
                except OSError as e:
                    if e.errno not in (errno.EINVAL, errno.ENOSYS):
                        raise
                    sent = _copy_range(f, out, pos, min(b - pos, _STREAM_CHUNK))
                if not sent:
                    raise _NotStreamable("the file shrank while being read")
                pos += sent
            out.write(suffix)
    return write


def _copy_range(f, out, pos: int, n: int) -> int:
    f.seek(pos)
    chunk = f.read(n)
    out.write(chunk)
    return len(chunk)


def _plain_ranges(path: str, start: int) -> tuple[list[tuple[int, int]], dict] | None:
    """An uncompressed trace: where its array ends (and the keys after it), and the byte
    range of each piece. None when the end is not found."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        tail_at = max(start, size - _TAIL_KEEP - _STREAM_CHUNK)
        f.seek(tail_at)
        found = _parse_tail(f.read())
        if found is None:
            return None
        end = tail_at + found[0]

        def near(target: int) -> tuple[int, int] | None:
            f.seek(target)
            m = _CUT.search(f.read(min(1 << 20, end - target)))
            return None if m is None else (target + m.start(), target + m.end())
        return _cut_ranges(start, end, near), found[1]


def _piece_count(nbytes: int) -> int:
    """Pieces for nbytes of events: one per _SEGMENT, and one per core for a small array."""
    cores = min(_BATCH_PIPES, os.cpu_count() or 1)
    return max(1, round(nbytes / _SEGMENT), min(cores, nbytes // _MIN_PIECE))


def _cut_ranges(start: int, end: int, near) -> list[tuple[int, int]]:
    """The byte ranges of the array's pieces: cut at about equal distances, each where
    near(target) finds a cut (its match's start and end) after target."""
    n = _piece_count(end - start)
    ranges = [[start, None]]
    for i in range(1, n):
        target = start + (end - start) * i // n
        if target <= ranges[-1][0]:
            continue
        m = near(target)
        if m is None or m[1] - 1 >= end - 1:
            continue
        ranges[-1][1] = m[0] + 1
        ranges.append([m[1] - 1, None])
    ranges[-1][1] = end
    return [(a, b) for a, b in ranges]


def _memory_ranges(data: bytes) -> tuple[list[tuple[int, int]], dict] | None:
    """A compressed trace inflated into memory (data: from the array's '[' on): as
    _plain_ranges. The keys after the array must fit in _TAIL_KEEP bytes, so that many
    are searched for its end (5x _TAIL_KEEP took 26 ms on a 24 MB trace)."""
    tail_at = max(0, len(data) - _TAIL_KEEP)
    found = _parse_tail(data[tail_at:])
    if found is None:
        return None
    end = tail_at + found[0]

    def near(target: int) -> tuple[int, int] | None:
        m = _CUT.search(data, target, min(end, target + (1 << 20)))
        return None if m is None else (m.start(), m.end())
    return _cut_ranges(0, end, near), found[1]


def _memory_writer(data: bytes, fifo: str, a: int, b: int, prefix: bytes, suffix: bytes):
    """Bytes a..b of data into the pipe (the GIL is let go while the pipe is full)."""
    def write(stop: threading.Event) -> None:
        view = memoryview(data)
        with open(fifo, "wb", buffering=0) as out:
            _widen(out.fileno())
            out.write(prefix)
            pos = a
            while pos < b and not stop.is_set():
                pos += out.write(view[pos:min(b, pos + _STREAM_CHUNK)])
            out.write(suffix)
    return write


class _TooLarge(Exception):
    """The gzip stream inflated past its bound (loaders/base.inflate_limit)."""


class _StreamPieces:
    """A compressed trace: one writer inflates the stream and writes the array into the
    pipes one after the other, cutting after about `target` bytes each. The reader makes the
    pipes a batch at a time (publish); the writer waits for the next one when it gets there,
    and when the array ends it gives the pipes left in the batch an empty array. Whatever
    ends the writer (the end of the array, a failure, the bound), every pipe published is
    then opened and closed, so that DuckDB, which waits to open each pipe of its batch,
    never waits for a writer that is gone (that froze the run on a trace with a long run of
    whitespace after its events: no end of the array was found). No more than `limit` bytes
    are inflated (_TooLarge)."""

    def __init__(self, stream, pending: bytes, make_fifo, target: int, limit: int | None = None):
        self.stream, self.pending, self.make_fifo, self.target = stream, pending, make_fifo, target
        self.limit = limit
        self.too_large = False
        self.tail_keys: dict | None = None
        self.fifos: list[str] = []
        self.cond = threading.Condition()
        self.waiting = False   # the writer waits for a pipe not made yet
        self.writer = _Writer(self.fifos, self.write)

    def publish(self, n: int) -> list[str]:
        with self.cond:
            new = [self.make_fifo(len(self.fifos) + i) for i in range(n)]
            self.fifos.extend(new)
            self.cond.notify_all()
        return new

    def more(self) -> bool:
        """After a batch was read: whether the writer has more of the array to write."""
        with self.cond:
            while self.writer.is_alive() and not self.waiting:
                self.cond.wait(0.05)
            return self.writer.is_alive()

    def _open(self, k: int, stop: threading.Event):
        with self.cond:
            while k >= len(self.fifos):
                if stop.is_set():
                    raise _Stopped
                self.waiting = True
                self.cond.notify_all()
                self.cond.wait(0.05)
            self.waiting = False
        out = open(self.fifos[k], "wb")
        _widen(out.fileno())
        return out

    def write(self, stop: threading.Event) -> None:
        k = 0
        ended = False
        out = self._open(0, stop)
        try:
            seg_len = 0
            carry = b""

            def emit(data: bytes, final: bool) -> None:
                nonlocal k, out, seg_len, carry
                data = carry + data
                pos = 0
                while True:
                    look = min(len(data), pos + max(self.target - seg_len, 0))
                    m = _CUT.search(data, look)
                    if m is None:
                        break
                    out.write(data[pos:m.start() + 1])
                    out.write(b"]")
                    out.close()
                    k += 1
                    out = self._open(k, stop)
                    out.write(b"[")
                    pos, seg_len = m.end() - 1, 0
                keep = 0 if final else _CARRY
                stop_at = max(pos, len(data) - keep)
                out.write(data[pos:stop_at])
                seg_len += stop_at - pos
                carry = data[stop_at:]

            held = self.pending
            inflated = len(held)
            while not stop.is_set():
                chunk = self.stream.read(_STREAM_CHUNK)
                if not chunk:
                    break
                inflated += len(chunk)
                if self.limit is not None and inflated > self.limit:
                    self.too_large = True   # (before the pipes close: the reader then looks)
                    raise _TooLarge
                if len(chunk) == _STREAM_CHUNK and not chunk.strip(b" \t\r\n"):
                    # A run of whitespace of 4 MiB or more (valid JSON): this pipe would hold
                    # it and the next cut come too late, while DuckDB waits to open the next
                    # pipe of its batch (and cannot read a run that long in a pipe anyway).
                    # The whole-document path reads it, in time linear in its size.
                    raise _NotStreamable("a long run of whitespace")
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
            ended = True
        finally:
            out.close()
            with self.cond:
                spare = self.fifos[k + 1:]
            for fifo in spare:   # an empty array where the array has ended, else nothing
                if stop.is_set():
                    break
                with open(fifo, "wb") as f:
                    if ended:
                        f.write(b"[]")


def _json_text(col: str) -> str:
    """col->>'$' of a JSON column that holds text (CAST(json AS VARCHAR)): only strings need
    parsing (to unquote and unescape them); any other JSON value is its text already."""
    return f"CASE WHEN starts_with({col}, '\"') THEN CAST({col} AS JSON)->>'$' ELSE {col} END"


def _read_events_sql() -> str:
    """The streamed batch into _ev: the columns of _read_typed's _ev, computed with fewer
    JSON parses (each value's text taken once; Input Dims and Input type in one parse)."""
    return f"""
    CREATE OR REPLACE TABLE {_EV} AS
    SELECT ph, cat, name,
           {_int_of(_json_text("pid_j"))} AS pid, {_int_of(_json_text("tid_j"))} AS tid,
           {_us_to_ns(_json_text("ts_j"))} AS ts_ns, {_us_to_ns(_json_text("dur_j"))} AS dur_ns,
           CASE WHEN cat IN {_ARGS_UNUSED} AND NOT (ph IN ('i', 'I') AND name = '[memory]')
                AND NOT (ph = 'M' AND name = 'thread_name') THEN NULL ELSE args END AS args,
           CAST(shape[1] AS VARCHAR) AS input_dims, CAST(shape[2] AS VARCHAR) AS input_types,
           flow_id, {_kind_of("ph", "cat")}
    FROM (SELECT ph, lower(cat) AS cat, name, CAST(pid AS VARCHAR) AS pid_j,
                 CAST(tid AS VARCHAR) AS tid_j, CAST(ts AS VARCHAR) AS ts_j,
                 CAST(dur AS VARCHAR) AS dur_j, args, id->>'$' AS flow_id,
                 -- args as DuckDB wrote them hold the keys' text unescaped: without
                 -- '"Input ' anywhere (Python functions), neither key is there to parse for
                 CASE WHEN lower(cat) IN {CAT_CPU_OP} AND contains(CAST(args AS VARCHAR), '"Input ')
                      THEN json_extract(args, ['$."Input Dims"', '$."Input type"']) END AS shape
          FROM read_json(?, format='array', columns={_EVENT_COLUMNS}))"""


def _read_streaming(con: duckdb.DuckDBPyConnection, path: str, compression: str,
                    rows: "_Rows", whole: bytes | None = None) -> bool:
    """The fast path for well-formed traces: the events in batches (each inserted by `rows`)
    and _kineto_doc, without ever holding the document (but for `whole`: the inflated
    trace, where EarlyInflate made it). False (nothing left in the store) when the trace
    needs the whole-document path."""
    opener = gzip.open if compression == "gzip" else open
    tmpdir = None
    writers: list[_Writer] = []
    try:
        with (io.BytesIO(whole) if whole is not None else opener(path, "rb")) as stream:
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
                fifo = os.path.join(tmpdir, f"events{i:05d}.json")
                os.mkfifo(fifo)
                return fifo

            def read(fifos: list[str]) -> bool:
                # One statement reads the batch's pipes, several at a time (one thread
                # each). Rows of different pipes interleave: like DuckDB's JSON reader itself
                # (which may emit an event cut by its buffer boundaries after later ones),
                # the load promises no row order; every table is defined by its content.
                try:
                    with rows.read_time.part():
                        con.execute(_read_events_sql(), [fifos])
                except duckdb.Error:
                    return False
                return True

            def read_ranges(ranges: list[tuple[int, int]], writer) -> bool:
                """The pieces of the array, _BATCH_PIPES at a time, each written into its
                pipe by writer(fifo, a, b, prefix, suffix) on a thread of its own."""
                nonlocal writers
                last = len(ranges) - 1
                for b0 in range(0, len(ranges), _BATCH_PIPES):
                    writers = []
                    for i in range(b0, min(b0 + _BATCH_PIPES, len(ranges))):
                        fifo = fifo_of(i)
                        a, b = ranges[i]
                        writers.append(_Writer([fifo], writer(
                            fifo, a, b, b"[" if i else b"", b"]" if i < last else b"")))
                    for w in writers:
                        w.start()
                    try:
                        ok = read([w.fifos[0] for w in writers])
                    finally:
                        for w in writers:
                            w.drain()
                    if not ok or any(w.error is not None or not w.done for w in writers) \
                            or not rows.batch(streamed=True):
                        return False
                    for w in writers:
                        os.unlink(w.fifos[0])
                return True

            def read_split(split: tuple[list[tuple[int, int]], dict] | None, writer) -> dict | None:
                """The pieces an array split (_plain_ranges, _memory_ranges) found, read by
                read_ranges; the keys after the array, or None where this path cannot
                load the trace (no end found, a second traceEvents, a failed read)."""
                if split is None or "traceEvents" in split[1]:
                    return None
                return split[1] if read_ranges(split[0], writer) else None

            inflated = None
            if whole is not None:
                inflated = whole[start:]
            elif compression == "gzip" and gzip_trailer_size(path) - start <= _INFLATE_MAX:
                # small (as the gzip trailer records its size, mod 2**32): inflated whole
                rest = stream.read(_INFLATE_MAX + 1)
                if len(rest) <= _INFLATE_MAX:
                    inflated = buf[start:] + rest
                else:  # the trailer's size wrapped around 2**32: stream it after all
                    buf += rest
            if inflated is not None:
                tail_keys = read_split(_memory_ranges(inflated), lambda fifo, a, b, pre, suf:
                                       _memory_writer(inflated, fifo, a, b, pre, suf))
            elif compression == "gzip":
                # the first batch sized by the size the gzip trailer records (mod 2**32)
                first = max(1, min(_BATCH_PIPES, round(max(gzip_trailer_size(path) - start, 1) / _SEGMENT)))
                limit = inflate_limit(path)
                pieces = _StreamPieces(stream, buf[start:], fifo_of, _SEGMENT, limit - start)
                writers = [pieces.writer]
                batch = pieces.publish(first)
                pieces.writer.start()
                while True:
                    ok = read(batch)
                    if pieces.too_large:
                        rows.undo()
                        raise TraceError(path, too_large_text(limit))
                    if not ok or pieces.writer.error is not None or not rows.batch(streamed=True):
                        return rows.undo()
                    if not pieces.more():
                        break
                    batch = pieces.publish(_BATCH_PIPES)
                pieces.writer.join()
                if not pieces.writer.done or pieces.tail_keys is None:
                    return rows.undo()
                tail_keys = pieces.tail_keys
            else:
                tail_keys = read_split(_plain_ranges(path, start), lambda fifo, a, b, pre, suf:
                                       _plain_writer(path, fifo, a, b, pre, suf))
        if tail_keys is None or not rows.total or "traceEvents" in tail_keys:
            return rows.undo()
        keys.update(tail_keys)
        doc = [None if keys.get(k) is None else json.dumps(keys[k]) for k in _DOC_KEYS]
        con.execute("CREATE OR REPLACE TEMP TABLE _kineto_doc AS SELECT "
                    + ", ".join(f"CAST(? AS JSON) AS {k}" for k in _DOC_KEYS), doc)
        return True
    except (OSError, EOFError, zlib.error, _NotStreamable, UnicodeError, ValueError):
        return rows.undo()
    finally:
        for w in writers:
            w.drain()
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)


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
        CREATE OR REPLACE TABLE {_EV} AS
        SELECT e.ph, lower(e.cat) AS cat, e.name,
               {_int_of("e.pid->>'$'")} AS pid, {_int_of("e.tid->>'$'")} AS tid,
               {_us_to_ns("e.ts->>'$'")} AS ts_ns, {_us_to_ns("e.dur->>'$'")} AS dur_ns,
               {_event_args("e.args", "e.ph", "e.cat", "e.name")}, e.id->>'$' AS flow_id,
               {_kind_of("e.ph", "lower(e.cat)")}
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
        if compression == "gzip" and "maximum_object_size" in str(e) \
                and _document_bytes(path, compression) >= inflate_limit(path):
            raise TraceError(path, too_large_text(inflate_limit(path))) from None
        raise TraceError(path, "truncated or malformed JSON: " + _first_line(e)) from None
    _check_document(con, path)
    if con.execute("SELECT any_value(json_type(traceEvents)) FROM _kineto_doc").fetchone()[0] != "ARRAY":
        raise TraceError(path, "'traceEvents' is not a list: not a torch.profiler/Kineto trace")
    con.execute(f"""
        CREATE OR REPLACE TABLE {_EV} AS
        SELECT e->>'ph' AS ph, lower(e->>'cat') AS cat, e->>'name' AS name,
               {_int_of("e->>'pid'")} AS pid, {_int_of("e->>'tid'")} AS tid,
               {_us_to_ns("e->>'ts'")} AS ts_ns, {_us_to_ns("e->>'dur'")} AS dur_ns,
               {_event_args("(e->'args')", "(e->>'ph')", "(e->>'cat')", "(e->>'name')")},
               e->>'id' AS flow_id, {_kind_of("(e->>'ph')", "lower(e->>'cat')")}
        FROM (SELECT unnest(CAST(traceEvents AS JSON[])) AS e FROM _kineto_doc)
        WHERE json_type(e) = 'OBJECT'""")
    return con.execute("SELECT json_array_length(traceEvents) FROM _kineto_doc").fetchone()[0] \
        - con.execute(f"SELECT count(*) FROM {_EV}").fetchone()[0]


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


CAT_KERNEL = _sql_list(_K_KERNEL)
CAT_MEMCPY = _sql_list(_K_MEMCPY)
CAT_MEMSET = _sql_list(_K_MEMSET)
CAT_RUNTIME = _sql_list(_K_RUNTIME)
CAT_CPU_OP = _sql_list(_K_CPU_OP)
CAT_ANNOTATION = _sql_list(_K_ANNOTATION, _K_GPU_ANNOTATION)
# (contains() first: a cheap test that every name the LIKE matches passes)
DATALOADER_NAME = ("((contains(name, 'DataLoader') AND name LIKE '%DataLoader%__next__%') "
                   "OR name = 'navdoctor.dataloader_next')")


def _args_of(keys: tuple[str, ...], where: str, json_keys: tuple[str, ...] = ()) -> str:
    """The rows of _ev that `where` selects, with `a` (the text of each of `keys` in args,
    as args->>key) and `j` (the JSON of each of `json_keys`, as args->key), from one parse of
    args per row instead of one per key."""
    def path(k: str) -> str:
        return "'$.\"" + k.replace('"', '\\"') + "\"'"
    cols = f"json_extract_string(args, [{', '.join(path(k) for k in keys)}]) AS a"
    if json_keys:
        cols += f", json_extract(args, [{', '.join(path(k) for k in json_keys)}]) AS j"
    return f"(SELECT *, {cols} FROM {_EV} WHERE {where})"


# ph = 'X' AND cat NOT IN ('gpu_user_annotation'): a complete event with a category, not that one
_X_NOT_GPU_ANNOTATION = f"kind <> 0 AND kind <> {_K_GPU_ANNOTATION}"


def _insert_rows(con: duckdb.DuckDBPyConnection, trace_id: int, cuda_sync_seen: bool,
                 events: int, kernel_names: list[str | None]) -> None:
    """The rows of the events in _ev (`events` of them, kernel_names the distinct names of
    its kernels): into the store's tables, and into the side tables (_SIDE_TABLES) what only
    the whole trace decides (_insert_whole_trace)."""
    t = int(trace_id)
    store = []   # the store's tables: on either connection (see _run_on_two)
    side = []    # the side tables: temporary, so on this connection
    a = "args"
    corr = _int_of(f"{a}->>'correlation'")
    # device, stream, correlation of a GPU activity: a[1], a[2], a[3] of _args_of(_GPU_KEYS)
    device = f"CAST(COALESCE({_int_of('a[1]')}, pid) AS INTEGER)"
    stream = f"COALESCE({_int_of('a[2]')}, tid)"
    gpu_corr = _int_of("a[3]")
    # uses_tensor_cores and is_communication from the kernel's name: its batch's distinct
    # names classified once here (as the nsys loader does), joined in by the insert.
    names = kernel_names
    con.execute(f"""
        CREATE OR REPLACE TABLE {_KERNEL_NAMES} AS
        SELECT unnest(?::VARCHAR[]) AS name, unnest(?::BOOLEAN[]) AS tc,
               unnest(?::BOOLEAN[]) AS comm""",
                [names, [None if n is None else tensor_core_kernel(n) for n in names],
                 [communication_kernel(n) for n in names]])
    store.append(f"""
        INSERT INTO kernels
        SELECT {t}, 'kineto', {device}, {stream}, {gpu_corr}, ev.name, ts_ns, ts_ns + dur_ns, dur_ns,
               TRY_CAST(j[1]->>0 AS INTEGER), TRY_CAST(j[1]->>1 AS INTEGER),
               TRY_CAST(j[1]->>2 AS INTEGER), TRY_CAST(j[2]->>0 AS INTEGER),
               TRY_CAST(j[2]->>1 AS INTEGER), TRY_CAST(j[2]->>2 AS INTEGER),
               TRY_CAST(a[4] AS INTEGER), TRY_CAST(a[5] AS BIGINT),
               TRY_CAST(a[6] AS DOUBLE) / 100.0,
               kn.tc, kn.comm
        FROM {_args_of(_GPU_KEYS + ('registers per thread', 'shared memory', 'est. achieved occupancy %'),
                       f"kind = {_K_KERNEL}", ('grid', 'block'))} ev
        LEFT JOIN {_KERNEL_NAMES} kn ON ev.name IS NOT DISTINCT FROM kn.name""")
    # 'Memcpy HtoD (Pageable -> Device)': kind and memory types are in the name.
    store.append(f"""
        INSERT INTO memcpy
        SELECT {t}, 'kineto', {device}, {stream}, {gpu_corr},
               NULLIF(regexp_extract(name, 'Memcpy ([A-Za-z]+)', 1), ''),
               lower(NULLIF(regexp_extract(name, '\\(([A-Za-z]+) *-> *([A-Za-z]+)\\)', 1), '')),
               lower(NULLIF(regexp_extract(name, '\\(([A-Za-z]+) *-> *([A-Za-z]+)\\)', 2), '')),
               TRY_CAST(a[4] AS BIGINT), ts_ns, ts_ns + dur_ns, dur_ns
        FROM {_args_of(_GPU_KEYS + ('bytes',), f"kind = {_K_MEMCPY}")}""")
    store.append(f"""
        INSERT INTO memset
        SELECT {t}, 'kineto', {device}, {stream}, {gpu_corr}, TRY_CAST(a[4] AS BIGINT),
               ts_ns, ts_ns + dur_ns, dur_ns
        FROM {_args_of(_GPU_KEYS + ('bytes',), f"kind = {_K_MEMSET}")}""")
    store.append(f"""
        INSERT INTO runtime_calls
        SELECT {t}, 'kineto', pid, tid, {corr},
               CASE WHEN cat = 'cuda_driver' THEN 'driver' ELSE 'runtime' END,
               name, ts_ns, ts_ns + dur_ns, dur_ns, is_launch_api(name), is_sync_api(name)
        FROM {_EV} WHERE kind = {_K_RUNTIME}""")
    store.append(f"""
        INSERT INTO cpu_ops
        SELECT {t}, 'kineto', pid, tid, name,
               CASE WHEN cat = 'operator' THEN 'cpu_op' ELSE cat END,
               ts_ns, ts_ns + dur_ns, dur_ns, input_dims, input_types
        FROM {_EV} WHERE kind = {_K_CPU_OP}
          AND name NOT LIKE 'ProfilerStep#%'""")
    store.append(f"""
        INSERT INTO nvtx_ranges
        SELECT {t}, 'kineto', pid, tid, name, cat, ts_ns, ts_ns + dur_ns, dur_ns
        FROM {_EV} WHERE kind IN ({_K_ANNOTATION}, {_K_GPU_ANNOTATION})""")
    store.append(f"""
        INSERT INTO dataloader_waits
        SELECT {t}, 'kineto', pid, tid, name, ts_ns, ts_ns + dur_ns, dur_ns
        FROM {_EV} WHERE {_X_NOT_GPU_ANNOTATION} AND {DATALOADER_NAME}""")
    # Blocking waits: the sync events of newer Kineto (not its "Stream Wait Event", in which
    # the host does not wait, as the nsys loader), and blocking runtime calls.
    store.append(f"""
        INSERT INTO sync_events
        SELECT {t}, 'kineto', pid, tid,
               CASE WHEN name ILIKE '%stream%' THEN 'stream' WHEN name ILIKE '%event%' THEN 'event'
                    WHEN name ILIKE '%context%' THEN 'context' ELSE 'device' END,
               name, {corr}, ts_ns, ts_ns + dur_ns, dur_ns
        FROM {_EV} WHERE kind = {_K_SYNC} AND NOT coalesce(sync_record_without_host_wait(name), false)""")
    store.append(f"""
        INSERT INTO memory_events
        SELECT {t}, 'kineto',
               CASE TRY_CAST(a[1] AS INTEGER) WHEN 0 THEN 'cpu' WHEN 1 THEN 'cuda'
                    ELSE CAST(a[1] AS VARCHAR) END,
               TRY_CAST(a[2] AS INTEGER), ts_ns, TRY_CAST(a[3] AS BIGINT),
               TRY_CAST(a[4] AS BIGINT), TRY_CAST(a[5] AS BIGINT)
        FROM {_args_of(('Device Type', 'Device Id', 'Bytes', 'Total Allocated', 'Total Reserved'),
                       "ph IN ('i', 'I') AND name = '[memory]'")}""")
    # Steps, the blocking runtime calls, thread names and ac2g flows: see _insert_whole_trace.
    side.append(f"""
        INSERT INTO _k_steps
        SELECT name, ts_ns, dur_ns FROM {_EV}
        WHERE {_X_NOT_GPU_ANNOTATION}
          AND (prefix(name, '{_STEP_PATTERNS[0][1]}#') OR prefix(name, '{_STEP_PATTERNS[1][1]}#'))
          AND (regexp_matches(name, '{_STEP_PATTERNS[0][0]}')
               OR regexp_matches(name, '{_STEP_PATTERNS[1][0]}'))""")
    if not cuda_sync_seen:
        side.append(f"""
            INSERT INTO _k_runtime_syncs
            SELECT {t}, 'kineto', pid, tid, sync_kind_of_api(name), name, {corr},
                   ts_ns, ts_ns + dur_ns, dur_ns
            FROM {_EV} WHERE kind = {_K_RUNTIME} AND is_sync_api(name)""")
    side.append(f"""
        INSERT INTO _k_threads
        SELECT DISTINCT pid, tid, {a}->>'name'
        FROM {_EV} WHERE ph = 'M' AND name = 'thread_name' AND {a}->>'name' IS NOT NULL""")
    side.append(f"""
        INSERT INTO _k_flows
        SELECT ph, flow_id, ts_ns, tid FROM {_EV} WHERE cat = 'ac2g' AND ph IN ('s', 'f')""")
    _run_on_two(con, store, side, one_thread=events > _ROW_GROUP_ROWS)


# The store's tables whose inserts cost the most, costliest first (_run_on_two).
_COSTLIEST = ("cpu_ops", "kernels", "memory_events", "runtime_calls", "dataloader_waits")

# DuckDB's row group: a scan of a table of at most this many rows is one task, so a
# statement over such a batch runs on one thread whatever `threads` says.
_ROW_GROUP_ROWS = 122_880


def _run_on_two(con: duckdb.DuckDBPyConnection, store: list[str], side: list[str],
                one_thread: bool = True) -> None:
    """The statements of `store` on two connections at once (this one and a cursor, on a
    thread of its own; one statement of a small batch keeps about one core busy), those of
    `side` on this one. Each statement fills its own table, so the order they run in does
    not change any table. An error raises the first failing statement's, in list order.
    With one_thread, DuckDB runs them with one thread each (see below)."""
    if (os.cpu_count() or 1) < 2:
        for q in side + store:
            con.execute(q)
        return
    # the costliest first, so that neither connection is left with a long one at the end
    # (per 250 MB of events on one thread: the CPU ops 0.09 s, most rows; the kernels 0.06,
    # most args parsed; the memory events 0.035 and the CUDA calls 0.024; the rest 0.02 or
    # less; the memory events last cost 0.02 s of wall time per batch)
    todo = sorted(range(len(store)), key=lambda i: next(
        (rank for rank, table in enumerate(_COSTLIEST) if f"INTO {table}\n" in store[i]),
        len(_COSTLIEST)))
    lock = threading.Lock()
    failed: dict[int, BaseException] = {}

    def work(c) -> None:
        while not failed:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            try:
                c.execute(store[i])
            except BaseException as e:  # noqa: BLE001 - raised in the caller below
                failed[i] = e

    # One DuckDB thread per statement while two run at once: each connection's own thread
    # runs its statement. With DuckDB's worker threads too, the large inserts wrote their
    # rows compressed as they went (optimistic writes), which the checkpoint after a batch
    # (_bound_memory) does anyway where memory needs it: 1 GB of events, CPU s of the whole
    # analysis 10.6 -> 10.0, peak RSS 0.73-0.96 -> 0.74 GB (docs/performance.md, "Why it is built this way").
    # A batch of one row group (the 2 MB fixture's 74 k events) runs on one thread anyway;
    # there the two SETs only cost time (~6 ms: DuckDB stops and restarts its workers).
    threads = None
    if one_thread:
        threads = con.execute("SELECT current_setting('threads')").fetchall()[0][0]
        con.execute("SET threads = 1")
    cur = con.cursor()
    helper = threading.Thread(target=work, args=(cur,), name="navdoctor-inserts", daemon=True)
    helper.start()
    try:
        for q in side:
            con.execute(q)
        work(con)
        while helper.is_alive():
            helper.join(0.05)
    except BaseException:  # a Ctrl-C or an error here: the other statement is stopped too
        failed.setdefault(-1, None)
        while helper.is_alive():
            cur.interrupt()
            helper.join(0.05)
        raise
    finally:
        cur.close()
        if threads is not None:
            con.execute(f"SET threads = {int(threads)}")
    if failed:
        raise failed[min(failed)]


_GPU_KEYS = ("device", "stream", "correlation")

# Steps: torch's ProfilerStep#N (a scheduled profiler), else the navdoctor.step#N ranges
# navdoctor's collector marks when it profiles a whole run (no schedule, so no ProfilerStep).
# Each pattern matches only names that start with its origin and '#' (the inserts test that
# prefix first, a regular expression per event costing ~0.1 s of CPU per GB).
_STEP_PATTERNS = (("^ProfilerStep#[0-9]+$", "ProfilerStep"),
                  ("^navdoctor\\.step#[0-9]+$", "navdoctor.step"))

# What the rows of one batch cannot decide alone, gathered over the batches of a trace.
_SIDE_TABLES = {
    "_k_steps": "name VARCHAR, ts_ns BIGINT, dur_ns BIGINT",
    "_k_runtime_syncs": None,   # the columns of sync_events
    "_k_threads": "pid BIGINT, tid BIGINT, name VARCHAR",
    "_k_flows": "ph VARCHAR, flow_id VARCHAR, ts_ns BIGINT, tid BIGINT",
}


def _insert_whole_trace(con: duckdb.DuckDBPyConnection, trace_id: int, cuda_sync_seen: bool) -> None:
    t = int(trace_id)
    for pattern, origin in _STEP_PATTERNS:
        con.execute(f"""
            INSERT INTO steps
            SELECT {t}, 'kineto', CAST(regexp_extract(name, '#([0-9]+)', 1) AS INTEGER),
                   min(ts_ns), max(ts_ns + dur_ns), max(ts_ns + dur_ns) - min(ts_ns), '{origin}',
                   min(ts_ns), max(ts_ns + dur_ns)
            FROM _k_steps WHERE regexp_matches(name, '{pattern}')
            GROUP BY 3""")
        if con.execute(f"SELECT count(*) FROM steps WHERE trace_id = {t}").fetchone()[0]:
            break
    # Blocking waits: the sync events of newer Kineto (inserted with the rows), else the
    # blocking runtime calls.
    if not cuda_sync_seen:
        con.execute("INSERT INTO sync_events SELECT * FROM _k_runtime_syncs")
    con.execute(f"INSERT INTO threads SELECT DISTINCT {t}, 'kineto', pid, tid, name FROM _k_threads")
    _fill_correlation_from_flows(con, t)
    if cuda_sync_seen:
        _sync_records_on_host_threads(con, t)


# How far a cuda_sync record's start may lie outside its runtime call (on the public traces
# that have them: within 5 us).
SYNC_CALL_SLACK_NS = 50_000


def _sync_records_on_host_threads(con: duckdb.DuckDBPyConnection, trace_id: int) -> None:
    """Kineto writes a cuda_sync record on the GPU's row (pid: the device, tid: the stream or
    -1), but the host thread waited in it: give each the pid/tid of the runtime call with its
    correlation id (cudaStreamSynchronize ...), as the nsys loader does. The sync cycles of the
    breakdown and the sync rules count a thread's launches between its syncs; on the GPU's
    row a sync has none, so every stretch between two of them read as a round trip."""
    # The call is the one with the record's correlation id that holds the record's start (within
    # SYNC_CALL_SLACK_NS; the ids restart in each process of a merged trace), the nearest if
    # several: its pid and tid together.
    t = int(trace_id)
    con.execute(f"""
        UPDATE sync_events s SET pid = m.call.pid, tid = m.call.tid
        FROM (SELECT s2.rowid AS sid,
                     arg_min({{'pid': r.pid, 'tid': r.tid}}, abs(r.start_ns - s2.start_ns)) AS call
              FROM sync_events s2 JOIN runtime_calls r
                ON r.trace_id = {t} AND r.correlation_id = s2.correlation_id
               AND s2.start_ns BETWEEN r.start_ns - {SYNC_CALL_SLACK_NS} AND r.end_ns + {SYNC_CALL_SLACK_NS}
              WHERE s2.trace_id = {t} AND s2.source = 'kineto'
              GROUP BY s2.rowid) m
        WHERE s.rowid = m.sid""")


def _fill_correlation_from_flows(con: duckdb.DuckDBPyConnection, trace_id: int) -> None:
    """Old traces link a launch to its kernel only by an 'ac2g' flow (s at the launch, f at
    the kernel, same id); give such kernels the flow id as their correlation id."""
    con.execute(f"""
        UPDATE kernels k SET correlation_id = TRY_CAST(f.flow_id AS BIGINT)
        FROM _k_flows f
        WHERE k.trace_id = {int(trace_id)} AND k.correlation_id IS NULL
          AND f.ph = 'f' AND f.ts_ns = k.start_ns""")
    con.execute(f"""
        UPDATE runtime_calls r SET correlation_id = TRY_CAST(s.flow_id AS BIGINT)
        FROM _k_flows s
        WHERE r.trace_id = {int(trace_id)} AND r.correlation_id IS NULL
          AND s.ph = 's' AND s.ts_ns = r.start_ns AND s.tid = r.tid""")


# The store's tables a Kineto trace fills (all rows of a trace are removed when its
# streamed load gives up half way and the whole-document path reads it again).
_FILLED = ("kernels", "memcpy", "memset", "runtime_calls", "cpu_ops", "nvtx_ranges", "steps",
           "dataloader_waits", "sync_events", "memory_events", "threads", "device_info")
_BAD = "(ts_ns IS NULL OR (ph = 'X' AND (dur_ns IS NULL OR dur_ns < 0)))"


class _Rows:
    """The events of one trace going into the store, one batch (_ev) at a time: counted,
    checked, inserted and dropped; what only the whole trace decides is gathered in side
    tables and inserted by finish()."""

    def __init__(self, con: duckdb.DuckDBPyConnection, trace_id: int):
        self.con, self.t = con, int(trace_id)
        self.read_time = Timer("load.kineto.read")
        self.insert_time = Timer("load.kineto.insert")
        self._start()

    def _start(self) -> None:
        self.total = self.bad_ts = self.bad_dur = self.gpu = 0
        self.start_ns = self.end_ns = None
        self.cuda_sync = False
        self.inserted = False
        self.limit: float | None = None
        for name, columns in _SIDE_TABLES.items():
            if columns is None:
                self.con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS "
                                 "SELECT * FROM sync_events LIMIT 0")
            else:
                self.con.execute(f"CREATE OR REPLACE TEMP TABLE {name} ({columns})")

    def batch(self, streamed: bool) -> bool:
        """Count, check, insert and drop the events in _ev. False (nothing inserted) when a
        streamed batch holds a null event, which only the whole-document path skips right."""
        con = self.con
        with self.insert_time.part():
            odd, total, bad_ts, bad_dur, lo, hi, gpu, cuda_sync, kernel_names = con.execute(f"""
                SELECT count(*) FILTER (ph IS NULL AND cat IS NULL AND name IS NULL
                                        AND pid IS NULL AND tid IS NULL AND ts_ns IS NULL
                                        AND dur_ns IS NULL AND args IS NULL AND flow_id IS NULL),
                       count(*), count(*) FILTER (ts_ns IS NULL),
                       count(*) FILTER (ph = 'X' AND (dur_ns IS NULL OR dur_ns < 0)),
                       min(ts_ns) FILTER (ph IN ('X', 'i', 'I') AND {_BAD} IS NOT TRUE),
                       max(ts_ns + COALESCE(dur_ns, 0)) FILTER (ph IN ('X', 'i', 'I')
                                                                AND {_BAD} IS NOT TRUE),
                       count(*) FILTER (cat IN ('kernel', 'gpu_memcpy', 'memcpy', 'gpu_memset',
                                                'memset') AND {_BAD} IS NOT TRUE),
                       count(*) FILTER (cat = 'cuda_sync' AND {_BAD} IS NOT TRUE),
                       -- (the kernels' names, classified by _insert_rows; NULL one included)
                       list(DISTINCT name) FILTER (kind = {_K_KERNEL})
                FROM {_EV}""").fetchone()
            if streamed and odd:
                return False
            self.total += total
            self.bad_ts += bad_ts
            self.bad_dur += bad_dur
            self.gpu += gpu
            if lo is not None:
                self.start_ns = lo if self.start_ns is None else min(self.start_ns, lo)
                self.end_ns = hi if self.end_ns is None else max(self.end_ns, hi)
            if cuda_sync and not self.cuda_sync:
                self.cuda_sync = True
                con.execute("DELETE FROM _k_runtime_syncs")   # newer Kineto: never used
            if bad_ts or bad_dur:
                con.execute(f"DELETE FROM {_EV} WHERE {_BAD}")
            _insert_rows(con, self.t, self.cuda_sync, total, kernel_names or [])
            self.inserted = True
            con.execute(f"DROP TABLE {_EV}")
            self._bound_memory()
        return True

    def _bound_memory(self) -> None:
        """A checkpoint after a batch that leaves the store over its share of DuckDB's memory
        (store.CHECKPOINT_SHARE, as the nsys loader)."""
        if self.limit is None:
            self.limit = memory_limit_bytes(self.con)
        if needs_checkpoint(self.con, self.limit):
            self.con.execute("CHECKPOINT")

    def undo(self) -> bool:
        """Take the trace's rows out again (the whole-document path reads it instead)."""
        con = self.con
        con.execute(f"DROP TABLE IF EXISTS {_EV}")
        con.execute("DROP TABLE IF EXISTS _kineto_doc")
        if self.inserted:
            for table in _FILLED:
                con.execute(f"DELETE FROM {table} WHERE trace_id = {self.t}")
        self._start()
        return False

    def finish(self) -> None:
        _insert_whole_trace(self.con, self.t, self.cuda_sync)
        self._bound_memory()

    def drop(self) -> None:
        self.con.execute(f"DROP TABLE IF EXISTS {_EV}")
        for name in _SIDE_TABLES:
            self.con.execute(f"DROP TABLE IF EXISTS {name}")


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
