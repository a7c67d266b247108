"""A small data-bound training loop to try `navdoctor verify` on any machine, CPU or GPU.

Every sample is fetched from "remote storage" (a sleep of --latency-ms stands in for the round
trip of a network file system or object store), then JPEG-decoded and flipped on the CPU; the
model is a small convolutional net. With num_workers=0 each step waits for every fetch of its
batch in turn, so the run is I/O-bound wherever it runs, even on a busy machine with few cores:
the waits overlap in loader workers without needing CPU time.

    navdoctor verify --remedy num_workers,pin_memory,channels_last navdoctor/verify/demo.py

It runs as a plain script (no navdoctor import) and downloads nothing.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.io import decode_jpeg, encode_jpeg


class RemoteJpegs(Dataset):
    def __init__(self, jpegs: list[torch.Tensor], length: int, latency_ms: float):
        self.jpegs, self.length, self.latency = jpegs, length, latency_ms / 1000

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        time.sleep(self.latency)                                  # the storage round trip
        image = decode_jpeg(self.jpegs[index % len(self.jpegs)]).float().div_(255)
        if index % 2:
            image = image.flip(-1)
        return image, index % 10


def small_convnet() -> nn.Module:
    def block(c_in: int, c_out: int) -> list[nn.Module]:
        return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
                nn.MaxPool2d(2)]
    return nn.Sequential(*block(3, 16), *block(16, 32), *block(32, 32),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--latency-ms", type=float, default=10.0, help="per sample (default 10)")
    p.add_argument("--side", type=int, default=64, help="image side in pixels (default 64)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = p.parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    torch.manual_seed(0)
    rng = torch.Generator().manual_seed(0)
    jpegs = [encode_jpeg((torch.rand(3, args.side, args.side, generator=rng) * 255).to(torch.uint8))
             for _ in range(16)]
    loader = DataLoader(RemoteJpegs(jpegs, args.steps * args.batch_size, args.latency_ms),
                        batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = small_convnet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    start = time.perf_counter()
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    print(f"demo: {args.steps} steps in {time.perf_counter() - start:.2f} s on {device.type}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
