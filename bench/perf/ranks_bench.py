#!/usr/bin/env python3
"""Multi-rank jobs (issue #15): wall time and peak memory of `navdoctor analyze --ranks DIR`
with the local process pool (--executor local) and a Dask LocalCluster (--executor dask), for
jobs of 8, 32 and 64 generated ranks (docs/performance.md, "Multi-rank jobs").

    python bench/perf/ranks_bench.py                          # 8, 32, 64 ranks of ~4 MB
    python bench/perf/ranks_bench.py --ranks 64 --steps 1000 --kernels 110 --executors local

The ranks are those of tests/ranks_factory.py (a DDP step: data loading, kernels, an NCCL
all-reduce), with rank 1's data loading 20 ms slower (the straggler every run must name).
Two ranks are generated (a normal one and the slow one) and the others are copies of the
normal one with their own rank in distributedInfo: the all-reduce ends when the slowest rank
is in, whatever the number of ranks, so the copies are the job's other ranks, and a 64-rank
job of large traces is written in seconds.

Each run is one subprocess (`python -m navdoctor.cli analyze --ranks DIR --executor X
--workers W -q --json REPORT`). Its memory is measured two ways:
  tree peak    the largest sum of the RSS of the process and all its descendants (pool
               workers; Dask's scheduler thread, nannies and workers), sampled every 50 ms
               with psutil; pages shared between processes count once per process, so this
               is an upper bound;
  largest      the ru_maxrss that os.wait4 reports for the child: the peak of the largest
               single process of the tree (its reaped descendants included).
CPU time is user + sys of the tree (wait4 again): the neighbours of a shared machine disturb
it much less than the wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))

try:
    import psutil
except ImportError:       # comes with dask[distributed]; without it only 'largest' is measured
    psutil = None

_INFO = re.compile(rb'"distributedInfo": \{"backend": "nccl", "rank": (\d+), "world_size": (\d+)\}')


def make_ranks(out_dir: str, ranks: int, steps: int, kernels: int) -> float:
    """A job of `ranks` traces in out_dir (rank 1 the straggler); returns MB per rank."""
    from ranks_factory import make_job
    with tempfile.TemporaryDirectory(prefix="ranks-template-") as tmp:
        normal, slow = make_job(tmp, ranks=2, steps=steps, kernels=kernels,
                                data_us=[500.0, 20500.0])
        templates = {0: open(normal, "rb").read(), 1: open(slow, "rb").read()}
    os.makedirs(out_dir, exist_ok=True)
    for r in range(ranks):
        data = templates[1 if r == 1 else 0]
        # distributedInfo is at the end of the file: rewrite it there only
        head, tail = data[:-4096], data[-4096:]
        tail, n = _INFO.subn(f'"distributedInfo": {{"backend": "nccl", "rank": {r}, '
                             f'"world_size": {ranks}}}'.encode(), tail)
        assert n == 1, "distributedInfo not found at the end of the generated trace"
        with open(os.path.join(out_dir, f"rank{r:03d}.json"), "wb") as f:
            f.write(head + tail)
    return len(templates[0]) / 1e6


def tree_rss(p) -> int:
    total = 0
    try:
        procs = [p] + p.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def run_one(job_dir: str, executor: str, workers: int, report: str) -> dict:
    cmd = [sys.executable, "-m", "navdoctor.cli", "analyze", "--ranks", job_dir,
           "--executor", executor, "--workers", str(workers), "-q", "--json", report]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)
    peak = 0
    if psutil is not None:
        p = psutil.Process(child.pid)
        # Sample until the child exits (it stays a zombie, unreaped, so its pid stays ours).
        while p.status() != psutil.STATUS_ZOMBIE:
            peak = max(peak, tree_rss(p))
            time.sleep(0.05)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t0
    err = child.stderr.read().decode(errors="replace").strip()
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{executor} on {job_dir}: exit {child.returncode}: {err}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "tree_peak_mb": peak / 2**20 if peak else None, "largest_mb": usage.ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--steps", type=int, default=100, help="steps per rank (default 100)")
    ap.add_argument("--kernels", type=int, default=70,
                    help="compute kernels per step (default 70: ~4 MB per rank)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--executors", nargs="+", default=["local", "dask"],
                    choices=["local", "dask"])
    ap.add_argument("--dir", default=None, help="where the jobs are written (default: a "
                    "temporary folder, removed after)")
    ap.add_argument("--json", dest="json_path", help="also write the results here")
    args = ap.parse_args()

    base = args.dir or tempfile.mkdtemp(prefix="navdoctor-ranks-bench-")
    results = []
    try:
        for n in args.ranks:
            job_dir = os.path.join(base, f"job{n}")
            shutil.rmtree(job_dir, ignore_errors=True)
            mb = make_ranks(job_dir, n, args.steps, args.kernels)
            row = {"ranks": n, "mb_per_rank": mb, "load_1min_before": os.getloadavg()[0]}
            jobs = {}
            for ex in args.executors:
                report = os.path.join(base, f"report-{n}-{ex}.json")
                row[ex] = run_one(job_dir, ex, args.workers, report)
                jobs[ex] = json.load(open(report))["job"]
                straggler = (jobs[ex]["straggler"] or {}).get("rank")
                if straggler != 1:
                    raise SystemExit(f"{ex}, {n} ranks: straggler {straggler}, not rank 1")
            row["same_job"] = all(j == jobs[args.executors[0]] for j in jobs.values())
            row["load_1min_after"] = os.getloadavg()[0]
            results.append(row)
            shutil.rmtree(job_dir, ignore_errors=True)
            print(f"# {n} ranks done", file=sys.stderr, flush=True)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)

    print(f"# {os.cpu_count()} CPUs, --workers {args.workers}, {args.steps} steps x "
          f"{args.kernels} kernels per rank; python {sys.version.split()[0]}")
    cols = ["ranks", "MB/rank"]
    for ex in args.executors:
        cols += [f"{ex} s", f"{ex} cpu s", f"{ex} tree MB", f"{ex} largest MB"]
    if set(args.executors) == {"local", "dask"}:
        cols += ["dask/local time", "dask/local cpu", "dask/local tree"]
    cols += ["same job", "load 1m"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in results:
        cells = [str(r["ranks"]), f"{r['mb_per_rank']:.1f}"]
        for ex in args.executors:
            m = r[ex]
            cells += [f"{m['wall_s']:.1f}", f"{m['cpu_s']:.1f}",
                      f"{m['tree_peak_mb']:.0f}" if m["tree_peak_mb"] else "-",
                      f"{m['largest_mb']:.0f}"]
        if set(args.executors) == {"local", "dask"}:
            cells += [f"{r['dask']['wall_s'] / r['local']['wall_s']:.2f}",
                      f"{r['dask']['cpu_s'] / r['local']['cpu_s']:.2f}",
                      f"{r['dask']['tree_peak_mb'] / r['local']['tree_peak_mb']:.2f}"
                      if r["local"]["tree_peak_mb"] else "-"]
        cells += ["yes" if r["same_job"] else "NO",
                  f"{r['load_1min_before']:.1f}-{r['load_1min_after']:.1f}"]
        print("| " + " | ".join(cells) + " |")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
