"""The trace store: one DuckDB database, one normalized schema for every trace format.

Every time is an integer nanosecond (BIGINT). Every row carries `trace_id` (which input it
came from, see `inputs`) and `source` ('kineto' or 'nsys'). The schema is a public interface:
user rules query it, so a change here is a change of docs/schema.md and of SCHEMA_VERSION.
"""
from __future__ import annotations

import os
import re
import tempfile
import uuid

import duckdb

from .errors import NavdoctorError
from .kernelnames import (LAUNCH_API_PATTERN, SYNC_API_PATTERN, SYNC_KIND_SQL,
                          SYNC_WITHOUT_HOST_WAIT_SQL, TRAINING_KERNEL_SQL)

SCHEMA_VERSION = "1.6"   # 1.6: unprofiled_steps.loader_wait_low_ns/_high_ns (additive); 1.5: the unprofiled_step view (additive); 1.4: unprofiled_steps.loader_wait_ns (additive); 1.3: unprofiled_steps, tracer_cost.unprofiled_step_ns (additive); 1.2: um_events (additive); 1.1: cpu_ops.input_types (additive)

# DuckDB's memory for one analysis. Past it, DuckDB spills to a private temporary folder
# (which it removes when done): large traces are analysed in bounded memory. Override with
# NAVDOCTOR_MEMORY_LIMIT (a DuckDB size such as '4GB').
MEMORY_LIMIT_ENV = "NAVDOCTOR_MEMORY_LIMIT"
DEFAULT_MEMORY_LIMIT = "1GB"
_SIZE = re.compile(r"\s*[0-9]+(\.[0-9]+)?\s*(B|KB|MB|GB|TB|KIB|MIB|GIB|TIB)\s*", re.IGNORECASE)

# Column lists are kept in one place so loaders and docs agree on them.
TABLES: dict[str, str] = {
    "inputs": """
        trace_id INTEGER, path VARCHAR, format VARCHAR, source VARCHAR,
        producer VARCHAR,            -- e.g. 'torch 2.11.0' or 'nsys 2025.3.1'
        start_ns BIGINT, end_ns BIGINT, events BIGINT, warnings VARCHAR[]""",
    "device_info": """
        trace_id INTEGER, source VARCHAR, device_id INTEGER, name VARCHAR,
        total_memory_bytes BIGINT, sm_count INTEGER, compute_major INTEGER,
        compute_minor INTEGER, max_threads_per_sm INTEGER""",
    "threads": """
        trace_id INTEGER, source VARCHAR, pid BIGINT, tid BIGINT, name VARCHAR""",
    "steps": """
        trace_id INTEGER, source VARCHAR, step_num INTEGER,
        start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT,  -- the window analysed (see cpu_*)
        origin VARCHAR,              -- 'ProfilerStep', 'nvtx', 'navdoctor.step', 'inferred:<method>',
                                     -- 'gpu-window', or 'whole-trace' (see step_inference)
        cpu_start_ns BIGINT, cpu_end_ns BIGINT  -- the marker as the host recorded it""",
    "step_inference": """
        trace_id INTEGER,            -- one row per trace whose steps navdoctor inferred
        method VARCHAR,              -- annotation|optimizer|dataloader|module|period|gpu-window
        detail VARCHAR, steps INTEGER, period_calls INTEGER,
        start_up_ns BIGINT, tear_down_ns BIGINT,  -- left out before/after the steady steps
        irregular_ns BIGINT, irregular_stretches INTEGER, note VARCHAR""",
    "kernels": """
        trace_id INTEGER, source VARCHAR, device_id INTEGER, stream_id BIGINT,
        correlation_id BIGINT, name VARCHAR, start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT,
        grid_x INTEGER, grid_y INTEGER, grid_z INTEGER, block_x INTEGER, block_y INTEGER,
        block_z INTEGER, registers_per_thread INTEGER, shared_memory_bytes BIGINT,
        est_occupancy DOUBLE,        -- 0..1, when the trace carries it
        uses_tensor_cores BOOLEAN,   -- from the kernel name; NULL when it cannot tell
        is_communication BOOLEAN     -- an NCCL/RCCL collective or send/receive (from the name)""",
    "memcpy": """
        trace_id INTEGER, source VARCHAR, device_id INTEGER, stream_id BIGINT,
        correlation_id BIGINT, kind VARCHAR,  -- 'HtoD', 'DtoH', 'DtoD', 'HtoH', 'PtoP'
        src_memory VARCHAR, dst_memory VARCHAR,  -- 'pageable', 'pinned', 'device', 'managed', ...
        bytes BIGINT, start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT""",
    "memset": """
        trace_id INTEGER, source VARCHAR, device_id INTEGER, stream_id BIGINT,
        correlation_id BIGINT, bytes BIGINT, start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT""",
    "runtime_calls": """
        trace_id INTEGER, source VARCHAR, pid BIGINT, tid BIGINT, correlation_id BIGINT,
        api VARCHAR,                 -- 'runtime' or 'driver'
        name VARCHAR, start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT,
        is_launch BOOLEAN, is_sync BOOLEAN""",
    "cpu_ops": """
        trace_id INTEGER, source VARCHAR, pid BIGINT, tid BIGINT, name VARCHAR,
        category VARCHAR,            -- 'cpu_op', 'python_function', ...
        start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT,
        input_shapes VARCHAR,        -- JSON list of the inputs' dims (record_shapes), e.g. '[[8,64],[64,10]]'
        input_types VARCHAR          -- JSON list of the inputs' types, e.g. '["c10::BFloat16","float"]'""",
    "nvtx_ranges": """
        trace_id INTEGER, source VARCHAR, pid BIGINT, tid BIGINT, name VARCHAR,
        domain VARCHAR,              -- NVTX domain, or 'user_annotation' for record_function
        start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT""",
    "dataloader_waits": """
        trace_id INTEGER, source VARCHAR, pid BIGINT, tid BIGINT, name VARCHAR,
        start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT""",
    "os_calls": """
        trace_id INTEGER, source VARCHAR, pid BIGINT, tid BIGINT, name VARCHAR,
        start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT""",
    "sync_events": """
        trace_id INTEGER, source VARCHAR, pid BIGINT, tid BIGINT, kind VARCHAR,
        -- 'device', 'stream', 'event', 'context', 'memcpy' (a blocking copy)
        name VARCHAR, correlation_id BIGINT, start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT""",
    "memory_events": """
        trace_id INTEGER, source VARCHAR, device_type VARCHAR, device_id INTEGER,
        ts_ns BIGINT, bytes_delta BIGINT, total_allocated BIGINT, total_reserved BIGINT""",
    "um_events": """
        trace_id INTEGER, source VARCHAR,
        kind VARCHAR,                -- 'gpu_fault' (a fault group on one page), 'cpu_fault', 'migration'
        side VARCHAR,                -- faults: the processor that faulted; migrations: where
                                     -- the pages went ('gpu': HtoD/DtoD, 'cpu': DtoH)
        pid BIGINT, device_id INTEGER, stream_id BIGINT,
        address BIGINT,              -- virtual address of the page (of the first page migrated)
        faults BIGINT,               -- page faults in the row (GPU: numberOfPageFaults; CPU: 1)
        bytes BIGINT,                -- migrations: bytes moved
        access_type VARCHAR,         -- GPU faults: 'read', 'write', 'atomic', 'prefetch'
        direction VARCHAR,           -- migrations: 'HtoD', 'DtoH', 'DtoD'
        cause VARCHAR,               -- migrations: 'coherence' (on a page fault), 'user'
                                     -- (cudaMemPrefetchAsync), 'prefetch' (speculative),
                                     -- 'eviction', 'access_counters'
        start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT  -- CPU faults: end = start (no end recorded)""",
    # The step as timed without any tracer, where it was measured (diagnose's timing pass, or
    # `analyze --unprofiled-step-ms`): the Nsight Systems tracer's cost per CUDA call is then
    # measured, not assumed (views.tracer_cost; docs/verdict.md, "Tracer cost").
    "unprofiled_steps": """
        trace_id INTEGER, step_ns BIGINT,
        origin VARCHAR,              -- 'timing pass' (diagnose) or 'given' (analyze)
        loader_wait_ns BIGINT,       -- of it, the GPU idle waiting for DataLoader batches
                                     -- (the timing runner's LoaderWait); NULL: not measured
        loader_wait_low_ns BIGINT,   -- where it was timed in several runs (processes): the
        loader_wait_high_ns BIGINT   -- least and most of them (loader_wait_ns their mean);
                                     -- NULL: one run""",
    # The ranks of one job (navdoctor/ranks/): filled by a job analysis only, one row per rank
    # analysed as its own trace; empty otherwise (docs/schema.md, "Multi-rank jobs").
    "ranks": """
        trace_id INTEGER, rank INTEGER, world_size INTEGER, backend VARCHAR, path VARCHAR,
        bound VARCHAR, confidence DOUBLE  -- the rank's own verdict, as for one trace""",
    "rank_steps": """
        trace_id INTEGER, rank INTEGER, step_num INTEGER, job_step INTEGER,  -- NULL: unmatched
        start_ns BIGINT, end_ns BIGINT, step_ns BIGINT, compute_ns BIGINT, comm_ns BIGINT,
        copy_ns BIGINT, data_ns BIGINT, sync_ns BIGINT, launch_ns BIGINT, host_ns BIGINT,
        idle_ns BIGINT,              -- the rank's step_breakdown (comm_ns: exposed)
        comm_total_ns BIGINT,        -- time any collective ran in the step, overlapped or not
        steady BOOLEAN               -- in the rank's steady_steps""",
    "rank_collectives": """
        trace_id INTEGER, rank INTEGER, seq INTEGER,  -- the rank's collectives in start order
        name VARCHAR,                -- collective_kind(): 'allreduce', 'sendrecv', ...
        kind VARCHAR,                -- 'kernel' (NCCL/RCCL) or 'host' (gloo/MPI/UCC)
        step_num INTEGER, start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT""",
}


def memory_limit() -> str:
    """The DuckDB memory limit to use; a malformed NAVDOCTOR_MEMORY_LIMIT is an error, not
    silently another limit."""
    limit = os.environ.get(MEMORY_LIMIT_ENV, "").strip() or DEFAULT_MEMORY_LIMIT
    if not _SIZE.fullmatch(limit):
        raise NavdoctorError(f"{MEMORY_LIMIT_ENV}={limit!r} is not a size with a unit, such as 4GB or 512MB")
    return limit


_UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


# DuckDB keeps rows appended since its last checkpoint uncompressed; a checkpoint compresses
# them (~5-10x). The loaders checkpoint after a batch that leaves the store's memory over this
# share of DuckDB's limit, so that a large trace's store stays inside the limit instead of
# spilling it; below it, none is made (it costs ~0.25 s of CPU per 2 M rows, and the analysis
# reads uncompressed rows faster).
CHECKPOINT_SHARE = 0.4


def memory_limit_bytes(con: duckdb.DuckDBPyConnection) -> float:
    """DuckDB's memory limit (current_setting gives e.g. '953.6 MiB'); 1 GB if unreadable.
    The loaders checkpoint when the store passes CHECKPOINT_SHARE of it."""
    text = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]+)\s*", str(text))
    if m and m.group(2).upper() in _UNITS:
        return float(m.group(1)) * _UNITS[m.group(2).upper()]
    return 1e9


def needs_checkpoint(con: duckdb.DuckDBPyConnection, limit_bytes: float) -> bool:
    """Whether DuckDB's memory is over CHECKPOINT_SHARE of limit_bytes (memory_limit_bytes,
    read once by the caller). (fetchall: a result left unfinished would refuse a loader's
    next register())"""
    used = con.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchall()[0][0]
    return bool(used) and used > CHECKPOINT_SHARE * limit_bytes


def configure(con: duckdb.DuckDBPyConnection) -> None:
    """Bound DuckDB's memory (see DEFAULT_MEMORY_LIMIT); spills go to a folder of our own, not
    to DuckDB's default '.tmp' in the working directory."""
    limit = memory_limit()
    con.execute(f"SET memory_limit = '{limit}'")
    # DuckDB's own progress bar would draw on stderr during long statements, -q or not.
    con.execute("SET enable_progress_bar = false")
    # An ASOF join whose left side DuckDB estimates under 64 rows runs as a nested loop over
    # all pairs. Its estimates through the *_in_steps views are off by orders of magnitude
    # (7 rows for 0.8 M CPU ops), so a rule's ASOF join of 10 k convolutions with 0.8 M ops
    # took 57 s on a 1 GB trace (and hit the rule time limit) instead of 0.3 s: always the
    # sort-based ASOF join.
    # (GLOBAL: rules run on cursors, which do not inherit a connection-level SET)
    con.execute("SET GLOBAL asof_loop_join_threshold = 0")
    if con.execute("SELECT current_setting('temp_directory')").fetchone()[0] == ".tmp":
        spill = os.path.join(tempfile.gettempdir(), f"navdoctor-spill-{uuid.uuid4().hex}")
        con.execute(f"SET temp_directory = '{spill}'")


# What DuckDB may spill to its temporary folder: SPILL_PER_INPUT_BYTE times the inputs' size
# on disk (a compressed trace's inflated size is about 16x), at least SPILL_FLOOR. DuckDB's
# own default is 90% of the free disk.
SPILL_PER_INPUT_BYTE = 16
SPILL_FLOOR = 2 << 30


def bound_spill(con: duckdb.DuckDBPyConnection, input_bytes: int) -> None:
    """Bound DuckDB's temporary files by the size of the inputs (SPILL_PER_INPUT_BYTE)."""
    limit = max(SPILL_FLOOR, SPILL_PER_INPUT_BYTE * max(int(input_bytes), 0))
    con.execute(f"SET max_temp_directory_size = '{limit}B'")


def create_schema(con: duckdb.DuckDBPyConnection, functions: bool = True) -> None:
    """The tables and macros; with `functions`, the Python functions too (register_functions:
    an analysis whose rules call none of them leaves them out, see uses_functions)."""
    configure(con)
    for table, columns in TABLES.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({columns}\n)")
    for macro in MACROS:
        con.execute(macro)
    if functions:
        register_functions(con)


# The Python functions register_functions gives SQL (training_kernel is a macro, MACROS).
FUNCTIONS = ("tensor_core_kernel", "communication_kernel", "host_collective", "collective_kind")


def uses_functions(sql: str) -> bool:
    """Whether `sql` may call one of FUNCTIONS: it names one anywhere (comments and strings
    included; DuckDB's names are case-blind and have no escaped form)."""
    low = sql.lower()
    return any(name in low for name in FUNCTIONS)


# Names longer than this are not classified by the store's Python functions inside rules (NULL).
UDF_MAX_NAME_CHARS = 16384


def register_functions(con: duckdb.DuckDBPyConnection, bounded: bool = False) -> None:
    """Python functions callable from SQL (rules included). One implementation serves both
    loaders: tensor_core_kernel(name) -> TRUE / FALSE / NULL, communication_kernel(name) and
    host_collective(name) -> TRUE / FALSE, collective_kind(name) -> 'allreduce', ... or NULL
    (see navdoctor/kernelnames.py). training_kernel(name) is the SQL macro of MACROS.

    bounded: the versions rules get (engine.lock_down replaces the first ones with them).
    Rules can call these on strings they build (repeat('x', 10^8) on every row): a cached
    Python function would then hold gigabytes (DuckDB's memory limit does not cover
    Python's) and run for minutes between two interrupt checks. A name over
    UDF_MAX_NAME_CHARS is then not classified (NULL), and names over 512 characters bypass
    the caches (kernelnames), so a rule adds nothing to them but real names.

    DuckDB needs numpy to register a Python function (~35 ms to import on a small trace's
    analysis, which is why an analysis whose rules call none of them does not register
    them). Imported here first: DuckDB's own lazy import of it turned a Ctrl-C during the
    import into 'numpy is required ... but it wasn't installed'; ours is a plain
    KeyboardInterrupt."""
    import numpy  # noqa: F401
    try:
        from duckdb.sqltypes import BOOLEAN, VARCHAR
    except ImportError:  # duckdb 1.x
        from duckdb.typing import BOOLEAN, VARCHAR
    from .kernelnames import (collective_kind, communication_kernel, host_collective,
                              tensor_core_kernel)
    for name, fn, out in (("tensor_core_kernel", tensor_core_kernel, BOOLEAN),
                          ("communication_kernel", communication_kernel, BOOLEAN),
                          ("host_collective", host_collective, BOOLEAN),
                          ("collective_kind", collective_kind, VARCHAR)):
        if bounded:
            try:
                con.remove_function(name)
            except (duckdb.Error, ValueError):
                pass
        try:
            con.create_function(name, _bounded(fn) if bounded else fn, [VARCHAR], out,
                                null_handling="special", side_effects=False)
        except duckdb.CatalogException:
            pass  # already registered on this connection


def _bounded(fn):
    uncached = getattr(fn, "__wrapped__", fn)

    def bounded(name: str | None):
        if name is None or len(name) > UDF_MAX_NAME_CHARS:
            return None
        return fn(name) if len(name) <= 512 else uncached(name)
    return bounded


def table_columns(table: str) -> list[str]:
    """Column names of a table, in order (comments stripped)."""
    names = []
    for line in TABLES[table].splitlines():
        line = line.split("--", 1)[0]
        for part in line.split(","):
            part = part.strip()
            if part:
                names.append(part.split()[0])
    return names


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, rows: list,
                columns: list[str] | None = None) -> None:
    """Insert rows (tuples in the order of columns, else of the table's columns) with one
    statement: each column as a list, unnested side by side. DuckDB's executemany runs one
    INSERT per row (~1 ms a row on this 2-core VM: 10.5 s for 10,000 steps), this one ~0.13 s.
    A column is sent as one typed list: one that mixes ints and floats goes as DOUBLE (an int
    past 2**53 would lose digits), so give a column one Python type."""
    if not rows:
        return
    values = [list(c) for c in zip(*rows)]
    into = f"{table} ({', '.join(columns)})" if columns else table
    con.execute(f"INSERT INTO {into} SELECT {', '.join('unnest(?)' for _ in values)}", values)


def connect_new(db_path: str | None) -> duckdb.DuckDBPyConnection:
    """A connection to a new store: in memory, or a new database file at db_path (navdoctor
    never overwrites one)."""
    if db_path and os.path.exists(db_path):
        raise NavdoctorError(f"{db_path}: already exists; navdoctor never overwrites a database "
                             "(choose a new --db path)")
    return duckdb.connect(db_path or ":memory:")


def open_store(path: str | None = None) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(path or ":memory:")
    create_schema(con)
    return con


# SQL macros shared by the loaders (and usable in rules), so both trace formats classify
# API calls and kernels the same way.
MACROS = [
    # kernelnames.training_kernel(n), the same TRUE / FALSE for every name (NULL: FALSE), in SQL.
    f"CREATE OR REPLACE MACRO training_kernel(n) AS {TRAINING_KERNEL_SQL}",
    # kernelnames' API patterns: launches (and among them graph replays), blocking calls,
    # the kind of a sync, and the CUPTI sync records in which the host does not wait.
    f"""CREATE OR REPLACE MACRO is_launch_api(n) AS
        regexp_matches(n, '{LAUNCH_API_PATTERN}')""",
    # The launches among them that replay a whole CUDA graph.
    r"""CREATE OR REPLACE MACRO is_graph_launch_api(n) AS
        is_launch_api(n) AND contains(n, 'GraphLaunch')""",
    f"""CREATE OR REPLACE MACRO is_sync_api(n) AS
        regexp_matches(n, '{SYNC_API_PATTERN}')""",
    f"CREATE OR REPLACE MACRO sync_kind_of_api(n) AS {SYNC_KIND_SQL}",
    f"CREATE OR REPLACE MACRO sync_record_without_host_wait(n) AS {SYNC_WITHOUT_HOST_WAIT_SQL}",
    # A DataLoader wait timed without a tracer (wait) against the trace's (traced_wait), of
    # the traced and the unprofiled step: the tracer's part of the traced wait, and the share
    # of the unprofiled step the loader holds (the loader_wait view, once per timing run;
    # NULL for a NULL wait, which DuckDB's least() would skip).
    r"""CREATE OR REPLACE MACRO loader_tracer_ns(wait, traced_wait, traced_step, unprofiled_step) AS
        CASE WHEN wait IS NOT NULL
             THEN greatest(0, least(traced_wait - wait, traced_step - unprofiled_step)) END""",
    r"""CREATE OR REPLACE MACRO loader_wait_share(wait, traced_wait, unprofiled_step) AS
        CASE WHEN wait IS NOT NULL THEN least(wait, traced_wait) / nullif(unprofiled_step, 0) END""",
]
