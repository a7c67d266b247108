"""launch/compute: a training step with torch.profiler's anti-patterns, each in a realistic place.

Baseline, all at once (each is one of navdoctor's patterns.yaml / launch.yaml rules):
 - conv: convolutions with a bias right before BatchNorm (BatchNorm subtracts it again);
 - matmul: an fp16 (autocast) head whose matmul dims are not multiples of 8 (4095 features);
 - copy: a per-step noise augmentation made on the CPU (torch.randn) and copied to the GPU;
 - loop: a per-sample loop that indexes the batch (for i in range(n): margins[i] = ...);
 - optimizer: SGD stepping parameter by parameter (foreach=False);
 - zero_grad: zero_grad(set_to_none=False), which fills every gradient with zeros each step.
Fixed (--fixed): no bias before BN, dims padded to multiples of 8, noise made on the GPU, the
loop vectorised, foreach SGD and set_to_none=True.
--patterns keeps a subset (the rest written the fixed way). The optimizer remedies of
`navdoctor verify` (foreach_optimizer, zero_grad_set_to_none) are measured on
`--patterns optimizer,zero_grad --layers 64 --width 1001 --anchors 1`: many small parameters,
so that per-tensor launches are a visible part of the step.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import StepTimer, mark_step, resolve_device, workload_parser  # noqa: E402

PATTERNS = ("conv", "matmul", "copy", "loop", "optimizer", "zero_grad")


def backbone(bias: bool) -> nn.Module:
    def block(c_in, c_out, stride):
        return [nn.Conv2d(c_in, c_out, 3, stride, 1, bias=bias), nn.BatchNorm2d(c_out),
                nn.ReLU(inplace=True)]
    return nn.Sequential(*block(3, 32, 2), *block(32, 64, 2), *block(64, 64, 1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())


def main(argv: list[str] | None = None) -> int:
    parser = workload_parser(__doc__.splitlines()[0], default_steps=20)
    parser.add_argument("--patterns", default=",".join(PATTERNS),
                        help="the anti-patterns to keep (comma-separated): " + ", ".join(PATTERNS))
    parser.add_argument("--layers", type=int, default=8, help="hidden layers in the head")
    parser.add_argument("--width", type=int, default=4095,
                        help="head width while the matmul pattern is on (then rounded up to 8)")
    parser.add_argument("--anchors", type=int, default=64,
                        help="head rows per image (a detection head scores many anchors)")
    args = parser.parse_args(argv)
    on = set() if args.fixed else {p.strip() for p in args.patterns.split(",") if p.strip()}
    unknown = on - set(PATTERNS)
    if unknown:
        parser.error(f"unknown pattern(s): {', '.join(sorted(unknown))}")
    device = resolve_device(args.device)
    on_cuda = device.type == "cuda"
    batch, side, width, layers, anchors = (4, 32, 33, 2, 4) if args.small else \
        (64, 128, args.width, args.layers, args.anchors)
    if "matmul" not in on:
        width = (width + 7) // 8 * 8
    classes = width - 2 if "matmul" in on else width
    torch.manual_seed(args.seed)
    feats = backbone(bias="conv" in on).to(device)
    head = nn.Sequential(nn.Linear(64, width), nn.ReLU(),
                         *[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())],
                         nn.Linear(width, classes)).to(device)
    params = list(feats.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach="optimizer" not in on)
    images = torch.randn(batch, 3, side, side, device=device)
    labels = torch.randint(0, classes, (batch * anchors,), device=device)
    amp = torch.autocast(device.type, dtype=torch.float16 if on_cuda else torch.bfloat16)
    timer = StepTimer(device)
    for _ in range(args.steps):
        if "copy" in on:
            noise = torch.randn(images.shape).to(device)
        else:
            noise = torch.randn(images.shape, device=device)
        with amp:
            logits = head(feats(images + 0.01 * noise).repeat_interleave(anchors, 0))
        loss = F.cross_entropy(logits.float(), labels)
        # per-image margins of the first anchor, for a metrics hook
        first = logits[::anchors]
        if "loop" in on:
            margins = torch.empty(batch, device=device)
            for i in range(batch):
                margins[i] = first[i].max() - first[i, labels[i * anchors]]
        else:
            margins = first.max(dim=1).values - first.gather(1, labels[::anchors, None])[:, 0]
        loss = loss + 0.0 * margins.float().mean()
        opt.zero_grad(set_to_none="zero_grad" not in on)
        loss.backward()
        opt.step()
        timer.lap()
        mark_step()
    timer.report("ops_patterns", args.fixed, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
