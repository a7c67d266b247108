"""Which inputs are the ranks of one job: Kineto's `distributedInfo` (rank, world_size,
backend), read from the few keys before 'traceEvents' without loading the trace."""
from __future__ import annotations

import glob
import gzip
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import NavdoctorError, TraceError
from ..loaders import kineto
from ..loaders.base import TraceInput, inflate_limit

# torch writes distributedInfo (and deviceProperties) before traceEvents; 1 MiB holds them
# with room to spare (8 GPUs' properties are ~3 kB).
_HEAD_BYTES = 1 << 20


# The most ranks of a job: rank and world_size are INTEGER columns of the store.
MAX_WORLD_SIZE = 2**31 - 1


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    backend: str | None
    # how the rank's trace is read, where it is not its file alone: one process of a
    # multi-process Nsight Systems export (nsys_split.py)
    trace: TraceInput | None = None


def rank_info(path: str) -> RankInfo | None:
    """The trace's distributedInfo, or None (not Kineto, no distributedInfo, unreadable: the
    loader reports those in its own words)."""
    if not os.path.isfile(path):   # a pipe or a device would block the read: the loader says
        return None
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == kineto.GZIP_MAGIC
        opener = gzip.open if gz else open
        with opener(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
        parsed = kineto._parse_head(head)
        if not parsed:
            return None
        info = parsed[0].get("distributedInfo")
        if info is None:   # other writers put it after the events
            info = _tail_keys(path, opener).get("distributedInfo")
    except (OSError, EOFError, zlib.error, kineto._NotStreamable, UnicodeError, ValueError,
            RecursionError):
        return None   # (the loader says what is wrong with the file, in its own words)
    if not isinstance(info, dict):
        return None
    rank, world = info.get("rank"), info.get("world_size")
    if not isinstance(rank, int) or not isinstance(world, int) or isinstance(rank, bool):
        return None
    if not 0 <= rank < world:
        raise TraceError(path, f"distributedInfo says rank {rank} of world_size {world}")
    if world > MAX_WORLD_SIZE:   # (the store's ranks table holds INTEGER)
        raise TraceError(path, f"distributedInfo says world_size {world}: more ranks than a "
                               f"job can have (at most {MAX_WORLD_SIZE})")
    backend = info.get("backend")
    return RankInfo(rank, world, backend if isinstance(backend, str) else None)


def _tail_keys(path: str, opener) -> dict:
    """The top-level keys after 'traceEvents' (its last _HEAD_BYTES; a gzip is read through)."""
    with opener(path, "rb") as f:
        if opener is open:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(size - _HEAD_BYTES, 0))
            tail = f.read()
        else:   # (no further than the inflate bound: the loader says what is past it)
            tail, left = b"", inflate_limit(path)
            while left > 0 and (chunk := f.read(1 << 22)):
                tail = (tail + chunk)[-_HEAD_BYTES:]
                left -= len(chunk)
            if left <= 0:
                return {}
    found = kineto._parse_tail(tail)
    return found[1] if found else {}


def expand_ranks(spec: str, skip=()) -> list[str]:
    """--ranks DIR|GLOB: the trace files of a folder (Kineto .json/.json.gz), or a glob;
    without navdoctor's own JSON documents (a report written into the ranks' folder, by this
    run or an earlier one, is no rank: the rerun gives the same result) and without `skip`
    (the run's output paths)."""
    from ..report import is_navdoctor_report
    skipped = {os.path.realpath(s) for s in skip if s and s != "-"}

    def rank_file(f: str) -> bool:
        return (os.path.isfile(f) and os.path.realpath(f) not in skipped
                and not is_navdoctor_report(f))
    p = Path(spec)
    if p.is_dir():
        files = sorted(str(f) for f in p.iterdir()
                       if (f.name.endswith(".json") or f.name.endswith(".json.gz")) and rank_file(str(f)))
        if not files:
            raise NavdoctorError(f"--ranks {spec}: no .json or .json.gz trace in this folder")
        return files
    files = sorted(f for f in glob.glob(spec) if rank_file(f))
    if not files:
        raise NavdoctorError(f"--ranks {spec}: no such folder, and no file matches this pattern")
    return files


def job_ranks(paths: list[str], required: bool = False) -> dict[str, RankInfo] | None:
    """{path: RankInfo} when the inputs are two or more ranks of one job; None when they are
    not ranks (analysed together as views of one run, as before). Mixing the two, or ranks of
    different jobs, is an error: no analysis can treat them as one thing."""
    if len(paths) == 1 and not required:
        return None    # one trace is analysed as one trace, rank or not: nothing to read here
    infos = {p: rank_info(p) for p in paths}
    with_rank = [p for p, i in infos.items() if i]
    if not with_rank or (len(paths) == 1 and not required):
        if required:
            raise NavdoctorError(f"--ranks: {paths[0]} has no distributedInfo (rank, world_size): "
                                 "not a rank of a torch.distributed job")
        return None
    if len(with_rank) < len(paths):
        plain = next(p for p in paths if not infos[p])
        raise NavdoctorError(f"{plain}: has no distributedInfo but {with_rank[0]} is rank "
                             f"{infos[with_rank[0]].rank} of a job: give the ranks of one job "
                             "(--ranks), or traces of one process, not both")
    worlds = {infos[p].world_size for p in paths}
    if len(worlds) > 1:
        raise NavdoctorError(f"the traces are ranks of different jobs (world sizes "
                             f"{', '.join(map(str, sorted(worlds)))}): give the ranks of one job")
    seen: dict[int, str] = {}
    for p in paths:
        r = infos[p].rank
        if r in seen:
            raise NavdoctorError(f"{p}: rank {r} again (also {seen[r]}): give each rank once")
        seen[r] = p
    return {p: infos[p] for p in sorted(paths, key=lambda p: infos[p].rank)}
