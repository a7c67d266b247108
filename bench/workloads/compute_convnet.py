"""compute: a ResNet-50 training step in strict fp32 at a batch that fills the GPU.

Baseline: the data is already on the GPU, so the step is all convolution kernels; in strict
fp32 (TF32 off, as in scripts that pin numerics for reproducibility) they run on the CUDA
cores, not the tensor cores.
Fixed (--fixed): bf16 autocast and channels_last memory format, so cuDNN picks tensor-core
kernels without layout transposes.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import StepTimer, mark_step, resolve_device, workload_parser  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    batch: int
    side: int


FULL = Sizes(batch=128, side=224)
SMALL = Sizes(batch=2, side=64)
NUM_CLASSES = 1000


def main(argv: list[str] | None = None) -> int:
    args = workload_parser(__doc__.splitlines()[0]).parse_args(argv)
    device = resolve_device(args.device)
    sizes = SMALL if args.small else FULL
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True        # fixed shapes: let cuDNN pick its best kernels
    if not args.fixed:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False

    memory_format = torch.channels_last if args.fixed else torch.contiguous_format
    model = torchvision.models.resnet50(weights=None, num_classes=NUM_CLASSES)
    model = model.to(device, memory_format=memory_format)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # Data resident on the device: nothing but the model's own work is left in the step.
    images = torch.randn(sizes.batch, 3, sizes.side, sizes.side, device=device)
    images = images.contiguous(memory_format=memory_format)
    labels = torch.randint(0, NUM_CLASSES, (sizes.batch,), device=device)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if args.fixed
                else contextlib.nullcontext())

    timer = StepTimer(device)
    for _ in range(args.steps):
        with autocast:
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        timer.lap()
        mark_step()
    timer.report("compute_convnet", args.fixed, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
