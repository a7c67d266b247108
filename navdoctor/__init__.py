"""navdoctor: bottleneck diagnosis for PyTorch vision models on NVIDIA GPUs."""
from __future__ import annotations

__version__ = "0.1.0"

# The mark the collector leaves in a run's trace where a DataLoader runs out (a
# record_function range, or an NVTX range in the Nsight Systems pass); the analysis leaves the
# step holding it out (breakdown.drop_loop_tails). Here: the collector imports nothing heavier.
LOOP_END_MARK = "navdoctor.loop_end"

# The collector installs a callback here while it profiles a script; outside
# `navdoctor diagnose` step() costs one attribute lookup and does nothing.
_step_hook = None


def step() -> None:
    """Mark the end of one step (one frame, one batch) of the user's loop.

    Optional: the collector also finds steps on its own (DataLoader batches, optimizer
    steps). A script that calls this gets exactly its own step boundaries instead.
    """
    hook = _step_hook
    if hook is not None:
        hook()
