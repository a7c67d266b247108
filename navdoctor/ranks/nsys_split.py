"""An Nsight Systems export of several processes that each run kernels (a torchrun job
captured with `nsys profile`: one process per GPU) holds the ranks of one job. Each such
process becomes a rank: a temporary export of its own rows, analysed as any rank is; the
job layer then matches their steps and collectives as for Kineto ranks.

The export's rows carry the process in globalPid, or in globalTid, whose bits above the
lowest 24 (the thread id) are the process's (Nsight Systems' serialized global id)."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from ..errors import TraceError
from ..kernelnames import communication_kernel
from .detect import RankInfo

_TID_BITS = 24


def _sqlite_path(path: str, fmt: str, tmp: Path) -> str:
    from ..analysis import gunzip_export
    return path if fmt == "nsys-sqlite" else gunzip_export(path, str(tmp / "export.sqlite"))


def kernel_processes(sqlite_path: str) -> list[int]:
    """The globalPid of every process that ran kernels, by the lowest device it ran them on."""
    con = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
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
            f"GROUP BY globalPid ORDER BY {order}")]
    except sqlite3.Error:
        return []   # the loader says what is wrong with the file, in its own words
    finally:
        con.close()


def _backend(sqlite_path: str) -> str | None:
    """'nccl' when a kernel is a communication kernel (kernelnames, as everywhere)."""
    con = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
    try:
        names = con.execute("SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                            "JOIN StringIds s ON s.id = k.shortName").fetchall()
    except sqlite3.Error:
        return None
    finally:
        con.close()
    return "nccl" if any(communication_kernel(n) for (n,) in names) else None


def _keep_process(con: sqlite3.Connection, gpid: int) -> None:
    """Delete every row of another process: tables with globalPid, or globalTid."""
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for t in tables:
        cols = {r[1] for r in con.execute(f'PRAGMA table_info("{t}")')}
        if "globalPid" in cols:
            con.execute(f'DELETE FROM "{t}" WHERE globalPid IS NOT NULL '
                        f'AND (globalPid >> {_TID_BITS}) != (? >> {_TID_BITS})', (gpid,))
        elif "globalTid" in cols:
            con.execute(f'DELETE FROM "{t}" WHERE globalTid IS NOT NULL '
                        f'AND (globalTid >> {_TID_BITS}) != (? >> {_TID_BITS})', (gpid,))
    con.commit()


def split_ranks(path: str, fmt: str, tmp: Path) -> tuple[dict[str, RankInfo], dict[str, str]] | None:
    """({per-process export: RankInfo}, {per-process export: how the report names it}) when
    the export holds two or more processes that ran kernels; None otherwise (one trace,
    analysed as today). Ranks are numbered by the lowest device each process used."""
    if fmt not in ("nsys-sqlite", "nsys-sqlite.gz"):
        return None
    src_path = _sqlite_path(path, fmt, tmp)
    pids = kernel_processes(src_path)
    if len(pids) < 2:
        return None
    backend = _backend(src_path)
    out: dict[str, RankInfo] = {}
    names: dict[str, str] = {}
    src = sqlite3.connect(f"file:{src_path}?mode=ro", uri=True)
    try:
        for rank, gpid in enumerate(pids):
            dst_path = tmp / f"rank{rank}.sqlite"
            dst = sqlite3.connect(dst_path)
            try:
                src.backup(dst)
                _keep_process(dst, gpid)
            finally:
                dst.close()
            out[str(dst_path)] = RankInfo(rank, len(pids), backend)
            names[str(dst_path)] = f"{path} (process {gpid >> _TID_BITS & 0xFFFFFF})"
    except sqlite3.Error as e:
        raise TraceError(path, f"could not split the export into its processes ({e})") from None
    finally:
        src.close()
    return out, names
