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
def _timed(record):
    """Run the block, then record(wall_s, cpu_s) of it; nothing when not profiling."""
    if _phases is None:
        yield
        return
    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        record(time.perf_counter() - wall0, time.process_time() - cpu0)


def phase(name: str):
    def record(wall_s: float, cpu_s: float) -> None:
        if _phases is not None:  # profiling may have stopped inside the block
            _phases.append({"phase": name, "wall_s": round(wall_s, 4), "cpu_s": round(cpu_s, 4)})
    return _timed(record)


class Timer:
    """Wall and CPU time summed over many stretches (the batches of a load), recorded as one
    phase by record()."""

    def __init__(self, name: str):
        self.name, self.wall_s, self.cpu_s = name, 0.0, 0.0

    def part(self):
        def record(wall_s: float, cpu_s: float) -> None:
            self.wall_s += wall_s
            self.cpu_s += cpu_s
        return _timed(record)

    def record(self) -> None:
        if _phases is not None:
            _phases.append({"phase": self.name, "wall_s": round(self.wall_s, 4),
                            "cpu_s": round(self.cpu_s, 4)})


def write(path: str, phases: list[dict], total_wall_s: float, total_cpu_s: float) -> None:
    """The profile as JSON; the totals cover the whole command (imports included)."""
    doc = {"total_wall_s": round(total_wall_s, 4), "total_cpu_s": round(total_cpu_s, 4),
           "phases": phases}
    try:
        with open(path + ".part", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(path + ".part", path)
    except BaseException as e:
        try:
            os.unlink(path + ".part")
        except OSError:
            pass
        if isinstance(e, OSError):   # a full disk: one line naming the file
            from .errors import NavdoctorError
            raise NavdoctorError(f"{path}: cannot write: {e.strerror or e}") from None
        raise


def is_profile(path) -> bool:
    """Whether path holds a profile this module wrote (which --profile may replace)."""
    try:
        if os.path.getsize(path) > 16 << 20:   # (a profile is a few kB)
            return False
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and set(doc) == {"total_wall_s", "total_cpu_s", "phases"}
