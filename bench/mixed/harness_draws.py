"""Does diagnose's timing pass see a DataLoader wait where a plain run of the same script does
not? One mixed-corpus data configuration run in fresh processes, in alternation: plain
(`python mix.py ... --fix none`, its own median step from CUDA events) and under diagnose's
timing runner (`python -m navdoctor.verify.runner --remedy none ...`: step hooks, CUDA events
at each boundary and around each fetch, verify's Module.__call__ wrapper), here with 2 warm-up
and 12 timed steps (diagnose's own skip and count follow its schedule: 4 and 10 by default).
The order within a round alternates. One JSON line per process into RESULTS as it finishes.

    python bench/mixed/harness_draws.py RESULTS.jsonl --model lraspp --batch 64 --amount 4.5 \
        [--rounds 4] [--budget S]
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# diagnose's timing pass: its warm-up and steps (collect/diagnose.py: the recorded steps, at
# least TIMED_STEPS_AT_LEAST); mix.py's own run is as long as the corpus's plain runs.
RUNNER_WARMUP, RUNNER_STEPS, MIX_STEPS = 2, 12, 24


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", type=Path)
    ap.add_argument("--model", default="lraspp")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--amount", type=float, required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--budget", type=float, default=500)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(HERE))
    from loader_wait import finished_run
    deadline = time.monotonic() + a.budget
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    mix = [str(HERE / "mix.py"), "--kind", "data", "--amount", str(a.amount), "--model", a.model,
           "--steps", str(MIX_STEPS), "--fix", "none"] + (["--batch", str(a.batch)] if a.batch else [])
    config = {"model": a.model, "batch": a.batch, "amount": a.amount}
    with a.results.open("a") as out:
        for rnd in range(a.rounds):
            order = ("plain", "runner") if rnd % 2 == 0 else ("runner", "plain")
            for how in order:
                if deadline - time.monotonic() < 30:
                    return 0
                tmp = tempfile.TemporaryDirectory()
                status = Path(tmp.name) / "status.json"
                cmd = [sys.executable, *mix] if how == "plain" else [
                    sys.executable, "-m", "navdoctor.verify.runner", "--remedy", "none",
                    "--status", str(status), "--warmup", str(RUNNER_WARMUP),
                    "--steps", str(RUNNER_STEPS), "--", *mix]
                t = time.monotonic()
                try:
                    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
                except subprocess.TimeoutExpired as e:     # a row for it, and on to the next
                    proc = subprocess.CompletedProcess(cmd, 124, e.stdout or "", e.stderr or "")
                    proc.stdout, proc.stderr = (x.decode() if isinstance(x, bytes) else x
                                                for x in (proc.stdout, proc.stderr))
                row = {**config, "round": rnd, "how": how,
                       **finished_run(proc, status, RUNNER_WARMUP, time.monotonic() - t)}
                tmp.cleanup()
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(json.dumps(row)[:300], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
