#!/usr/bin/env python3
"""Same results before and after a change: analyse each trace with two navdoctor checkouts,
keeping the database (`--db`), and compare every table and view of the store (all rows,
sorted) and the JSON report (all but the database path).

    git archive BASE | tar -x -C /tmp/base
    python bench/perf/equivalence.py --base /tmp/base --new . --work /tmp/eq TRACE...
    python bench/perf/equivalence.py --base /tmp/base --new . --work /tmp/eq --fixtures

The base's outputs are kept in WORK/base and reused when they exist (the base does not
change); the new code's are made again each run. Exit status 1 when anything differs.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fixture_traces() -> list[str]:
    """Every Kineto trace of the repository's fixtures (and the synthetic JSON ones)."""
    out = set()
    for pattern in ("fixtures/**/kineto*.json*", "fixtures/synthetic/**/*.json", "fixtures/cpu/*.json.gz"):
        out.update(glob.glob(os.path.join(ROOT, pattern), recursive=True))
    return sorted(out)


def run(code_root: str, trace: str, out_dir: str, python: str) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    db, report = os.path.join(out_dir, "store.duckdb"), os.path.join(out_dir, "report.json")
    for p in (db, report, db + ".wal"):
        if os.path.exists(p):
            os.remove(p)
    t0 = time.perf_counter()
    proc = subprocess.run([python, "-c", "import sys; from navdoctor.cli import run; sys.exit(run())",
                           "analyze", trace, "-q", "--json", report, "--db", db],
                          env=dict(os.environ, PYTHONPATH=code_root), capture_output=True, text=True,
                          cwd=out_dir)  # not the caller's folder: `python -c` imports from there first
    return {"rc": proc.returncode, "stderr": proc.stderr.strip()[-500:], "db": db, "report": report,
            "wall_s": time.perf_counter() - t0}


def _key(v):
    """A sortable, exact key for a value (NaN equals NaN; -0.0 stays distinct from 0.0)."""
    if isinstance(v, float):
        return ("f", "nan" if math.isnan(v) else v.hex())
    return (type(v).__name__, repr(v))


def store_digest(db: str) -> dict[str, tuple[int, str]]:
    """Per table and view: (rows, digest of the rows sorted)."""
    import duckdb
    con = duckdb.connect(db, read_only=True)
    try:
        names = [r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
            "UNION SELECT view_name FROM duckdb_views() WHERE database_name = current_database() "
            "AND NOT internal").fetchall()]
        out = {}
        for name in sorted(names):
            rows = con.execute(f'SELECT * FROM "{name}"').fetchall()
            keys = sorted(tuple(_key(v) for v in row) for row in rows)
            h = hashlib.sha256(repr(keys).encode()).hexdigest()
            out[name] = (len(rows), h)
        return out
    finally:
        con.close()


def report_of(path: str, code_root: str) -> dict:
    """The report without its database path; the checkout's rules folder (in the paths of
    rule files) reads <RULES>."""
    with open(path) as f:
        text = f.read().replace(os.path.join(os.path.abspath(code_root), "rules") + os.sep,
                                "<RULES>/")
    doc = json.loads(text)
    doc.pop("database", None)
    return doc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="*")
    p.add_argument("--base", required=True, help="the checkout before the change")
    p.add_argument("--new", default=ROOT, help="the checkout after it (default: this one)")
    p.add_argument("--work", required=True, help="folder for the databases and reports")
    p.add_argument("--fixtures", action="store_true", help="add every Kineto fixture of the repository")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--keep", action="store_true", help="keep the new databases")
    args = p.parse_args(argv)
    traces = list(args.traces) + (fixture_traces() if args.fixtures else [])
    traces = [os.path.abspath(t) for t in traces]
    for root in (args.base, args.new):   # each checkout's own code, not another's
        where = subprocess.run([args.python, "-c", "import navdoctor; print(navdoctor.__file__)"],
                               env=dict(os.environ, PYTHONPATH=root), capture_output=True,
                               text=True, cwd=args.work if os.path.isdir(args.work) else "/").stdout
        if not where.startswith(os.path.abspath(root)):
            sys.exit(f"{root}: `import navdoctor` finds {where.strip()!r}")
    same = differ = failed = 0
    for trace in traces:
        tag = hashlib.sha1(os.path.abspath(trace).encode()).hexdigest()[:12]
        base_dir = os.path.join(args.work, "base", tag)
        new_dir = os.path.join(args.work, "new", tag)
        done = os.path.join(base_dir, "digest.json")
        if os.path.exists(done):
            with open(done) as f:
                b = json.load(f)
        else:
            r = run(args.base, trace, base_dir, args.python)
            b = {"rc": r["rc"], "stderr": r["stderr"], "wall_s": r["wall_s"]}
            if r["rc"] in (0, 1):
                b["store"] = store_digest(r["db"])
                b["report"] = report_of(r["report"], args.base)
                os.remove(r["db"])
            with open(done, "w") as f:
                json.dump(b, f)
        r = run(args.new, trace, new_dir, args.python)
        n = {"rc": r["rc"], "stderr": r["stderr"], "wall_s": r["wall_s"]}
        if r["rc"] in (0, 1):
            n["store"] = {k: list(v) for k, v in store_digest(r["db"]).items()}
            n["report"] = report_of(r["report"], args.new)
            if not args.keep:
                os.remove(r["db"])
        problems = []
        if b["rc"] != n["rc"]:
            problems.append(f"exit status {b['rc']} -> {n['rc']} ({n['stderr'] or b['stderr']})")
        elif b["rc"] not in (0, 1):
            if b["stderr"] != n["stderr"]:
                problems.append(f"error message: {b['stderr']!r} -> {n['stderr']!r}")
        else:
            bs, ns = b["store"], n["store"]
            for name in sorted(set(bs) | set(ns)):
                if list(bs.get(name, [])) != list(ns.get(name, [])):
                    problems.append(f"table {name}: {bs.get(name)} -> {ns.get(name)}")
            if b["report"] != n["report"]:
                for k in sorted(set(b["report"]) | set(n["report"])):
                    if b["report"].get(k) != n["report"].get(k):
                        problems.append(f"report[{k}] differs")
        status = "same" if not problems else "DIFFERENT"
        if problems:
            differ += 1
        else:
            same += 1
        if b["rc"] not in (0, 1):
            failed += 1
        print(f"{status:9s} {trace}  (base {b['wall_s']:.2f} s, new {n['wall_s']:.2f} s, rc {n['rc']})",
              flush=True)
        for line in problems[:12]:
            print(f"          {line}")
    print(f"{same + differ} traces: {same} identical, {differ} different "
          f"({failed} refused by both with the same message counted as identical when they match)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
