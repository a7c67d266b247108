"""A Lightning training script written the way its users write one, with nothing for a
profiler: a LightningModule around a torchvision ResNet, a Dataset that decodes JPEG bytes and
augments them with PIL on the CPU, a DataLoader with the worker count given, and
`Trainer.fit`. Lightning owns the loop (its own fetcher, closure-wrapped optimizer steps,
callbacks): navdoctor has to find the steps in it. Prints `step N ms X` per training batch
(from a callback, the script's own meter) and a summary line.

    python bench/thirdparty/lightning_train.py [--workers 0] [--steps 60] [--model resnet50]
"""
from __future__ import annotations

import argparse
import io
import statistics
import time

import numpy as np
import torch
import torchvision
from PIL import Image, ImageFilter
from torch.utils.data import DataLoader, Dataset

import lightning as L


class JpegBytes(Dataset):
    """Synthetic photos kept as JPEG bytes (as a dataset read from disk would hand them over),
    decoded and augmented per item on the CPU."""

    def __init__(self, count: int, size: int, crop: int, blur: float, jitter: bool = True):
        rng = np.random.default_rng(0)
        self.items = []
        for n in range(min(count, 64)):
            arr = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(arr).save(buf, format="JPEG", quality=90)
            self.items.append(buf.getvalue())
        self.count, self.crop, self.blur = count, crop, blur
        self.augment = torchvision.transforms.Compose([
            torchvision.transforms.RandomResizedCrop(crop),
            torchvision.transforms.RandomHorizontalFlip(),
        ] + ([torchvision.transforms.ColorJitter(0.3, 0.3, 0.3)] if jitter else []))
        self.to_tensor = torchvision.transforms.Compose([
            torchvision.transforms.ToTensor(),
            torchvision.transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ])

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        with Image.open(io.BytesIO(self.items[i % len(self.items)])) as im:
            img = self.augment(im.convert("RGB"))
        if self.blur:
            img = img.filter(ImageFilter.GaussianBlur(self.blur))
        return self.to_tensor(img), i % 10


class Classifier(L.LightningModule):
    def __init__(self, model: str, lr: float = 0.05):
        super().__init__()
        self.net = getattr(torchvision.models, model)(weights=None, num_classes=10)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class StepMeter(L.Callback):
    """The script's own meter: wall time from one training batch's end to the next's (no
    synchronize: the host runs at most a few steps ahead, so the steady pace is the GPU's or
    the loader's)."""

    def __init__(self):
        self.last, self.times = None, []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        now = time.perf_counter()
        if self.last is not None:
            self.times.append((now - self.last) * 1e3)
            print(f"step {batch_idx} ms {self.times[-1]:.3f}", flush=True)
        self.last = now


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--size", type=int, default=256, help="stored image side")
    ap.add_argument("--crop", type=int, default=176)
    ap.add_argument("--blur", type=float, default=0.0, help="extra CPU work per image")
    ap.add_argument("--light", action="store_true", help="no ColorJitter (less CPU work)")
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args()
    data = JpegBytes(args.steps * args.batch, args.size, args.crop, args.blur,
                     jitter=not args.light)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        drop_last=True)
    meter = StepMeter()
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu" if args.cpu else "auto",
                        devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[meter], num_sanity_val_steps=0)
    trainer.fit(Classifier(args.model), loader)
    if meter.times:
        print(f"steps {len(meter.times)} median_ms {statistics.median(meter.times):.3f}",
              flush=True)


if __name__ == "__main__":
    main()
