#!/usr/bin/env python3
"""Check the SQLite page reader (navdoctor/loaders/sqlite_pages.py) against SQLite itself.

For every SQLite file given (a .sqlite.gz is decompressed to a temporary file; folders are
searched for *.sqlite and *.sqlite.gz), and every rowid table in it, the int64 arrays that
nsys._int_chunks yields (page reader, with its fallback to SQLite) are compared with those of
the text path alone (nsys._text_chunks): for the table's integer-declared columns together
(what the loader asks for), and with --thorough also for all columns together and each column
alone. Prints, per file, the tables the page reader read whole, those it left (in part) to
SQLite and why, and any difference (exit status 1 when there is one).

    python bench/perf/check_sqlite_pages.py fixtures ../shared/public-traces --thorough
    python bench/perf/check_sqlite_pages.py /work/perfdata/nsys_1m_kernels.sqlite --tables \\
        CUPTI_ACTIVITY_KIND_KERNEL,CUPTI_ACTIVITY_KIND_RUNTIME,StringIds
"""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
import tempfile
import time
from collections import Counter

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from navdoctor.loaders import nsys, sqlite_pages  # noqa: E402


def files(paths: list[str]) -> list[str]:
    out = []
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                out += [os.path.join(root, n) for n in sorted(names)
                        if n.endswith((".sqlite", ".sqlite.gz"))]
        else:
            out.append(p)
    return out


def equal_streams(a, b, k: int) -> tuple[bool, int]:
    """Whether two iterators of (rows, k) arrays hold the same rows, chunked however;
    (equal, rows of b). Holds a chunk or two of each at a time."""
    ra = rb = np.empty((0, k), dtype=np.int64)
    rows = 0
    a, b = iter(a), iter(b)
    while True:
        while ra.shape[0] == 0:
            x = next(a, None)
            if x is None:
                break
            ra = x
        while rb.shape[0] == 0:
            y = next(b, None)
            if y is None:
                break
            rb = y
            rows += y.shape[0]
        if ra.shape[0] == 0 or rb.shape[0] == 0:
            return ra.shape[0] == rb.shape[0] == 0, rows
        n = min(ra.shape[0], rb.shape[0])
        if ra.shape[1] != k or not np.array_equal(ra[:n], rb[:n]):
            return False, rows
        ra, rb = ra[n:], rb[n:]


def same(src, table: str, cols: list[str]) -> tuple[bool, str | None, int]:
    """(arrays equal, why the page reader stopped or None, rows)."""
    before = len(src.page_fallbacks)
    ok, rows = equal_streams(nsys._int_chunks(src, table, cols),
                             nsys._text_chunks(src, table, cols), 1 + len(cols))
    why = src.page_fallbacks[-1][1] if len(src.page_fallbacks) > before else None
    return ok, why, rows


def check(path: str, thorough: bool, only: set[str] | None) -> dict:
    src = nsys._Source(path)
    res = {"fast": [], "fallback": [], "diff": [], "rows": 0}
    try:
        for lower, table in sorted(src.tables.items()):
            if only and table not in only:
                continue
            if not src.has_rowid(table):
                continue
            info = src.db.execute(f"PRAGMA table_info({nsys._q(table)})").fetchall()
            ints = [r[1] for r in info if "INT" in (r[2] or "").upper()]
            sets = [ints] if ints else []
            if thorough:
                sets += [[r[1] for r in info]] + [[r[1]] for r in info]
            whys = set()
            for cols in sets:
                ok, why, rows = same(src, table, cols)
                if not ok:
                    res["diff"].append(f"{table} {cols}")
                if why and cols is sets[0]:
                    whys.add(why)
                if cols is sets[0]:
                    res["rows"] += rows
            if sets:
                (res["fallback"] if whys else res["fast"]).append(
                    table + (f" ({'; '.join(sorted(whys))})" if whys else ""))
    finally:
        src.close()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--thorough", action="store_true")
    ap.add_argument("--tables", help="comma-separated table names (default: all)")
    args = ap.parse_args()
    only = set(args.tables.split(",")) if args.tables else None
    bad = 0
    whys: Counter = Counter()
    tmp = tempfile.mkdtemp(prefix="pages_check_")
    try:
        for path in files(args.paths):
            real = path
            if path.endswith(".gz"):
                real = os.path.join(tmp, "x.sqlite")
                with gzip.open(path, "rb") as g, open(real, "wb") as f:
                    shutil.copyfileobj(g, f)
            t = time.perf_counter()
            r = check(real, args.thorough, only)
            fb = r["fallback"]
            print(f"{path}: {len(r['fast'])} tables by pages, {len(fb)} through SQLite "
                  f"(in part), {r['rows']} rows, {len(r['diff'])} differences "
                  f"[{time.perf_counter() - t:.1f} s]")
            for x in fb:
                print("    fallback:", x)
                whys[x.split(" (", 1)[1].rstrip(")") if " (" in x else "?"] += 1
            for x in r["diff"]:
                print("    DIFFERENT:", x)
            bad += len(r["diff"])
            if real != path:
                os.remove(real)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if whys:
        print("fallback reasons:", dict(whys))
    print("differences:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
