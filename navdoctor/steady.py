"""A run's step as navdoctor summarises it: the mean over its steps, an isolated stall left
out. Shared by the trace views (views/steps.py: steady_steps) and by the passes that time a
script without a tracer (collect/diagnose.py, verify/), so that the two figures compare."""
from __future__ import annotations

STALL_FACTOR = 3          # an isolated stall: the one step of its trace this many times the median ...
STALL_MIN_STEPS = 5       # ... in a trace of at least this many steps


def _steady_mean(step_samples: list[float], values: list[float]) -> float:
    """The mean of values (one per step) over the steps that are not isolated stalls (over
    STALL_FACTOR x the median step), as trace_summary leaves them out."""
    import statistics
    mid = statistics.median(step_samples)
    return round(statistics.fmean([v for s, v in zip(step_samples, values) if s <= STALL_FACTOR * mid]), 4)


def steady_step_ms(samples: list[float]) -> float | None:
    """A step time from per-step times timed without a tracer, summarised as a trace's step
    is (trace_summary: the mean, stalls over STALL_FACTOR x the median left out), so that the
    two compare (tracer_cost). None without samples."""
    return _steady_mean(samples, samples) if samples else None


def steady_loader_wait_ms(step_samples: list[float], wait_samples: list[float] | None) -> float | None:
    """The GPU's wait for DataLoader batches per step, timed without a tracer (the timing
    runner's LoaderWait), over the steps steady_step_ms keeps; None without samples."""
    if not step_samples or not wait_samples or len(wait_samples) != len(step_samples):
        return None
    return _steady_mean(step_samples, wait_samples)


def steady_run_ms(step_samples: list[float], wait_samples: list[float] | None) -> tuple[float | None, float | None]:
    """One timed run's figures without a tracer, over the same steps: its step (steady_step_ms)
    and its GPU's wait for DataLoader batches (steady_loader_wait_ms), as diagnose's timing
    runs, verify's timed runs and the bench scripts summarise a run."""
    return steady_step_ms(step_samples), steady_loader_wait_ms(step_samples, wait_samples)
