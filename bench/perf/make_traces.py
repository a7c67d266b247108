#!/usr/bin/env python3
"""Generate large, deterministic traces shaped like real ones, for the performance benchmark.

A real fixture's trace is repeated back to back: every repetition is the same workload with its
timestamps shifted by one period and its ids (correlation ids, external ids, flow ids, Python
ids, ProfilerStep / navdoctor.step numbers) shifted past the previous repetition's, so the
result reads like one long capture of many steps.

Kineto:  a plain .json of about each target size, and its .json.gz. Written streaming: the
         fixture (24 MB) is parsed once into per-event text templates, and each repetition is
         formatted and written out; the large trace is never held in memory.
nsys:    an SQLite export with N million kernel rows, with the runtime (CUDA API), memcpy,
         synchronisation and NVTX rows of the same repetitions, made inside SQLite with
         INSERT ... SELECT over a table of repetition numbers (no row passes through Python).
         Memory-usage events, OS runtime calls, thread names and strings are kept as in the
         fixture (one repetition's worth).

    python bench/perf/make_traces.py --out /work/perfdata                 # all sizes
    python bench/perf/make_traces.py --out /work/perfdata --kineto-mb 100 --nsys-mrows 1
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_FIXTURE = os.path.join(ROOT, "fixtures", "gpu", "nav_default")
GAP_NS = 500_000  # idle time between two repetitions

# ----------------------------------------------------------------------------- Kineto --

_TS, _CORR, _EXT, _FLOW, _PYID, _PYPAR, _STEP = ("@@TS@@", "@@CORR@@", "@@EXT@@", "@@FLOW@@",
                                                  "@@PYID@@", "@@PYPAR@@", "@@STEP@@")


def _ns(us) -> int:
    return int(round(float(us) * 1000))


def _ts_text(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def _repeated(ev: dict) -> bool:
    """Metadata and the profiler's own span markers are written once; the rest repeats."""
    return ev.get("ph") != "M" and isinstance(ev.get("pid"), int) and "ts" in ev


def _template(ev: dict) -> tuple[str, list[tuple[str, int]]]:
    """The event as JSON text with %-placeholders, and the (kind, base) of each placeholder."""
    e = dict(ev)
    slots: list[tuple[str, int]] = []
    e["ts"] = _TS
    if "args" in e and isinstance(e["args"], dict):
        a = e["args"] = dict(e["args"])
        for key, tok in (("correlation", _CORR), ("External id", _EXT), ("Python id", _PYID),
                         ("Python parent id", _PYPAR)):
            if isinstance(a.get(key), int):
                a[key] = tok
    if e.get("cat") == "ac2g" and isinstance(e.get("id"), int):
        e["id"] = _FLOW
    name = e.get("name")
    if isinstance(name, str) and name.startswith("ProfilerStep#") and name[13:].isdigit():
        e["name"] = "ProfilerStep#" + _STEP
    text = json.dumps(e).replace("%", "%%")
    # Placeholders in the order they occur in the text.
    found = []
    for tok, kind, base in ((_TS, "ts", _ns(ev["ts"])),
                            (_CORR, "corr", (ev.get("args") or {}).get("correlation")),
                            (_EXT, "ext", (ev.get("args") or {}).get("External id")),
                            (_PYID, "py", (ev.get("args") or {}).get("Python id")),
                            (_PYPAR, "py", (ev.get("args") or {}).get("Python parent id")),
                            (_FLOW, "corr", ev.get("id")),
                            (_STEP, "step", int(name[13:]) if e.get("name") != name else 0)):
        quoted = '"' + tok + '"'
        if quoted in text:
            found.append((text.index(quoted), quoted, kind, base))
        elif tok in text:  # inside a string (the step number)
            found.append((text.index(tok), tok, kind, base))
    for _, tok, kind, base in sorted(found):
        text = text.replace(tok, "%s" if kind == "ts" else "%d", 1)
        slots.append((kind, base))
    return text, slots


def make_kineto(fixture: str, out_path: str, target_bytes: int) -> dict:
    with gzip.open(os.path.join(fixture, "kineto.json.gz"), "rb") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    once = [e for e in events if not _repeated(e)]
    rep = [e for e in events if _repeated(e)]
    # One period: the span of the repeated events, plus a gap.
    lo = min(_ns(e["ts"]) for e in rep)
    hi = max(_ns(e["ts"]) + _ns(e.get("dur", 0) or 0) for e in rep)
    period = hi - lo + GAP_NS

    def span(values):
        values = [v for v in values if isinstance(v, int)]
        return (max(values) - min(values) + 1) if values else 0

    corr_span = span([(e.get("args") or {}).get("correlation") for e in rep]
                     + [e.get("id") for e in rep if e.get("cat") == "ac2g"])
    ext_span = span([(e.get("args") or {}).get("External id") for e in rep])
    py_span = span([(e.get("args") or {}).get("Python id") for e in rep]
                   + [(e.get("args") or {}).get("Python parent id") for e in rep])
    steps = [int(e["name"][13:]) for e in rep
             if str(e.get("name", "")).startswith("ProfilerStep#") and e["name"][13:].isdigit()]
    step_span = span(steps) or 1
    templates = [_template(e) for e in rep]

    def rep_text(r: int) -> str:
        shift = {"ts": r * period, "corr": r * corr_span, "ext": r * ext_span, "py": r * py_span,
                 "step": r * step_span}
        out = []
        for text, slots in templates:
            vals = tuple(_ts_text(base + shift[kind]) if kind == "ts" else base + shift[kind]
                         for kind, base in slots)
            out.append(text % vals)
        return ",\n".join(out)

    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    keys = list(doc)
    before = {k: head[k] for k in keys[: keys.index("traceEvents")]}
    after = {k: head[k] for k in keys[keys.index("traceEvents") + 1:]}
    first = rep_text(0)
    per_rep = len(first.encode()) + 2
    reps = max(1, round(target_bytes / per_rep))
    tmp = out_path + ".part"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("{\n")
        for k, v in before.items():
            f.write(f"  {json.dumps(k)}: {json.dumps(v)},\n")
        f.write('  "traceEvents": [\n')
        for e in once:
            f.write(json.dumps(e) + ",\n")
        for r in range(reps):
            f.write(first if r == 0 else rep_text(r))
            f.write(",\n" if r < reps - 1 else "\n")
        f.write("  ]")
        for k, v in after.items():
            f.write(f",\n  {json.dumps(k)}: {json.dumps(v)}")
        f.write("\n}\n")
    os.replace(tmp, out_path)
    return {"path": out_path, "reps": reps, "events": len(once) + reps * len(rep),
            "kernels": reps * sum(1 for e in rep if e.get("cat") == "kernel"),
            "steps": reps * len(set(steps)), "bytes": os.path.getsize(out_path)}


def gzip_file(path: str) -> str:
    out = path + ".gz"
    with open(path, "rb") as src, open(out + ".part", "wb") as dst:
        if shutil.which("gzip"):
            subprocess.run(["gzip", "-6", "-c"], stdin=src, stdout=dst, check=True)
        else:
            with gzip.GzipFile(fileobj=dst, mode="wb", compresslevel=6) as g:
                shutil.copyfileobj(src, g, 1 << 20)
    os.replace(out + ".part", out)
    return out


# ------------------------------------------------------------------------------- nsys --

# table -> columns shifted by the period (times) and by the correlation span.
_NSYS_TABLES = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "correlationId"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "correlationId"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("start", "end", "correlationId"),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("start", "end", "correlationId"),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": ("start", "end", "correlationId"),
    "NVTX_EVENTS": ("start", "end"),
}


def make_nsys(fixture: str, out_path: str, kernel_rows: int) -> dict:
    tmp = out_path + ".part"
    with gzip.open(os.path.join(fixture, "nsys.sqlite.gz"), "rb") as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    db = sqlite3.connect(tmp)
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("PRAGMA cache_size=-262144")
    have = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    tables = [t for t in _NSYS_TABLES if t in have]
    # Rows that repeat: timed rows (NVTX: ranges and marks with a time >= 0, not domain
    # creation); one period spans them all, plus a gap.
    rep_where = {t: "start >= 0" for t in tables}
    if "NVTX_EVENTS" in tables:
        rep_where["NVTX_EVENTS"] = "start >= 0 AND end IS NOT NULL"
    if "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION" in tables and "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        # The end-of-capture context sync has no API call in the export: it happens once.
        rep_where["CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"] = (
            "start >= 0 AND correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME)")
    lo, hi = None, None
    for t in tables:
        a, b = db.execute(f"SELECT min(start), max(COALESCE(end, start)) FROM {t} "
                          f"WHERE {rep_where[t]}").fetchone()
        if a is not None:
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
    period = hi - lo + GAP_NS
    corr_lo, corr_hi = db.execute(
        "SELECT min(c), max(c) FROM (" + " UNION ALL ".join(
            f"SELECT correlationId c FROM {t}" for t in tables if "correlationId" in _NSYS_TABLES[t])
        + ")").fetchone()
    corr_span = corr_hi - corr_lo + 1
    steps = [int(r[0]) for r in db.execute(
        "SELECT substr(text, 16) FROM NVTX_EVENTS WHERE text LIKE 'navdoctor.step#%'")]
    step_span = (max(steps) - min(steps) + 1) if steps else 1
    per_rep = db.execute(f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                         f"WHERE {rep_where['CUPTI_ACTIVITY_KIND_KERNEL']}").fetchone()[0]
    reps = max(1, round(kernel_rows / per_rep))
    db.execute("CREATE TEMP TABLE _reps (r INTEGER PRIMARY KEY)")
    db.executemany("INSERT INTO _reps VALUES (?)", [(r,) for r in range(1, reps)])
    for t in tables:
        cols = [r[1] for r in db.execute(f"PRAGMA table_info({t})")]
        exprs = []
        for c in cols:
            if c in ("start", "end"):
                exprs.append(f"{c} + _reps.r * {period}")
            elif c == "correlationId" and c in _NSYS_TABLES[t]:
                exprs.append(f"{c} + _reps.r * {corr_span}")
            elif t == "NVTX_EVENTS" and c == "text":
                exprs.append(f"CASE WHEN text LIKE 'navdoctor.step#%' THEN 'navdoctor.step#' || "
                             f"(CAST(substr(text, 16) AS INTEGER) + _reps.r * {step_span}) "
                             f"ELSE text END")
            else:
                exprs.append(f'"{c}"')
        db.execute(f"CREATE TEMP TABLE _one AS SELECT * FROM {t} WHERE {rep_where[t]}")
        col_list = ", ".join(f'"{c}"' for c in cols)
        db.execute(f"INSERT INTO {t} ({col_list}) SELECT {', '.join(exprs)} "
                   f"FROM _reps CROSS JOIN (SELECT * FROM temp._one) ORDER BY _reps.r")
        db.execute("DROP TABLE temp._one")
        db.commit()
    counts = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
    db.close()
    os.replace(tmp, out_path)
    return {"path": out_path, "reps": reps, "rows": counts, "bytes": os.path.getsize(out_path)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="/work/perfdata", help="output folder (outside the repo)")
    p.add_argument("--fixture", default=DEFAULT_FIXTURE,
                   help="fixture folder with kineto.json.gz and nsys.sqlite.gz")
    p.add_argument("--kineto-mb", type=int, nargs="*", default=[100, 500, 1000],
                   help="Kineto sizes in MB (10^6 bytes)")
    p.add_argument("--nsys-mrows", type=float, nargs="*", default=[1, 5, 10],
                   help="nsys kernel rows, in millions")
    p.add_argument("--no-gzip", action="store_true", help="skip the .json.gz copies")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    manifest_path = os.path.join(args.out, "manifest.json")
    manifest = json.load(open(manifest_path)) if os.path.exists(manifest_path) else {}
    for mb in args.kineto_mb:
        t0 = time.time()
        path = os.path.join(args.out, f"kineto_{mb}mb.json")
        info = make_kineto(args.fixture, path, mb * 1_000_000)
        manifest[os.path.basename(path)] = info
        print(f"{path}: {info['bytes'] / 1e6:.0f} MB, {info['events']} events, "
              f"{info['kernels']} kernels, {info['steps']} steps ({time.time() - t0:.0f} s)", flush=True)
        if not args.no_gzip:
            t0 = time.time()
            gz = gzip_file(path)
            manifest[os.path.basename(gz)] = dict(info, path=gz, bytes=os.path.getsize(gz))
            print(f"{gz}: {os.path.getsize(gz) / 1e6:.0f} MB ({time.time() - t0:.0f} s)", flush=True)
    for m in args.nsys_mrows:
        t0 = time.time()
        label = f"{m:g}".replace(".", "_")
        path = os.path.join(args.out, f"nsys_{label}m_kernels.sqlite")
        info = make_nsys(args.fixture, path, int(m * 1_000_000))
        manifest[os.path.basename(path)] = info
        print(f"{path}: {info['bytes'] / 1e6:.0f} MB, rows {info['rows']} "
              f"({time.time() - t0:.0f} s)", flush=True)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
