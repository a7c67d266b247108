"""Issue #14's A/A pairs on the GPU machine: each configuration captured twice, in separate
processes one after the other, with navdoctor's torch.profiler pass (the `diagnose` torch pass,
no analysis on the device); `navdoctor compare` then reads each pair here. Round-robin over the
configurations, so a time limit leaves every configuration with some pairs.

    python bench/compare/aa_capture.py WORK [--pairs 4] [--budget S]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = {
    "compute_matmul": ["bench/workloads/compute_matmul.py", "--steps", "14"],
    "memory_item_sync": ["bench/workloads/memory_item_sync.py", "--steps", "14"],
    "launch_python_loop": ["bench/workloads/launch_python_loop.py", "--steps", "14"],
    "io_slow_storage": ["bench/workloads/io_slow_storage.py", "--steps", "14"],
    "nav_default": ["navdoctor/workloads/navigation.py", "--frames", "14"],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--first", type=int, default=0, help="number of the first pair (a later call)")
    ap.add_argument("--only", default="", help="configurations, comma-separated (default: all)")
    ap.add_argument("--budget", type=float, default=300)
    ap.add_argument("--extra", default="", help="arguments added to every configuration (tests: --device cpu --small)")
    a = ap.parse_args()
    deadline = time.monotonic() + a.budget
    a.work.mkdir(parents=True, exist_ok=True)
    log = (a.work / "aa.jsonl").open("a")
    only = set(a.only.split(",")) if a.only else set(CONFIGS)
    for pair in range(a.first, a.first + a.pairs):
        for name, cmd in CONFIGS.items():
            if name not in only:
                continue
            for side in ("a", "b"):
                out = a.work / f"{name}_{pair}{side}"
                if (out / "kineto.json.gz").exists():
                    continue
                if deadline - time.monotonic() < 12:
                    return
                out.mkdir(parents=True, exist_ok=True)
                t = time.monotonic()
                p = subprocess.run([sys.executable, "-m", "navdoctor.collect.runner", "--mode", "torch",
                                    "--out", str(out), "--wait", "2", "--warmup", "2", "--active", "8",
                                    "--", *cmd, *a.extra.split()], capture_output=True, text=True,
                                   timeout=max(10, deadline - time.monotonic()))
                row = {"config": name, "pair": pair, "side": side, "rc": p.returncode,
                       "seconds": round(time.monotonic() - t, 1),
                       "trace": (out / "kineto.json.gz").exists()}
                if p.returncode:
                    row["tail"] = (p.stdout + p.stderr)[-300:]
                log.write(json.dumps(row) + "\n")
                log.flush()
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
