"""Does a trace tell what Nsight Systems' tracing cost its host per CUDA call? (docs/accuracy.md,
"Tracer cost"). For each mixed-corpus point: the traced step's excess over the unprofiled one
per counted CUDA call, against the median duration of the trace's cudaLaunchKernel calls; a
least-squares line through the host-bound launch points (and the two H200 measurements the
verdict's 5 us came from, docs/verdict.md "Tracer cost"); and the verdicts with that cost per
trace instead of 5 us.

    python bench/mixed/tracer_fit.py [--labels fixtures/gpu/mixed/labels.yaml]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from navdoctor.analysis import analyze  # noqa: E402
from navdoctor.verdict import class_shares, cost_at, decide, without_tracer  # noqa: E402
from score_mix import measured_label  # noqa: E402  (this folder: the label rule, once)

# torchvision train.py --workers 12 and the ultralytics YOLO stream on the H200 host: the traced
# step's excess over the script's own unprofiled meter per CUDA call (docs/verdict.md)
CALIBRATION = {"handmade/train_w12.nsys.sqlite.gz": 7.0, "handmade/yolo_seg_stream.nsys.sqlite.gz": 12.4}


def measure(path: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "t.duckdb")
        v = analyze([str(path)], [], db_path=db).verdict
        con = duckdb.connect(db, read_only=True)
        launch_med = con.execute("SELECT median(dur_ns) FROM runtime_calls_in_steps "
                                 "WHERE name = 'cudaLaunchKernel'").fetchone()[0]
        con.close()
    return {"shares": v.shares, "step": v.step_ms, "calls": (v.tracer_cost or {}).get("cuda_calls_per_step", 0),
            "launch_us": launch_med / 1e3}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--labels", type=Path, default=ROOT / "fixtures/gpu/mixed/labels.yaml")
    a = ap.parse_args()
    points = yaml.safe_load(a.labels.read_text())["points"]
    rows = {}
    for name, p in sorted(points.items()):
        m = measure(a.labels.parent / p["file"])
        _, label = measured_label(p["cause"], {"none": p["none_ms"], "cause": p["cause_fixed_ms"],
                                               "compute": p["compute_fixed_ms"],
                                               "compile": p.get("compile_fixed_ms")})
        m.update(label=label, cause=p["cause"], family=p.get("model", "resnet50"),
                 excess_us=(m["step"] - p["none_ms"]) * 1e3 / m["calls"] if m["calls"] else None)
        rows[name] = m
        print(f"{name:24} launch median {m['launch_us']:5.2f} us, excess {m['excess_us']:6.2f} us per counted call")
    fit = [(r["launch_us"], r["excess_us"]) for r in rows.values()
           if r["family"] == "resnet50" and r["cause"] == "launch"]
    fit += [(measure(ROOT / "fixtures/gpu" / f)["launch_us"], us) for f, us in CALIBRATION.items()]
    x, y = np.array(fit).T
    slope, icept = np.polyfit(x, y, 1)
    print(f"fit on {len(fit)} host-bound launch points: excess = {slope:.2f} x median {icept:+.2f} us; "
          f"correlation {np.corrcoef(x, y)[0, 1]:.2f}")
    for title, cost in (("5 us per call", lambda r: 5.0), ("fitted per trace", lambda r: max(0.0, slope * r["launch_us"] + icept))):
        score: dict[str, list[int]] = {}
        for r in rows.values():
            c = cost_at(r["shares"], r["step"], r["calls"], int(cost(r) * 1e3)) if r["calls"] else None
            bound = decide(class_shares(without_tracer(r["shares"], c)), True, 10)[0]
            s = score.setdefault(r["family"], [0, 0])
            s[0] += bound == r["label"]
            s[1] += 1
        print(f"{title}: as labelled " + ", ".join(f"{f} {k}/{n}" for f, (k, n) in sorted(score.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
