"""Speedup, its confidence interval, and a verdict that accounts for run-to-run noise.

Each arm (baseline, remedy) is a list of runs, each run a list of steady-state step times.
The speedup is median(baseline steps) / median(remedy steps), all runs of an arm pooled.

Runs are interleaved, so round i's baseline and remedy runs ran side by side: they are a
pair. The interval is the hull of two, both over these pairs:

- a two-level (hierarchical) bootstrap: resample the rounds with replacement, then the steps
  within each chosen run, and recompute the ratio. Resampling rounds carries the run-to-run
  noise (another process, a different thread placement, a cold cache) into the interval;
  resampling steps carries the step-to-step noise; a drift that slows both runs of a round
  alike cancels out.
- a paired t-interval: the log of each round's ratio of run medians, one value per round,
  gives a Student t interval. A bootstrap over 2-5 rounds cannot see how large the
  run-to-run noise is (it reuses the same few rounds), while the t-interval widens honestly
  when rounds disagree.

With one run per arm only step-to-step noise is left, and the interval is narrower than the
truth (said in a note).

Verdict, with a margin m (default 5%), read as an equivalence test:
    helps         the whole interval lies above 1 + m
    hurts         the whole interval lies below 1 / (1 + m)
    no effect     the whole interval lies within [1 / (1 + m), 1 + m]: any effect is smaller
                  than the margin
    inconclusive  the interval reaches past a margin bound without clearing it: the noise is
                  too large for these repeats (more --repeats, or steps, narrow it)
"""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field

HELPS, NO_EFFECT, HURTS, INCONCLUSIVE = "helps", "no effect", "hurts", "inconclusive"


@dataclass
class Comparison:
    before_ms: float
    after_ms: float
    speedup: float
    ci_low: float
    ci_high: float
    verdict: str
    confidence: float
    margin: float
    runs_before: int
    runs_after: int
    steps_before: int
    steps_after: int
    run_spread_before: float | None     # relative spread (max-min)/median of run medians
    run_spread_after: float | None
    notes: list[str] = field(default_factory=list)
    ci_bootstrap: tuple[float, float] | None = None
    ci_paired_t: tuple[float, float] | None = None

    def to_json(self) -> dict:
        r = lambda x, n=4: None if x is None else round(x, n)  # noqa: E731
        return {"before_ms": r(self.before_ms), "after_ms": r(self.after_ms),
                "speedup": r(self.speedup), "ci": [r(self.ci_low), r(self.ci_high)],
                "confidence": self.confidence, "margin": self.margin, "verdict": self.verdict,
                "runs_before": self.runs_before, "runs_after": self.runs_after,
                "steps_before": self.steps_before, "steps_after": self.steps_after,
                "run_spread_before": r(self.run_spread_before),
                "run_spread_after": r(self.run_spread_after),
                "ci_bootstrap": None if self.ci_bootstrap is None else [r(x) for x in self.ci_bootstrap],
                "ci_paired_t": None if self.ci_paired_t is None else [r(x) for x in self.ci_paired_t]}


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _pooled(runs: list[list[float]]) -> list[float]:
    return [x for run in runs for x in run]


def _spread(runs: list[list[float]]) -> float | None:
    if len(runs) < 2:
        return None
    medians = [_median(r) for r in runs]
    centre = _median(medians)
    return (max(medians) - min(medians)) / centre if centre > 0 else None


def bootstrap_ratio(before: list[list[float]], after: list[list[float]], resamples: int = 2000,
                    confidence: float = 0.95, seed: int = 0, paired: bool = False,
                    center=None, runs: bool = True) -> tuple[float, float]:
    """Percentile interval of center(before)/center(after) (the median by default) under a
    two-level bootstrap. With paired, before[i] and after[i] ran in the same round and rounds
    are resampled together, so a drift that slows both arms of a round alike cancels out.
    With runs=False only the steps within each run are resampled (the runs stay)."""
    rng = random.Random(seed)
    center = center or _median

    def pool(runs: list[list[float]]) -> float:
        pooled: list[float] = []
        for run in runs:
            pooled.extend(rng.choices(run, k=len(run)) if len(run) > 1 else run)
        return center(pooled)

    ratios = []
    for _ in range(resamples):
        if not runs:
            b, a = before, after
        elif paired:
            idx = rng.choices(range(len(before)), k=len(before))
            b, a = [before[i] for i in idx], [after[i] for i in idx]
        else:
            b, a = rng.choices(before, k=len(before)), rng.choices(after, k=len(after))
        ratios.append(pool(b) / pool(a))
    ratios.sort()
    tail = (1 - confidence) / 2
    low = ratios[int(tail * resamples)]
    high = ratios[min(resamples - 1, int((1 - tail) * resamples))]
    return low, high


# Two-sided Student t quantiles, by confidence then degrees of freedom (larger df: normal).
_T = {0.90: [6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812],
      0.95: [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228],
      0.99: [63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169]}
_Z = {0.90: 1.645, 0.95: 1.960, 0.99: 2.576}


def t_quantile(confidence: float, df: int) -> float:
    if confidence not in _T:
        raise ValueError(f"confidence {confidence}: one of {sorted(_T)}")
    if df <= len(_T[confidence]):
        return _T[confidence][df - 1]
    # Beyond 10 degrees of freedom: the normal quantile plus two Cornish-Fisher terms.
    z = _Z[confidence]
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def paired_interval(before: list[list[float]], after: list[list[float]],
                    confidence: float = 0.95) -> tuple[float, float] | None:
    """t-interval of the speedup from per-round ratios of run medians (before[i] and after[i]
    ran in the same round); None with fewer than two rounds."""
    if len(before) != len(after) or len(before) < 2:
        return None
    logs = [math.log(_median(b) / _median(a)) for b, a in zip(before, after)]
    n = len(logs)
    mean = sum(logs) / n
    sd = statistics.stdev(logs)
    half = t_quantile(confidence, n - 1) * sd / math.sqrt(n)
    return math.exp(mean - half), math.exp(mean + half)


def decide(low: float, high: float, margin: float) -> str:
    up, down = 1 + margin, 1 / (1 + margin)
    if low > up:
        return HELPS
    if high < down:
        return HURTS
    if low >= down and high <= up:
        return NO_EFFECT
    return INCONCLUSIVE


def compare(before: list[list[float]], after: list[list[float]], margin: float = 0.05,
            confidence: float = 0.95, resamples: int = 2000, seed: int = 0,
            paired: bool = True) -> Comparison:
    """before/after: runs of step times (ms); with paired, before[i] and after[i] ran in the
    same round. Runs without steps are ignored (and pairing with them)."""
    if paired and len(before) == len(after):
        kept = [(b, a) for b, a in zip(before, after) if b and a]
        before, after = [list(b) for b, _ in kept], [list(a) for _, a in kept]
    else:
        paired = False
        before = [list(r) for r in before if r]
        after = [list(r) for r in after if r]
    if not before or not after:
        raise ValueError("each arm needs at least one run with steps")
    b, a = _median(_pooled(before)), _median(_pooled(after))
    boot = bootstrap_ratio(before, after, resamples, confidence, seed, paired=paired)
    low, high = boot
    notes = []
    t_interval = paired_interval(before, after, confidence) if paired else None
    if t_interval is not None:
        low, high = min(low, t_interval[0]), max(high, t_interval[1])
    if len(before) < 2 or len(after) < 2:
        notes.append("one run in an arm: the interval holds step-to-step noise only, not "
                     "run-to-run noise (use --repeats 3 or more)")
    return Comparison(before_ms=b, after_ms=a, speedup=b / a, ci_low=low, ci_high=high,
                      verdict=decide(low, high, margin), confidence=confidence, margin=margin,
                      runs_before=len(before), runs_after=len(after),
                      steps_before=sum(map(len, before)), steps_after=sum(map(len, after)),
                      run_spread_before=_spread(before), run_spread_after=_spread(after),
                      notes=notes, ci_bootstrap=boot, ci_paired_t=t_interval)


# ---- one statistic for `navdoctor compare`: the mean step, as the analysis reports it -------

def _mean(values: list[float]) -> float:
    return statistics.fmean(values)


def steps_interval(before: list[list[float]], after: list[list[float]], confidence: float = 0.95,
                   resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(before's steps) / mean(after's steps), each
    capture's steps resampled within it (its steps are the samples; the captures stay)."""
    return bootstrap_ratio(before, after, resamples, confidence, seed, center=_mean, runs=False)


def halves_log_ratio(steps: list[float]) -> float | None:
    """log(mean of a capture's later half / mean of its earlier half): the two halves of one
    run read as two runs of it. None under 3 steps."""
    if len(steps) < 3:
        return None
    h = len(steps) // 2
    return math.log(_mean(steps[h:]) / _mean(steps[:h]))


def between_runs_interval(before_means: list[float], after_means: list[float], center: float,
                          confidence: float = 0.95) -> tuple[float, float]:
    """Welch's t interval of the speed-up from the captures' own step times (one mean per
    capture, on a log scale), around `center` (the speed-up reported): the run-to-run noise
    is what the captures of each side differ by. Needs two or more captures a side."""
    lb, la = [math.log(x) for x in before_means], [math.log(x) for x in after_means]
    vb, va = statistics.variance(lb) / len(lb), statistics.variance(la) / len(la)
    se = math.sqrt(vb + va)
    if se == 0:
        return center, center
    df = (vb + va) ** 2 / ((vb ** 2 / (len(lb) - 1) if vb else 0) + (va ** 2 / (len(la) - 1) if va else 0))
    half = t_quantile(confidence, max(1, int(df))) * se
    return center * math.exp(-half), center * math.exp(half)


def normal_quantile(confidence: float) -> float:
    if confidence not in _Z:
        raise ValueError(f"confidence {confidence}: one of {sorted(_Z)}")
    return _Z[confidence]
