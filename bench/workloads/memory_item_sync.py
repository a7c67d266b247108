"""memory: per-sample metric logging with .item() forces hundreds of GPU->CPU syncs a step.

Baseline: an evaluation loop logs loss, correctness and confidence of every sample in a Python
loop with `.item()`; each call copies one number to the host and waits for the GPU, so the GPU
idles while Python walks the batch.
Fixed (--fixed): the per-sample metrics are computed for the whole batch at once and kept on the
GPU; they come to the host with a single `.cpu()` after the loop.
"""
from __future__ import annotations

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


FULL = Sizes(batch=256, side=128)
SMALL = Sizes(batch=8, side=32)
NUM_CLASSES = 100


def log_per_sample(logits: torch.Tensor, labels: torch.Tensor, log: list[tuple]) -> None:
    """The habit: a Python loop over samples, three host syncs each."""
    for i in range(logits.shape[0]):
        loss = F.cross_entropy(logits[i:i + 1], labels[i:i + 1]).item()
        correct = (logits[i].argmax() == labels[i]).item()
        confidence = logits[i].softmax(dim=-1).max().item()
        log.append((loss, correct, confidence))


def batch_metrics(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The same three numbers per sample, as one (batch, 3) tensor that stays on the device."""
    losses = F.cross_entropy(logits, labels, reduction="none")
    correct = (logits.argmax(dim=-1) == labels).float()
    confidence = logits.softmax(dim=-1).amax(dim=-1)
    return torch.stack([losses, correct, confidence], dim=1)


def main(argv: list[str] | None = None) -> int:
    args = workload_parser(__doc__.splitlines()[0]).parse_args(argv)
    device = resolve_device(args.device)
    sizes = SMALL if args.small else FULL
    torch.manual_seed(args.seed)

    model = torchvision.models.resnet18(weights=None, num_classes=NUM_CLASSES).to(device).eval()
    images = torch.randn(sizes.batch, 3, sizes.side, sizes.side, device=device)
    labels = torch.randint(0, NUM_CLASSES, (sizes.batch,), device=device)
    host_log: list[tuple] = []
    device_log: list[torch.Tensor] = []

    timer = StepTimer(device)
    with torch.inference_mode():
        for _ in range(args.steps):
            logits = model(images)
            if args.fixed:
                device_log.append(batch_metrics(logits, labels))
            else:
                log_per_sample(logits, labels, host_log)
            timer.lap()
            mark_step()
        if args.fixed:
            host_log = torch.cat(device_log).cpu().tolist()     # one transfer for the whole run
    timer.report("memory_item_sync", args.fixed, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
