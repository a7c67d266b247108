"""Load Nsight Systems exports (`nsys export --type sqlite`) into the trace store.

The SQLite file is read with Python's own sqlite3 module, read-only (DuckDB's sqlite extension
would need a download). Moving rows one Python object at a time would be the bottleneck, so:
 - integer columns (nearly all of an export: times, ids, and StringIds references for names)
   travel as text: SQLite formats each chunk of rows with printf() and group_concat() into one
   string, numpy parses it, and DuckDB scans the numpy columns directly (`con.register`). A
   reader thread formats the next chunks while the main thread inserts (sqlite3 lets go of
   the GIL while SQLite works);
 - the large tables (kernels, CUDA calls) go from each chunk straight into the store, with
   their names joined from small per-string tables; the others are staged in temp tables;
 - the few text columns (NVTX text, StringIds values) are fetched in large batches;
 - every join and mapping (names, enums, pid/tid) is then done in DuckDB SQL.

Schema notes, checked against the Nsight Systems SQLite schema reference (2024.x to 2026.x
exports) and tolerant of older ones:
 - tables are created lazily: any of them may be missing, and columns come and go between
   versions, so every column is looked up (PRAGMA table_info) before it is read;
 - enum codes are mapped through the export's own ENUM_* tables (`name` symbol such as
   'CUDA_MEMCPY_KIND_HTOD', and/or `label` such as 'Host-to-Device'); only when an export has
   no such table do the values documented for nsys 2021.5 stand in;
 - globalTid serialises pid and tid: pid = globalTid / 0x1000000 % 0x1000000,
   tid = globalTid % 0x1000000 (nsys docs, "Serialized process and thread identifiers");
 - CUDA runtime and driver calls share CUPTI_ACTIVITY_KIND_RUNTIME, told apart by eventClass
   (ENUM_NSYS_EVENT_CLASS); rows of other classes there (backtrace records) are not calls;
 - API names lose nsys's entry-point version suffix ('cudaLaunchKernel_v7000' is stored as
   'cudaLaunchKernel', as Kineto names it); '_ptsz'/'_ptds' (per-thread stream) stay;
 - CUPTI_ACTIVITY_KIND_SYNCHRONIZATION rows carry no thread: the thread and API name come from
   the runtime call with the same correlationId in the same process;
 - CUDA graphs traced whole (nsys's default --cuda-graph-trace=graph) have no kernel rows: each
   graph execution becomes one '[CUDA graph N]' kernel row, with a warning.
"""
from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import threading
import urllib.request
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import duckdb
import numpy as np

from ..errors import TraceError, guard_sqlite, interrupted
from ..kernelnames import communication_kernel, tensor_core_kernel
from ..profiling import phase
from ..store import memory_limit_bytes, needs_checkpoint
from . import sqlite_pages
from .base import LoadResult

SQLITE_MAGIC = b"SQLite format 3\x00"
NSYS_REP_SUFFIXES = (".nsys-rep", ".qdrep")

# An integer no export holds, standing for SQL NULL while integers travel as text.
_NULL = -9223372036854775807
_CHUNK = 131072
# DuckDB keeps rows appended since its last checkpoint uncompressed; a checkpoint compresses
# them (~10x on an export's calls and kernels) and keeps a large export's store inside
# DuckDB's memory limit instead of spilling it to disk. The streamed tables share the
# checkpoints (a checkpoint's work is about proportional to the rows it compresses, so
# fewer cost about as much, but a table's small remainder is no longer compressed alone):
# one when DuckDB's memory passes store.CHECKPOINT_SHARE of its limit after a chunk (as the
# Kineto loader), or after _CHECKPOINT_ROWS streamed rows, and one at the end of the load.
_CHECKPOINT_ROWS = 8_000_000
# One reader thread formats the next chunks in SQLite (it lets go of the GIL) while the main
# thread inserts into DuckDB. A second reader does not read faster: SQLite's threads contend
# (on its global allocator mutex, as far as we can tell), and two readers took 1.9x the CPU
# time of one for the same text, and more wall time (1 M-kernel export, 2 cores).
_WORKERS = 1
TID_BITS = 24   # globalTid = (hardware and VM ids) << 48 | pid << 24 | tid
_PID = "((({g}) >> 24) & 16777215)"
_TID = "(({g}) & 16777215)"


# --------------------------------------------------------------------------- detection --

def is_nsys_sqlite(path: str) -> bool:
    """True when the file is an SQLite database (by its 16-byte header, whatever its name).
    Whether it is an Nsight Systems export is checked by the loader, which says so if not."""
    with open(path, "rb") as f:
        return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC


def is_nsys_rep(path: str) -> bool:
    """True for an Nsight Systems report (.nsys-rep, or .qdrep from before 2021.3).

    The report format is undocumented and has no published signature, so this goes by the
    file name, once the content has been seen to be neither SQLite nor JSON."""
    if not str(path).lower().endswith(NSYS_REP_SUFFIXES):
        return False
    with open(path, "rb") as f:
        head = f.read(64)
    return not head.startswith(SQLITE_MAGIC) and head.lstrip()[:1] not in (b"{", b"[")


def find_nsys(nsys_exe: str | None = None) -> str | None:
    """The nsys executable: the one given, $NSYS, on PATH, or in the usual install places."""
    for cand in (nsys_exe, os.environ.get("NSYS")):
        if cand:
            found = shutil.which(cand) or (cand if os.path.isfile(cand) and os.access(cand, os.X_OK) else None)
            if found:
                return found
            if cand == nsys_exe:
                return None  # an explicit choice that does not exist is not silently replaced
    found = shutil.which("nsys")
    if found:
        return found
    import glob
    patterns = ["/usr/local/cuda/bin/nsys", "/usr/local/cuda-*/bin/nsys",
                "/opt/nvidia/nsight-systems/*/bin/nsys", "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
                "/usr/lib/nsight-systems/bin/nsys"]
    for pat in patterns:
        hits = sorted(glob.glob(pat), reverse=True)  # newest version first
        for hit in hits:
            if os.access(hit, os.X_OK):
                return hit
    return None


def convert_nsys_rep(path: str, out_dir: str, nsys_exe: str | None = None) -> str:
    """Export an .nsys-rep report to SQLite with the nsys CLI; returns the .sqlite path.

    An up-to-date export already in out_dir is reused; nsys never overwrites a file here."""
    exe = find_nsys(nsys_exe)
    if exe is None:
        where = f"'{nsys_exe}' was not found" if nsys_exe else "nsys is not on PATH"
        raise TraceError(path, f"reading a .nsys-rep report needs the Nsight Systems CLI and {where}: "
                               "install Nsight Systems (https://developer.nvidia.com/nsight-systems), "
                               "or export it yourself with `nsys export --type sqlite -o report.sqlite "
                               f"{os.path.basename(path)}` and pass the .sqlite file")
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.basename(path)
    for suffix in NSYS_REP_SUFFIXES:
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
    out = os.path.join(out_dir, stem + ".sqlite")
    n = 1
    while os.path.exists(out):
        try:
            if os.path.getmtime(out) >= os.path.getmtime(path) and is_nsys_sqlite(out):
                return out
        except OSError:
            pass
        out = os.path.join(out_dir, f"{stem}-{n}.sqlite")
        n += 1
    cmd = [exe, "export", "--type", "sqlite", "-o", out, "--force-overwrite=false", path]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.SubprocessError) as e:
        raise TraceError(path, f"could not run `{exe} export`: {e}") from None
    if proc.returncode == 0 and not os.path.exists(out) and os.path.exists(out + ".sqlite"):
        out += ".sqlite"  # in case this nsys version appends the extension itself
    if proc.returncode != 0 or not os.path.exists(out):
        lines = [l.strip() for l in (proc.stderr + "\n" + proc.stdout).splitlines() if l.strip()]
        why = lines[-1] if lines else f"exit status {proc.returncode}"
        raise TraceError(path, f"`nsys export --type sqlite` failed: {why[:300]}")
    return out


# ------------------------------------------------------------------------------ source --

# The longest text or blob SQLite may build while navdoctor reads an export (a name, an NVTX
# text; SQLite's own default is 1e9 bytes): a file cannot make it build larger ones.
_SQLITE_MAX_LENGTH = 64 << 20


def open_export(path: str) -> sqlite3.Connection:
    """A connection that only reads the export, and only its tables as the file declares
    them: read-only (immutable, where no -wal file beside it asks SQLite to read one: SQLite
    then creates no -shm or -wal file beside the user's file), `trusted_schema` off (no
    function of a view or trigger the file defines runs), no write of any kind (query_only),
    texts it builds bounded (_SQLITE_MAX_LENGTH), and stopped by Ctrl-C or SIGTERM
    (errors.guard_sqlite). Which objects of the file are read is _Source's business: tables
    only, never its views."""
    url = urllib.request.pathname2url(os.path.abspath(path))
    mode = "mode=ro" if os.path.exists(path + "-wal") else "mode=ro&immutable=1"
    con = sqlite3.connect(f"file:{url}?{mode}", uri=True, check_same_thread=False)
    try:
        con.execute("PRAGMA trusted_schema = OFF")
        con.execute("PRAGMA query_only = ON")
        if hasattr(con, "setlimit"):
            con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _SQLITE_MAX_LENGTH)
        guard_sqlite(con)
    except BaseException:
        con.close()
        raise
    return con


def export_objects(con: sqlite3.Connection) -> tuple[dict[str, str], dict[str, str]]:
    """What the file names: its tables (lower-case name -> real name), and its views and
    virtual tables (lower-case name -> 'view' / 'virtual table'), whose rows the file's own
    SQL or a module would compute, and which navdoctor never reads."""
    tables: dict[str, str] = {}
    others: dict[str, str] = {}
    for name, kind, sql in con.execute(
            "SELECT name, type, sql FROM sqlite_master WHERE type IN ('table', 'view')"):
        if not isinstance(name, str):
            continue
        if kind == "table" and not re.match(r"\s*CREATE\s+VIRTUAL", sql or "", re.I):
            tables[name.lower()] = name
        else:
            others[name.lower()] = "view" if kind == "view" else "virtual table"
    return tables, others


class _Source:
    """The export, opened read-only (open_export), with its tables and columns looked up
    once. Only the file's tables are read: an object navdoctor reads by name that is a view or
    a virtual table (whose rows the file's own SQL or a module would compute: an endless
    recursive query, a cross join of millions of rows) is refused, with the file named
    (`shown`: the user's file where `path` is a temporary copy of it)."""

    def __init__(self, path: str, shown: str | None = None):
        self.path = path
        self.shown = shown or path
        self.db = self.connect()
        self.tables, self.not_tables = export_objects(self.db)
        self._columns: dict[str, dict[str, str]] = {}
        # (table, why, rowid from which SQLite read it) for each table read through SQLite
        # (in part) because the page reader could not read it.
        self.page_fallbacks: list[tuple[str, str, int | None]] = []

    def connect(self) -> sqlite3.Connection:
        return open_export(self.path)

    def close(self) -> None:
        self.db.close()

    def table(self, name: str) -> str | None:
        """The real name of the table `name` (any case), None where the file has none; a view
        or virtual table of that name is refused (nsys writes neither)."""
        kind = self.not_tables.get(name.lower())
        if kind is not None and name.lower() not in self.tables:
            raise TraceError(self.shown, f"'{name}' is a {kind} in this file, not a table: an "
                                         "Nsight Systems export holds tables only, and navdoctor "
                                         "reads nothing else")
        return self.tables.get(name.lower())

    def columns(self, table: str) -> dict[str, str]:
        """lower-case column name -> real name."""
        if table not in self._columns:
            self._columns[table] = {r[1].lower(): r[1] for r in
                                    self.db.execute(f"PRAGMA table_info({_q(table)})")}
        return self._columns[table]

    def col(self, table: str | None, *names: str) -> str | None:
        """The first of `names` that the table has (real spelling), else None."""
        if table is None:
            return None
        cols = self.columns(table)
        for n in names:
            if n.lower() in cols:
                return cols[n.lower()]
        return None

    def count(self, table: str | None) -> int:
        if table is None:
            return 0
        return self.db.execute(f"SELECT count(*) FROM {_q(table)}").fetchone()[0]

    def has_rowid(self, table: str) -> bool:
        if self.tables.get(table.lower()) != table:
            return False
        try:
            self.db.execute(f"SELECT rowid FROM {_q(table)} LIMIT 1").fetchall()
            return True
        except sqlite3.OperationalError:
            return False

    def looks_like_nsys(self) -> bool:
        names = self.tables
        return ("stringids" in names or any(n.startswith(("target_info_", "cupti_", "enum_nsys_"))
                                             for n in names)
                or "nvtx_events" in names or "osrt_api" in names or "meta_data_export" in names)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


class _FastPathError(Exception):
    """The text path cannot read a chunk; the rows from `resume_rowid` on (every row before it
    was delivered) are to be read one Python value at a time."""

    def __init__(self, table: str, resume_rowid: int | None = None):
        super().__init__(table)
        self.resume_rowid = resume_rowid


# ------------------------------------------------------------------------ bulk copying --

def _int_chunks(src: _Source, table: str, cols: list[str]) -> Iterator[np.ndarray]:
    """Yield int64 arrays of shape (rows, 1 + len(cols)): rowid, then the columns, NULL as
    _NULL, in rowid order. The table's pages are decoded from the file (sqlite_pages) where
    they can be; the rest of the table (all of it, or the rows from where the page reader
    stopped) comes from SQLite as text (_text_chunks)."""
    resume = None
    try:
        yield from sqlite_pages.int_chunks(src.db, src.path, table, cols, _NULL)
        return
    except sqlite_pages.Unsupported as e:
        resume = e.resume_rowid
        src.page_fallbacks.append((table, e.why, resume))
    yield from _text_chunks(src, table, cols, resume)


def _text_chunks(src: _Source, table: str, cols: list[str],
                 start: int | None = None) -> Iterator[np.ndarray]:
    """_int_chunks through SQLite (from rowid `start` on, when given): SQLite renders each
    chunk as one comma-separated string that numpy parses. A chunk it cannot parse raises
    _FastPathError with the rowid to resume from."""
    exprs = ["rowid"] + [f"IFNULL({_q(c)}, {_NULL})" for c in cols]
    k = len(exprs)
    row_text = "printf(" + _sql_str(",".join(["%lld"] * k)) + ", " + ", ".join(exprs) + ")"
    since = "" if start is None else f" WHERE rowid >= {int(start)}"
    lo, hi, n = src.db.execute(
        f"SELECT min(rowid), max(rowid), count(*) FROM {_q(table)}{since}").fetchone()
    if not n:
        return
    if hi - lo + 1 > 4 * n + _CHUNK:
        # Sparse rowids: ranges would be mostly empty; stream the rows' texts instead.
        cur = src.db.execute(f"SELECT {row_text} FROM {_q(table)}{since} ORDER BY rowid")
        resume = lo
        while True:
            rows = cur.fetchmany(_CHUNK)
            if not rows:
                return
            a = np.fromstring(",".join([r[0] for r in rows]), dtype=np.int64, sep=",")
            if a.size != len(rows) * k:
                raise _FastPathError(table, resume)
            a = a.reshape(len(rows), k)
            resume = int(a[-1, 0]) + 1
            yield a
    sql = (f"SELECT count(*), group_concat({row_text}, ',') FROM {_q(table)} "
           "WHERE rowid >= ? AND rowid < ?")
    local = threading.local()
    opened: list[sqlite3.Connection] = []
    lock = threading.Lock()

    def work(bounds: tuple[int, int]) -> np.ndarray | None:
        db = getattr(local, "db", None)
        if db is None:
            db = local.db = src.connect()
            with lock:
                opened.append(db)
        cnt, txt = db.execute(sql, bounds).fetchone()
        if not cnt:
            return None
        a = np.fromstring(txt, dtype=np.int64, sep=",")
        if a.size != cnt * k:
            raise _FastPathError(table, bounds[0])
        return a.reshape(cnt, k)

    ranges = [(b, min(b + _CHUNK, hi + 1)) for b in range(lo, hi + 1, _CHUNK)]
    try:
        with ThreadPoolExecutor(_WORKERS) as ex:
            pending: deque = deque()
            for r in ranges:
                pending.append(ex.submit(work, r))
                if len(pending) >= 2 * _WORKERS:  # bounded: a few chunks in memory at a time
                    a = pending.popleft().result()
                    if a is not None:
                        yield a
            while pending:
                a = pending.popleft().result()
                if a is not None:
                    yield a
    finally:
        for db in opened:
            db.close()


def _as_int64(values) -> np.ndarray:
    try:
        return np.array([_NULL if v is None else v for v in values], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        out = np.empty(len(values), dtype=np.int64)
        for i, v in enumerate(values):
            try:
                out[i] = _NULL if v is None else int(v)
            except (TypeError, ValueError, OverflowError):
                out[i] = _NULL
        return out


def _as_text(values) -> np.ndarray:
    return np.array([v if v is None or isinstance(v, str) else
                     (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))
                     for v in values], dtype=object)


def _row_chunks(src: _Source, table: str, ints: list[str], texts: list[str],
                where: str = "") -> Iterator[tuple[list[np.ndarray], list[np.ndarray]]]:
    """Batches of rows fetched as Python values: (int columns with rowid first, text columns)."""
    rowid = "rowid" if src.has_rowid(table) else "NULL"
    sel = ", ".join([rowid] + [_q(c) for c in ints + texts])
    cur = src.db.execute(f"SELECT {sel} FROM {_q(table)} {where}")
    base = 0
    while True:
        rows = cur.fetchmany(_CHUNK)
        if not rows:
            return
        cols = list(zip(*rows))
        if rowid == "NULL":  # no rowid: number the rows
            cols[0] = range(base + 1, base + 1 + len(rows))
        base += len(rows)
        yield ([_as_int64(c) for c in cols[: 1 + len(ints)]],
               [_as_text(c) for c in cols[1 + len(ints):]])


def _insert_arrays(con: duckdb.DuckDBPyConnection, dest: str, names: list[str],
                   arrays: list[np.ndarray], int_count: int) -> None:
    con.register("_nsys_chunk", {f"c{i}": a for i, a in enumerate(arrays)})
    try:
        exprs = [f"NULLIF(c{i}, {_NULL})" if i < int_count else f"c{i}"
                 for i in range(len(arrays))]
        con.execute(f"INSERT INTO {dest} ({', '.join(names)}) SELECT {', '.join(exprs)} "
                    "FROM _nsys_chunk")
    finally:
        con.unregister("_nsys_chunk")


# --------------------------------------------------------------------------- enum maps --

# Used only for exports that lack the ENUM_* table (nsys before ~2021.3); these are the values
# the Nsight Systems 2021.5 export documentation lists.
_FALLBACK_ENUMS: dict[str, dict[int, str]] = {
    "ENUM_CUDA_MEMCPY_OPER": {0: "CUDA_MEMCPY_KIND_UNKNOWN", 1: "CUDA_MEMCPY_KIND_HTOD",
                              2: "CUDA_MEMCPY_KIND_DTOH", 3: "CUDA_MEMCPY_KIND_HTOA",
                              4: "CUDA_MEMCPY_KIND_ATOH", 5: "CUDA_MEMCPY_KIND_ATOA",
                              6: "CUDA_MEMCPY_KIND_ATOD", 7: "CUDA_MEMCPY_KIND_DTOA",
                              8: "CUDA_MEMCPY_KIND_DTOD", 9: "CUDA_MEMCPY_KIND_HTOH",
                              10: "CUDA_MEMCPY_KIND_PTOP", 11: "CUDA_MEMCPY_KIND_UVM_HTOD",
                              12: "CUDA_MEMCPY_KIND_UVM_DTOH", 13: "CUDA_MEMCPY_KIND_UVM_DTOD"},
    "ENUM_CUDA_MEM_KIND": {0: "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", 1: "CUDA_MEMOPR_MEMORY_KIND_PINNED",
                           2: "CUDA_MEMOPR_MEMORY_KIND_DEVICE", 3: "CUDA_MEMOPR_MEMORY_KIND_ARRAY",
                           4: "CUDA_MEMOPR_MEMORY_KIND_MANAGED",
                           5: "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC",
                           6: "CUDA_MEMOPR_MEMORY_KIND_MANAGED_STATIC",
                           7: "CUDA_MEMOPR_MEMORY_KIND_UNKNOWN"},
    "ENUM_CUPTI_SYNC_TYPE": {0: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_UNKNOWN",
                             1: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE",
                             2: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT",
                             3: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE",
                             4: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE"},
    "ENUM_CUDA_DEV_MEM_EVENT_OPER": {0: "CUDA_DEV_MEM_EVENT_OPR_ALLOCATION",
                                     1: "CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION"},
    "ENUM_NSYS_EVENT_TYPE": {34: "NvtxMark", 59: "NvtxPushPopRange", 60: "NvtxStartEndRange",
                             75: "NvtxDomainCreate", 76: "NvtxDomainDestroy"},
}


def _memcpy_kind(text: str) -> str | None:
    """'CUDA_MEMCPY_KIND_HTOD' / 'Host-to-Device' / 'Unified Host-to-Device' -> 'HtoD'."""
    t = text.upper()
    m = re.search(r"(?:^|_)([HDAP])TO([HDAP])$", t)
    if m:
        return f"{m.group(1)}to{m.group(2)}"
    m = re.search(r"(HOST|DEVICE|ARRAY|PEER)\s*-?\s*TO\s*-?\s*(HOST|DEVICE|ARRAY|PEER)", t)
    if m:
        return f"{m.group(1)[0]}to{m.group(2)[0]}"
    return None


def _memory_kind(text: str) -> str | None:
    """'CUDA_MEMOPR_MEMORY_KIND_PAGEABLE' / 'Pageable' -> 'pageable'; 'Device Static' ->
    'device_static'; unknown -> None."""
    t = text.strip()
    if "KIND_" in t.upper():
        t = t[t.upper().rindex("KIND_") + 5:]
    t = re.sub(r"[\s-]+", "_", t.lower())
    return None if t in ("", "unknown") else t


def _sync_kind(text: str) -> str | None:
    t = text.upper()
    if "WAIT" in t:
        return "stream_wait"  # cudaStreamWaitEvent: the GPU waits, the host does not
    for word, kind in (("EVENT", "event"), ("STREAM", "stream"), ("CONTEXT", "context"),
                       ("DEVICE", "device")):
        if word in t:
            return kind
    return None


def _mem_sign(text: str) -> int | None:
    t = text.upper()
    if "DEALLOC" in t or "FREE" in t:
        return -1
    if "ALLOC" in t:
        return 1
    return None


def _api_class(text: str) -> str | None:
    t = text.upper()
    if "DRIVER" in t:
        return "driver"
    if "RUNTIME" in t:
        return "runtime"
    return "-"  # another class (e.g. backtrace records): not an API call


def _case(expr: str, mapping: dict[int, object], default: str = "NULL") -> str:
    if not mapping:
        return default
    parts = []
    for k, v in sorted(mapping.items()):
        lit = "NULL" if v is None else (_sql_str(v) if isinstance(v, str) else str(int(v)))
        parts.append(f"WHEN {int(k)} THEN {lit}")
    return f"CASE {expr} {' '.join(parts)} ELSE {default} END"


# ------------------------------------------------------------------------------ loader --

def load_nsys_sqlite(con: duckdb.DuckDBPyConnection, path: str, trace_id: int,
                     shown: str | None = None, process: int | None = None) -> LoadResult:
    """The export at `path` into the store as trace `trace_id`. shown: how errors name the
    file (the user's .sqlite.gz where path is its inflated copy); process: a globalPid whose
    rows alone are loaded (one rank of a multi-process export: ranks/nsys_split.py), rows of
    other processes left out as they are read."""
    shown = shown or path
    try:
        if not is_nsys_sqlite(path):
            raise TraceError(shown, "not an SQLite file (no 'SQLite format 3' header)")
    except OSError as e:
        raise TraceError(shown, f"cannot read: {e.strerror or e}") from None
    try:
        src = _Source(path, shown)
    except sqlite3.Error as e:
        if interrupted(e):
            raise KeyboardInterrupt from None
        raise TraceError(shown, f"corrupt or unreadable SQLite file: {_first_line(e)}") from None
    loader = _Loader(src, con, int(trace_id), process)
    try:
        if not src.looks_like_nsys():
            raise TraceError(shown, "SQLite file is not an Nsight Systems export (no StringIds, "
                                    "TARGET_INFO_* or CUPTI_* tables)")
        return loader.run()
    except sqlite3.Error as e:
        loader.discard()
        if interrupted(e):   # errors.sqlite_progress stopped the statement
            raise KeyboardInterrupt from None
        raise TraceError(shown, f"corrupt or unreadable Nsight Systems export: {_first_line(e)}") from None
    except TraceError:
        loader.discard()
        raise
    except duckdb.Error as e:
        loader.discard()
        if interrupted(e):
            raise KeyboardInterrupt from None
        raise TraceError(shown, f"could not load this Nsight Systems export: {_first_line(e)}") from None
    finally:
        loader.drop_temp()
        src.close()


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else type(e).__name__


_TABLES_FILLED = ["kernels", "memcpy", "memset", "runtime_calls", "sync_events", "nvtx_ranges",
                  "steps", "dataloader_waits", "os_calls", "threads", "device_info", "memory_events",
                  "um_events"]


class _Loader:
    def __init__(self, src: _Source, con: duckdb.DuckDBPyConnection, trace_id: int,
                 process: int | None = None):
        self.src, self.con, self.t = src, con, trace_id
        # The process kept (its globalPid without the thread bits), or None: all of them.
        self.process = None if process is None else int(process) >> TID_BITS
        self.result = LoadResult(path=src.path, format="nsys-sqlite", source="nsys")
        self.temp: list[str] = []
        self.events = 0
        self.unsaved = 0   # rows streamed into the store since its last checkpoint
        self.limit: float | None = None

    # -- plumbing --------------------------------------------------------------------
    def warn(self, msg: str) -> None:
        self.result.warnings.append(msg)

    # -- one process of several (ranks/nsys_split.py) ------------------------------------
    def process_column(self, table: str) -> str | None:
        """The column that says whose a row of `table` is (globalPid, else globalTid: both
        carry the process above their lowest 24 bits), where only one process is loaded."""
        if self.process is None:
            return None
        return self.src.col(table, "globalPid") or self.src.col(table, "globalTid")

    def own_rows(self, column: np.ndarray) -> np.ndarray:
        """Which rows are the loaded process's, by their process column (NULL: anyone's)."""
        return (column == _NULL) | ((column >> TID_BITS) == self.process)

    def int_chunks(self, table: str, cols: list[str]) -> Iterator[np.ndarray]:
        """_int_chunks of the loaded process's rows."""
        who = self.process_column(table)
        if who is None:
            yield from _int_chunks(self.src, table, cols)
            return
        for a in _int_chunks(self.src, table, cols + [who]):
            yield a[self.own_rows(a[:, -1]), :-1]

    def row_chunks(self, table: str, ints: list[str], texts: list[str],
                   where: str = "") -> Iterator[tuple[list[np.ndarray], list[np.ndarray]]]:
        """_row_chunks of the loaded process's rows."""
        who = self.process_column(table)
        if who is None:
            yield from _row_chunks(self.src, table, ints, texts, where)
            return
        for ints_a, txt_a in _row_chunks(self.src, table, ints + [who], texts, where):
            keep = self.own_rows(ints_a[-1])
            yield [a[keep] for a in ints_a[:-1]], [a[keep] for a in txt_a]

    def count(self, table: str | None) -> int:
        """The rows of `table` (the loaded process's)."""
        if table is None:
            return 0
        who = self.process_column(table)
        if who is None:
            return self.src.count(table)
        return self.src.db.execute(
            f"SELECT count(*) FROM {_q(table)} WHERE {_q(who)} IS NULL "
            f"OR ({_q(who)} >> {TID_BITS}) = ?", (self.process,)).fetchone()[0]

    def copy(self, table: str | None, dest: str, ints: dict[str, tuple[str, ...] | str],
             texts: dict[str, tuple[str, ...] | str] | None = None) -> int:
        """Copy a source table into the DuckDB temp table `dest`, with a `_rowid` column and
        one column per key of ints (BIGINT) and texts (VARCHAR); each value names the source
        column (or alternatives, first present wins); absent columns are NULL."""
        texts = texts or {}
        cols = ["_rowid BIGINT"] + [f"{d} BIGINT" for d in ints] + [f"{d} VARCHAR" for d in texts]
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE {dest} ({', '.join(cols)})")
        self.temp.append(dest)
        if table is None:
            return 0

        int_d, int_s = self._present(table, ints)
        txt_d, txt_s = self._present(table, texts)
        with phase(f"load.nsys.copy.{table}"):
            self._copy_present(table, dest, int_d, int_s, txt_d, txt_s)
        return self.con.execute(f"SELECT count(*) FROM {dest}").fetchone()[0]

    def _present(self, table: str, spec: dict[str, tuple[str, ...] | str]) -> tuple[list[str], list[str]]:
        """The destination names of spec whose source column the export has, and those
        columns' real names (the first of each spec's candidates that exists)."""
        d_names, s_names = [], []
        for d, candidates in spec.items():
            real = self.src.col(table, *((candidates,) if isinstance(candidates, str) else candidates))
            if real:
                d_names.append(d)
                s_names.append(real)
        return d_names, s_names

    def _copy_present(self, table, dest, int_d, int_s, txt_d, txt_s) -> None:
        if self.src.has_rowid(table):
            try:
                for a in self.int_chunks(table, int_s):
                    _insert_arrays(self.con, dest, ["_rowid"] + int_d,
                                   [a[:, i] for i in range(a.shape[1])], a.shape[1])
            except _FastPathError:
                self.con.execute(f"DELETE FROM {dest}")
                self._copy_slow(table, dest, int_d, int_s, [], [])
            if txt_s:
                tdest = dest + "_text"
                self.con.execute(f"CREATE OR REPLACE TEMP TABLE {tdest} (_rowid BIGINT, "
                                 + ", ".join(f"{d} VARCHAR" for d in txt_d) + ")")
                self.temp.append(tdest)
                where = "WHERE " + " OR ".join(f"{_q(c)} IS NOT NULL" for c in txt_s)
                for ints_a, txt_a in _row_chunks(self.src, table, [], txt_s, where):
                    _insert_arrays(self.con, tdest, ["_rowid"] + txt_d, ints_a + txt_a, 1)
                sets = ", ".join(f"{d} = x.{d}" for d in txt_d)
                self.con.execute(f"UPDATE {dest} SET {sets} FROM {tdest} x "
                                 f"WHERE {dest}._rowid = x._rowid")
        else:
            self._copy_slow(table, dest, int_d, int_s, txt_d, txt_s)

    def stream(self, table: str | None, ints: dict[str, tuple[str, ...] | str],
               per_chunk) -> int:
        """Read a large source table chunk by chunk, with no staging copy: for each chunk,
        per_chunk() runs with the temp view `_nsys_rows` holding it (`_rowid` and one BIGINT
        column per key of ints, NULL where the export lacks the column). Memory stays bounded
        by a few chunks whatever the table's size. Returns the rows read."""
        if table is None:
            return 0
        int_d, int_s = self._present(table, ints)
        present = ["_rowid"] + int_d
        cols = [f"NULLIF(c{i}, {_NULL}) AS {d}" for i, d in enumerate(present)]
        cols += [f"NULL::BIGINT AS {d}" for d in ints if d not in int_d]
        rows = 0

        def run(arrays: list[np.ndarray]) -> None:
            nonlocal rows
            self.con.register("_nsys_rows_raw", {f"c{i}": a for i, a in enumerate(arrays)})
            try:
                if not rows:  # the view is bound when made: once the first chunk is there
                    self.con.execute("CREATE OR REPLACE TEMP VIEW _nsys_rows AS SELECT "
                                     + ", ".join(cols) + " FROM _nsys_rows_raw")
                per_chunk()
            finally:
                self.con.unregister("_nsys_rows_raw")
            rows += len(arrays[0])
            self.unsaved += len(arrays[0])
            self.bound_memory()

        with phase(f"load.nsys.stream.{table}"):
            row_by_row, resume = not self.src.has_rowid(table), None
            if not row_by_row:
                try:
                    for a in self.int_chunks(table, int_s):
                        run([a[:, i] for i in range(a.shape[1])])
                except _FastPathError as e:
                    row_by_row, resume = True, e.resume_rowid
            if row_by_row:
                where = f"WHERE rowid >= {int(resume)}" if resume is not None else ""
                for ints_a, _ in self.row_chunks(table, int_s, [], where):
                    run(ints_a)
        self.con.execute("DROP VIEW IF EXISTS _nsys_rows")
        return rows

    def bound_memory(self) -> None:
        """Checkpoint (compress the rows streamed so far) when DuckDB's memory passes
        store.CHECKPOINT_SHARE of its limit, or after _CHECKPOINT_ROWS streamed rows."""
        if self.unsaved >= _CHECKPOINT_ROWS:
            self.checkpoint()
            return
        if self.limit is None:
            self.limit = memory_limit_bytes(self.con)
        if needs_checkpoint(self.con, self.limit):
            self.checkpoint()

    def checkpoint(self) -> None:
        self.con.execute("CHECKPOINT")
        self.unsaved = 0

    def _copy_slow(self, table, dest, int_d, int_s, txt_d, txt_s) -> None:
        for ints_a, txt_a in self.row_chunks(table, int_s, txt_s):
            _insert_arrays(self.con, dest, ["_rowid"] + int_d + txt_d, ints_a + txt_a,
                           1 + len(int_d))

    def enum(self, name: str, normalise) -> dict[int, object]:
        """id -> normalised value, from the export's ENUM table (symbol `name` first, then
        `label`), or from the documented values when the export has no such table."""
        table = self.src.table(name)
        raw: dict[int, list[str]] = {}
        if table is not None:
            id_col = self.src.col(table, "id")
            text_cols = [c for c in (self.src.col(table, "name"), self.src.col(table, "label")) if c]
            if id_col and text_cols:
                sel = ", ".join(_q(c) for c in [id_col] + text_cols)
                for row in self.src.db.execute(f"SELECT {sel} FROM {_q(table)}"):
                    if row[0] is not None:
                        raw[int(row[0])] = [str(v) for v in row[1:] if v is not None]
        else:
            raw = {k: [v] for k, v in _FALLBACK_ENUMS.get(name, {}).items()}
        out: dict[int, object] = {}
        for k, texts in raw.items():
            val = None
            for text in texts:
                val = normalise(text)
                if val is not None:
                    break
            out[k] = val
        return out

    def insert(self, sql: str) -> int:
        n = self.con.execute(sql).fetchone()[0]
        return int(n or 0)

    def done(self, *tables: str) -> None:
        """Drop temp tables no longer needed, so that their memory serves the next ones."""
        for t in tables:
            self.con.execute(f"DROP TABLE IF EXISTS {t}")
            if t in self.temp:
                self.temp.remove(t)
            if t + "_text" in self.temp:
                self.con.execute(f"DROP TABLE IF EXISTS {t}_text")
                self.temp.remove(t + "_text")

    def drop_temp(self) -> None:
        for t in reversed(self.temp):
            try:
                self.con.execute(f"DROP TABLE IF EXISTS {t}")
            except duckdb.Error:
                pass
        self.temp.clear()

    def discard(self) -> None:
        """Remove this trace's rows after a failure part-way through."""
        for table in _TABLES_FILLED:
            try:
                self.con.execute(f"DELETE FROM {table} WHERE trace_id = ?", [self.t])
            except duckdb.Error:
                pass

    # -- the load --------------------------------------------------------------------
    def run(self) -> LoadResult:
        src = self.src
        strings = src.table("StringIds")
        if strings is None:
            self.warn("no StringIds table: kernel, API and NVTX names are missing")
        with phase("load.nsys.strings"):
            self.copy(strings, "_nsys_str", {"id": "id"}, {"value": "value"})
            self.con.execute("UPDATE _nsys_str SET id = _rowid WHERE id IS NULL")
            self.strings_unique = self.con.execute(
                "SELECT count(id) = count(DISTINCT id) FROM _nsys_str").fetchone()[0]

        for part in (self.load_kernels, self.load_graphs, self.load_memcpy, self.load_memset,
                     self.load_runtime, self.load_sync, self.load_nvtx, self.load_os_calls,
                     self.load_threads, self.load_device_info, self.load_memory, self.load_um):
            with phase("load.nsys." + part.__name__[len("load_"):]):
                part()
            # After the last streamed table: the rest of the load (the syncs join the calls)
            # and the analysis read them many times, and compressed they leave DuckDB's
            # memory to its joins and sorts (1 M kernels: the syncs' join 0.24 s on the calls
            # left uncompressed, 0.04 s compressed; the rules 1.6x).
            if part == self.load_runtime and self.unsaved >= 500_000:
                with phase("load.nsys.checkpoint"):
                    self.checkpoint()
        self.result.producer = self.producer()
        self.result.events = self.events
        self.result.start_ns, self.result.end_ns = self.span()
        return self.result

    def load_kernels(self) -> None:
        """Kernels go straight from the export into `kernels`, chunk by chunk. Their names
        come from a small table of the (demangled, short, mangled) StringIds triples seen so
        far, each classified once (tensor cores, communication): millions of kernels, few
        names."""
        t = self.t
        table = self.src.table("CUPTI_ACTIVITY_KIND_KERNEL")
        self.con.execute("""CREATE OR REPLACE TEMP TABLE _nsys_kname (
            dem BIGINT, short BIGINT, mangled BIGINT, name VARCHAR, tc BOOLEAN, comm BOOLEAN)""")
        self.temp.append("_nsys_kname")
        same_names = ("n.dem IS NOT DISTINCT FROM k.dem AND n.short IS NOT DISTINCT FROM k.short "
                      "AND n.mangled IS NOT DISTINCT FROM k.mangled")
        # With duplicate StringIds ids a triple has several names and a kernel several rows;
        # the skipped kernels are then counted over those rows, as they are inserted.
        bad_from = ("_nsys_rows k" if self.strings_unique else
                    f"_nsys_rows k JOIN _nsys_kname n ON {same_names}")
        bad = 0
        inserted = 0

        def name_new_triples() -> None:
            new = self.con.execute(f"""
                SELECT k.dem, k.short, k.mangled, COALESCE(sd.value, ss.value, sm.value)
                FROM (SELECT DISTINCT dem, short, mangled FROM _nsys_rows) k
                LEFT JOIN _nsys_str sd ON sd.id = k.dem
                LEFT JOIN _nsys_str ss ON ss.id = k.short
                LEFT JOIN _nsys_str sm ON sm.id = k.mangled
                WHERE NOT EXISTS (SELECT 1 FROM _nsys_kname n WHERE {same_names})""").fetchall()
            if new:
                cols = list(zip(*new))
                _insert_arrays(self.con, "_nsys_kname",
                               ["dem", "short", "mangled", "name", "tc", "comm"],
                               [_as_int64(cols[0]), _as_int64(cols[1]), _as_int64(cols[2]),
                                np.array(cols[3], dtype=object),
                                np.array([tensor_core_kernel(x) for x in cols[3]], dtype=object),
                                np.array([communication_kernel(x) for x in cols[3]], dtype=object)],
                               3)

        def per_chunk() -> None:
            nonlocal bad, inserted
            name_new_triples()
            bad += self.con.execute(
                f"SELECT count(*) FROM {bad_from} WHERE k.start_ns IS NULL OR k.end_ns IS NULL "
                "OR k.end_ns < k.start_ns OR (k.start_ns = 0 AND k.end_ns = 0)").fetchone()[0]
            inserted += self.insert(f"""
                INSERT INTO kernels
                SELECT {t}, 'nsys', TRY_CAST(k.device_id AS INTEGER), k.stream_id, k.corr, n.name,
                       k.start_ns, k.end_ns, k.end_ns - k.start_ns,
                       TRY_CAST(k.grid_x AS INTEGER), TRY_CAST(k.grid_y AS INTEGER),
                       TRY_CAST(k.grid_z AS INTEGER), TRY_CAST(k.block_x AS INTEGER),
                       TRY_CAST(k.block_y AS INTEGER), TRY_CAST(k.block_z AS INTEGER),
                       TRY_CAST(k.regs AS INTEGER),
                       CASE WHEN k.smem_s IS NULL AND k.smem_d IS NULL THEN NULL
                            ELSE COALESCE(k.smem_s, 0) + COALESCE(k.smem_d, 0) END,
                       NULL, n.tc, n.comm
                FROM _nsys_rows k JOIN _nsys_kname n ON {same_names}
                WHERE k.start_ns IS NOT NULL AND k.end_ns >= k.start_ns
                  AND NOT (k.start_ns = 0 AND k.end_ns = 0)""")

        n = self.stream(table, {
            "start_ns": "start", "end_ns": "end", "device_id": "deviceId", "stream_id": "streamId",
            "corr": "correlationId", "dem": ("demangledName", "name"), "short": "shortName",
            "mangled": "mangledName", "grid_x": "gridX", "grid_y": "gridY", "grid_z": "gridZ",
            "block_x": "blockX", "block_y": "blockY", "block_z": "blockZ", "regs": "registersPerThread",
            "smem_s": "staticSharedMemory", "smem_d": "dynamicSharedMemory"}, per_chunk)
        self.done("_nsys_kname")
        if n == 0:
            if not self.count(self.src.table("CUPTI_ACTIVITY_KIND_GRAPH_TRACE")):
                self.warn("no CUDA kernels in this export (capture with `nsys profile "
                          "--trace=cuda`): GPU time cannot be measured")
            return
        if bad:
            self.warn(f"{bad} kernels without usable start/end times were skipped")
        self.events += inserted

    def load_graphs(self) -> None:
        """CUDA graphs traced whole (nsys's default, --cuda-graph-trace=graph) leave their
        kernels out of CUPTI_ACTIVITY_KIND_KERNEL; one row per graph execution stands in for
        them, so that GPU busy time is still counted."""
        table = self.src.table("CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
        if not self.copy(table, "_nsys_graph", {
                "start_ns": "start", "end_ns": "end", "device_id": "deviceId",
                "stream_id": "streamId", "corr": "correlationId", "graph_id": "graphId"}):
            return
        n = self.insert(f"""
            INSERT INTO kernels
            SELECT {self.t}, 'nsys', TRY_CAST(device_id AS INTEGER), stream_id, corr,
                   '[CUDA graph ' || COALESCE(CAST(graph_id AS VARCHAR), '?') || ']',
                   start_ns, end_ns, end_ns - start_ns, NULL, NULL, NULL, NULL, NULL, NULL,
                   NULL, NULL, NULL, NULL, FALSE
            FROM _nsys_graph WHERE start_ns IS NOT NULL AND end_ns >= start_ns""")
        self.done("_nsys_graph")
        if n:
            self.events += n
            self.warn(f"{n} CUDA graph executions were traced whole (nsys --cuda-graph-trace=graph): "
                      "each is one '[CUDA graph N]' row in kernels, without its kernels; capture "
                      "with --cuda-graph-trace=node to see them")

    def load_memcpy(self) -> None:
        table = self.src.table("CUPTI_ACTIVITY_KIND_MEMCPY")
        n = self.copy(table, "_nsys_memcpy", {
            "start_ns": "start", "end_ns": "end", "device_id": "deviceId", "stream_id": "streamId",
            "corr": "correlationId", "bytes": "bytes", "copy_kind": "copyKind",
            "src_kind": "srcKind", "dst_kind": "dstKind"})
        if not n:
            return
        kinds = self.enum("ENUM_CUDA_MEMCPY_OPER", _memcpy_kind)
        mem = self.enum("ENUM_CUDA_MEM_KIND", _memory_kind)
        self.events += self.insert(f"""
            INSERT INTO memcpy
            SELECT {self.t}, 'nsys', TRY_CAST(device_id AS INTEGER), stream_id, corr,
                   {_case('copy_kind', kinds)}, {_case('src_kind', mem)}, {_case('dst_kind', mem)},
                   bytes, start_ns, end_ns, end_ns - start_ns
            FROM _nsys_memcpy WHERE start_ns IS NOT NULL AND end_ns >= start_ns""")
        self.done("_nsys_memcpy")

    def load_memset(self) -> None:
        table = self.src.table("CUPTI_ACTIVITY_KIND_MEMSET")
        if not self.copy(table, "_nsys_memset", {
                "start_ns": "start", "end_ns": "end", "device_id": "deviceId",
                "stream_id": "streamId", "corr": "correlationId", "bytes": "bytes"}):
            return
        self.events += self.insert(f"""
            INSERT INTO memset
            SELECT {self.t}, 'nsys', TRY_CAST(device_id AS INTEGER), stream_id, corr, bytes,
                   start_ns, end_ns, end_ns - start_ns
            FROM _nsys_memset WHERE start_ns IS NOT NULL AND end_ns >= start_ns""")
        self.done("_nsys_memset")

    def load_runtime(self) -> None:
        runtime = self.src.table("CUPTI_ACTIVITY_KIND_RUNTIME")
        driver = self.src.table("CUPTI_ACTIVITY_KIND_DRIVER")
        if runtime is None and driver is None:
            self.warn("no CUDA API calls in this export (CUPTI_ACTIVITY_KIND_RUNTIME): "
                      "launch and synchronisation overheads cannot be measured")
            return
        classes = self.enum("ENUM_NSYS_EVENT_CLASS", _api_class)
        by_name = ("CASE WHEN name LIKE 'cuda%' OR name IS NULL THEN 'runtime' "
                   "WHEN name LIKE 'cu%' THEN 'driver' ELSE 'runtime' END")
        # Each API name is cleaned and classified once, not once per call.
        self.con.execute(r"""
            CREATE OR REPLACE TEMP TABLE _nsys_api_names AS
            SELECT id, name, COALESCE(is_launch_api(name), false) AS is_launch,
                   COALESCE(is_sync_api(name), false) AS is_sync
            FROM (SELECT id, regexp_replace(value, '_v[0-9]+((_ptsz|_ptds)?)$', '\1') AS name
                  FROM _nsys_str)""")
        self.temp.append("_nsys_api_names")
        for table, fixed in ((runtime, None), (driver, "driver")):
            api = f"'{fixed}'" if fixed else _case("event_class", classes, by_name)
            g = "r.gtid"
            insert = f"""
                INSERT INTO runtime_calls
                SELECT {self.t}, 'nsys', pid, tid, corr, api, name, start_ns, end_ns,
                       end_ns - start_ns, COALESCE(is_launch, false), COALESCE(is_sync, false)
                FROM (SELECT *, {api} AS api
                      FROM (SELECT {_PID.format(g=g)} AS pid, {_TID.format(g=g)} AS tid, r.corr,
                                   s.name, s.is_launch, s.is_sync, r.start_ns, r.end_ns,
                                   r.event_class
                            FROM _nsys_rows r LEFT JOIN _nsys_api_names s ON s.id = r.name_id))
                WHERE api <> '-' AND start_ns IS NOT NULL AND end_ns >= start_ns"""

            def per_chunk(insert=insert) -> None:
                self.events += self.insert(insert)

            self.stream(table, {"start_ns": "start", "end_ns": "end", "gtid": "globalTid",
                                "corr": "correlationId", "name_id": "nameId",
                                "event_class": "eventClass"}, per_chunk)
        self.done("_nsys_api_names")

    def load_sync(self) -> None:
        t = self.t
        table = self.src.table("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")
        n = self.copy(table, "_nsys_sync", {
            "start_ns": "start", "end_ns": "end", "gpid": "globalPid", "corr": "correlationId",
            "sync_type": ("syncType", "deprecatedSyncType")})
        if n:
            kinds = self.enum("ENUM_CUPTI_SYNC_TYPE", _sync_kind)
            # The API call with the same correlation id names the wait better than syncType:
            # nsys 2025.3 exports cudaStreamSynchronize with the STREAM_WAIT_EVENT code.
            self.events += self.insert(f"""
                INSERT INTO sync_events
                SELECT trace_id, source, pid, tid, kind, name, corr, start_ns, end_ns, dur_ns FROM (
                    SELECT {t} AS trace_id, 'nsys' AS source,
                           COALESCE(r.pid, {_PID.format(g='s.gpid')}) AS pid, r.tid,
                           CASE WHEN sync_record_without_host_wait(r.name)
                                THEN 'stream_wait'  -- the host does not wait in these
                                WHEN is_sync_api(r.name) THEN sync_kind_of_api(r.name)
                                ELSE s.kind0 END AS kind,
                           r.name, s.corr, s.start_ns, s.end_ns, s.end_ns - s.start_ns AS dur_ns
                    FROM (SELECT *, {_case('sync_type', kinds)} AS kind0 FROM _nsys_sync) s
                    LEFT JOIN (SELECT * FROM runtime_calls WHERE trace_id = {t}) r
                      ON r.correlation_id = s.corr
                     AND (s.gpid IS NULL OR r.pid = {_PID.format(g='s.gpid')})
                    WHERE s.start_ns IS NOT NULL AND s.end_ns >= s.start_ns
                    QUALIFY row_number() OVER (PARTITION BY s._rowid
                                               ORDER BY (r.api = 'runtime') DESC NULLS LAST) = 1)
                WHERE kind IS DISTINCT FROM 'stream_wait'""")
            # Blocking copies are no CUPTI synchronisation records: add them from the calls.
            only = "AND sync_kind_of_api(name) = 'memcpy'"
        else:
            only = ""
        self.insert(f"""
            INSERT INTO sync_events
            SELECT {t}, 'nsys', pid, tid, sync_kind_of_api(name), name, correlation_id,
                   start_ns, end_ns, dur_ns
            FROM runtime_calls WHERE trace_id = {t} AND is_sync {only}""")

    def load_nvtx(self) -> None:
        t = self.t
        table = self.src.table("NVTX_EVENTS")
        if table is None:
            self.warn("no NVTX_EVENTS table (capture with `--trace=nvtx`): step markers "
                      "(navdoctor.step#N) and DataLoader waits cannot be seen")
            return
        if not self.copy(table, "_nsys_nvtx", {
                "start_ns": "start", "end_ns": "end", "event_type": "eventType",
                "gtid": "globalTid", "text_id": "textId", "domain_id": "domainId"},
                {"text": "text"}):
            return
        # Ranges are the event types named '...Range' (NvtxPushPopRange, NvtxStartEndRange);
        # a type the ENUM table does not know counts as a range when the row has an end.
        types = self.enum("ENUM_NSYS_EVENT_TYPE", lambda s: s.lower())
        not_ranges = sorted(k for k, v in types.items() if not (v and "range" in v))
        domains = sorted(k for k, v in types.items() if v and "domaincreate" in v)
        is_range = (f"(event_type IS NULL OR event_type NOT IN ({', '.join(map(str, not_ranges))}))"
                    if not_ranges else "true")
        is_domain = f"event_type IN ({', '.join(map(str, domains))})" if domains else "false"
        g = "e.gtid"
        self.con.execute(f"""
            CREATE OR REPLACE TEMP TABLE _nsys_domains AS
            SELECT {_PID.format(g=g)} AS pid, e.domain_id, any_value(COALESCE(e.text, s.value)) AS name
            FROM _nsys_nvtx e LEFT JOIN _nsys_str s ON s.id = e.text_id
            WHERE {is_domain} AND e.domain_id IS NOT NULL
            GROUP BY ALL""")
        self.temp.append("_nsys_domains")
        self.events += self.insert(f"""
            INSERT INTO nvtx_ranges
            SELECT {t}, 'nsys', {_PID.format(g=g)}, {_TID.format(g=g)}, COALESCE(e.text, s.value),
                   d.name, e.start_ns, e.end_ns, e.end_ns - e.start_ns
            FROM _nsys_nvtx e
            LEFT JOIN _nsys_str s ON s.id = e.text_id
            LEFT JOIN _nsys_domains d
              ON d.domain_id = e.domain_id AND d.pid = {_PID.format(g=g)}
            WHERE {is_range} AND e.end_ns IS NOT NULL AND e.start_ns IS NOT NULL
              AND e.end_ns >= e.start_ns""")
        # Steps: our collector's navdoctor.step#N ranges, else torch's ProfilerStep#N.
        for prefix in (r"navdoctor\.step", "ProfilerStep"):
            n = self.insert(f"""
                INSERT INTO steps
                SELECT {t}, 'nsys', TRY_CAST(regexp_extract(name, '#([0-9]+)', 1) AS INTEGER),
                       min(start_ns), max(end_ns), max(end_ns) - min(start_ns), 'nvtx',
                       min(start_ns), max(end_ns)
                FROM nvtx_ranges
                WHERE trace_id = {t} AND regexp_matches(name, '^{prefix}#[0-9]+([^0-9]|$)')
                GROUP BY 3""")
            if n:
                break
        self.insert(f"""
            INSERT INTO dataloader_waits
            SELECT {t}, 'nsys', pid, tid, name, start_ns, end_ns, dur_ns
            FROM nvtx_ranges
            WHERE trace_id = {t} AND ((contains(name, 'DataLoader') AND contains(name, '__next__'))
                                      OR name = 'navdoctor.dataloader_next')""")

    def load_os_calls(self) -> None:
        table = self.src.table("OSRT_API")
        if not self.copy(table, "_nsys_osrt", {"start_ns": "start", "end_ns": "end",
                                               "gtid": "globalTid", "name_id": "nameId"}):
            return
        g = "o.gtid"
        self.events += self.insert(f"""
            INSERT INTO os_calls
            SELECT {self.t}, 'nsys', {_PID.format(g=g)}, {_TID.format(g=g)}, s.value,
                   o.start_ns, o.end_ns, o.end_ns - o.start_ns
            FROM _nsys_osrt o LEFT JOIN _nsys_str s ON s.id = o.name_id
            WHERE o.start_ns IS NOT NULL AND o.end_ns >= o.start_ns""")

    def load_threads(self) -> None:
        table = self.src.table("ThreadNames")
        if not self.copy(table, "_nsys_threads", {"gtid": "globalTid", "name_id": "nameId"}):
            return
        g = "x.gtid"
        self.events += self.insert(f"""
            INSERT INTO threads
            SELECT DISTINCT {self.t}, 'nsys', {_PID.format(g=g)}, {_TID.format(g=g)}, s.value
            FROM _nsys_threads x JOIN _nsys_str s ON s.id = x.name_id
            WHERE x.gtid IS NOT NULL""")

    def load_device_info(self) -> None:
        src = self.src
        gpu = src.table("TARGET_INFO_GPU")
        cuda = src.table("TARGET_INFO_CUDA_DEVICE")
        if gpu is None and cuda is None:
            return

        def pick(table, *names):
            c = src.col(table, *names)
            return _q(c) if c else "NULL"

        gpus: dict[object, dict] = {}
        if gpu is not None:
            sel = {"id": pick(gpu, "id"), "cu": pick(gpu, "cuDevice"), "name": pick(gpu, "name"),
                   "mem": pick(gpu, "totalMemory"), "sms": pick(gpu, "smCount"),
                   "major": pick(gpu, "computeMajor"), "minor": pick(gpu, "computeMinor"),
                   "cc": pick(gpu, "computeCapability"),
                   "tpsm": pick(gpu, "maxThreadsPerSm", "maxThreadsPerMultiProcessor",
                                "maxThreadsPerMultiprocessor"),
                   "warps": pick(gpu, "maxWarpsPerSm"), "warp": pick(gpu, "threadsPerWarp")}
            for row in src.db.execute(f"SELECT {', '.join(sel.values())} FROM {_q(gpu)}"):
                r = dict(zip(sel, row))
                if r["major"] is None and r["cc"]:
                    m = re.match(r"\s*(\d+)\.(\d+)", str(r["cc"]))
                    if m:
                        r["major"], r["minor"] = int(m.group(1)), int(m.group(2))
                if r["tpsm"] is None and r["warps"] and r["warp"]:
                    r["tpsm"] = int(r["warps"]) * int(r["warp"])
                gpus.setdefault(r["id"], r)
        rows: dict[int, tuple] = {}
        if cuda is not None and src.col(cuda, "cudaId"):
            # A process's CUDA device ordinal (the kernels' deviceId) -> the physical GPU.
            # Prefer the mappings of processes that ran kernels.
            kpids = {r[0] for r in self.con.execute(
                "SELECT DISTINCT pid FROM (SELECT pid FROM runtime_calls WHERE trace_id = ?)",
                [self.t]).fetchall()}
            sel = [pick(cuda, "cudaId"), pick(cuda, "gpuId"), pick(cuda, "pid"),
                   pick(cuda, "numMultiprocessors", "multiProcessorCount")]
            maps = sorted(src.db.execute(f"SELECT {', '.join(sel)} FROM {_q(cuda)}").fetchall(),
                          key=lambda m: m[2] not in kpids)
            for cuda_id, gpu_id, _pid, sms in maps:
                if cuda_id is None or int(cuda_id) in rows:
                    continue
                g = gpus.get(gpu_id, {})
                rows[int(cuda_id)] = (int(cuda_id), g.get("name"), g.get("mem"),
                                      g.get("sms") or sms, g.get("major"), g.get("minor"),
                                      g.get("tpsm"))
        if not rows:
            for g in gpus.values():
                dev = g["cu"] if g["cu"] is not None else g["id"]
                if dev is None or int(dev) in rows:
                    continue
                rows[int(dev)] = (int(dev), g["name"], g["mem"], g["sms"], g["major"],
                                  g["minor"], g["tpsm"])
        def num(v):
            try:
                return None if v is None else int(v)
            except (TypeError, ValueError):
                return None

        for dev, name, mem, sms, major, minor, tpsm in rows.values():
            self.con.execute("INSERT INTO device_info VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             [self.t, "nsys", dev, None if name is None else str(name), num(mem),
                              num(sms), num(major), num(minor), num(tpsm)])
            self.events += 1

    def load_memory(self) -> None:
        table = self.src.table("CUDA_GPU_MEMORY_USAGE_EVENTS")
        if not self.copy(table, "_nsys_mem", {"ts": "start", "device_id": "deviceId",
                                              "bytes": "bytes", "mem_kind": "memKind",
                                              "op": "memoryOperationType"}):
            return
        signs = self.enum("ENUM_CUDA_DEV_MEM_EVENT_OPER", _mem_sign)
        mem = self.enum("ENUM_CUDA_MEM_KIND", _memory_kind)
        host = sorted(k for k, v in mem.items() if v in ("pageable", "pinned"))
        not_host = f"mem_kind IS NULL OR mem_kind NOT IN ({', '.join(map(str, host))})" if host else "true"
        self.events += self.insert(f"""
            INSERT INTO memory_events
            SELECT {self.t}, 'nsys', 'cuda', TRY_CAST(device_id AS INTEGER), ts, delta, NULL,
                   sum(delta) OVER (PARTITION BY device_id ORDER BY ts, _rowid
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
            FROM (SELECT *, {_case('op', signs)} * bytes AS delta FROM _nsys_mem
                  WHERE ts IS NOT NULL AND ({not_host}))
            WHERE delta IS NOT NULL""")

    def producer(self) -> str:
        for name in ("META_DATA_EXPORT", "EXPORT_META_DATA", "META_DATA_CAPTURE"):
            table = self.src.table(name)
            if table is None or not self.src.col(table, "name") or not self.src.col(table, "value"):
                continue
            row = self.src.db.execute(
                f"SELECT value FROM {_q(table)} WHERE upper(name) LIKE '%PRODUCT_VERSION%' "
                "OR upper(name) LIKE '%NSYS_VERSION%' LIMIT 1").fetchone()
            if row and row[0]:
                return f"nsys {row[0]}"
        return "nsys"

    def span(self) -> tuple[int | None, int | None]:
        t = self.t
        lo, hi = self.con.execute(f"""
            SELECT min(s), max(e) FROM (
                SELECT start_ns s, end_ns e FROM kernels WHERE trace_id = {t}
                UNION ALL SELECT start_ns, end_ns FROM memcpy WHERE trace_id = {t}
                UNION ALL SELECT start_ns, end_ns FROM memset WHERE trace_id = {t}
                UNION ALL SELECT start_ns, end_ns FROM runtime_calls WHERE trace_id = {t}
                UNION ALL SELECT start_ns, end_ns FROM nvtx_ranges WHERE trace_id = {t}
                UNION ALL SELECT start_ns, end_ns FROM os_calls WHERE trace_id = {t})""").fetchone()
        if lo is None:
            table = self.src.table("ANALYSIS_DETAILS")
            if table and self.src.col(table, "startTime") and self.src.col(table, "stopTime"):
                row = self.src.db.execute(
                    f"SELECT min(startTime), max(stopTime) FROM {_q(table)}").fetchone()
                if row:
                    lo, hi = row
        return lo, hi

    def load_um(self) -> None:
        """Unified memory (`nsys profile --cuda-um-gpu-page-faults=true
        --cuda-um-cpu-page-faults=true`): GPU fault groups, CPU faults, and the migrations
        among the copies (the copy kinds whose ENUM_CUDA_MEMCPY_OPER symbol or label says
        'UVM'/'Unified', with their cause from ENUM_CUDA_UNIF_MEM_MIGRATION) into um_events.
        The migrations stay in memcpy too (as HtoD/DtoH): they are copies the GPU ran.
        Every column may be missing from an older export; the table stays empty without them."""
        t, src = self.t, self.src
        gpu = src.table("CUDA_UM_GPU_PAGE_FAULT_EVENTS")
        if self.copy(gpu, "_nsys_um_gpu", {
                "start_ns": "start", "end_ns": "end", "gpid": "globalPid", "device_id": "deviceId",
                "address": "address", "faults": "numberOfPageFaults", "access": "faultAccessType"}):
            access = self.enum("ENUM_CUDA_UNIF_MEM_ACCESS_TYPE", _um_access)
            self.events += self.insert(f"""
                INSERT INTO um_events
                SELECT {t}, 'nsys', 'gpu_fault', 'gpu', {_PID.format(g='gpid')},
                       TRY_CAST(device_id AS INTEGER), NULL, address, COALESCE(faults, 1), NULL,
                       {_case('access', access)}, NULL, NULL, start_ns, COALESCE(end_ns, start_ns),
                       COALESCE(end_ns, start_ns) - start_ns
                FROM _nsys_um_gpu
                WHERE start_ns IS NOT NULL AND (end_ns IS NULL OR end_ns >= start_ns)""")
        self.done("_nsys_um_gpu")
        cpu = src.table("CUDA_UM_CPU_PAGE_FAULT_EVENTS")
        if self.copy(cpu, "_nsys_um_cpu", {"start_ns": "start", "gpid": "globalPid",
                                           "address": "address"}):
            # nsys records the instant of a CPU fault, not how long it took.
            self.events += self.insert(f"""
                INSERT INTO um_events
                SELECT {t}, 'nsys', 'cpu_fault', 'cpu', {_PID.format(g='gpid')}, NULL, NULL,
                       address, 1, NULL, NULL, NULL, NULL, start_ns, start_ns, 0
                FROM _nsys_um_cpu WHERE start_ns IS NOT NULL""")
        self.done("_nsys_um_cpu")
        memcpy = src.table("CUPTI_ACTIVITY_KIND_MEMCPY")
        copy_kind = src.col(memcpy, "copyKind")
        uvm = {k: v for k, v in self.enum("ENUM_CUDA_MEMCPY_OPER", _um_direction).items() if v}
        if not (memcpy and copy_kind and uvm):
            return
        spec = {"start_ns": "start", "end_ns": "end", "device_id": "deviceId", "stream_id": "streamId",
                "gpid": "globalPid", "bytes": "bytes", "copy_kind": "copyKind",
                "cause": "migrationCause", "address": "virtualAddress"}
        self.con.execute("CREATE OR REPLACE TEMP TABLE _nsys_um_mig (_rowid BIGINT, "
                         + ", ".join(f"{d} BIGINT" for d in spec) + ")")
        self.temp.append("_nsys_um_mig")
        present = [(d, src.col(memcpy, s)) for d, s in spec.items() if src.col(memcpy, s)]
        # Only the migration rows leave SQLite: the other copies are memcpy's (load_memcpy).
        where = f"WHERE {_q(copy_kind)} IN ({', '.join(str(k) for k in sorted(uvm))})"
        for ints, _ in self.row_chunks(memcpy, [c for _, c in present], [], where):
            _insert_arrays(self.con, "_nsys_um_mig", ["_rowid"] + [d for d, _ in present], ints,
                           1 + len(present))
        causes = self.enum("ENUM_CUDA_UNIF_MEM_MIGRATION", _um_cause)
        direction = _case("copy_kind", uvm)
        self.events += self.insert(f"""
            INSERT INTO um_events
            SELECT {t}, 'nsys', 'migration', CASE WHEN dir = 'DtoH' THEN 'cpu' ELSE 'gpu' END,
                   pid, device_id, stream_id, address, NULL, bytes, NULL, dir, cause,
                   start_ns, end_ns, end_ns - start_ns
            FROM (SELECT {_PID.format(g='gpid')} AS pid, TRY_CAST(device_id AS INTEGER) AS device_id,
                         stream_id, address, bytes, {direction} AS dir, {_case('cause', causes)} AS cause,
                         start_ns, end_ns
                  FROM _nsys_um_mig WHERE start_ns IS NOT NULL AND end_ns >= start_ns)""")
        self.done("_nsys_um_mig")


# ---------------------------------------------------------------------- unified memory --

def _um_direction(text: str) -> str | None:
    """A unified-memory copy kind ('CUDA_MEMCPY_KIND_UVM_HTOD', 'Unified Host-to-Device') ->
    'HtoD'; any other copy kind -> None."""
    t = text.upper()
    return _memcpy_kind(text) if ("UVM" in t or "UNIFIED" in t) else None


def _um_cause(text: str) -> str | None:
    """'CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_COHERENCE' / 'Page fault' -> 'coherence', and
    user (cudaMemPrefetchAsync), prefetch (speculative), eviction, access_counters."""
    t = text.upper()
    t = t[t.rindex("CAUSE_") + 6:] if "CAUSE_" in t else t
    # 'User prefetch' is the user's, so USER is tried before PREFETCH.
    for key, cause in (("COHERENCE", "coherence"), ("PAGE FAULT", "coherence"), ("USER", "user"),
                       ("PREFET", "prefetch"), ("EVICT", "eviction"), ("ACCESS", "access_counters")):
        if key in t:
            return cause
    return None


def _um_access(text: str) -> str | None:
    """'CUDA_UNIFIED_MEMORY_ACCESS_TYPE_READ' / 'Read' -> 'read'; unknown -> None."""
    t = text.upper()
    t = t[t.rindex("TYPE_") + 5:] if "TYPE_" in t else t
    t = t.strip().lower()
    return t if t in ("read", "write", "atomic", "prefetch") else None
