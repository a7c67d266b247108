"""One cause of GPU idle time mixed with a fixed amount of GPU compute, in a set proportion:
the mixed corpus of issue #20 (the verdict policy's ground truth).

The model is a torchvision ResNet-50 (fp32, batch 64 at 192 px, SGD), trained on a batch that
stays on the GPU; on top of it each step carries one cause of idle time, in an amount:

  data    --amount MS   CPU "augmentation" per batch in a DataLoader (workers 0)
                        fix: --workers 8 (persistent), the seed article's first I/O remedy
  host    --amount MS   CPU post-processing of each step's predictions on the loop thread
                        fix: the post-processing done on the GPU (no read-back, no CPU loop)
  launch  --amount N    N tiny elementwise GPU ops per step from a Python loop
                        fix: the same ops captured once in a CUDA graph and replayed
  sync    --amount N    N `.item()` reads per step, spread over the model's layers
                        fix: no reads inside the step (values stay on the GPU)
  copy    --amount MB   an extra MB of pageable host memory copied to the GPU per step
                        fix: pinned memory and a non_blocking copy
  none                  the model alone

`--fix cause` applies the cause's remedy, `--fix compute` the compute remedy (bf16 autocast
and channels_last). Step times come from CUDA events at the step boundaries (no per-step
synchronize, which would add a stall of its own). `--calibrate` prints the model's step time
and each cause's cost per unit of amount, from which run_mix.py picks amounts.

Prints `fix F steps N median_ms X` per variant.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
import torchvision

BATCH, SIDE, CLASSES = 64, 192, 100
try:
    from navdoctor import step as mark_step
except ImportError:
    def mark_step():
        pass


def busy_cpu(ms: float, state: np.ndarray) -> np.ndarray:
    """Real CPU work (a repeated box blur of a small image) until `ms` have passed."""
    end = time.perf_counter() + ms / 1e3
    x = state
    while time.perf_counter() < end:
        x = (x + np.roll(x, 1, 0) + np.roll(x, 1, 1)) / 3.0
    return x


class Samples(torch.utils.data.Dataset):
    def __init__(self, n: int, ms_per_sample: float):
        self.n, self.ms = n, ms_per_sample
        rng = np.random.default_rng(0)
        self.patch = rng.random((32, 32), dtype=np.float32)
        self.sample = torch.from_numpy(rng.random((3, SIDE, SIDE), dtype=np.float32))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        busy_cpu(self.ms, self.patch)
        return self.sample.clone(), i % CLASSES


class EventTimer:
    def __init__(self):
        self.marks = []
        self.lap()

    def lap(self):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        self.marks.append(e)

    def times_ms(self):
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]


def add_sync_hooks(model: torch.nn.Module, n: int) -> int:
    """`.item()` reads spread over the leaf modules, n per step in all."""
    leaves = [m for m in model.modules() if not list(m.children())]
    per = [n // len(leaves) + (1 if i < n % len(leaves) else 0) for i in range(len(leaves))]
    for m, k in zip(leaves, per):
        if k:
            def hook(_m, _inp, out, k=k):
                for _ in range(k):
                    out.reshape(-1)[0].item()
            m.register_forward_hook(hook)
    return sum(per)


def tiny_ops(t: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        t = t * 0.999 + 0.001
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=("none", "data", "host", "launch", "sync", "copy"), default="none")
    ap.add_argument("--amount", type=float, default=0.0)
    ap.add_argument("--fix", default="none",
                    help="none | cause | compute, or several with commas (one run each, in turn)")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--calibrate", action="store_true")
    a = ap.parse_args()
    if a.calibrate:
        print(json.dumps(calibrate()))
        return
    for fix in a.fix.split(","):
        if fix not in ("none", "cause", "compute"):
            raise SystemExit(f"--fix {fix}: expected none, cause or compute")
        print(f"fix {fix} steps {a.steps} median_ms {run(a.kind, a.amount, fix, a.steps):.3f}", flush=True)


def build(fix: str):
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last if fix == "compute" else torch.contiguous_format
    model = torchvision.models.resnet50(num_classes=CLASSES).to(dev, memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(BATCH, 3, SIDE, SIDE, device=dev).to(memory_format=fmt)
    y = torch.randint(0, CLASSES, (BATCH,), device=dev)
    return dev, model, opt, x, y


def run(kind: str, amount: float, fix: str, steps: int) -> float:
    dev, model, opt, x0, y0 = build(fix)
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=fix == "compute")
    fmt = torch.channels_last if fix == "compute" else torch.contiguous_format
    cause_fixed = fix == "cause"
    if kind == "sync" and not cause_fixed:
        add_sync_hooks(model, int(amount))
    state = np.random.default_rng(1).random((32, 32), dtype=np.float32)
    small = torch.ones(1024, device=dev)
    graph = None
    if kind == "launch" and cause_fixed:
        static_in = small.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            tiny_ops(static_in, int(amount))          # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = tiny_ops(static_in, int(amount))
    extra = None
    if kind == "copy":
        n = int(amount * 2**20 / 4)
        extra = torch.rand(n)
        if cause_fixed:
            extra = extra.pin_memory()
    if kind == "data":
        workers = 8 if cause_fixed else 0
        loader = torch.utils.data.DataLoader(
            Samples(BATCH * (steps + 2), amount / BATCH), batch_size=BATCH, num_workers=workers,
            pin_memory=True, persistent_workers=workers > 0, prefetch_factor=4 if workers else None)
        batches = ((xb.to(dev, non_blocking=True).to(memory_format=fmt), yb.to(dev, non_blocking=True))
                   for xb, yb in loader)
    else:
        batches = ((x0, y0) for _ in range(steps + 2))
    timer = None
    for n, (x, y) in enumerate(batches):
        if n == 2:                  # two warm-up steps (cuDNN autotuning, allocator)
            torch.cuda.synchronize()
            timer = EventTimer()
        if kind == "copy":
            aux = extra.to(dev, non_blocking=cause_fixed)
        with autocast:
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
        if kind == "copy":
            loss = loss + 0.0 * aux[:1].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if kind == "host":
            if cause_fixed:
                top = logits.detach().float().softmax(1).topk(5, 1)      # stays on the GPU
            else:
                probs = logits.detach().float().softmax(1).cpu().numpy()
                state = busy_cpu(amount, state + probs[0, :1].mean())
        if kind == "launch":
            if graph is not None:
                graph.replay()
            else:
                small = tiny_ops(small, int(amount))
        if timer is not None:
            timer.lap()
        mark_step()
        if n + 1 >= steps + 2:
            break
    return statistics.median(timer.times_ms())


def calibrate() -> dict:
    out = {"model_ms": run("none", 0, "none", 20),
           "model_compute_fixed_ms": run("none", 0, "compute", 20)}
    dev = torch.device("cuda")
    small = torch.ones(1024, device=dev)
    torch.cuda.synchronize()
    t = time.perf_counter()
    tiny_ops(small, 4000)
    torch.cuda.synchronize()
    out["launch_ms_per_op"] = (time.perf_counter() - t) * 1e3 / 4000
    with_syncs = run("sync", 320, "none", 12)
    out["sync_ms_per_read"] = max(1e-4, (with_syncs - out["model_ms"]) / 320)
    host = torch.rand(64 * 2**18)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5):
        host.to(dev)
    torch.cuda.synchronize()
    out["copy_ms_per_mb"] = (time.perf_counter() - t) * 1e3 / (5 * 64)
    return out


if __name__ == "__main__":
    main()
