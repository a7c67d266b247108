"""The mixed corpus's data points timed again as `diagnose`'s timing pass times them (no tracer),
for the GPU's wait for DataLoader batches (navdoctor.verify.runner's LoaderWait): as is and with
the cause's remedy (8 workers), in turn, `--repeat` times. One JSON line per run into RESULTS as
it finishes; runs already there are skipped, so running it again resumes.

    python bench/mixed/loader_wait.py RESULTS.jsonl [--labels fixtures/gpu/mixed/labels.yaml]
        [--gpu H100] [--repeat 1] [--budget S]

Only the points captured on this kind of GPU (labels.yaml's `gpu`, H200 where absent).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BATCH = {"resnet50": None, "lraspp": 64, "deeplabv3mnv3": 32, "fcn50": 8}   # the calibrated batches
WARMUP, STEPS = 4, 20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", type=Path)
    ap.add_argument("--labels", type=Path, default=ROOT / "fixtures/gpu/mixed/labels.yaml")
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--budget", type=float, default=500)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    deadline = time.monotonic() + a.budget
    points = {k: p for k, p in yaml.safe_load(a.labels.read_text())["points"].items()
              if p["cause"] == "data" and p.get("gpu", "H200") == a.gpu}
    done = set()
    if a.results.exists():
        done = {(r["point"], r["fix"], r["rep"]) for r in map(json.loads, a.results.read_text().splitlines())}
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with a.results.open("a") as out:
        for rep in range(a.repeat):
            for name, p in points.items():
                for fix in ("none", "cause"):
                    if (name, fix, rep) in done:
                        continue
                    if deadline - time.monotonic() < 40:
                        return 0
                    model = p.get("model", "resnet50")
                    status = Path(tempfile.mkdtemp()) / "status.json"
                    cmd = [sys.executable, "-m", "navdoctor.verify.runner", "--remedy", "none",
                           "--status", str(status), "--warmup", str(WARMUP), "--steps", str(STEPS), "--",
                           str(HERE / "mix.py"), "--kind", "data", "--amount", str(p["amount"]),
                           "--model", model, "--steps", str(WARMUP + STEPS + 4), "--fix", fix]
                    if BATCH[model]:
                        cmd += ["--batch", str(BATCH[model])]
                    t = time.monotonic()
                    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
                    row = {"point": name, "fix": fix, "rep": rep,
                           **finished_run(proc, status, WARMUP, time.monotonic() - t)}
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(json.dumps(row)[:300], flush=True)
    return 0


def finished_run(proc: subprocess.CompletedProcess, status: Path, warmup: int, seconds: float) -> dict:
    """One mix.py process's figures: its own median (mix.py prints it where it ran to its end),
    and where it ran under navdoctor.verify.runner (status written) the runner's steady step and
    DataLoader wait over the steps after `warmup`, as diagnose's timing pass reads them."""
    from navdoctor.steady import steady_run_ms
    row = {"rc": proc.returncode, "seconds": round(seconds, 1)}
    mine = [line for line in proc.stdout.splitlines() if line.startswith("fix ")]
    row["mix_median_ms"] = float(mine[0].split()[-1]) if mine else None
    if status.exists():
        st = json.loads(status.read_text())
        steps, waits = st["step_ms"][warmup:], st.get("loader_wait_ms")
        step_ms, loader_wait_ms = steady_run_ms(steps, waits[warmup:] if waits else None)
        row.update(step_ms=step_ms, loader_wait_ms=loader_wait_ms, steps=len(steps),
                   clock=st["clock"], source=st["step_source"], device=st["device"])
    if proc.returncode:
        row["tail"] = (proc.stdout + proc.stderr)[-400:]
    return row


if __name__ == "__main__":
    sys.exit(main())
