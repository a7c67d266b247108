"""Issue #20's data-vs-compute sweep on the GPU machine: for each target data share, the
script unprofiled with --workers 0 and with --workers 8 (the io remedy), and `navdoctor
diagnose` of the --workers 0 run; one JSON line per stage to RESULTS as it finishes.

    python bench/mixed/run_sweep.py RESULTS.jsonl WORK [--shares 0.1,0.25,0.45,0.7] [--budget S]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "data_vs_compute.py")


def run(cmd, timeout):
    t = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(5, timeout))
    return p.returncode, p.stdout + p.stderr, round(time.monotonic() - t, 1)


def median(text):
    m = re.search(r"median_ms ([\d.]+)", text)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--shares", default="0.1,0.25,0.45,0.7")
    ap.add_argument("--budget", type=float, default=200)
    a = ap.parse_args()
    deadline = time.monotonic() + a.budget
    a.work.mkdir(parents=True, exist_ok=True)
    out = a.results.open("a")

    def rec(row):
        out.write(json.dumps(row) + "\n")
        out.flush()
        print(json.dumps(row)[:300], flush=True)

    rc, text, secs = run([sys.executable, SCRIPT, "--calibrate"], 120)
    model_ms = float(re.search(r"model_ms ([\d.]+)", text).group(1))
    rec({"stage": "calibrate", "model_ms": model_ms, "seconds": secs})
    for share in (float(s) for s in a.shares.split(",")):
        data_ms = round(model_ms * share / (1 - share), 2)
        row = {"share_target": share, "data_ms": data_ms}
        for workers in (0, 8):
            if deadline - time.monotonic() < 20:
                break
            rc, text, secs = run([sys.executable, SCRIPT, "--data-ms", str(data_ms), "--workers",
                                  str(workers), "--steps", "24"], deadline - time.monotonic())
            rec({**row, "stage": f"plain_w{workers}", "rc": rc, "median_ms": median(text), "seconds": secs})
        if deadline - time.monotonic() < 40:
            continue
        report = a.work / f"share{share}.json"
        rc, text, secs = run([sys.executable, "-m", "navdoctor.cli", "diagnose", "--out",
                              str(a.work / f"runs{share}"), "--json", str(report), "-q", SCRIPT,
                              "--data-ms", str(data_ms), "--workers", "0", "--steps", "24"],
                             deadline - time.monotonic())
        r = {**row, "stage": "diagnose", "rc": rc, "seconds": secs}
        if report.exists():
            v = json.loads(report.read_text())["verdict"]
            r.update(bound=v["bound"], confidence=v["confidence"], shares=v["shares"],
                     class_shares=v["class_shares"], step_ms=v["step_ms"],
                     estimated_gain=v.get("estimated_gain"),
                     per_trace=[(t["source"], t["bound"], t["shares"]) for t in v["per_trace"]])
        else:
            r["tail"] = text[-600:]
        rec(r)


if __name__ == "__main__":
    main()
