"""What every corpus workload shares: its command line, the device choice, step marking, timing.

Each workload script puts this folder on sys.path itself, so it runs from any working
directory, as `python bench/workloads/NAME.py` or through runpy.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

try:
    from navdoctor import step as mark_step
except ImportError:  # navdoctor not installed: the workloads still run
    def mark_step():
        pass

__all__ = ["mark_step", "workload_parser", "resolve_device", "StepTimer", "train_classifier"]


def workload_parser(description: str, default_steps: int = 30) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: cuda if available")
    parser.add_argument("--steps", type=int, default=default_steps)
    parser.add_argument("--small", action="store_true",
                        help="tiny sizes that run on a CPU in seconds (tests); the defaults are "
                             "sized for an H100/H200, where the bottleneck is unmistakable")
    parser.add_argument("--fixed", action="store_true",
                        help="apply the remedy for this workload's bottleneck")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def resolve_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but no CUDA device is available")
    return torch.device(choice)


class StepTimer:
    """Times steps without synchronising inside the loop.

    On CUDA an event is recorded at every step boundary and all are read at the end: a
    synchronize per step would add the very kind of stall some of these workloads are about.
    """

    def __init__(self, device: torch.device):
        self.on_cuda = device.type == "cuda"
        self.marks: list = []
        self.lap()      # the first step starts now

    def lap(self) -> None:
        """Call at the end of each step."""
        if self.on_cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def step_ms(self) -> list[float]:
        if self.on_cuda:
            torch.cuda.synchronize()
            return [start.elapsed_time(end) for start, end in zip(self.marks, self.marks[1:])]
        return [(end - start) * 1000 for start, end in zip(self.marks, self.marks[1:])]

    def report(self, name: str, fixed: bool, device: torch.device) -> float:
        """Print and return the median step time; the first step (one-time set-up) is left out
        when there are others."""
        times = self.step_ms()
        steady = times[1:] or times
        median = statistics.median(steady)
        variant = "fixed" if fixed else "baseline"
        print(f"{name} ({variant}, {device.type}): median step time {median:.2f} ms "
              f"over {len(steady)} steps")
        return median


def train_classifier(loader, model, optimizer, device: torch.device, non_blocking: bool,
                     name: str, fixed: bool) -> float:
    """One pass of a plain classification training loop over `loader`, one step per batch;
    returns the median step time (the I/O workloads differ only in how batches are made)."""
    import torch.nn.functional as F
    timer = StepTimer(device)
    for images, labels in loader:
        images = images.to(device, non_blocking=non_blocking)
        labels = labels.to(device, non_blocking=non_blocking)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        timer.lap()
        mark_step()
    return timer.report(name, fixed, device)
