"""Issue #20's mixed corpus on the GPU machine: for each cause (data, host, launch, sync, copy)
and target share of the step, mix.py unprofiled as is, with the cause's remedy and with the
compute remedy (one process, in turn), then `navdoctor diagnose` (both passes) of the mix as is. One JSON
line per stage into RESULTS as it finishes; stages already in RESULTS are skipped, so a second
call resumes where a time limit stopped the first.

    python bench/mixed/run_mix.py RESULTS.jsonl WORK [--shares 0.35,0.6,0.1] [--kinds ...] [--budget S]
                                  [--model resnet50|lraspp] [--repeat R]

--repeat R times the three variants R times, interleaved (none, cause, compute, none, ...) in
one process, and records each variant's median over the R runs with the runs themselves, so
that a label can be told firm (its two remedies apart by more than their runs spread) or not.
--compile adds a fourth variant, the second compute remedy (mix.py --fix compile), except for
the sync cause.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIX = str(HERE / "mix.py")
UNIT = {"data": None, "host": None, "launch": "launch_ms_per_op", "sync": "sync_ms_per_read",
        "copy": "copy_ms_per_mb"}


def run(cmd, timeout):
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(5, timeout))
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        rc, text = 124, "timeout"
    return rc, text, round(time.monotonic() - t, 1)


def fix_runs(text: str, fix: str) -> list[float]:
    """Each run's median step (ms) of one variant, as mix.py prints them."""
    return [float(x) for x in re.findall(rf"fix {fix} steps \d+ median_ms ([\d.]+)", text)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--shares", default="0.35,0.6,0.1")
    ap.add_argument("--kinds", default="data,host,launch,sync,copy")
    ap.add_argument("--budget", type=float, default=500)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--model", default="resnet50", help="mix.py's --model")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--compile", action="store_true", help="also time mix.py --fix compile")
    ap.add_argument("--no-diagnose", action="store_true",
                    help="time the points only (a second timing of points already diagnosed)")
    a = ap.parse_args()
    if a.compile:
        os.environ["MIX_COMPILE"] = "1"           # the calibration times the compiled model too
    deadline = time.monotonic() + a.budget
    a.work.mkdir(parents=True, exist_ok=True)
    done = {}
    if a.results.exists():
        for line in a.results.read_text().splitlines():
            row = json.loads(line)
            if row.get("model", "resnet50") == a.model:
                done[(row.get("kind"), row.get("share_target"), row["stage"])] = row
    out = a.results.open("a")

    def rec(row):
        out.write(json.dumps(row) + "\n")
        out.flush()
        print(json.dumps(row)[:400], flush=True)

    cal = done.get((None, None, "calibrate"))
    if cal is None:
        rc, text, secs = run([sys.executable, MIX, "--calibrate", "--model", a.model], 300)
        # the JSON line is stdout's; warnings (inductor's) may follow it on stderr
        line = [x for x in text.splitlines() if x.startswith("{")][-1:] or [text[-400:]]
        cal = {"stage": "calibrate", "seconds": secs, **json.loads(line[0])}
        rec(cal)
    model_args = ["--model", a.model] + (["--batch", str(cal["batch"])] if cal.get("batch") else [])
    for share in (float(s) for s in a.shares.split(",")):
        for kind in a.kinds.split(","):
            cost_ms = cal["model_ms"] * share / (1 - share)
            unit = UNIT[kind]
            amount = round(cost_ms / cal[unit], 3) if unit else round(cost_ms, 2)
            if kind in ("launch", "sync"):
                amount = max(1, int(amount))
            base = {"kind": kind, "share_target": share, "amount": amount,
                    **({"model": a.model} if a.model != "resnet50" else {})}
            mix = [MIX, "--kind", kind, "--amount", str(amount), "--steps", str(a.steps), *model_args]
            fixes = ("none", "cause", "compute") + (("compile",) if a.compile and kind != "sync" else ())
            todo = [f for f in fixes if (kind, share, f"plain_{f}") not in done]
            if todo:
                if deadline - time.monotonic() < 30:
                    return
                rc, text, secs = run([sys.executable, *mix, "--fix", ",".join(todo * a.repeat)],
                                     deadline - time.monotonic())
                for fix in todo:
                    runs = fix_runs(text, fix)
                    rec({**base, "stage": f"plain_{fix}", "rc": rc,
                         "median_ms": statistics.median(runs) if runs else None,
                         **({"runs_ms": runs} if a.repeat > 1 else {}),
                         "seconds": secs, **({"tail": text[-400:]} if rc or not runs else {})})
            if a.no_diagnose or (kind, share, "diagnose") in done or deadline - time.monotonic() < 30:
                continue
            name = f"{kind}_{share}" if a.model == "resnet50" else f"{a.model}_{kind}_{share}"
            report = a.work / f"{name}.report.json"
            runs = a.work / f"runs_{name}"
            rc, text, secs = run([sys.executable, "-m", "navdoctor.cli", "diagnose",
                                  "--out", str(runs), "--json", str(report), "-q", *mix],
                                 deadline - time.monotonic())
            row = {**base, "stage": "diagnose", "rc": rc, "seconds": secs}
            if report.exists():
                r = json.loads(report.read_text())
                v = r["verdict"]
                row.update(bound=v["bound"], confidence=v["confidence"], shares=v["shares"],
                           class_shares=v["class_shares"], step_ms=v["step_ms"], steps=v["steps"],
                           estimated_gain=v.get("estimated_gain"),
                           # diagnose's own timing pass (the step without a tracer), and the
                           # tracer cost per CUDA call measured from it
                           unprofiled_step_ms=(r.get("run") or {}).get("unprofiled_step_ms"),
                           unprofiled_loader_wait_ms=(r.get("run") or {}).get("unprofiled_loader_wait_ms"),
                           # each timing run's wait, where diagnose timed two
                           unprofiled_loader_waits_ms=(r.get("run") or {}).get("unprofiled_loader_waits_ms"),
                           tracer_cost=v.get("tracer_cost"),
                           findings=[(f["rule"], f["category"], f.get("speedup_up_to"))
                                     for f in r["findings"]])
                for trace in runs.rglob("kineto.json.gz"):        # fixture candidates
                    shutil.copy(trace, a.work / f"{name}.kineto.json.gz")
                for export in runs.rglob("*.sqlite"):
                    with open(export, "rb") as src, gzip.open(a.work / f"{name}.nsys.sqlite.gz", "wb") as dst:
                        shutil.copyfileobj(src, dst)
            else:
                row["tail"] = text[-600:]
            rec(row)


if __name__ == "__main__":
    main()
