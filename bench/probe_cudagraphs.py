"""On a GPU: how each way of compiling the launch workload's batch-1 MLP fares, per step.

    TORCH_LOGS=cudagraphs python bench/probe_cudagraphs.py

Eager, the workload's hand-captured CUDA graph, torch.compile default and reduce-overhead
(inference mode with viewed or cloned inputs, and no_grad), and Module.compile(reduce-overhead):
the table in docs/verify.md ("The launch workload") comes from this script. Each line gives the
median of the last 40 of 60 steps (synchronised), the first step (compiling), and dynamo's
counts of compiled graphs, graph breaks and skipped CUDA graphs.
"""
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parent / "workloads"))
from launch_batch1_small import Block, cuda_graph_runner  # noqa: E402

def build():
    torch.manual_seed(0)
    return nn.Sequential(*(Block(256) for _ in range(48))).cuda().eval()

def run(name, make, ctx, clone=False, n=60):
    torch._dynamo.reset(); counters.clear()
    samples = torch.randn(n, 1, 256, device="cuda")
    t0 = time.time()
    with ctx():
        fn = make()
        ts = []
        for s in samples:
            if clone: s = s.clone()
            torch.compiler.cudagraph_mark_step_begin()
            torch.cuda.synchronize(); t = time.perf_counter(); fn(s); torch.cuda.synchronize()
            ts.append((time.perf_counter() - t) * 1e3)
    print(f"{name:40s} median(last 40) {statistics.median(ts[-40:]):.3f} ms  first {ts[0]:.0f} ms  "
          f"total {time.time()-t0:.1f}s skips={counters['inductor'].get('cudagraph_skips', 0)} "
          f"graphs={counters['stats'].get('unique_graphs', 0)} breaks={sum(counters['graph_break'].values())}",
          flush=True)

m = build()
run("eager inference_mode", lambda: m, torch.inference_mode)
run("hand graph", lambda: cuda_graph_runner(m, torch.randn(1, 256, device="cuda")), torch.inference_mode)
run("compile default inference_mode", lambda: torch.compile(m), torch.inference_mode)
run("reduce-overhead inference_mode (views)", lambda: torch.compile(m, mode="reduce-overhead"), torch.inference_mode)
run("reduce-overhead inference_mode (clones)", lambda: torch.compile(m, mode="reduce-overhead"), torch.inference_mode, clone=True)
run("reduce-overhead no_grad (views)", lambda: torch.compile(m, mode="reduce-overhead"), torch.no_grad)
m2 = build()
def mc():
    m2.compile(mode="reduce-overhead"); return m2
run("module.compile reduce-overhead inf_mode", mc, torch.inference_mode)
