"""Time the mixed corpus's sync points again, plain (no capture), with mix.py's fixed read.

Until the fifteenth session mix.py's sync cause read `out.reshape(-1)[0].item()`, which copies
the whole output wherever it is not contiguous: every activation under channels_last (the compute
remedy) and ConvNeXt's permuted blocks as is. The labels of the sync points compare remedies
timed that way. This times each point's three variants again (as is, cause fixed, compute fixed),
interleaved R times in one process, at the amount the point was captured with (labels.yaml), and
writes one JSON line per point as it finishes; points already in RESULTS are skipped, so a second
call resumes.

    python bench/mixed/retime_sync.py RESULTS.jsonl --gpu H100 [--repeat 3] [--budget S]
        [--points KEY,KEY] [--skip-model convnexttiny]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import yaml

from run_mix import fix_runs, run     # (this folder: how mix.py is run and read, once)

HERE = Path(__file__).resolve().parent
LABELS = HERE.parents[1] / "fixtures" / "gpu" / "mixed" / "labels.yaml"


SEEDS = {"H100": HERE.parents[1] / "bench" / "results" / "mix-calibrations-seed.jsonl",
         "H200": HERE.parents[1] / "bench" / "results" / "mix-calibrations-seed-h200.jsonl"}


def calibrated_batches(gpu: str) -> dict[str, int]:
    """The batch each model's points were captured at: run_mix.py passes the calibration's
    (`--calibrate` picks a segmenter's batch: LR-ASPP 64, DeepLabV3 32, not mix.py's
    defaults), from the calibrations the corpus's calls started from (heldout_data.sh)."""
    rows = [json.loads(x) for x in SEEDS[gpu].read_text().splitlines() if x.strip()]
    return {r.get("model") or "resnet50": r["batch"] for r in rows if r.get("batch")}


def sync_points(gpu: str) -> dict[str, dict]:
    """labels.yaml's sync points captured on this GPU, each with its model named."""
    points = yaml.safe_load(LABELS.read_text())["points"]
    return {k: {**p, "model": p.get("model", "resnet50")} for k, p in points.items()
            if p.get("cause") == "sync" and p.get("gpu", "H200") == gpu}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", type=Path)
    ap.add_argument("--gpu", required=True, help="the points captured on this GPU (H100, H200)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--budget", type=float, default=540)
    ap.add_argument("--points", default="",
                    help="comma-separated labels.yaml keys: time only these, in this order "
                         "(a short device call does the points whose labels may move first)")
    ap.add_argument("--skip-model", action="append", default=[],
                    help="leave this model's points out (apply_retime.py keeps ConvNeXt-Tiny's)")
    a = ap.parse_args()
    deadline = time.monotonic() + a.budget
    points = sync_points(a.gpu)
    wanted = list(dict.fromkeys(k for k in a.points.split(",") if k)) or list(points)
    unknown = [k for k in wanted if k not in points]
    if unknown:
        raise SystemExit(f"--points: not a {a.gpu} sync point of labels.yaml: {', '.join(unknown)}")
    skipped = [k for k in wanted if points[k]["model"] in a.skip_model]
    if a.points and skipped:
        raise SystemExit(f"--points names {', '.join(skipped)}, whose model --skip-model leaves out")
    wanted = [k for k in wanted if k not in skipped]
    batches = calibrated_batches(a.gpu)
    done = set()      # points timed whole; a failed one is timed again
    if a.results.exists():
        rows = [json.loads(x) for x in a.results.read_text().splitlines() if x.strip()]
        done = {r["point"] for r in rows if not r.get("rc") and all(r["runs_ms"].values())}
    with a.results.open("a") as out:
        for key in wanted:
            if key in done:
                continue
            left = deadline - time.monotonic()
            if left < 40:
                print(f"budget spent before {key}", flush=True)
                return
            p = points[key]
            model = p["model"]
            cmd = [sys.executable, str(HERE / "mix.py"), "--kind", "sync", "--amount", str(p["amount"]),
                   "--steps", str(a.steps), "--model", model,
                   *(["--batch", str(batches[model])] if model in batches else []),
                   "--fix", ",".join(["none", "cause", "compute"] * a.repeat)]
            rc, text, secs = run(cmd, left - 10)
            if rc == 124:
                print(f"{key}: timed out", flush=True)
                return
            runs = {f: fix_runs(text, f) for f in ("none", "cause", "compute")}
            row = {"point": key, "amount": p["amount"], "model": model, "batch": batches.get(model),
                   "rc": rc, "seconds": secs, "runs_ms": runs,
                   **{f"{f}_ms": round(statistics.median(r), 3) if r else None for f, r in runs.items()},
                   # the medians timed with the old read: labels.yaml's own until apply_retime.py
                   # moved them to timed_before_read_fix
                   "old": dict(zip(("none", "cause", "compute"), p.get("timed_before_read_fix") or
                                   [p.get(k) for k in ("none_ms", "cause_fixed_ms", "compute_fixed_ms")]))}
            if rc or not all(runs.values()):
                row["tail"] = text[-500:]
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row)[:300], flush=True)


if __name__ == "__main__":
    main()
