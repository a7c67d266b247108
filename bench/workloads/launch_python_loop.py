"""launch: a Python loop of tiny elementwise ops (a per-timestep smoothing filter) each step.

Each step smooths the heading history of every tracked obstacle, then scores the tracks with a
small MLP (about 2 ms of fp32 GPU work on an H200, the same in both variants).
Baseline: the smoothing is an exponential moving average written as a loop over 256 timesteps
of a few elementwise ops on small tensors: about a thousand kernel launches of a few
microseconds of GPU work each, every step; the CPU issuing them sets the pace.
Fixed (--fixed): the filter is linear, so the whole loop is one matrix product with a
precomputed (timesteps x timesteps) weight matrix; what is left per step is a handful of
launches and the scorer's GPU work.
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
    scorer_width: int


FULL = Sizes(timesteps=256, tracks=32768, scorer_width=1024)
SMALL = Sizes(timesteps=32, tracks=64, scorer_width=16)
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
    # Scores each track from its smoothed history: (tracks, timesteps) -> (tracks, 1).
    scorer = torch.nn.Sequential(
        torch.nn.Linear(sizes.timesteps, sizes.scorer_width), torch.nn.ReLU(),
        torch.nn.Linear(sizes.scorer_width, sizes.scorer_width), torch.nn.ReLU(),
        torch.nn.Linear(sizes.scorer_width, 1)).to(device).eval()

    timer = StepTimer(device)
    for _ in range(args.steps):
        with torch.no_grad():
            if args.fixed:
                smoothed = torch.matmul(weights, headings)
            else:
                smoothed = smooth_loop(headings, SMOOTHING)
            scorer(smoothed.T)
        timer.lap()
        mark_step()
    timer.report("launch_python_loop", args.fixed, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
