"""launch: a Python loop of tiny elementwise ops (a per-timestep smoothing filter) each step.

Baseline: the heading of every tracked obstacle is smoothed with an exponential moving average,
written as a loop over 256 timesteps of a few elementwise ops on small tensors: about a
thousand kernel launches of a few microseconds of GPU work each, every step.
Fixed (--fixed): the filter is linear, so the whole loop is one matrix product with a
precomputed (timesteps x timesteps) weight matrix.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import StepTimer, mark_step, resolve_device, workload_parser  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    timesteps: int
    tracks: int


FULL = Sizes(timesteps=256, tracks=32768)
SMALL = Sizes(timesteps=32, tracks=64)
SMOOTHING = 0.9     # weight of the previous state


def smooth_loop(signal: torch.Tensor, alpha: float) -> torch.Tensor:
    """state[t] = alpha * state[t-1] + (1 - alpha) * signal[t], state[0] = signal[0]."""
    smoothed = torch.empty_like(signal)
    state = signal[0]
    smoothed[0] = state
    for t in range(1, signal.shape[0]):
        state = alpha * state + (1 - alpha) * signal[t]
        smoothed[t] = state
    return smoothed


def smoothing_matrix(timesteps: int, alpha: float, device: torch.device) -> torch.Tensor:
    """W with smooth_loop(signal) == W @ signal: row t holds the weight of each signal[k]."""
    t = torch.arange(timesteps, dtype=torch.float64).view(-1, 1)
    k = torch.arange(timesteps, dtype=torch.float64).view(1, -1)
    lag = (t - k).clamp(min=0)
    weights = torch.where(k <= t, (1 - alpha) * alpha ** lag, torch.zeros(()))
    weights[:, 0] = alpha ** t.view(-1)          # signal[0] is the initial state, not an input
    return weights.to(device=device, dtype=torch.float32)


def main(argv: list[str] | None = None) -> int:
    args = workload_parser(__doc__.splitlines()[0]).parse_args(argv)
    device = resolve_device(args.device)
    sizes = SMALL if args.small else FULL
    torch.manual_seed(args.seed)

    headings = torch.randn(sizes.timesteps, sizes.tracks, device=device)
    weights = smoothing_matrix(sizes.timesteps, SMOOTHING, device) if args.fixed else None

    timer = StepTimer(device)
    for _ in range(args.steps):
        if args.fixed:
            torch.matmul(weights, headings)
        else:
            smooth_loop(headings, SMOOTHING)
        timer.lap()
        mark_step()
    timer.report("launch_python_loop", args.fixed, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
