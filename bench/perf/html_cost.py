#!/usr/bin/env python3
"""What writing the HTML report costs: `navdoctor analyze FILE -q --json A` against the same with
`--html B`, interleaved (plain, html, html, plain, ...), each run a fresh process.

    python bench/perf/html_cost.py /work/perfdata/kineto_1000mb.json [--repeat 2]

Prints each run's wall and CPU time, the medians, the difference and the ratio, the HTML's size
and the 1-minute load average before and after (a shared machine: docs/performance.md).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def run(cmd: list[str]) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if err.strip():
        print(err.strip(), file=sys.stderr)
    if os.waitstatus_to_exitcode(status) not in (0, 1):  # 1: a --fail-on finding; not used here
        raise SystemExit(f"{' '.join(cmd)}: exit code {os.waitstatus_to_exitcode(status)}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--repeat", type=int, default=2, help="runs of each variant")
    p.add_argument("--navdoctor", default=os.path.join(os.path.dirname(sys.executable), "navdoctor"))
    p.add_argument("--stages", action="store_true",
                   help="also time the HTML's own stages inside one analysis (this process)")
    a = p.parse_args()
    if not os.path.exists(a.trace):
        print(f"{a.trace}: no such file (bench/perf/make_traces.py makes it)", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="navdoctor-html-cost-")
    json_out, html_out = os.path.join(tmp, "r.json"), os.path.join(tmp, "r.html")
    load0 = os.getloadavg()[0]
    times: dict[str, list[tuple[float, float, int]]] = {"plain": [], "html": []}
    order = [v for i in range(a.repeat) for v in (("plain", "html") if i % 2 == 0 else ("html", "plain"))]
    for variant in order:
        cmd = [a.navdoctor, "analyze", a.trace, "-q", "--json", json_out]
        if variant == "html":
            cmd += ["--html", html_out]
        wall, cpu, rss = run(cmd)
        times[variant].append((wall, cpu, rss))
        print(f"{variant:5}  wall {wall:7.2f} s  cpu {cpu:7.2f} s  peak RSS {rss / 2**20:.2f} GB"
              f"  (load {os.getloadavg()[0]:.2f})", flush=True)
    load1 = os.getloadavg()[0]
    med = {k: (statistics.median(w for w, _, _ in v), statistics.median(c for _, c, _ in v))
           for k, v in times.items()}
    size = os.path.getsize(html_out)
    print(f"\n{os.path.basename(a.trace)} ({os.path.getsize(a.trace) / 1e6:.0f} MB), {a.repeat} run(s) each, "
          f"interleaved; 1-min load average {load0:.2f} before, {load1:.2f} after")
    print(f"median wall: plain {med['plain'][0]:.2f} s, with --html {med['html'][0]:.2f} s: "
          f"+{med['html'][0] - med['plain'][0]:.2f} s ({med['html'][0] / med['plain'][0]:.3f}x)")
    print(f"median CPU:  plain {med['plain'][1]:.2f} s, with --html {med['html'][1]:.2f} s: "
          f"+{med['html'][1] - med['plain'][1]:.2f} s ({med['html'][1] / med['plain'][1]:.3f}x)")
    print(f"HTML report: {size / 1e6:.2f} MB")
    for f in (json_out, html_out):
        os.unlink(f)
    os.rmdir(tmp)
    if a.stages:
        stages(a.trace)
    return 0


def stages(trace: str) -> None:
    """The HTML's own work in one analysis, timed from inside: keeping and reading the sweep
    segments, gathering the views, rendering the page (writing it is one rename of ~2.6 MB)."""
    from navdoctor import analysis
    from navdoctor.report import build_report
    from navdoctor.reporters import data, html
    from navdoctor.rules import load_rules
    spent: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
        return wrapper
    data.capture_step_segments = timed("capture_step_segments", data.capture_step_segments)
    data.gather = timed("gather", data.gather)
    t0 = time.perf_counter()
    a = analysis.analyze([trace], load_rules(), None, html=True)
    total = time.perf_counter() - t0
    t1 = time.perf_counter()
    page = html.render_report_html(build_report(a), a.html_data)
    spent["render"] = time.perf_counter() - t1
    print(f"\nin one analysis with --html ({total:.2f} s in all): " + ", ".join(
        f"{k} {v:.3f} s" for k, v in spent.items()) + f"; page {len(page.encode()) / 1e6:.2f} MB")


if __name__ == "__main__":
    sys.exit(main())
