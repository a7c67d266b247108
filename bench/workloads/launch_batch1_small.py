"""launch: batch-1 inference of a deep, narrow MLP is hundreds of microsecond-long kernels.

Baseline: every step runs one sample through 48 residual blocks (LayerNorm, Linear, GELU,
Linear); each kernel finishes faster than Python and the CUDA driver can launch the next one,
so the GPU idles between kernels.
Fixed (--fixed): the forward pass is captured once in a CUDA graph (torch.cuda.CUDAGraph) and
replayed each step, one launch for all kernels. A CPU has no CUDA graphs: there the fixed run
stays eager.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import StepTimer, mark_step, resolve_device, workload_parser  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    width: int
    blocks: int


FULL = Sizes(width=256, blocks=48)
SMALL = Sizes(width=32, blocks=4)


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def cuda_graph_runner(model: nn.Module, example: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Capture model(example) once; the returned function copies its input into the captured
    input buffer and replays the graph. Its output tensor is overwritten by the next replay."""
    static_input = example.clone()
    # Warm up on a side stream, as capture requires: cuBLAS handles and allocator pools are set up
    # outside the graph.
    side_stream = torch.cuda.Stream()
    side_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side_stream):
        for _ in range(3):
            model(static_input)
    torch.cuda.current_stream().wait_stream(side_stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_output = model(static_input)

    def replay(x: torch.Tensor) -> torch.Tensor:
        static_input.copy_(x)
        graph.replay()
        return static_output
    return replay


def main(argv: list[str] | None = None) -> int:
    args = workload_parser(__doc__.splitlines()[0]).parse_args(argv)
    device = resolve_device(args.device)
    sizes = SMALL if args.small else FULL
    torch.manual_seed(args.seed)

    model = nn.Sequential(*(Block(sizes.width) for _ in range(sizes.blocks))).to(device).eval()
    samples = torch.randn(args.steps, 1, sizes.width, device=device)   # one sample per step

    with torch.inference_mode():
        forward = model
        if args.fixed and device.type == "cuda":
            forward = cuda_graph_runner(model, samples[0])
        elif args.fixed:
            print("launch_batch1_small: CUDA graphs need a CUDA device; the fixed run stays eager",
                  file=sys.stderr)

        timer = StepTimer(device)
        for sample in samples:
            forward(sample)
            timer.lap()
            mark_step()
    timer.report("launch_batch1_small", args.fixed, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
