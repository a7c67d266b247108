"""Photo-like JPEGs for the third-party evidence runs (nothing here is a real photo, nothing
is downloaded): an ImageFolder tree for torchvision's reference train.py, and a folder of
camera frames for the per-frame loops.

Each image is a smooth random colour field with texture on top, about the size of an
ImageNet photo (500x375) or a camera frame (640x480), at JPEG quality 90, so that decoding
and resizing cost what they cost on photographs of that size (noise would decode slower,
flat colour faster).

    python bench/thirdparty/make_images.py imagefolder DIR --train 2048 --val 128 --classes 10
    python bench/thirdparty/make_images.py frames DIR --count 120
"""
from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image


def photo(seed: int, width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (height // 24 + 2, width // 24 + 2, 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), np.int16)
    texture = rng.normal(0, 12, (height, width, 1)).astype(np.int16)
    return Image.fromarray(np.clip(base + texture, 0, 255).astype(np.uint8))


def _write(job: tuple[str, int, int, int]) -> None:
    path, seed, width, height = job
    photo(seed, width, height).save(path, quality=90)


def write_all(jobs: list[tuple[str, int, int, int]]) -> None:
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        list(pool.map(_write, jobs, chunksize=32))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="kind", required=True)
    f = sub.add_parser("imagefolder")
    f.add_argument("dir", type=Path)
    f.add_argument("--train", type=int, default=2048)
    f.add_argument("--val", type=int, default=128)
    f.add_argument("--classes", type=int, default=10)
    g = sub.add_parser("frames")
    g.add_argument("dir", type=Path)
    g.add_argument("--count", type=int, default=120)
    args = ap.parse_args()

    jobs = []
    if args.kind == "imagefolder":
        for split, count in (("train", args.train), ("val", args.val)):
            for c in range(args.classes):
                (args.dir / split / f"class{c:02d}").mkdir(parents=True, exist_ok=True)
            for i in range(count):
                c = i % args.classes
                jobs.append((str(args.dir / split / f"class{c:02d}" / f"{split}{i:06d}.jpg"),
                             i + (0 if split == "train" else 10**7), 500, 375))
    else:
        args.dir.mkdir(parents=True, exist_ok=True)
        jobs = [(str(args.dir / f"frame{i:05d}.jpg"), i, 640, 480) for i in range(args.count)]
    write_all(jobs)
    print(f"{len(jobs)} images in {args.dir}")


if __name__ == "__main__":
    main()
