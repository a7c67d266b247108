"""launch/compute: a training step with torch.profiler's anti-patterns, each in a realistic place.

Baseline, all at once (each is one of navdoctor's patterns.yaml / launch.yaml rules):
 - convolutions with a bias right before BatchNorm (the bias is subtracted again at once);
 - an fp16 (autocast) head whose matmul dims are not multiples of 8 (1001 -> 999 features);
 - per-step class weights made on the CPU (torch.ones) and then copied to the GPU;
 - a per-sample loop that indexes the batch (for i in range(n): scores[i] = ...);
 - SGD stepping parameter by parameter (foreach=False) over many small tensors, and
   zero_grad(set_to_none=False), which fills every gradient with zeros each step.
Fixed (--fixed): no bias before BN, dims padded to multiples of 8, weights made on the GPU,
the loop vectorised, foreach SGD and set_to_none=True.
The head has 64 small layers so that the optimizer's per-tensor launches are a visible part of
the step (the case `navdoctor verify --remedy foreach_optimizer,zero_grad_set_to_none` measures).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import StepTimer, mark_step, resolve_device, workload_parser  # noqa: E402


def backbone(bias: bool) -> nn.Module:
    def block(c_in, c_out, stride):
        return [nn.Conv2d(c_in, c_out, 3, stride, 1, bias=bias), nn.BatchNorm2d(c_out),
                nn.ReLU(inplace=True)]
    return nn.Sequential(*block(3, 32, 2), *block(32, 64, 2), *block(64, 64, 1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())


def main(argv: list[str] | None = None) -> int:
    parser = workload_parser(__doc__.splitlines()[0], default_steps=20)
    parser.add_argument("--layers", type=int, default=64, help="small layers in the head")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    on_cuda = device.type == "cuda"
    batch, side = (4, 32) if args.small else (64, 128)
    torch.manual_seed(args.seed)
    fixed = args.fixed
    width, classes = (1008, 1000) if fixed else (1001, 999)
    layers = args.layers
    if args.small:
        (width, classes), layers = ((40, 32) if fixed else (33, 31)), 4
    feats = backbone(bias=not fixed).to(device)
    head = nn.Sequential(nn.Linear(64, width), nn.ReLU(),
                         *[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())],
                         nn.Linear(width, classes)).to(device)
    params = list(feats.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=fixed)
    images = torch.randn(batch, 3, side, side, device=device)
    labels = torch.randint(0, classes, (batch,), device=device)
    amp = torch.autocast(device.type, dtype=torch.float16 if on_cuda else torch.bfloat16)
    timer = StepTimer(device)
    for _ in range(args.steps):
        if fixed:
            class_weights = torch.ones(classes, device=device)
        else:
            class_weights = torch.ones(classes).to(device)
        with amp:
            logits = head(feats(images))
        loss = F.cross_entropy(logits.float(), labels, weight=class_weights)
        # per-sample margins for a metrics hook
        if fixed:
            margins = logits.max(dim=1).values - logits.gather(1, labels[:, None])[:, 0]
        else:
            margins = torch.empty(batch, device=device)
            for i in range(batch):
                margins[i] = logits[i].max() - logits[i, labels[i]]
        loss = loss + 0.0 * margins.float().mean()
        opt.zero_grad(set_to_none=fixed)
        loss.backward()
        opt.step()
        timer.lap()
        mark_step()
    timer.report("ops_patterns", fixed, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
