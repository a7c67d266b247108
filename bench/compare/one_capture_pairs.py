"""`navdoctor compare` with one capture a side on the committed captures (docs/compare.md, "One
capture a side"): A/A pairs (one configuration of the mixed corpus captured again in a later
session: same model, cause and amount, another process) and before/after pairs (a cause's
amount lowered, in the same session; fixtures/gpu's baselines and their remedies). Prints, per
pair, the mean steps, the speed-up, the steps' own interval, the run-to-run factor and the
verdict, then how many A/A pairs were called and how many fixes were missed.

    python bench/compare/one_capture_pairs.py
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from navdoctor.compare import analyse_capture, compare_captures  # noqa: E402
from navdoctor.rules import load_rules  # noqa: E402

MIXED = ROOT / "fixtures" / "gpu" / "mixed"
GPU = ROOT / "fixtures" / "gpu"
A_A = [("h100_data_0.2", "h100r11_data_0.2"), ("h100_data_0.3", "h100r11_data_0.3"),
       ("h100_data_0.45", "h100r12_data_0.45"), ("h100_data_0.6", "h100r12_data_0.6"),
       ("h100_data_0.35", "h100r12x_data_0.35"), ("data_0.1", "h200r14_data_0.1"),
       ("data_0.35", "h200r14_data_0.35"), ("lraspp_data_0.22", "h100r12_lraspp_data_0.22"),
       ("lraspp_data_0.22", "h100r12x_lraspp_data_0.22"),
       ("h100r12_lraspp_data_0.22", "h100r12x_lraspp_data_0.22"),
       ("lraspp_data_0.3", "h100r11_lraspp_data_0.3"), ("lraspp_data_0.3", "h100r12x_lraspp_data_0.3"),
       ("h200_lraspp_data_0.22", "h200r14_lraspp_data_0.22"),
       ("h100_fcn50_data_0.22", "h100r11_fcn50_data_0.22"),
       ("h100_dlv3mnv3_data_0.22", "h100r11_deeplabv3mnv3_data_0.22")]
LOWERED = [("data_0.35", "data_0.1"), ("h100_data_0.45", "h100_data_0.2"),
           ("h100_host_0.45", "h100_host_0.2"), ("h100_copy_0.45", "h100_copy_0.2"),
           ("h100_launch_0.45", "h100_launch_0.2"), ("host_0.35", "host_0.1"), ("sync_0.35", "sync_0.1"),
           ("launch_0.35", "launch_0.1"), ("h100_sync_0.45", "h100_sync_0.2"),
           ("h100_data_0.6", "h100_data_0.3")]
REMEDIES = ["compute_convnet", "compute_matmul", "memory_pageable_copy", "memory_item_sync",
            "launch_batch1_small", "io_jpeg_decode", "io_slow_storage", "launch_python_loop"]


def main() -> None:
    rules = load_rules()
    cache = {}

    def cap(path: Path):
        if path not in cache:
            cache[path] = analyse_capture(str(path), rules)
        return cache[path]

    mixed = lambda n: MIXED / f"{n}.nsys.sqlite.gz"  # noqa: E731
    groups = [("A/A", [(a, b, mixed(a), mixed(b)) for a, b in A_A]),
              ("fix", [(a, b, mixed(a), mixed(b)) for a, b in LOWERED]
               + [(r, r + "_fixed", GPU / r / "nsys.sqlite.gz", GPU / (r + "_fixed") / "nsys.sqlite.gz")
                  for r in REMEDIES]
               + [("navigation_batched", "navigation_batched_tuned",
                   GPU / "navigation_batched" / "nsys.sqlite.gz", GPU / "navigation_batched_tuned" / "nsys.sqlite.gz"),
                  ("nav_default", "nav_realtime_tuned", GPU / "nav_default" / "nsys.sqlite.gz",
                   GPU / "nav_realtime_tuned" / "nsys.sqlite.gz")])]
    for kind, pairs in groups:
        print(f"| {kind} pair | mean step (ms) | speed-up [95%] | steps alone | run-to-run | verdict |")
        print("|---|---|---|---|---|---|")
        off = 0
        for a, b, pa, pb in pairs:
            st = compare_captures([cap(pa)], [cap(pb)]).step_time
            off += (st.result != "no change beyond the noise") if kind == "A/A" else (st.result != "faster")
            print(f"| {a} → {b} | {st.before_ms:.2f} → {st.after_ms:.2f} | {st.speedup:.2f}x "
                  f"[{st.ci[0]:.2f}, {st.ci[1]:.2f}] | [{st.step_ci[0]:.2f}, {st.step_ci[1]:.2f}] | "
                  f"x{st.run_to_run.factor:.2f} | {st.result} |", flush=True)
        print(f"\n{kind}: {off} of {len(pairs)} " + ("called faster or slower" if kind == "A/A" else "not called faster") + "\n")


if __name__ == "__main__":
    main()
