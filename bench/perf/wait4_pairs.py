#!/usr/bin/env python3
"""Alternate runs of two versions of navdoctor on one trace, each child waited on by os.wait4
(no polling step): wall time (spawn to wait), CPU time (the child's user + system) and peak
RSS (ru_maxrss), the median of each. The order alternates every pair.

    python bench/perf/wait4_pairs.py --before /tmp/nd/base --after . TRACE 20

Each version runs as `python -c "from navdoctor.cli import console; console()" analyze TRACE
-q --json OUT` with PYTHONPATH at its root, from the current folder (start it from one with
no navdoctor/ in it); its bytecode is compiled first.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("trace")
    ap.add_argument("pairs", type=int)
    a = ap.parse_args()
    trees = {"before": os.path.abspath(a.before), "after": os.path.abspath(a.after)}
    for t in trees.values():
        subprocess.run([a.python, "-m", "compileall", "-q", os.path.join(t, "navdoctor")], check=True)
    res: dict[str, list[tuple[float, float, float]]] = {k: [] for k in trees}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.pairs):
            order = list(trees.items()) if i % 2 == 0 else list(trees.items())[::-1]
            for name, tree in order:
                env = dict(os.environ, PYTHONPATH=tree)
                t0 = time.perf_counter()
                pid = os.posix_spawn(a.python, [a.python, "-c", "from navdoctor.cli import console; console()",
                                                "analyze", a.trace, "-q", "--json",
                                                os.path.join(tmp, name + ".json")], env)
                _, status, ru = os.wait4(pid, 0)
                wall = time.perf_counter() - t0
                if status != 0:
                    sys.exit(f"{name}: exit status {status}")
                res[name].append((wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1e6))
    load1 = os.getloadavg()[0]
    for name, r in res.items():
        ws, cs, rs = zip(*r)
        print(f"{name:7s} n={len(r)} wall median {statistics.median(ws):.3f} (min {min(ws):.3f} "
              f"max {max(ws):.3f})  cpu median {statistics.median(cs):.3f} (min {min(cs):.3f})  "
              f"rss {statistics.median(rs):.2f} GB")
    print(f"load {load0:.2f}..{load1:.2f}")


if __name__ == "__main__":
    main()
