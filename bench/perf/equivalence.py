#!/usr/bin/env python3
"""Same results before and after a change: analyse each trace with two versions of navdoctor,
keeping the store (--db), the JSON report and the HTML report, and compare them.

    git archive BASE | tar -x -C /tmp/nd/base        # the code to compare against
    python bench/perf/equivalence.py --old /tmp/nd/base --new . --out /tmp/nd/eq \
        [--public ../shared/public-traces] [--extra /work/perfdata/nsys_1m_kernels.sqlite]

Compared, for every trace (or pair of traces analysed together):
  - every table and view of the store (temporary tables excepted): the same rows, as
    multisets (all rows sorted; tables over --full-rows rows by an order-free sum of row
    hashes and the row count);
  - the JSON report, all but the database path;
  - the HTML report's data (the analysis's html_data), all but the kind of a merged
    timeline box (see html_data()).
With --no-html the analyses write no HTML report: the store's breakdown then comes from the
sweep summed as it streams (breakdown.step_time_sql), which `analyze` takes without --html,
rather than from the segments the HTML report draws.
The old version's outputs are kept in --out/old and reused while its code is unchanged
(--rerun-old to redo them). Exits 1 when anything differs.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

import duckdb

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fixture_cases(root: str) -> list[list[str]]:
    """Each repository fixture alone, and two Kineto + nsys pairs analysed together."""
    f = os.path.join(root, "fixtures")
    paths = sorted(set(
        glob.glob(f"{f}/gpu/**/nsys.sqlite.gz", recursive=True)
        + glob.glob(f"{f}/gpu/**/kineto.json.gz", recursive=True)
        + glob.glob(f"{f}/gpu/handmade/*.sqlite.gz") + glob.glob(f"{f}/gpu/mixed/*.sqlite.gz")
        + glob.glob(f"{f}/synthetic/*.json") + glob.glob(f"{f}/synthetic/*.sqlite")
        + glob.glob(f"{f}/synthetic/job-*/*.json")
        + glob.glob(f"{f}/cpu/*.json.gz") + glob.glob(f"{f}/ranks/**/*.json*", recursive=True)))
    cases = [[p] for p in paths]
    for d in ("nav_default", "memory_item_sync"):
        k, n = f"{f}/gpu/{d}/kineto.json.gz", f"{f}/gpu/{d}/nsys.sqlite.gz"
        if os.path.exists(k) and os.path.exists(n):
            cases.append([k, n])
    return cases


def public_cases(folder: str) -> list[list[str]]:
    paths = []
    for ext in ("*.json", "*.json.gz", "*.sqlite", "*.sqlite.gz"):
        paths += glob.glob(os.path.join(folder, "**", ext), recursive=True)
    return [[p] for p in sorted(paths) if "SOURCE_REF" not in os.path.basename(p)]


def case_name(paths: list[str]) -> str:
    h = hashlib.sha1("\0".join(os.path.abspath(p) for p in paths).encode()).hexdigest()[:10]
    return os.path.basename(paths[0]).split(".")[0][:40] + "-" + h


def analyse(code: str, paths: list[str], out: str, html: bool = True) -> dict:
    """Runs one analysis with the code at `code`, writing out/{store.duckdb,report.json,
    html_data.json}; returns what happened."""
    os.makedirs(out, exist_ok=True)
    for name in ("store.duckdb", "store.duckdb.wal", "report.json", "html_data.json"):
        if os.path.exists(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    # html_data is what the HTML report draws; it is dumped here rather than comparing the
    # HTML page (which embeds the tool's version and assets).
    script = r"""
import json, sys
sys.argv = ['navdoctor'] + sys.argv[1:]
from navdoctor import analysis as A
orig = A.analyze
def analyze(*a, **k):
    res = orig(*a, **k)
    if res.html_data is not None:
        with open(OUT + '/html_data.json', 'w') as f:
            json.dump(res.html_data, f, sort_keys=True, default=repr)
    return res
A.analyze = analyze
from navdoctor.cli import run
run()
""".replace("OUT", repr(out))
    env = dict(os.environ, PYTHONPATH=os.path.abspath(code))
    with_html, html = html, os.path.join(out, "report.html")
    cmd = [sys.executable, "-c", script, "analyze", *paths, "-q", "--db",
           os.path.join(out, "store.duckdb"), "--json", os.path.join(out, "report.json")]
    if with_html:
        cmd += ["--html", html]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if os.path.exists(html):
        os.remove(html)
    return {"rc": p.returncode, "seconds": round(time.perf_counter() - t0, 2),
            "stderr": p.stderr[-2000:]}


def relations(con: duckdb.DuckDBPyConnection) -> list[str]:
    rows = con.execute("""
        SELECT table_name FROM duckdb_tables() WHERE NOT temporary AND database_name = current_database()
        UNION ALL SELECT view_name FROM duckdb_views()
        WHERE NOT internal AND NOT temporary AND database_name = current_database()""").fetchall()
    return sorted(r[0] for r in rows)


def snapshot(db: str, full_rows: int) -> dict:
    """Per relation: its columns and, as a multiset, its rows (sorted reprs, or for large
    relations the count and an order-free sum of row hashes)."""
    con = duckdb.connect(db, read_only=True)
    snap = {}
    for rel in relations(con):
        cols = [d[0] for d in con.execute(f'SELECT * FROM "{rel}" LIMIT 0').description]
        n = con.execute(f'SELECT count(*) FROM "{rel}"').fetchone()[0]
        if n <= full_rows:
            rows = sorted(_untemp(repr(r)) for r in con.execute(f'SELECT * FROM "{rel}"').fetchall())
            snap[rel] = {"columns": cols, "rows": n, "content": rows}
        else:
            cl = ", ".join(f'"{c}"' for c in cols)
            h = con.execute(f'SELECT sum(hash({cl})::HUGEINT)::VARCHAR, '
                            f'bit_xor(hash({cl}, 1)) FROM "{rel}"').fetchone()
            snap[rel] = {"columns": cols, "rows": n, "content": [str(h)]}
    con.close()
    return snap


# A multi-process nsys export is split into per-rank files in a fresh temporary folder.
_RANKS_TMP = re.compile(r"navdoctor-ranks-[A-Za-z0-9_]+")


def _untemp(text: str) -> str:
    return _RANKS_TMP.sub("navdoctor-ranks-TMP", text)


def report(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        doc = json.loads(_untemp(f.read()))
    doc.pop("database", None)
    return doc


def html_data(path: str) -> dict | None:
    """The HTML report's data, with the kind of each merged timeline box (one that holds
    several events) left out: it is the kind of the longest event in the box, and when two
    are equally long the code before this round picks either (arg_max on a tie; seen on
    fixtures/gpu/nav_default/kineto.json.gz, old code against itself)."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        doc = json.loads(_untemp(f.read()))
    for t in doc.get("timelines") or []:
        for b in t.get("boxes") or []:
            if isinstance(b, list) and len(b) >= 6 and isinstance(b[5], int) and b[5] > 1:
                b[1] = b[2] = "(merged)"
    return doc


def _close(a, b) -> bool:
    """Equal but for floats within 1e-12 of each other (relative): sums of floats that
    DuckDB adds in whatever order its threads deliver the rows."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-12 * max(abs(a), abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


def compare(old: str, new: str, full_rows: int) -> list[str]:
    diffs = []
    ro, rn = report(os.path.join(old, "report.json")), report(os.path.join(new, "report.json"))
    if ro != rn:
        diffs.append("report.json differs")
    ho, hn = (html_data(os.path.join(d, "html_data.json")) for d in (old, new))
    if ho != hn:
        diffs.append("html_data differs" + (" (floating-point rounding only, <= 1e-12 relative)"
                                            if _close(ho, hn) else ""))
    so, sn = (os.path.join(d, "store.duckdb") for d in (old, new))
    if os.path.exists(so) != os.path.exists(sn):
        return diffs + ["store exists in one only"]
    if not os.path.exists(so):
        return diffs
    a, b = snapshot(so, full_rows), snapshot(sn, full_rows)
    for rel in sorted(set(a) | set(b)):
        if rel not in a or rel not in b:
            diffs.append(f"{rel}: only in {'new' if rel not in a else 'old'}")
        elif a[rel] != b[rel]:
            x, y = a[rel], b[rel]
            what = "columns" if x["columns"] != y["columns"] else f"rows {x['rows']} vs {y['rows']}"
            if x["columns"] == y["columns"] and len(x["content"]) > 1:
                only_old = sorted(set(x["content"]) - set(y["content"]))[:2]
                only_new = sorted(set(y["content"]) - set(x["content"]))[:2]
                what += f"; old only {only_old}; new only {only_new}"
            diffs.append(f"{rel}: {what}")
    return diffs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="root of the code to compare against")
    ap.add_argument("--new", default=ROOT)
    ap.add_argument("--out", required=True)
    ap.add_argument("--public", help="a folder of more traces (read in place)")
    ap.add_argument("--extra", nargs="*", default=[], help="more traces, each analysed alone")
    ap.add_argument("--only", help="only the cases with a path containing this")
    ap.add_argument("--no-fixtures", action="store_true")
    ap.add_argument("--rerun-old", action="store_true")
    ap.add_argument("--full-rows", type=int, default=200_000)
    ap.add_argument("--no-html", action="store_true",
                    help="analyse without --html (the breakdown's path without segments)")
    a = ap.parse_args()
    cases = [] if a.no_fixtures else fixture_cases(os.path.abspath(a.new))
    if a.public:
        cases += public_cases(a.public)
    cases += [[p] for p in a.extra]
    if a.only:
        cases = [c for c in cases if any(a.only in p for p in c)]
    same = differ = flaky = 0
    for paths in cases:
        name = case_name(paths)
        old_dir, new_dir = (os.path.join(a.out, side, name) for side in ("old", "new"))
        info_path = os.path.join(old_dir, "run.json")
        if a.rerun_old or not os.path.exists(info_path):
            info = analyse(a.old, paths, old_dir, not a.no_html)
            with open(info_path, "w") as f:
                json.dump(info, f)
        else:
            with open(info_path) as f:
                info = json.load(f)
        new_info = analyse(a.new, paths, new_dir, not a.no_html)
        diffs = compare(old_dir, new_dir, a.full_rows)
        if info["rc"] != new_info["rc"]:
            diffs.insert(0, f"exit status {info['rc']} vs {new_info['rc']}: {new_info['stderr'][-300:]}")
        label = " + ".join(os.path.relpath(p) for p in paths)
        unstable = []
        if diffs:
            # Does the old code differ from itself (a tie that row order decides)?
            again = old_dir + ".again"
            analyse(a.old, paths, again, not a.no_html)
            unstable = compare(old_dir, again, a.full_rows)
        if diffs:
            differ += 1
            kept = new_dir + ".differs"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(new_dir, kept)
            print(f"DIFFERS  {label}")
            for d in diffs:
                print(f"         {d[:600]}")
            if unstable:
                flaky += 1
                print("         (the old code run again differs from its first run too: "
                      + "; ".join(u[:200] for u in unstable) + ")")
        else:
            same += 1
            print(f"same     {label}  (rc {new_info['rc']}, {info['seconds']} s -> {new_info['seconds']} s)")
        sys.stdout.flush()
    print(f"\n{same + differ} analyses: {same} identical, {differ} differ"
          + (f" ({flaky} of them also differ between two runs of the old code)" if flaky else ""))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
