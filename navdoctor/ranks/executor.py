"""Where the ranks are analysed: in this process (--workers 1), in a pool of local processes
(--executor local, the default), or on Dask distributed (--executor dask: a LocalCluster this
process starts, or an existing cluster with --scheduler ADDRESS). docs/distributed.md says why
Dask and not Ray.

Every executor runs the same task (job.analyse_rank) and hands back the same RankOutcome: a
verdict, findings and two small Parquet files (its steps and its collectives), which
job.build_job merges in DuckDB whatever ran them. Memory is bounded by the ranks in flight at
once, one per worker (thread), not by the job: 64 ranks on 2 workers hold 2 ranks' stores at a
time, and the parent holds only the finished outcomes.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import re
import tempfile
from typing import Callable, Iterator

from .. import store
from ..errors import NavdoctorError
from ..rules import Rule
from .detect import RankInfo
from .job import RankOutcome, analyse_rank, analyse_rank_task

EXECUTORS = ("local", "dask")
DASK_INSTALL = ("--executor dask needs Dask distributed, which is not installed: "
                "pip install 'navdoctor[dask]' (or pip install 'dask[distributed]')")

Progress = Callable[[str], None]
Task = tuple  # (path, RankInfo, trace_id, rules): job.analyse_rank's arguments

_UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def limit_bytes(limit: str) -> int:
    """A DuckDB size ('1GB', '512MB', '1.5GiB') in bytes (store.memory_limit checked its form)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", limit)
    if not m or m.group(2).upper() not in _UNITS:
        raise NavdoctorError(f"{store.MEMORY_LIMIT_ENV}={limit!r} is not a size such as 4GB")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def share_of_limit(parts: int) -> str:
    """An equal part of NAVDOCTOR_MEMORY_LIMIT (1GB by default), so that all the ranks in
    flight together stay within what one analysis may use (at least 128 MB: below that DuckDB
    spills all the time)."""
    return f"{max(limit_bytes(store.memory_limit()) // max(parts, 1), 128 * 2**20)}B"


def _worker_memory(workers: int) -> None:
    """A pool worker's set-up: its share of the memory limit; and Ctrl-C left to the parent
    (the terminal sends SIGINT to every process of the group: a worker would print its own
    traceback), which ends the pool (its workers get SIGTERM and end at once)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ[store.MEMORY_LIMIT_ENV] = share_of_limit(workers)


# ---- the executors: each yields one RankOutcome per task, in any order ------------------------

def _run_local(tasks: list[Task], workers: int, progress: Progress,
               scheduler: str | None) -> Iterator[RankOutcome]:
    if workers <= 1:
        for t in tasks:
            progress(f"rank {t[1].rank}: analysing {t[0]}")
            yield analyse_rank(*t)
        return
    progress(f"analysing {len(tasks)} ranks on {workers} local processes")
    # spawn, not fork: the parent holds DuckDB and its threads, which a fork would copy
    # mid-state.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, initializer=_worker_memory, initargs=(workers,)) as pool:
        # imap holds only finished results, and chunks of one: a rank is seconds of work.
        yield from pool.imap(analyse_rank_task, tasks)


def _dask_task(task: Task, client_limit: str, local_share: str | None) -> RankOutcome:
    """One rank on a Dask worker. Its DuckDB gets `local_share` on the LocalCluster (as a
    pool worker would), else half of this worker's memory per thread (the other half is
    Python's: the loader's buffers, the worker itself), at most the client's own limit."""
    limit = local_share
    if limit is None:
        # the client's limit, not one left in this worker's environment by an earlier job
        limit = client_limit
        try:
            from distributed import get_worker
            w = get_worker()
            if w.memory_manager.memory_limit:
                per_thread = w.memory_manager.memory_limit // max(w.state.nthreads, 1) // 2
                limit = f"{max(min(per_thread, limit_bytes(limit)), 128 * 2**20)}B"
        except (ImportError, ValueError, AttributeError):
            pass
    # The store reads its limit from the environment. Every task of a job on one worker
    # computes the same value, so threads of a worker that write it at once agree.
    os.environ[store.MEMORY_LIMIT_ENV] = limit
    return analyse_rank(*task)


def _run_dask(tasks: list[Task], workers: int, progress: Progress,
              scheduler: str | None) -> Iterator[RankOutcome]:
    try:
        import distributed
    except ImportError:
        raise NavdoctorError(DASK_INSTALL) from None
    if scheduler:
        try:   # a malformed address fails here, before a Client exists to be torn down
            distributed.comm.get_address_host_port(scheduler)
        except ValueError as e:
            raise NavdoctorError(f"--scheduler {scheduler}: not a Dask scheduler address such "
                                 f"as tcp://host:8786 ({_first_line(e)})") from None
        progress(f"connecting to the Dask scheduler at {scheduler}")
        try:
            client = distributed.Client(scheduler, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as e:
            raise NavdoctorError(f"--scheduler {scheduler}: cannot reach a Dask scheduler there "
                                 f"({_first_line(e)})") from None
        cluster, local_share = None, None
    else:
        import dask
        share = share_of_limit(workers)
        progress(f"analysing {len(tasks)} ranks on a Dask LocalCluster of {workers} workers")
        # Worker logs stay quiet: a failed rank is reported once, as one line, by navdoctor.
        # One thread per worker process: DuckDB and the JSON parser are already parallel, and
        # one rank per process keeps a worker's memory that of one rank, its DuckDB within
        # `share` as a pool worker's. Dask's own memory limit is the machine's memory split
        # among the workers ('auto'): the nanny restarts a worker that would take more.
        # Spilling and pausing are off: a worker's results are kB (nothing to spill), and its
        # memory is the analysis in flight, which pausing does not free (a paused worker
        # waits for its memory to fall back, which what a process keeps after a rank need
        # not do: the job would wait). The nanny keeps this config
        # for the workers it starts and restarts.
        with dask.config.set({"distributed.worker.memory.target": False,
                              "distributed.worker.memory.spill": False,
                              "distributed.worker.memory.pause": False}):
            cluster = distributed.LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, memory_limit="auto",
                dashboard_address=None, silence_logs=logging.CRITICAL,
                local_directory=tempfile.gettempdir())
        client = distributed.Client(cluster, set_as_default=False)
        local_share = share
    try:
        client_limit = store.memory_limit()
        # pure=False: two ranks never share a result; the rules go with every task (a few kB).
        futures = [client.submit(_dask_task, t, client_limit, local_share, pure=False,
                                 key=f"navdoctor-rank-{t[1].rank}-{os.getpid()}-{t[2]}")
                   for t in tasks]
        for fut in distributed.as_completed(futures, loop=client.loop):
            try:
                outcome = fut.result()
            except distributed.client.FutureCancelledError as e:
                raise NavdoctorError(f"Dask cancelled a rank's task ({_first_line(e)})") from None
            except distributed.KilledWorker as e:
                raise NavdoctorError(
                    "a Dask worker died while analysing a rank (out of memory? give the "
                    f"workers more memory, or lower {store.MEMORY_LIMIT_ENV}): "
                    f"{_first_line(e)}") from None
            fut.release()    # the worker may forget it: the outcome is here now
            yield outcome
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


_EXECUTORS = {"local": _run_local, "dask": _run_dask}


def dask_available() -> bool:
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


def run_ranks(ranks: dict[str, RankInfo], rules: list[Rule], workers: int | None = None,
              progress: Progress = lambda m: None, executor: str = "local",
              scheduler: str | None = None) -> list[RankOutcome]:
    """Every rank analysed by `executor`; the outcomes in rank order (trace ids), whichever
    order they finished in, so every executor gives the job the same input."""
    if executor not in _EXECUTORS:
        raise NavdoctorError(f"--executor {executor}: choose from {', '.join(EXECUTORS)}")
    tasks = [(path, info, tid, rules) for tid, (path, info) in enumerate(ranks.items(), start=1)]
    workers = min(workers or default_workers(), len(tasks))
    out = []
    for o in _EXECUTORS[executor](tasks, workers, progress, scheduler):
        progress(f"rank {o.rank}: done")
        out.append(o)
    return sorted(out, key=lambda o: o.trace_id)
