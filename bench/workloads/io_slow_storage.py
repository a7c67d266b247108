"""io: reading samples one by one from slow (network-like) storage starves the GPU.

Baseline: the samples are files in a temporary folder and every read also waits a few
milliseconds (time.sleep stands in for network-storage latency); with num_workers=0 the
training step waits for every read of the batch in turn.
Fixed (--fixed): num_workers=8, prefetch_factor=4 and persistent_workers=True overlap the
reads with each other and with the GPU's work; pinned memory for the copies on CUDA.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torchvision
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import resolve_device, train_classifier, workload_parser  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    side: int               # stored images are uint8 (3, side, side)
    batch: int
    files: int
    read_latency_ms: float  # per sample, as on a network file system or object store


FULL = Sizes(side=224, batch=64, files=256, read_latency_ms=3.0)
SMALL = Sizes(side=32, batch=4, files=16, read_latency_ms=1.0)
NUM_CLASSES = 100


class RemoteImages(Dataset):
    def __init__(self, paths: list[Path], length: int, sizes: Sizes):
        self.paths = paths
        self.length = length
        self.sizes = sizes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        path = self.paths[index % len(self.paths)]
        time.sleep(self.sizes.read_latency_ms / 1000)     # the storage's round trip
        raw = bytearray(path.read_bytes())
        side = self.sizes.side
        image = torch.frombuffer(raw, dtype=torch.uint8).view(3, side, side)
        return image.float().div_(255).sub_(0.5), index % NUM_CLASSES


def write_samples(folder: Path, sizes: Sizes, seed: int) -> list[Path]:
    rng = torch.Generator().manual_seed(seed)
    paths = []
    for i in range(sizes.files):
        image = torch.randint(0, 256, (3, sizes.side, sizes.side), dtype=torch.uint8, generator=rng)
        path = folder / f"sample_{i:05d}.raw"
        path.write_bytes(image.numpy().tobytes())
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    args = workload_parser(__doc__.splitlines()[0]).parse_args(argv)
    device = resolve_device(args.device)
    sizes = SMALL if args.small else FULL
    torch.manual_seed(args.seed)

    model = torchvision.models.resnet18(weights=None, num_classes=NUM_CLASSES).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    pin_memory = args.fixed and device.type == "cuda"   # pinning only helps copies to a GPU

    with tempfile.TemporaryDirectory(prefix="slow-storage-") as folder:
        dataset = RemoteImages(write_samples(Path(folder), sizes, args.seed),
                               length=args.steps * sizes.batch, sizes=sizes)
        if args.fixed:
            workers = min(8, os.cpu_count() or 1) if args.small else 8   # small CI machines
            loader = DataLoader(dataset, batch_size=sizes.batch, shuffle=True, drop_last=True,
                                num_workers=workers, prefetch_factor=4, persistent_workers=True,
                                pin_memory=pin_memory)
        else:
            loader = DataLoader(dataset, batch_size=sizes.batch, shuffle=True, drop_last=True)

        train_classifier(loader, model, optimizer, device, pin_memory, "io_slow_storage", args.fixed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
