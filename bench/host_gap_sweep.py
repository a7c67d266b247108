"""The host-work threshold swept over the committed Nsight Systems captures: how the `host`
bucket (a stretch with no CUDA call from any launching thread, breakdown.HOST_WORK_GAP_NS)
and the verdict move with the threshold (docs/accuracy.md, "Host-work threshold").

    python bench/host_gap_sweep.py [--us 50,100,200,500,1000] [TRACE ...]

Without TRACE: every nsys capture under fixtures/gpu/ (the corpus and the hand captures).
Prints a Markdown row (host / launch share of the step, then the class, at each threshold) for
each trace whose class changes or whose host share passes 0.06 at some threshold, then one line
for the rest. No GPU needed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import navdoctor.breakdown as breakdown  # noqa: E402
from navdoctor.analysis import analyze  # noqa: E402
from navdoctor.rules import load_rules  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--us", default="50,100,200,500,1000", help="thresholds in microseconds")
    a = ap.parse_args()
    gpu = ROOT / "fixtures/gpu"
    traces = a.traces or sorted([*gpu.glob("*/nsys.sqlite.gz"), *gpu.glob("handmade/*.nsys.sqlite.gz")])
    thresholds = [int(x) for x in a.us.split(",")]
    rules, keep = load_rules(), breakdown.HOST_WORK_GAP_NS
    print("| trace | " + " | ".join(f"{us} µs" for us in thresholds) + " |")
    print("|---" * (len(thresholds) + 1) + "|")
    quiet, quiet_host = 0, 0.0
    try:
        for t in traces:
            cells, classes, host = [], set(), 0.0
            for us in thresholds:
                breakdown.HOST_WORK_GAP_NS = us * 1000
                v = analyze([str(t)], rules).verdict
                h, launch = v.shares.get("host", 0.0), v.shares.get("launch", 0.0)
                cells.append(f"{h:.2f}/{launch:.2f} {v.bound}")
                classes.add(v.bound)
                host = max(host, h)
            name = str(t.relative_to(gpu)).removesuffix(".nsys.sqlite.gz").removesuffix("/nsys.sqlite.gz")
            if len(classes) > 1 or host > 0.06:
                print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
            else:
                quiet, quiet_host = quiet + 1, max(quiet_host, host)
    finally:
        breakdown.HOST_WORK_GAP_NS = keep
    print(f"\nThe {quiet} other traces: host share at most {quiet_host:.2f}, class unchanged at every threshold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
