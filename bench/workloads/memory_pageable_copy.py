"""memory: a 256 MB pageable host tensor is copied to the GPU every step for a small model.

Baseline: an evaluation set of RGB-D frames lives in ordinary (pageable) host memory and the
loop calls `.to(device)` on it every step, so each step is one large synchronous host-to-device
copy, staged by the driver through a bounce buffer, followed by a little convolution work.
Fixed (--fixed): the set is uploaded once (from a pinned buffer, non_blocking) and stays
resident on the device; the step is only the model's work.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import StepTimer, mark_step, resolve_device, workload_parser  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    frames: int
    side: int           # frames are float32 (4, side, side): RGB + depth


FULL = Sizes(frames=16, side=1024)      # 16 * 4 * 1024 * 1024 * 4 bytes = 256 MiB
SMALL = Sizes(frames=2, side=64)


def small_model() -> nn.Module:
    """A strided stem that shrinks the frames 4x, three convolutions and a pooled head."""
    def conv(c_in: int, c_out: int, kernel: int, stride: int) -> list[nn.Module]:
        return [nn.Conv2d(c_in, c_out, kernel, stride, padding=kernel // 2 if stride == 1 else 0),
                nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
    return nn.Sequential(*conv(4, 32, 4, 4), *conv(32, 32, 3, 1), *conv(32, 64, 3, 2),
                         *conv(64, 64, 3, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, 10))


def main(argv: list[str] | None = None) -> int:
    args = workload_parser(__doc__.splitlines()[0]).parse_args(argv)
    device = resolve_device(args.device)
    sizes = SMALL if args.small else FULL
    torch.manual_seed(args.seed)
    on_cuda = device.type == "cuda"

    frames_on_host = torch.randn(sizes.frames, 4, sizes.side, sizes.side)   # pageable
    model = small_model().to(device).eval()
    resident_frames = None
    if args.fixed:
        # One upload, then the data stays on the device. Pinned memory makes that one copy a
        # DMA straight from host memory; it only exists with a CUDA device.
        staging = frames_on_host.pin_memory() if on_cuda else frames_on_host
        resident_frames = staging.to(device, non_blocking=on_cuda)

    timer = StepTimer(device)
    with torch.inference_mode():
        for _ in range(args.steps):
            frames = resident_frames if args.fixed else frames_on_host.to(device)
            model(frames)
            timer.lap()
            mark_step()
    timer.report("memory_pageable_copy", args.fixed, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
