"""Steps for traces that carry no step markers: inferred from the trace's own structure.

A trace with ProfilerStep#N or navdoctor.step#N ranges already has its steps (the loaders
read them). Any other trace (a hand-made `nsys profile` of a script, a `torch.profiler.profile()`
without a schedule) gets its steps here, from the first of these that the trace supports:

  annotation  ranges the user named like steps ('train_step', 'iteration 12', 'frame#3') that
              recur at the top level of a thread: each one opens a step
  optimizer   torch's Optimizer.step#... ranges: each one closes a step
  dataloader  DataLoader.__next__ waits: each one opens a step
  module      the outermost nn.Module call that recurs (Kineto with stacks): each opens a step
  period      the period of the launching thread's CUDA call sequence (the kernel names in
              launch order, with the copies and syncs between them): one step per period, cut
              where the host pauses longest (the data wait, the frame read, the sync)
  gpu-window  no structure found: the GPU-active span (host-active for CPU-only traces) cut
              into equal windows, with sparse leading and trailing windows left out; a trace
              too small to cut is analysed whole, as one step ('whole-trace')
Every source leaves out what comes before the first steady step and after the last (start-up:
CUDA context, module loading, cuDNN autotuning, compilation, the cold first iterations; and
tear-down): leading and trailing steps over TRIM_FACTOR x the median step, and for `period`
every stretch whose launch count is far from one period (an evaluation pass, a warm-up
iteration with other kernels). Nothing here knows any kernel or model by name.
The outcome per trace is a row of the table `step_inference` (docs/schema.md).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb

from . import store

# numpy only where steps are inferred (a trace without step markers): the common analysis
# never imports it (~35 ms of a small trace's start-up; see store.register_functions).
if TYPE_CHECKING:
    import numpy as np

MIN_STEPS = 3            # fewer inferred steps than this is no repeating structure
TRIM_FACTOR = 3.0        # leading/trailing steps this many times the median are start-up/tear-down
KGRAM = 4                # calls per token group when looking for periods
MAX_PERIOD_CANDIDATES = 30
MIN_PERIOD_SCORE = 0.6   # share of calls that repeat one period later, for a period to count
PERIOD_TIE = 0.02        # candidates within this of the best score: the shortest wins
PERIOD_SLACK = 0.5       # a step of period inference holds (1 +- this) x period calls
MAX_REPEATS = 256        # a step may be up to this many repeats of one call period (layers)
PAUSE_GAIN = 3.0         # a multiple of the period whose pauses stand out this much more is the step
FOLD_CALLS = 100_000     # calls folded when comparing pause structure (the middle of the run)
FALLBACK_WINDOWS = 10
FALLBACK_MIN_PER_WINDOW = 5   # fewer busy intervals than this per window: too little to cut
SPARSE_WINDOW = 0.5      # a leading/trailing window busy under this x the median is warm-up

# User range names that say "step": a word of them, digits and separators aside.
STEP_WORDS = re.compile(r"(?i)(^|[^a-z])(step|iter|iteration|batch|frame|train_step|"
                        r"training_step|eval_step|inference)([^a-z]|$)")

@dataclass
class Inference:
    trace_id: int
    method: str
    detail: str
    steps: list[tuple[int, int]]          # [start, end) in ns
    period_calls: int | None = None
    start_up_ns: int = 0
    tear_down_ns: int = 0
    irregular_ns: int = 0
    irregular_stretches: int = 0

    def note(self) -> str:
        how = {
            "annotation": f"from the recurring range '{self.detail}'",
            "optimizer": f"from the optimizer's steps ({self.detail})",
            "dataloader": "from the DataLoader waits (one per batch)",
            "module": f"from the calls of the outermost module '{self.detail}'",
            "period": f"from the period of the {self.detail.split('; ')[0]} ({self.period_calls} "
                      f"calls per step, {self.detail.split('; ', 1)[-1]})",
            "gpu-window": f"as equal windows of the {self.detail}: no repeating structure found",
        }[self.method]
        left = [f"start-up {self.start_up_ns / 1e6:.1f} ms", f"tear-down {self.tear_down_ns / 1e6:.1f} ms"]
        if self.irregular_stretches:
            left.append(f"{self.irregular_stretches} irregular stretch(es) of "
                        f"{self.irregular_ns / 1e6:.1f} ms")
        if self.method == "gpu-window" and len(self.steps) == 1:
            return (f"no step markers and too little GPU work for a repeating structure: the "
                    f"{self.detail} was analysed as one step; left out " + ", ".join(left))
        return (f"no step markers: {len(self.steps)} steps inferred {how}; left out "
                + ", ".join(left))


def infer_steps(con: duckdb.DuckDBPyConnection) -> dict[int, Inference]:
    """Insert inferred steps for every trace without any; return what was inferred, by trace."""
    out = {}
    traces = [r[0] for r in con.execute("""
        SELECT trace_id FROM inputs WHERE trace_id NOT IN (SELECT DISTINCT trace_id FROM steps)
        ORDER BY trace_id""").fetchall()]
    for t in traces:
        inf = (_from_ranges(con, t) or _from_period(con, t) or _fallback_windows(con, t))
        if inf is None:
            continue
        _store(con, inf)
        out[t] = inf
    return out


def _store(con: duckdb.DuckDBPyConnection, inf: Inference) -> None:
    source = con.execute("SELECT source FROM inputs WHERE trace_id = ?", [inf.trace_id]).fetchone()[0]
    origin = "gpu-window" if inf.method == "gpu-window" else f"inferred:{inf.method}"
    rows = [(inf.trace_id, source, i, s, e, e - s, origin, s, e)
            for i, (s, e) in enumerate(inf.steps, start=1)]
    store.insert_rows(con, "steps", rows)
    con.execute("INSERT INTO step_inference VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [inf.trace_id, inf.method, inf.detail, len(inf.steps), inf.period_calls,
                 inf.start_up_ns, inf.tear_down_ns, inf.irregular_ns, inf.irregular_stretches,
                 inf.note()])


def _span(con: duckdb.DuckDBPyConnection, t: int) -> tuple[int, int] | None:
    row = con.execute("""
        SELECT min(s), max(e) FROM (
            SELECT start_ns s, end_ns e FROM kernels WHERE trace_id = $t
            UNION ALL SELECT start_ns, end_ns FROM memcpy WHERE trace_id = $t
            UNION ALL SELECT start_ns, end_ns FROM runtime_calls WHERE trace_id = $t
            UNION ALL SELECT start_ns, end_ns FROM cpu_ops WHERE trace_id = $t
            UNION ALL SELECT start_ns, end_ns FROM dataloader_waits WHERE trace_id = $t
            UNION ALL SELECT start_ns, end_ns FROM nvtx_ranges WHERE trace_id = $t)""",
                      {"t": t}).fetchone()
    return None if row is None or row[0] is None else (int(row[0]), int(row[1]))


def _finish(con, t, method, detail, bounds: list[tuple[int, int]], period=None,
            calls: list[int] | None = None) -> Inference | None:
    """Steps from candidate windows: drop the irregular ones (period inference: far from one
    period of calls), then the leading/trailing outliers; account for what was left out."""
    import numpy as np
    span = _span(con, t)
    if span is None or len(bounds) < MIN_STEPS:
        return None
    kept = list(range(len(bounds)))
    irregular = []
    if period is not None and calls is not None:
        lo, hi = (1 - PERIOD_SLACK) * period, (1 + PERIOD_SLACK) * period
        irregular = [i for i in kept if not lo <= calls[i] <= hi]
        kept = [i for i in kept if lo <= calls[i] <= hi]
    if len(kept) < MIN_STEPS:
        return None
    durs = np.array([bounds[i][1] - bounds[i][0] for i in kept], dtype=np.float64)
    med = float(np.median(durs))
    a, b = 0, len(kept)
    while a < b and durs[a] > TRIM_FACTOR * med:
        a += 1
    while b > a and durs[b - 1] > TRIM_FACTOR * med:
        b -= 1
    steps_idx = kept[a:b]
    if len(steps_idx) < MIN_STEPS:
        return None
    first, last = steps_idx[0], steps_idx[-1]
    middle_irregular = [i for i in irregular if first < i < last]
    steps = [bounds[i] for i in steps_idx]
    return Inference(
        t, method, detail, steps, period,
        start_up_ns=max(0, steps[0][0] - span[0]), tear_down_ns=max(0, span[1] - steps[-1][1]),
        irregular_ns=int(sum(bounds[i][1] - bounds[i][0] for i in middle_irregular)),
        irregular_stretches=len(middle_irregular))


# --- recurring host ranges -------------------------------------------------------------------

def _top_level(con, t: int, table: str, where: str) -> str:
    """SQL of the rows of `table` (trace t, matching `where`) that no other such row of the
    same thread encloses."""
    return f"""
        SELECT name, start_ns, end_ns FROM ({_top_level_by_thread(t, table, where)})"""


def _top_level_by_thread(t: int, table: str, where: str) -> str:
    return f"""
        SELECT pid, tid, name, start_ns, end_ns FROM (
            SELECT pid, tid, name, start_ns, end_ns,
                   max(end_ns) OVER (PARTITION BY pid, tid ORDER BY start_ns, end_ns DESC
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS enclosing_end
            FROM {table} WHERE trace_id = {int(t)} AND start_ns IS NOT NULL AND end_ns IS NOT NULL
              AND ({where}))
        WHERE enclosing_end IS NULL OR enclosing_end <= start_ns"""


def _opening(starts: list[int]) -> list[tuple[int, int]]:
    return [(s, e) for s, e in zip(starts, starts[1:]) if e > s]


def _one_thread(t: int, where: str) -> str:
    """SQL of the top-level nvtx_ranges matching `where` on the one thread that has the most of
    them (the earliest, of equals): Kineto repeats a host's user annotations on the GPU
    timeline (gpu_user_annotation), a copy that must not count as more steps."""
    return f"""
        WITH r AS ({_top_level_by_thread(t, 'nvtx_ranges', where)}),
        th AS (SELECT pid, tid FROM r GROUP BY ALL ORDER BY count(*) DESC, min(start_ns) LIMIT 1)
        SELECT r.name, r.start_ns, r.end_ns FROM r JOIN th
            ON r.pid IS NOT DISTINCT FROM th.pid AND r.tid IS NOT DISTINCT FROM th.tid"""


def _from_ranges(con: duckdb.DuckDBPyConnection, t: int) -> Inference | None:
    # annotation: user ranges named like steps, digits stripped so 'iter 1', 'iter 2' are one
    rows = con.execute(f"""
        SELECT pid, tid, name, start_ns FROM ({_top_level_by_thread(t, 'nvtx_ranges', "name NOT LIKE 'ProfilerStep#%' AND name NOT LIKE 'navdoctor.%'")})
        ORDER BY start_ns""").fetchall()
    groups: dict[tuple, list[int]] = {}
    for pid, tid, name, start in rows:
        if name and STEP_WORDS.search(name) and not name.startswith(("Optimizer.", "enumerate(DataLoader)")):
            groups.setdefault((re.sub(r"\d+", "#", name).strip(), pid, tid), []).append(int(start))
    if groups:
        # per name and thread, so the GPU timeline's copy of a host annotation is not merged in
        (name, _, _), starts = max(groups.items(), key=lambda kv: (len(kv[1]), -kv[1][0]))
        inf = _finish(con, t, "annotation", name, _opening(starts))
        if inf:
            return inf
    # optimizer: Optimizer.step#SGD.step ranges close a step
    ends = [r[0] for r in con.execute(f"""
        SELECT end_ns FROM ({_one_thread(t, "name LIKE 'Optimizer.step#%'")})
        ORDER BY end_ns""").fetchall()]
    if len(ends) > MIN_STEPS:
        names = con.execute(f"""SELECT any_value(name) FROM nvtx_ranges WHERE trace_id = {int(t)}
                                AND name LIKE 'Optimizer.step#%'""").fetchone()[0]
        inf = _finish(con, t, "optimizer", names, _opening(ends))
        if inf:
            return inf
    # dataloader: on the thread that waits most often
    starts = [r[0] for r in con.execute(f"""
        WITH main AS (SELECT pid, tid FROM dataloader_waits WHERE trace_id = {int(t)}
                      GROUP BY ALL ORDER BY count(*) DESC LIMIT 1)
        SELECT d.start_ns FROM dataloader_waits d, main
        WHERE d.trace_id = {int(t)} AND d.pid IS NOT DISTINCT FROM main.pid
          AND d.tid IS NOT DISTINCT FROM main.tid ORDER BY d.start_ns""").fetchall()]
    if len(starts) > MIN_STEPS:
        inf = _finish(con, t, "dataloader", "DataLoader", _opening(starts))
        if inf:
            return inf
    # module: outermost recurring nn.Module call (Kineto python_function events, with_stack)
    rows = con.execute(f"""
        SELECT name, start_ns FROM ({_top_level(con, t, 'cpu_ops', "name LIKE 'nn.Module: %'")})
        ORDER BY start_ns""").fetchall()
    groups = {}
    for name, start in rows:
        groups.setdefault(name, []).append(int(start))
    recurring = {k: v for k, v in groups.items() if len(v) > MIN_STEPS}
    if recurring:
        most = max(len(v) for v in recurring.values())
        # Several models per frame: the first of those called (about) every frame.
        name, starts = min(((k, v) for k, v in recurring.items() if len(v) >= 0.8 * most),
                           key=lambda kv: kv[1][0])
        inf = _finish(con, t, "module", name.removeprefix("nn.Module: "), _opening(starts))
        if inf:
            return inf
    return None


# --- the period of the call sequence ---------------------------------------------------------

def _call_sequence(con: duckdb.DuckDBPyConnection, t: int):
    """(start_ns, end_ns, token, what) of the launching thread's CUDA calls in host order,
    token = the launched kernel's name (else the API name); or of the GPU's kernels when the
    trace has no CUDA calls; or of the busiest thread's top-level CPU ops. None if none."""
    import numpy as np
    main = con.execute("""
        SELECT pid, tid FROM runtime_calls WHERE trace_id = ? AND is_launch
        GROUP BY ALL ORDER BY count(*) DESC LIMIT 1""", [t]).fetchone()
    if main is not None:
        # Tokens are numbered as dense_rank() over the token strings, but the strings are met
        # only in small dictionaries: kernel names (kd) and the distinct (kernel, API) pairs
        # (td). Sorting or grouping millions of rows by a kernel's name held ~1 GB and
        # overran DuckDB's limit on a 5 M-kernel trace; now only integers are sorted and
        # grouped. Calls that start together are ordered by end and token (the old order of
        # such ties was the database's), so one trace always gives one sequence.
        q = f"""
            WITH kd AS (SELECT name, row_number() OVER (ORDER BY name) AS kid FROM (
                            SELECT DISTINCT name FROM kernels WHERE trace_id = {int(t)}
                            AND correlation_id IS NOT NULL AND name IS NOT NULL)),
            k AS (SELECT correlation_id, min(kd.kid) AS kid FROM kernels JOIN kd USING (name)
                  WHERE trace_id = {int(t)} AND correlation_id IS NOT NULL GROUP BY ALL),
            r AS (SELECT r.start_ns, r.end_ns, k.kid,
                         CASE WHEN k.kid IS NULL THEN r.name END AS api
                  FROM runtime_calls r LEFT JOIN k ON k.correlation_id = r.correlation_id
                  WHERE r.trace_id = {int(t)} AND r.pid IS NOT DISTINCT FROM $pid
                    AND r.tid IS NOT DISTINCT FROM $tid AND r.start_ns IS NOT NULL
                    AND (r.is_launch OR r.is_sync OR r.name ILIKE '%memcpy%' OR r.name ILIKE '%memset%')),
            td AS (SELECT d.kid, d.api, dense_rank() OVER (ORDER BY COALESCE(kd.name, d.api)) AS tok
                   FROM (SELECT DISTINCT kid, api FROM r) d LEFT JOIN kd USING (kid))
            SELECT r.start_ns, r.end_ns, td.tok FROM r JOIN td
              ON r.kid IS NOT DISTINCT FROM td.kid AND r.api IS NOT DISTINCT FROM td.api
            ORDER BY r.start_ns, r.end_ns, td.tok"""
        arrays = con.execute(q, {"pid": main[0], "tid": main[1]}).fetchnumpy()
        what = "CUDA call"
    elif con.execute("SELECT count(*) FROM kernels WHERE trace_id = ?", [t]).fetchone()[0]:
        arrays = con.execute(f"""
            WITH kd AS (SELECT name, dense_rank() OVER (ORDER BY name) AS tok FROM (
                            SELECT DISTINCT name FROM kernels
                            WHERE trace_id = {int(t)} AND start_ns IS NOT NULL))
            SELECT k.start_ns, k.end_ns, kd.tok FROM kernels k
            JOIN kd ON k.name IS NOT DISTINCT FROM kd.name
            WHERE k.trace_id = {int(t)} AND k.start_ns IS NOT NULL
            ORDER BY k.start_ns, k.end_ns, kd.tok""").fetchnumpy()
        what = "kernel"
    else:
        busiest = con.execute("""SELECT pid, tid FROM cpu_ops WHERE trace_id = ?
                                 GROUP BY ALL ORDER BY count(*) DESC LIMIT 1""", [t]).fetchone()
        if busiest is None:
            return None
        arrays = con.execute(f"""
            SELECT start_ns, end_ns, dense_rank() OVER (ORDER BY name) AS tok FROM (
                {_top_level(con, t, 'cpu_ops', "pid IS NOT DISTINCT FROM $pid AND tid IS NOT DISTINCT FROM $tid")})
            ORDER BY start_ns""", {"pid": busiest[0], "tid": busiest[1]}).fetchnumpy()
        what = "CPU op"
    start = np.asarray(arrays["start_ns"], dtype=np.int64)
    end = np.asarray(arrays["end_ns"], dtype=np.int64)
    tok = np.asarray(arrays["tok"], dtype=np.int64)
    return (start, end, tok, what) if len(tok) else None


def _kgram_hash(tok: np.ndarray, k: int) -> np.ndarray:
    import numpy as np
    n = len(tok) - k + 1
    h = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(k):
            h = h * np.uint64(1_000_003) + tok[j:j + n].astype(np.uint64)
    return h


def find_period(tok: np.ndarray) -> tuple[int, float] | None:
    """The period P (in calls) with which the middle of the sequence repeats itself (score:
    the share of calls equal to the call P later): the best-scoring candidate, or the shortest
    divisor of it within PERIOD_TIE of its score; None if nothing scores MIN_PERIOD_SCORE. Candidates are the usual distances between repeats of the same KGRAM calls."""
    import numpy as np
    n = len(tok)
    if n < 2 * MIN_STEPS:
        return None
    k = min(KGRAM, n)
    h = _kgram_hash(tok, k)
    order = np.argsort(h, kind="stable")
    same = h[order][1:] == h[order][:-1]
    gaps = (order[1:] - order[:-1])[same]
    if not len(gaps):
        return None
    vals, counts = np.unique(gaps, return_counts=True)
    cands = vals[np.argsort(-counts, kind="stable")[:MAX_PERIOD_CANDIDATES]]
    lo = int(n * 0.1)
    scores = {}
    for p in (int(c) for c in cands):
        hi = int(n * 0.9) - p
        if p < 1 or hi - lo < 2 * p or n // p < MIN_STEPS:
            continue
        scores[p] = float(np.mean(tok[lo:hi] == tok[lo + p:hi + p]))
    if not scores:
        return None
    best_p = max(scores, key=lambda q: (scores[q], -q))
    best = scores[best_p]
    if best < MIN_PERIOD_SCORE:
        return None
    # A multiple of the period scores as well as the period: the shortest near-best candidate
    # that divides the best one wins. A candidate that does not divide it is a repeating part
    # of the step (identical layers, the blocks of a stage), not the step.
    p = min(q for q, s in scores.items()
            if s >= best - PERIOD_TIE and _divides(q, best_p))
    return p, scores[p]


def _divides(q: int, p: int) -> bool:
    """q divides p exactly: a layer of 5 calls in a step of 96 layers and one other call
    (481 calls) does not (a tolerance of a call would let every short part divide the step)."""
    return p % q == 0


def _from_period(con: duckdb.DuckDBPyConnection, t: int) -> Inference | None:
    import numpy as np
    seq = _call_sequence(con, t)
    if seq is None:
        return None
    start, end, tok, what = seq
    found = find_period(tok)
    if found is None:
        return None
    p, _score = found
    n = len(tok)
    lead = np.empty(n, dtype=np.int64)
    lead[0] = 0
    lead[1:] = start[1:] - end[:-1]     # how long the host paused before each call
    whole = _repeats_per_step(lead, p)
    if whole is not None:
        return _cut_at_pauses(con, t, what, lead, start, end, p * whole)
    k = min(8, p, n)
    h = _kgram_hash(tok, k)
    m = len(h)
    _, inv, counts = np.unique(h, return_inverse=True, return_counts=True)
    periods = n / p
    # One reference period in the middle: its positions whose KGRAM occurs about once a period.
    ref = np.arange(max(0, m // 2 - p // 2), min(m, m // 2 - p // 2 + p))
    ok = ref[(counts[inv[ref]] >= 0.5 * periods) & (counts[inv[ref]] <= 1.3 * periods)]
    if not len(ok):
        return None
    groups = np.unique(inv[ok])
    pos = np.flatnonzero(np.isin(inv, groups))
    g = inv[pos]
    order = np.argsort(g, kind="stable")
    pos, g = pos[order], g[order]
    split = np.flatnonzero(np.diff(g)) + 1
    best_group, best_lead = None, None
    for chunk in np.split(pos, split):
        med = float(np.median(lead[chunk]))
        if best_lead is None or med > best_lead:
            best_group, best_lead = chunk, med
    anchors = []
    for q in np.sort(best_group):
        if not anchors or q - anchors[-1] >= (1 - PERIOD_SLACK) * p:
            anchors.append(int(q))
    if len(anchors) <= MIN_STEPS:
        return None
    times = [int(end[q - 1]) if q > 0 else int(start[q]) for q in anchors]
    bounds = [(a, b) for a, b in zip(times, times[1:])]
    calls = [b - a for a, b in zip(anchors, anchors[1:])]
    where = (f"{what} sequence; cut after the longest host pause" if best_lead and best_lead > 0
             else f"{what} sequence; cut at the same call of each period")
    inf = _finish(con, t, "period", where, bounds, period=p, calls=calls)
    return inf


def _pause_contrast(lead: np.ndarray, period: int) -> float:
    """How much the host's pause at one place of the period stands out: the sequence folded
    at `period`, the largest per-place median pause over the median pause (at least 1 us).
    A pause is never negative: calls that overlap (streams, integer-us traces rounding
    kernels into each other) paused for none; a median 'pause' of -1 us made the divisor 0
    (none of the fixtures or public traces has a median under 0)."""
    import numpy as np
    windows = len(lead) // period
    folded = lead[:windows * period].reshape(windows, period)
    return float(np.median(folded, axis=0).max()) / (max(float(np.median(lead)), 0.0) + 1_000.0)


def _repeats_per_step(lead: np.ndarray, p: int) -> int | None:
    """When the call period is a repeating part of the step (identical layers, a loop of the
    same ops) the calls alone cannot show the step; the host's pauses can: the step boundary
    (the data wait, the read-back) recurs every m periods. The smallest such m > 1 whose
    folded pause stands out PAUSE_GAIN times more than at one period; None if none does."""
    n = len(lead)
    lo, hi = int(n * 0.1), int(n * 0.9)
    mid = lead[lo:hi]
    if len(mid) > FOLD_CALLS:
        c = len(mid) // 2
        mid = mid[c - FOLD_CALLS // 2: c + FOLD_CALLS // 2]
    most = min(MAX_REPEATS, len(mid) // (MIN_STEPS * p))
    if most < 2:
        return None
    base = _pause_contrast(mid, p)
    if base >= PAUSE_GAIN:
        # A pause already stands out at one period: that is the step. A longer pause every
        # k-th step (a worker round, logging, a checkpoint) must not merge k steps into one.
        return None
    gains = {m: _pause_contrast(mid, m * p) for m in range(2, most + 1)}
    best = max(gains.values())
    if best <= 0 or best < PAUSE_GAIN * base:   # (<= 0: no pause at all, calls overlap)
        return None
    return min(m for m, c in gains.items() if c >= 0.8 * best)


def _cut_at_pauses(con, t: int, what: str, lead: np.ndarray, start: np.ndarray,
                   end: np.ndarray, step_calls: int) -> Inference | None:
    """Steps of about `step_calls` calls, each cut at the longest host pause near where the
    last step's cut says the next one is (so a call more or less per step does not drift)."""
    import numpy as np
    n = len(lead)
    slack = max(1, int(step_calls * 0.1))
    anchors = [int(np.argmax(lead[:step_calls]))]
    while anchors[-1] + step_calls - slack < n:
        a = anchors[-1] + step_calls - slack
        b = min(n, anchors[-1] + step_calls + slack + 1)
        anchors.append(a + int(np.argmax(lead[a:b])))
    if len(anchors) <= MIN_STEPS:
        return None
    times = [int(end[q - 1]) if q > 0 else int(start[q]) for q in anchors]
    bounds = list(zip(times, times[1:]))
    calls = [b - a for a, b in zip(anchors, anchors[1:])]
    return _finish(con, t, "period", f"{what} sequence; a step is a repeating part "
                   "(layers) several times over, cut after the longest host pause",
                   bounds, period=step_calls, calls=calls)


# --- fallback -------------------------------------------------------------------------------

def _gpu_span_step(con: duckdb.DuckDBPyConnection, t: int) -> Inference | None:
    """One step over a small GPU trace's GPU work: from where the host had issued its first
    kernel, copy or memset (the end of the launching call: a first launch that loads the
    modules is start-up; the operation itself where no call is linked) to the end of its last;
    a DataLoader wait that ended before that stays in the step, from its start (the batch the
    work came from). What comes before is start-up (the CUDA context, module loading, the first
    allocations: 2.20 s of a 2.46 s hand-made nsys capture of 46 kernels on the public traces,
    which read as launch-bound ~73x), what comes after is tear-down; both are said. The call is
    the nearest one with the operation's correlation id at or before it (the ids restart in
    each process of a capture)."""
    lo, hi, n = con.execute("""
        WITH g AS (
            SELECT correlation_id, start_ns, end_ns FROM kernels WHERE trace_id = $t
            UNION ALL SELECT correlation_id, start_ns, end_ns FROM memcpy WHERE trace_id = $t
            UNION ALL SELECT correlation_id, start_ns, end_ns FROM memset WHERE trace_id = $t),
        issued AS (
            SELECT g.start_ns, g.end_ns,
                   least(g.start_ns, coalesce(arg_max(r.end_ns, r.start_ns), g.start_ns)) AS issued_at
            FROM g LEFT JOIN runtime_calls r
              ON r.trace_id = $t AND r.correlation_id = g.correlation_id AND r.start_ns <= g.start_ns
            WHERE g.start_ns IS NOT NULL AND g.end_ns IS NOT NULL
            GROUP BY g.correlation_id, g.start_ns, g.end_ns)
        SELECT min(issued_at), max(end_ns), count(*) FROM issued""", {"t": t}).fetchone()
    span = _span(con, t)
    if lo is None or hi is None or hi <= lo or span is None:
        return None
    fed = con.execute("""SELECT max(start_ns) FROM dataloader_waits
                         WHERE trace_id = $t AND end_ns <= $lo""", {"t": t, "lo": lo}).fetchone()[0]
    lo = int(fed) if fed is not None else int(lo)
    return Inference(t, "gpu-window", f"GPU-active span ({n} GPU operations)", [(lo, int(hi))],
                     start_up_ns=max(0, lo - span[0]), tear_down_ns=max(0, span[1] - int(hi)))


def _fallback_windows(con: duckdb.DuckDBPyConnection, t: int) -> Inference | None:
    import numpy as np
    kernels = con.execute("SELECT count(*) FROM kernels WHERE trace_id = ?", [t]).fetchone()[0]
    table, what = ("kernels", "GPU-active span") if kernels else ("cpu_ops", "host-active span")
    if table == "cpu_ops":
        if not con.execute("SELECT count(*) FROM cpu_ops WHERE trace_id = ?", [t]).fetchone()[0]:
            return None
        busy_src = _top_level(con, t, "cpu_ops", "true")
    else:
        busy_src = f"SELECT name, start_ns, end_ns FROM kernels WHERE trace_id = {int(t)}"
    lo, hi, n = con.execute(
        f"SELECT min(start_ns), max(end_ns), count(*) FROM ({busy_src})").fetchone()
    if lo is None or hi <= lo:
        return None
    # A handful of kernels cut into windows would be windows of nothing: a GPU trace is then
    # one step over its GPU work (a CPU-only one is analysed whole by the caller).
    if n < FALLBACK_WINDOWS * FALLBACK_MIN_PER_WINDOW:
        return _gpu_span_step(con, t) if kernels else None
    w = (hi - lo) / FALLBACK_WINDOWS
    edges = [int(lo + i * w) for i in range(FALLBACK_WINDOWS)] + [int(hi)]
    bounds = list(zip(edges, edges[1:]))
    busy = []
    for s, e in bounds:
        busy.append(con.execute(f"""
            SELECT COALESCE(sum(least(end_ns, {e}) - greatest(start_ns, {s})), 0)
            FROM ({busy_src}) WHERE end_ns > {s} AND start_ns < {e}""").fetchone()[0])
    med = float(np.median(busy))
    a, b = 0, len(bounds)
    while a < b - MIN_STEPS and busy[a] < SPARSE_WINDOW * med:
        a += 1
    while b > a + MIN_STEPS and busy[b - 1] < SPARSE_WINDOW * med:
        b -= 1
    span = _span(con, t)
    steps = bounds[a:b]
    return Inference(t, "gpu-window", what, steps, start_up_ns=max(0, steps[0][0] - span[0]),
                     tear_down_ns=max(0, span[1] - steps[-1][1]))
