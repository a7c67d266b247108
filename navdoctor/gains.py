"""Predicted speed-ups (docs/verdict.md, "Predicted speed-ups"): per class of a verdict, the step
without that class's own time (expected) and a bound on what its remedies can give (up to);
per finding, its own expected figure and bound. The verdict layer's figures; the reporters
print them and `verify` checks them."""
from __future__ import annotations

from .headroom import speedup_without_share
from .verdict import class_shares as verdict_class_shares
from .verdict import class_speedup_expected, compute_speedup_expected


def upper_bound_speedup(share: float | None) -> float | None:
    """The speed-up if a share of the step were removed and nothing else changed."""
    if share is None or share <= 0:
        return None
    return speedup_without_share(share)


# What the GPU still has to do once a class's cause is gone: its kernels always, its copies
# unless the class is memory (whose remedies take copies off the critical path).
GPU_WORK_LEFT = {"io": ("compute", "comm", "copy"), "launch": ("compute", "comm", "copy"),
                 "memory": ("compute", "comm")}


def verdict_gains(v, has_gpu: bool = True) -> dict[str, dict[str, float]]:
    """estimated_gain as the report gives it for a verdict (navdoctor.verdict.Verdict): of the
    step the class shares are of (without the tracers' costs), compute's expected figure as
    the verdict weighs it (verdict.compute_speedup_expected)."""
    return estimated_gain(v.class_shares, v.judged_step_ms or v.step_ms,
                          v.shares if has_gpu else None, v.step_ms,
                          compute_speedup_expected(v.compute_headroom, v.loader_wait))


def estimated_gain(class_shares: dict[str, float], step_ms: float | None,
                   shares: dict[str, float] | None = None,
                   traced_step_ms: float | None = None,
                   compute_speedup: float | None = None) -> dict[str, dict[str, float]]:
    """Per class, two numbers (docs/verdict.md, "Predicted speed-ups"):
    - expected: the step without that class's own time (class_shares are of the step without
      the tracer's cost, step_ms is that step);
    - up to: a bound. A remedy for a cause of GPU idle time (io, memory, launch) cannot make
      the step shorter than the GPU's own work, so the bound is the traced step over the
      time the GPU works in it (the traced `shares`: the tracer's cost is host time, so the
      traced ratio is at least the unprofiled one). A remedy often removes more than its
      class's buckets (a sync also drains the queue the host must refill, pinned copies drop
      the host's staging), so the expected figure under-shoots it; the bound does not. For
      compute the bound is the step without any kernel time.
    compute_speedup, where the trace's kernels tell it (the compute headroom), is compute's
    expected figure instead: what bf16 and channels_last are expected to remove, not the
    step without its kernels.
    step_ms is the step the class shares are of; traced_step_ms the one `shares` are of
    (the same where no tracer cost was taken out)."""
    if not step_ms:
        return {}
    traced_step_ms = traced_step_ms or step_ms
    traced = verdict_class_shares(shares) if shares else {}
    out = {}
    for cls, share in class_shares.items():
        share = share or 0.0
        # a class with time in the traced step keeps its bound even where the tracer's
        # correction leaves it none (its launch time may be the tracer's, or may not)
        if share <= 0 and traced.get(cls, 0.0) < 0.005:
            continue
        bound = class_speedup_expected(cls, share)      # compute's: the kernel-free step
        at_least = step_ms / bound
        expected = class_speedup_expected(cls, share, compute_speedup)
        without = step_ms / expected
        if shares and cls in GPU_WORK_LEFT:
            # (at most 100x, as the expected figure: a GPU that works 0.02% of a step bounds
            # nothing a user can act on)
            work = max(sum(shares.get(b, 0.0) for b in GPU_WORK_LEFT[cls]), 0.01)
            if 1.0 / work > expected:
                bound, at_least = round(1.0 / work, 2), traced_step_ms * work
        if bound <= 1.0:
            continue
        out[cls] = {"step_ms_without": round(without, 3), "speedup_expected": expected,
                    "step_ms_at_least": round(at_least, 3), "speedup_up_to": bound}
    return out


def finding_bound(category: str, share: float, gains: dict[str, dict[str, float]]) -> float | None:
    """A finding's upper bound: for a cause of GPU idle time (io, memory, launch), its class's
    (removing one such cause cannot give more than the GPU's own work allows), else the
    finding's own expected figure."""
    expected = upper_bound_speedup(share)
    if not expected:
        return None
    # (compute's class figure, the step without any kernel, bounds nothing a finding can do)
    g = gains.get(category) if category in GPU_WORK_LEFT else None
    return max(expected, g["speedup_up_to"]) if g else expected
