#!/usr/bin/env python3
"""What the two floors leave (docs/performance.md, "Floors"): the first steps of a load, timed
alone, beside the floor run_bench.py measures.

    python bench/perf/floor_parts.py --kineto /work/perfdata/kineto_1000mb.json \
        --nsys /work/perfdata/nsys_1m_kernels.sqlite [--repeat 2]

Kineto (the trace's events array, as run_bench.py's duckdb-read reads it):
  count            SELECT count(*) FROM read_json(array): the floor
  count, columns   the same with the columns navdoctor's loader parses (kineto._EVENT_COLUMNS)
  stored           those columns stored in a DuckDB table, nothing else
nsys (the tables and columns the loader reads, navdoctor.loaders.nsys):
  page reader      the kernels' and CUDA calls' integer columns decoded from the file's pages
  stored           the same arrays inserted into DuckDB tables (a file, as the loader's store
                   spills), with no name join, no checkpoint of ours, no analysis
Each line: wall and CPU seconds of this process for that step.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import duckdb  # noqa: E402

# the loader's own reads of the two large tables (run_bench.NSYS_READ, the scan floor's list)
NSYS_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME")


def timed(label: str, work) -> None:
    w, c = time.perf_counter(), time.process_time()
    rows = work()
    print(f"{label:<28} {time.perf_counter() - w:6.2f} s wall {time.process_time() - c:6.2f} s CPU"
          f"  ({rows} rows)", flush=True)


def kineto_parts(trace: str, data_dir: str) -> None:
    import run_bench
    from navdoctor.loaders.kineto import _EVENT_COLUMNS
    events = run_bench.events_array(trace, data_dir)
    count = "SELECT count(*) FROM read_json(?, format='array'{})"
    timed("kineto count", lambda: duckdb.connect().execute(count.format(""), [events]).fetchone()[0])
    timed("kineto count, columns", lambda: duckdb.connect().execute(
        count.format(f", columns={_EVENT_COLUMNS}"), [events]).fetchone()[0])

    def stored():
        con = duckdb.connect()
        con.execute("CREATE TABLE ev AS SELECT * FROM read_json(?, format='array', "
                    f"columns={_EVENT_COLUMNS})", [events])
        return con.execute("SELECT count(*) FROM ev").fetchone()[0]
    timed("kineto stored", stored)


def nsys_parts(export: str) -> None:
    from navdoctor.loaders import nsys
    from run_bench import NSYS_READ
    tables = {t: NSYS_READ[t] for t in NSYS_TABLES}

    def read() -> int:
        src = nsys._Source(export)
        return sum(len(a) for table, cols in tables.items()
                   for a in nsys._int_chunks(src, table, cols))
    timed("nsys page reader", read)

    def stored() -> int:
        src = nsys._Source(export)
        with tempfile.TemporaryDirectory() as d:
            con = duckdb.connect(os.path.join(d, "store.duckdb"))
            rows = 0
            for k, (table, cols) in enumerate(tables.items()):
                for n, a in enumerate(nsys._int_chunks(src, table, cols)):
                    con.register("chunk", {f"c{i}": a[:, i] for i in range(a.shape[1])})
                    con.execute(f"CREATE TABLE t{k} AS SELECT * FROM chunk" if n == 0
                                else f"INSERT INTO t{k} SELECT * FROM chunk")
                    con.unregister("chunk")
                    rows += len(a)
            con.close()
        return rows
    timed("nsys stored", stored)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kineto", help="a Kineto trace (run_bench.py's data folder holds its events array)")
    ap.add_argument("--nsys", help="an Nsight Systems SQLite export")
    ap.add_argument("--data", help="run_bench.py's --data folder (default: the trace's folder)")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    if not (a.kineto or a.nsys):
        ap.error("give --kineto and/or --nsys")
    for _ in range(a.repeat):
        if a.kineto:
            kineto_parts(a.kineto, a.data or os.path.dirname(os.path.abspath(a.kineto)))
        if a.nsys:
            nsys_parts(a.nsys)
    return 0


if __name__ == "__main__":
    sys.exit(main())
