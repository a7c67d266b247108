"""Wall and CPU time of each phase of an analysis, for `navdoctor analyze --profile PATH` and
the benchmark (bench/perf/run_bench.py --profile): which phase to make faster next.

Phases nest by name ('load', 'load.nsys.kernels', 'rule.<id>'); when no profile is being
recorded, `phase()` costs one attribute lookup.
"""
from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager

_phases: list[dict] | None = None


def start() -> None:
    global _phases
    _phases = []


def stop() -> list[dict]:
    """The phases recorded since start(), in the order they finished."""
    global _phases
    out, _phases = _phases or [], None
    return out


@contextmanager
def phase(name: str):
    if _phases is None:
        yield
        return
    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        if _phases is not None:
            _phases.append({"phase": name, "wall_s": round(time.perf_counter() - wall0, 4),
                            "cpu_s": round(time.process_time() - cpu0, 4)})


class Timer:
    """Wall and CPU time summed over many stretches (the batches of a load), recorded as one
    phase by record()."""

    def __init__(self, name: str):
        self.name, self.wall_s, self.cpu_s = name, 0.0, 0.0

    @contextmanager
    def part(self):
        if _phases is None:
            yield
            return
        wall0, cpu0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall_s += time.perf_counter() - wall0
            self.cpu_s += time.process_time() - cpu0

    def record(self) -> None:
        if _phases is not None:
            _phases.append({"phase": self.name, "wall_s": round(self.wall_s, 4),
                            "cpu_s": round(self.cpu_s, 4)})


def write(path: str, phases: list[dict], total_wall_s: float, total_cpu_s: float) -> None:
    """The profile as JSON; the totals cover the whole command (imports included)."""
    doc = {"total_wall_s": round(total_wall_s, 4), "total_cpu_s": round(total_cpu_s, 4),
           "phases": phases}
    with open(path + ".part", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".part", path)


def is_profile(path) -> bool:
    """Whether path holds a profile this module wrote (which --profile may replace)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and set(doc) == {"total_wall_s", "total_cpu_s", "phases"}
