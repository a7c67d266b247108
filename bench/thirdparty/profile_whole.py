"""A hand-made torch.profiler capture, the way a user adds one to a script they did not write:
a plain `torch.profiler.profile()` (CPU and CUDA activities, no schedule, no stacks, no step
calls) around the whole script, exported as a Chrome trace. No ProfilerStep#N marks result.

    python bench/thirdparty/profile_whole.py OUT.json SCRIPT [ARGS...]
"""
from __future__ import annotations

import runpy
import sys

import torch
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: profile_whole.py OUT.json SCRIPT [ARGS...]")
    out, script, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    sys.argv = [script, *args]
    sys.path.insert(0, str(__import__("pathlib").Path(script).resolve().parent))
    with profile(activities=activities) as prof:
        runpy.run_path(script, run_name="__main__")
    prof.export_chrome_trace(out)


if __name__ == "__main__":
    main()
