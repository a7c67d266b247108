"""Where the ranks are analysed: in this process (--workers 1), or in a pool of local
processes (the default). A distributed engine (issue #15) is not done yet: docs/distributed.md.

Each rank is independent work whose result is small (a verdict, findings, two Parquet files of
steps and collectives), so memory is bounded by the ranks in flight at once, one per worker,
not by the job: 64 ranks on 2 workers hold 2 ranks' stores at a time.
"""
from __future__ import annotations

import multiprocessing
import os
from typing import Callable

from ..rules import Rule
from .detect import RankInfo
from .job import RankOutcome, analyse_rank, analyse_rank_task


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _worker_memory(workers: int) -> None:
    """Each worker's DuckDB gets an equal part of NAVDOCTOR_MEMORY_LIMIT (1GB by default),
    so the pool as a whole stays within what one analysis may use."""
    from .. import store
    limit = store.memory_limit()
    num = float("".join(c for c in limit if c.isdigit() or c == "."))
    unit = "".join(c for c in limit if c.isalpha()).upper()
    os.environ[store.MEMORY_LIMIT_ENV] = f"{max(num / workers, 0.125):.3f}{unit}"


def run_ranks(ranks: dict[str, RankInfo], rules: list[Rule], workers: int | None = None,
              progress: Callable[[str], None] = lambda m: None) -> list[RankOutcome]:
    tasks = [(path, info, tid, rules) for tid, (path, info) in enumerate(ranks.items(), start=1)]
    workers = min(workers or default_workers(), len(tasks))
    if workers <= 1:
        out = []
        for t in tasks:
            progress(f"rank {t[1].rank}: analysing {t[0]}")
            out.append(analyse_rank(*t))
        return out
    progress(f"analysing {len(tasks)} ranks on {workers} local processes")
    # spawn, not fork: the parent holds DuckDB and its threads, which a fork would copy
    # mid-state.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, initializer=_worker_memory, initargs=(workers,)) as pool:
        out = []
        # imap keeps the results in rank order and holds only finished ones.
        for o in pool.imap(analyse_rank_task, tasks):
            progress(f"rank {o.rank}: done")
            out.append(o)
        return out
