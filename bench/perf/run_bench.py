#!/usr/bin/env python3
"""Side-by-side wall time and peak RSS: navdoctor vs Holistic Trace Analysis, nsys-ai and a
bare JSON parse, on the traces made by make_traces.py.

Every measurement is one subprocess; its peak RSS is the ru_maxrss that os.wait4 reports for
that child (its own peak, children it waited for included). A watchdog kills a run when the
machine's available memory falls under --min-free-gb, and records it as 'killed (memory)'.

    python bench/perf/run_bench.py --data /work/perfdata                   # everything
    python bench/perf/run_bench.py --data /work/perfdata --only kineto_100mb.json --tools navdoctor,hta

Tools (each in its own interpreter/venv; peers never enter navdoctor's venv):
  navdoctor   navdoctor analyze FILE -q --json REPORT          (Kineto and nsys files)
  hta         HTA TraceAnalysis(trace_dir) + get_temporal_breakdown + get_idle_time_breakdown
              + get_cuda_kernel_launch_stats                   (Kineto files; folder with rank-0 link)
  orjson      orjson.loads of the whole file (gunzipped first for .gz)  (Kineto files)
  json        json.loads of the same                                    (Kineto files)
  nsys-ai     nsys-ai diagnose FILE --format json on a fresh copy of the export, cold cache
              (it writes indexes into the file and a cache beside it)   (nsys files)
  sqlite-scan the floor for nsys exports: SQLite reads every row and every column that
              navdoctor's loader reads (one aggregate per column, no analysis), one thread,
              with navdoctor's interpreter                              (nsys files)
  duckdb-read the floor for Kineto traces: DuckDB's own read_json of the traceEvents array,
              counting its rows and nothing else (SELECT count(*) FROM read_json(F,
              format='array'), DuckDB's defaults), with navdoctor's interpreter. The array is
              copied once, untimed, into a file of its own (DATA/.events/, gzipped for a .gz
              trace), since read_json cannot read part of a file        (Kineto files)

After the table, each file's navdoctor MB/s (file size / median wall time) and navdoctor ÷
floor (duckdb-read or sqlite-scan, medians of wall and of CPU time) are printed.

--profile adds `--profile` to navdoctor's runs and prints the wall and CPU time of each phase
(load and its parts, step alignment, breakdown, views, each rule) of its last run.

--report FILE runs nothing: it prints the table, the floor ratios and each file's last profiled
navdoctor run from a results file written earlier (the measurements kept in bench/results/):

    python bench/perf/run_bench.py --report bench/results/perf-floors-nsys1m-kineto1g.json

A results file maps each trace file to its tools' summaries and runs; it may also hold `what`
(how it was measured) and `sizes_mb` (the traces' sizes, for MB/s where DATA is absent).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HTA_SCRIPT = r"""
import sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
a.get_temporal_breakdown(visualize=False)
a.get_idle_time_breakdown(visualize=False)
a.get_cuda_kernel_launch_stats(visualize=False)
"""

PARSE_SCRIPT = r"""
import sys, gzip
mod = __import__(sys.argv[1])
p = sys.argv[2]
data = gzip.open(p, 'rb').read() if p.endswith('.gz') else open(p, 'rb').read()
doc = mod.loads(data)
assert len(doc['traceEvents']) > 0
"""


# The tables and columns navdoctor's nsys loader reads (navdoctor/loaders/nsys.py), for the
# sqlite-scan floor; columns an export lacks are skipped, as the loader skips them.
NSYS_READ = {
    "StringIds": ["id", "value"],
    "CUPTI_ACTIVITY_KIND_KERNEL": ["start", "end", "deviceId", "streamId", "correlationId",
                                   "demangledName", "shortName", "mangledName", "gridX", "gridY",
                                   "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
                                   "staticSharedMemory", "dynamicSharedMemory"],
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": ["start", "end", "deviceId", "streamId", "correlationId",
                                        "graphId"],
    "CUPTI_ACTIVITY_KIND_MEMCPY": ["start", "end", "deviceId", "streamId", "correlationId", "bytes",
                                   "copyKind", "srcKind", "dstKind"],
    "CUPTI_ACTIVITY_KIND_MEMSET": ["start", "end", "deviceId", "streamId", "correlationId", "bytes"],
    "CUPTI_ACTIVITY_KIND_RUNTIME": ["start", "end", "globalTid", "correlationId", "nameId",
                                    "eventClass"],
    "CUPTI_ACTIVITY_KIND_DRIVER": ["start", "end", "globalTid", "correlationId", "nameId",
                                   "eventClass"],
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": ["start", "end", "globalPid", "correlationId",
                                            "syncType"],
    "NVTX_EVENTS": ["start", "end", "eventType", "globalTid", "textId", "domainId", "text"],
    "OSRT_API": ["start", "end", "globalTid", "nameId"],
    "ThreadNames": ["globalTid", "nameId"],
    "CUDA_GPU_MEMORY_USAGE_EVENTS": ["start", "deviceId", "bytes", "memKind",
                                     "memoryOperationType"],
}

SQLITE_SCAN_SCRIPT = r"""
import sqlite3, sys, json, urllib.request, os
tables = json.loads(sys.argv[2])
db = sqlite3.connect("file:" + urllib.request.pathname2url(os.path.abspath(sys.argv[1])) + "?mode=ro", uri=True)
have = {r[0].lower(): r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
rows = 0
for table, cols in tables.items():
    real = have.get(table.lower())
    if real is None:
        continue
    present = {r[1].lower(): r[1] for r in db.execute(f'PRAGMA table_info("{real}")')}
    use = [present[c.lower()] for c in cols if c.lower() in present]
    sel = ", ".join(["count(*)"] + [f'max("{c}")' for c in use])
    rows += db.execute(f'SELECT {sel} FROM "{real}"').fetchone()[0]
assert rows > 0
"""


DUCKDB_READ_SCRIPT = r"""
import duckdb, sys
n = duckdb.connect().execute("SELECT count(*) FROM read_json(?, format='array')", [sys.argv[1]]).fetchone()[0]
assert n > 0
"""


def events_array(path: str, data_dir: str) -> str:
    """The traceEvents array of a Kineto trace in a file of its own (made once, kept in
    DATA/.events/ while the trace's size and mtime stay the same), for duckdb-read."""
    import gzip
    sys.path.insert(0, ROOT)
    from navdoctor.loaders.kineto import _TAIL_KEEP, _parse_head, _parse_tail
    st = os.stat(path)
    gz = path.endswith(".gz")
    out_dir = os.path.join(data_dir, ".events")
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, f"{os.path.basename(path)}.{st.st_size}.{int(st.st_mtime)}.events.json"
                       + (".gz" if gz else ""))
    if os.path.exists(out):
        return out
    opener = gzip.open if gz else open
    with opener(path, "rb") as f, opener(out + ".part", "wb") as o:
        buf, head = b"", None
        while head is None:
            buf += f.read(1 << 16)
            head = _parse_head(buf)
        held = buf[head[1]:]
        while True:
            chunk = f.read(1 << 22)
            if not chunk:
                break
            held += chunk
            if len(held) > 2 * _TAIL_KEEP:
                o.write(held[:-_TAIL_KEEP])
                held = held[-_TAIL_KEEP:]
        o.write(held[:_parse_tail(held)[0]])
    os.replace(out + ".part", out)
    return out


def mem_available_gb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024 / 1024
    return float("inf")


def measure(cmd: list[str], cwd: str | None, env: dict | None, timeout: float,
            min_free_gb: float) -> dict:
    """Run cmd once; wall seconds, peak RSS (MB), exit status."""
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    killed = None
    # stderr is drained by a thread so that a chatty tool never blocks on a full pipe.
    import threading
    err_chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)
    reader.start()
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - t0 > timeout:
            killed = "timeout"
        elif mem_available_gb() < min_free_gb:
            killed = "memory"
        if killed:
            os.killpg(proc.pid, signal.SIGKILL)
            pid, status, ru = os.wait4(proc.pid, 0)
            break
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join(timeout=5)
    err = b"".join(err_chunks).decode("utf-8", "replace").strip().splitlines()
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "rss_mb": ru.ru_maxrss / 1024,
            "rc": proc.returncode, "load1_before": load_before, "load1_after": os.getloadavg()[0],
            "killed": killed, "err": err[-1][:300] if err else ""}


def compile_navdoctor(python: str) -> None:
    """navdoctor's modules compiled to bytecode (__pycache__, untimed), as an installed
    package has them (pip compiles them at install, an editable install on first run). With
    PYTHONDONTWRITEBYTECODE set (as in this project's environment), every measured run would
    otherwise compile them again: ~30 ms of a small trace's analysis."""
    subprocess.run([python, "-m", "compileall", "-q", os.path.join(ROOT, "navdoctor")],
                   check=True, stdout=subprocess.DEVNULL)


def tool_commands(tool: str, path: str, args, scratch: str):
    """(cmd, cwd, env, prepare) for one run of tool on path; prepare() runs untimed first."""
    if tool == "navdoctor":
        env = dict(os.environ, PYTHONPATH=ROOT)
        # what the `navdoctor` command runs (pyproject.toml's console script)
        cmd = [args.navdoctor_python, "-c", "from navdoctor.cli import console; console()",
               "analyze", path, "-q", "--json", os.path.join(scratch, "navdoctor-report.json")]
        if args.profile:
            cmd += ["--profile", os.path.join(scratch, "navdoctor-profile.json")]
        return cmd, scratch, env, None
    if tool == "duckdb-read":
        return ([args.navdoctor_python, "-c", DUCKDB_READ_SCRIPT, events_array(path, args.data)],
                scratch, None, None)
    if tool == "sqlite-scan":
        return ([args.navdoctor_python, "-c", SQLITE_SCAN_SCRIPT, path, json.dumps(NSYS_READ)],
                scratch, None, None)
    if tool == "hta":
        d = os.path.join(scratch, "hta_" + os.path.basename(path).replace(".", "_"))
        os.makedirs(d, exist_ok=True)
        link = os.path.join(d, "rank-0.json.gz" if path.endswith(".gz") else "rank-0.json")
        if not os.path.lexists(link):
            os.symlink(os.path.abspath(path), link)
        return [args.peer_python, "-c", HTA_SCRIPT, d], scratch, None, None
    if tool in ("orjson", "json"):
        return [args.peer_python, "-c", PARSE_SCRIPT, tool, path], scratch, None, None
    if tool == "nsys-ai":
        work = os.path.join(scratch, "nsysai")
        copy = os.path.join(work, os.path.basename(path))

        def prepare():
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
            shutil.copyfile(path, copy)
        cmd = [args.nsysai, "diagnose", copy, "--format", "json", "-o", os.path.join(work, "out.json")]
        return cmd, work, None, prepare
    raise ValueError(tool)


def applies(tool: str, path: str) -> bool:
    kineto = ".json" in os.path.basename(path)
    return tool in ("navdoctor",) or (kineto and tool in ("hta", "orjson", "json", "duckdb-read")) or \
        (not kineto and tool in ("nsys-ai", "sqlite-scan"))


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["rc"] == 0 and not r["killed"]]
    if not ok:
        r = runs[-1] if runs else {}
        why = r.get("killed") or f"rc {r.get('rc')}: {r.get('err', '')}"
        return {"ok": False, "why": why, "n": 0,
                "max_rss_mb": max((x["rss_mb"] for x in runs), default=None),
                "max_wall_s": max((x["wall_s"] for x in runs), default=None)}
    t = [r["wall_s"] for r in ok]
    m = [r["rss_mb"] for r in ok]
    c = [r.get("cpu_s", 0) for r in ok]
    loads = [x for r in ok for x in (r.get("load1_before"), r.get("load1_after")) if x is not None]
    return {"ok": True, "n": len(ok), "t_med": statistics.median(t), "t_min": min(t), "t_max": max(t),
            "load_min": min(loads, default=None), "load_max": max(loads, default=None),
            "cpu_med": statistics.median(c),
            "m_med": statistics.median(m), "m_min": min(m), "m_max": max(m)}


def fmt_t(s: dict) -> str:
    if not s["ok"]:
        return f"failed ({s['why']})"
    return f"{s['t_med']:.2f} s ({s['t_min']:.2f}..{s['t_max']:.2f})"


def fmt_m(s: dict) -> str:
    if not s["ok"]:
        return "-" if s.get("max_rss_mb") is None else f">{s['max_rss_mb'] / 1024:.1f} GB at kill"
    return f"{s['m_med'] / 1024:.2f} GB ({s['m_min'] / 1024:.2f}..{s['m_max'] / 1024:.2f})"


def table(results: dict, sizes: dict) -> str:
    lines = ["| file | size | tool | runs | wall time, median (min..max) | CPU time (median) "
             "| peak RSS, median (min..max) | peer ÷ navdoctor: time | peer ÷ navdoctor: RSS "
             "| load avg (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for f, tools in results.items():
        nd = tools.get("navdoctor")
        for tool, s in tools.items():
            rt = rm = ""
            if tool != "navdoctor" and nd and nd["ok"] and s["ok"]:
                rt = f"{s['t_med'] / nd['t_med']:.1f}×"
                rm = f"{s['m_med'] / nd['m_med']:.1f}×"
            elif tool != "navdoctor" and nd and nd["ok"] and not s["ok"]:
                rt = f">{(s.get('max_wall_s') or 0) / nd['t_med']:.1f}× (did not finish)"
            cpu = f"{s['cpu_med']:.1f} s" if s["ok"] and "cpu_med" in s else "-"
            load = (f"{s['load_min']:.1f}..{s['load_max']:.1f}"
                    if s.get("load_min") is not None else "-")
            lines.append(f"| {f} | {sizes.get(f, 0) / 1e6:.0f} MB | {tool} | {s['n']} | {fmt_t(s)} "
                         f"| {cpu} | {fmt_m(s)} | {rt} | {rm} | {load} |")
    return "\n".join(lines)


FLOORS = ("duckdb-read", "sqlite-scan")


def floor_ratios(results: dict, sizes: dict) -> str:
    """navdoctor's MB/s, and navdoctor ÷ the floor measured on the same file."""
    lines = []
    for f, tools in results.items():
        nd = tools.get("navdoctor")
        if not nd or not nd.get("ok"):
            continue
        line = f"{f}: navdoctor {sizes.get(f, 0) / 1e6 / nd['t_med']:.0f} MB/s"
        for floor in FLOORS:
            fl = tools.get(floor)
            if fl and fl.get("ok"):
                line += (f"; navdoctor ÷ {floor}: {nd['t_med'] / fl['t_med']:.2f}× wall "
                         f"({nd['t_med']:.2f} / {fl['t_med']:.2f} s), "
                         f"{nd['cpu_med'] / max(fl['cpu_med'], 1e-9):.2f}× CPU "
                         f"({nd['cpu_med']:.1f} / {fl['cpu_med']:.1f} s)")
        lines.append(line)
    return "\n".join(lines)


def print_profile(profile: dict, run_wall_s: float) -> None:
    """One line per phase (nested phases indented by their dots), then what the phases leave
    out: interpreter start and imports."""
    print(f"    {'phase':52s} {'wall s':>8s} {'cpu s':>8s}")
    for ph in profile["phases"]:
        depth = ph["phase"].count(".")
        print(f"    {'  ' * depth + ph['phase']:52s} {ph['wall_s']:8.3f} {ph['cpu_s']:8.3f}")
    print(f"    {'analyze command (from its start)':52s} {profile['total_wall_s']:8.3f} "
          f"{profile['total_cpu_s']:8.3f}")
    print(f"    {'process start, imports, exit':52s} {run_wall_s - profile['total_wall_s']:8.3f}",
          flush=True)


def print_report(path: str, data_dir: str) -> int:
    """The tables of a saved results file, as a run prints them at its end."""
    saved = json.load(open(path))
    shown = {f: tools for f, tools in saved.items() if isinstance(tools, dict) and f != "sizes_mb"}
    sizes = {f: mb * 1e6 for f, mb in saved.get("sizes_mb", {}).items()}
    sizes.update({f: os.path.getsize(os.path.join(data_dir, f)) for f in shown
                  if os.path.exists(os.path.join(data_dir, f))})
    if saved.get("what"):
        print(saved["what"])
        print()
    print(table(shown, sizes))
    print()
    print(floor_ratios(shown, sizes))
    for f, tools in shown.items():
        runs = [r for r in tools.get("navdoctor", {}).get("runs", []) if r.get("profile")]
        if runs:
            print(f"\n{f}: navdoctor's last profiled run, {runs[-1]['wall_s']:.2f} s")
            print_profile(runs[-1]["profile"], runs[-1]["wall_s"])
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/work/perfdata")
    p.add_argument("--only", default="", help="comma-separated file names (default: all in the manifest)")
    p.add_argument("--tools", default="navdoctor,sqlite-scan,duckdb-read,hta,orjson,json,nsys-ai")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs of navdoctor (and of the JSON parses and the SQLite scan)")
    p.add_argument("--profile", action="store_true",
                   help="print the time of each phase of navdoctor's runs (analyze --profile)")
    p.add_argument("--peer-repeat", type=int, default=3, help="runs of HTA and nsys-ai")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a run is killed")
    p.add_argument("--min-free-gb", type=float, default=1.5,
                   help="kill a run when the machine's available memory drops below this")
    p.add_argument("--navdoctor-python", default=sys.executable)
    p.add_argument("--no-bytecode", action="store_true",
                   help="leave navdoctor's modules uncompiled (see compile_navdoctor)")
    p.add_argument("--peer-python", default="/work/benchvenv/bin/python")
    p.add_argument("--nsysai", default="/work/benchvenv/bin/nsys-ai")
    p.add_argument("--results", default=None, help="JSON results file (default DATA/results.json; "
                                                    "merged with earlier results)")
    p.add_argument("--report", metavar="FILE", help="print the tables of a results file; run nothing")
    args = p.parse_args(argv)
    if args.report:
        return print_report(args.report, args.data)
    manifest = json.load(open(os.path.join(args.data, "manifest.json")))
    files = [f for f in manifest if not args.only or f in args.only.split(",")]
    tools = args.tools.split(",")
    results_path = args.results or os.path.join(args.data, "results.json")
    saved = json.load(open(results_path)) if os.path.exists(results_path) else {}
    sizes = {f: os.path.getsize(os.path.join(args.data, f)) for f in manifest
             if os.path.exists(os.path.join(args.data, f))}
    if "navdoctor" in tools and not args.no_bytecode:
        compile_navdoctor(args.navdoctor_python)
    scratch = tempfile.mkdtemp(prefix="navdoctor-bench-", dir=args.data)
    try:
        for f in files:
            path = os.path.join(args.data, f)
            for tool in tools:
                if not applies(tool, path):
                    continue
                n = (args.repeat if tool in ("navdoctor", "orjson", "json", "sqlite-scan", "duckdb-read")
                     else args.peer_repeat)
                runs = []
                for i in range(n):
                    cmd, cwd, env, prepare = tool_commands(tool, path, args, scratch)
                    if prepare:
                        prepare()
                    report = os.path.join(scratch, "navdoctor-report.json")
                    if os.path.exists(report):
                        os.remove(report)  # navdoctor never replaces a file it did not write
                    r = measure(cmd, cwd, env, args.timeout, args.min_free_gb)
                    profile = os.path.join(scratch, "navdoctor-profile.json")
                    if tool == "navdoctor" and args.profile and os.path.exists(profile):
                        with open(profile) as pf:
                            r["profile"] = json.load(pf)
                        os.remove(profile)
                    runs.append(r)
                    print(f"{f:32s} {tool:10s} run {i + 1}/{n}: {r['wall_s']:8.2f} s "
                          f"cpu {r['cpu_s']:8.2f} s "
                          f"{r['rss_mb'] / 1024:6.2f} GB rc={r['rc']} "
                          f"load {r['load1_before']:.2f}->{r['load1_after']:.2f}"
                          + (f" killed={r['killed']}" if r["killed"] else "")
                          + (f" [{r['err']}]" if r["rc"] else ""), flush=True)
                    if r.get("profile"):
                        print_profile(r["profile"], r["wall_s"])
                    if r["rc"] != 0 or r["killed"]:
                        break  # a failure repeats; do not spend the time again
                saved.setdefault(f, {})[tool] = dict(summarize(runs), runs=runs,
                                                     when=time.strftime("%Y-%m-%d %H:%M"))
                with open(results_path, "w") as out:
                    json.dump(saved, out, indent=1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    shown = {f: {t: s for t, s in saved[f].items()} for f in manifest if f in saved}
    print()
    print(table(shown, sizes))
    print()
    print(floor_ratios(shown, sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
