"""Generated ranks of one DDP job: per step a DataLoader wait, forward/backward kernels, one
NCCL all-reduce that ends on every rank when the last rank's data is in, an optimizer kernel.

Each rank gets its own clock offset (ranks on different hosts): navdoctor must not compare
start times across ranks.
"""
from __future__ import annotations

from pathlib import Path

from kineto_factory import KinetoTrace

ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def make_job(out_dir, ranks: int = 4, steps: int = 6, data_us=None, compute_us=None,
             transfer_us: float = 2000.0, overlap: bool = False, kernels: int = 4) -> list[str]:
    """data_us / compute_us: per-rank lists (µs per step), default 500 / 8000 on every rank.
    overlap: the all-reduce runs beside the last backward kernels (a DDP bucket) instead of
    after them."""
    data_us = data_us or [500.0] * ranks
    compute_us = compute_us or [8000.0] * ranks
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    traces = [KinetoTrace(base_us=1_700_000_000_000.0 + r * 1_700_000.0,
                          distributed={"backend": "nccl", "rank": r, "world_size": ranks})
              for r in range(ranks)]
    t0 = 1000.0
    for n in range(steps):
        # When each rank reaches the all-reduce (its kernel starts), in the job's common time.
        arrive = []
        for r in range(ranks):
            a = t0 + data_us[r] + 20 + compute_us[r]
            if overlap:   # launched with the last quarter of the backward pass
                a -= compute_us[r] / 4
            arrive.append(a)
        end = max(arrive) + transfer_us
        if overlap:   # the slowest rank's compute may outlast the transfer
            end = max(end, max(t0 + data_us[r] + 20 + compute_us[r] for r in range(ranks)))
        step_end = end + 600
        for r, tr in enumerate(traces):
            tr.step(n, t0, step_end - t0)
            tr.dataloader(t0 + 5, data_us[r])
            t = t0 + data_us[r] + 20
            k = compute_us[r] / kernels
            for i in range(kernels):
                tr.launch_kernel("volta_sgemm_128x64_nn", t - 10 + i * 0.1, t, k)
                t += k
            ar = arrive[r]
            tr.launch_kernel(ALLREDUCE, ar - 10, ar, end - ar, stream=13)
            tr.launch_kernel("multi_tensor_apply_kernel", ar - 5, end + 50, 400)
        t0 = step_end + 100
    return [tr.write(out / f"rank{r}.json") for r, tr in enumerate(traces)]
