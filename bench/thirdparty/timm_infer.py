"""Batched inference with a timm model the way its README shows it, with nothing for a
profiler: images kept as JPEG bytes, timm's own eval transform (resize, centre crop,
normalise; PIL on the CPU) in a Dataset, a DataLoader with the worker count given, and the
model in eval mode under `torch.no_grad()`; the top-5 classes of each batch are read back.
Prints `batch N ms X` per batch (the script's own meter) and a summary line.

    python bench/thirdparty/timm_infer.py [--model convnext_tiny] [--workers 0] [--batches 60]
"""
from __future__ import annotations

import argparse
import io
import statistics
import time

import numpy as np
import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config
from torch.utils.data import DataLoader, Dataset


class JpegBytes(Dataset):
    def __init__(self, count: int, size: int, transform):
        rng = np.random.default_rng(0)
        self.items = []
        for _ in range(min(count, 64)):
            arr = rng.integers(0, 255, (size, size * 4 // 3, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(arr).save(buf, format="JPEG", quality=90)
            self.items.append(buf.getvalue())
        self.count, self.transform = count, transform

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        with Image.open(io.BytesIO(self.items[i % len(self.items)])) as im:
            return self.transform(im.convert("RGB"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="convnext_tiny")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=480, help="stored image height")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    model = timm.create_model(args.model, pretrained=False).eval().to(args.device)
    config = resolve_data_config({}, model=model)
    data = JpegBytes(args.batches * args.batch, args.size, create_transform(**config))
    loader = DataLoader(data, batch_size=args.batch, num_workers=args.workers)
    times, last = [], time.perf_counter()
    with torch.no_grad():
        for n, x in enumerate(loader):
            logits = model(x.to(args.device))
            top5 = logits.topk(5).indices.cpu()      # read back, as a caller would
            now = time.perf_counter()
            times.append((now - last) * 1e3)
            last = now
            print(f"batch {n} ms {times[-1]:.3f} top {int(top5[0, 0])}", flush=True)
    if times:
        print(f"batches {len(times)} median_ms {statistics.median(times[1:] or times):.3f}",
              flush=True)


if __name__ == "__main__":
    main()
