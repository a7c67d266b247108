"""A training loop whose data loading costs a set CPU time per batch, against a fixed model:
the data-vs-compute sweep of issue #20 (the verdict policy's ground truth).

Each batch's samples are prepared on the CPU for --data-ms in all (real CPU work: numpy
filtering of an image until the time is spent), in the main process (--workers 0) or in
worker processes (the io remedy). The model is a torchvision ResNet-50, bf16 autocast,
channels_last, batch 64 at 160 px (`--calibrate` prints its step time with no data cost).

Prints `step N ms X` per optimizer step (synchronised: the step's wall time) and a summary.

    python bench/mixed/data_vs_compute.py --calibrate
    python bench/mixed/data_vs_compute.py --data-ms 30 --workers 0 --steps 24
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torchvision

BATCH, SIDE = 64, 160


class Samples(torch.utils.data.Dataset):
    def __init__(self, n: int, ms_per_sample: float):
        self.n, self.s = n, ms_per_sample / 1e3
        rng = np.random.default_rng(0)
        self.patch = rng.random((32, 32), dtype=np.float32)     # fine-grained CPU work
        self.sample = torch.from_numpy(rng.random((3, SIDE, SIDE), dtype=np.float32))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        end = time.perf_counter() + self.s
        x = self.patch
        while time.perf_counter() < end:      # CPU "augmentation": a box blur, repeated
            x = (x + np.roll(x, 1, 0) + np.roll(x, 1, 1)) / 3.0
        return self.sample.clone(), i % 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-ms", type=float, default=0.0, help="CPU time per batch")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--calibrate", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50(num_classes=100).to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if args.calibrate:
        x = torch.randn(BATCH, 3, SIDE, SIDE, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 100, (BATCH,), device=dev)
        times = []
        for _ in range(25):
            t = time.perf_counter()
            with torch.autocast("cuda", torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t) * 1e3)
        print(f"model_ms {statistics.median(times[5:]):.3f}")
        return
    data = Samples(BATCH * args.steps, args.data_ms / BATCH)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, num_workers=args.workers,
                                         pin_memory=True, persistent_workers=args.workers > 0)
    times, last = [], time.perf_counter()
    for n, (x, y) in enumerate(loader):
        x = x.to(dev, non_blocking=True).to(memory_format=torch.channels_last)
        y = y.to(dev, non_blocking=True)
        with torch.autocast("cuda", torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        now = time.perf_counter()
        times.append((now - last) * 1e3)
        last = now
        print(f"step {n} ms {times[-1]:.3f}", flush=True)
    steady = times[4:] or times
    print(f"steps {len(times)} median_ms {statistics.median(steady):.3f}", flush=True)


if __name__ == "__main__":
    main()
