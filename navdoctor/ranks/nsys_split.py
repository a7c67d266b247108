"""An Nsight Systems export of several processes that each run kernels (a torchrun job
captured with `nsys profile`: one process per GPU) holds the ranks of one job. Each such
process becomes a rank: the export itself, loaded with only that process's rows
(loaders/nsys.load_nsys_sqlite(process=...)), analysed as any rank is; the job layer then
matches their steps and collectives as for Kineto ranks.

Nothing of the export is copied or written: every rank reads the user's file (a .sqlite.gz
is inflated once, within loaders/base.inflate_limit, and its ranks read that copy), so the
temporary disk a job takes does not grow with its processes, and the file's own SQL (views,
triggers) never runs (loaders/nsys.open_export).

The export's rows carry the process in globalPid, or in globalTid, whose bits above the
lowest 24 (the thread id) are the process's (Nsight Systems' serialized global id)."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from ..errors import interrupted
from ..kernelnames import communication_kernel
from ..loaders.base import TraceInput, inflate_bounded
from ..loaders.nsys import TID_BITS, export_objects, open_export
from .detect import RankInfo


def _sqlite_path(path: str, fmt: str, tmp: Path) -> str:
    return path if fmt == "nsys-sqlite" else inflate_bounded(path, str(tmp / "export.sqlite"))


def _tables(con: sqlite3.Connection) -> set[str]:
    """The file's tables (not its views or virtual tables), as the loader sees them."""
    return set(export_objects(con)[0].values())


def kernel_processes(sqlite_path: str) -> list[int]:
    """The globalPid of every process that ran kernels, by the lowest device it ran them on."""
    try:
        con = open_export(sqlite_path)
    except sqlite3.Error:
        return []   # the loader says what is wrong with the file, in its own words
    try:
        tables = _tables(con)
        if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
            return []
        # A process that ran kernels made CUDA streams: where the export lists them, one
        # process there (the usual export) spares the scan of every kernel below.
        if "TARGET_INFO_CUDA_STREAM" in tables and con.execute(
                "SELECT count(DISTINCT processId) FROM TARGET_INFO_CUDA_STREAM").fetchone()[0] == 1:
            return []
        cols = {r[1] for r in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")}
        if "globalPid" not in cols:
            return []
        order = "min(deviceId), globalPid" if "deviceId" in cols else "globalPid"
        return [r[0] for r in con.execute(
            f"SELECT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE globalPid IS NOT NULL "
            f"GROUP BY globalPid ORDER BY {order}") if isinstance(r[0], int)]
    except sqlite3.Error as e:
        if interrupted(e):
            raise KeyboardInterrupt from None
        return []   # the loader says what is wrong with the file, in its own words
    finally:
        con.close()


def _backend(sqlite_path: str) -> str | None:
    """'nccl' when a kernel is a communication kernel (kernelnames, as everywhere)."""
    con = open_export(sqlite_path)
    try:
        if not {"CUPTI_ACTIVITY_KIND_KERNEL", "StringIds"} <= _tables(con):
            return None
        names = con.execute("SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                            "JOIN StringIds s ON s.id = k.shortName").fetchall()
    except sqlite3.Error as e:
        if interrupted(e):
            raise KeyboardInterrupt from None
        return None
    finally:
        con.close()
    return "nccl" if any(isinstance(n, str) and communication_kernel(n) for (n,) in names) else None


def split_ranks(path: str, fmt: str, tmp: Path) -> tuple[dict[str, RankInfo], TraceInput | None]:
    """({rank's name: RankInfo}, None) when the export holds two or more processes that ran
    kernels: each RankInfo's `trace` reads the user's file (or its one inflated copy) with
    that process's rows alone, and the rank is named '<file> (process <pid>)'. Otherwise
    ({}, the export as one input: its inflated copy, where a .sqlite.gz was inflated here, so
    that the analysis does not inflate it again), or ({}, None) for what is no export. Ranks
    are numbered by the lowest device each process used."""
    if fmt not in ("nsys-sqlite", "nsys-sqlite.gz"):
        return {}, None
    src_path = _sqlite_path(path, fmt, tmp)
    one = TraceInput(path, sqlite=src_path if src_path != path else None)
    pids = kernel_processes(src_path)
    if len(pids) < 2:
        return {}, one
    backend = _backend(src_path)
    ranks: dict[str, RankInfo] = {}
    for rank, gpid in enumerate(pids):
        pid = gpid >> TID_BITS & 0xFFFFFF
        name = f"{path} (process {pid})"
        if name in ranks:   # the same pid on two machines (globalPid's upper bits differ)
            name = f"{path} (process {pid}, rank {rank})"
        ranks[name] = RankInfo(rank, len(pids), backend,
                               trace=TraceInput(path, sqlite=one.sqlite, process=gpid, shown=name))
    return ranks, None
