"""memory: a training loop that keeps every step's loss with its graph, so GPU memory grows.

Baseline: a "for later" hook (metrics, debugging) appends each step's feature map and loss
to a list, so every step leaves ~50 MB of activations (batch 32 at 224 px) alive on the GPU and
the allocator's memory in use at each step's start rises step after step.
Fixed (--fixed): the hook keeps only `loss.detach()` (4 bytes), so memory at each step's start
is flat.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import StepTimer, mark_step, resolve_device, workload_parser  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = workload_parser(__doc__.splitlines()[0], default_steps=20).parse_args(argv)
    device = resolve_device(args.device)
    batch, side = (4, 32) if args.small else (32, 224)
    torch.manual_seed(args.seed)
    net = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1),
                        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    images = torch.randn(batch, 3, side, side, device=device)
    labels = torch.randint(0, 10, (batch,), device=device)
    kept: list = []
    timer = StepTimer(device)
    for _ in range(args.steps):
        features = net[:2](images)
        logits = net[2:](features)
        loss = F.cross_entropy(logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if args.fixed:
            kept.append(loss.detach())
        else:
            # "for later": the step's feature map (with its graph) and its loss
            kept.append((features, loss))
        timer.lap()
        mark_step()
    timer.report("memory_growth", args.fixed, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
