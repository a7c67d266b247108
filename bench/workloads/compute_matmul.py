"""compute: large fp32 matrix products (a stack of transformer MLP blocks) keep the GPU busy.

Baseline: pre-norm residual MLP blocks (d=4096, hidden 4x) over 4096 tokens, forward and
backward in fp32 with TF32 off (PyTorch's default for matmul), data already on the GPU: the
step is nearly all fp32 GEMM kernels on the CUDA cores.
Fixed (--fixed): bf16 autocast, so the same products run on the tensor cores.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import StepTimer, mark_step, resolve_device, workload_parser  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    tokens: int
    width: int
    blocks: int


FULL = Sizes(tokens=4096, width=4096, blocks=4)
SMALL = Sizes(tokens=64, width=64, blocks=2)


class MLPBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def main(argv: list[str] | None = None) -> int:
    args = workload_parser(__doc__.splitlines()[0]).parse_args(argv)
    device = resolve_device(args.device)
    sizes = SMALL if args.small else FULL
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False   # PyTorch's default, stated for clarity

    model = nn.Sequential(*(MLPBlock(sizes.width) for _ in range(sizes.blocks))).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    tokens = torch.randn(sizes.tokens, sizes.width, device=device)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if args.fixed
                else contextlib.nullcontext())

    timer = StepTimer(device)
    for _ in range(args.steps):
        with autocast:
            loss = model(tokens).float().pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        timer.lap()
        mark_step()
    timer.report("compute_matmul", args.fixed, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
