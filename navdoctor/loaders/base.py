"""What every loader returns, and helpers they share."""
from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass, field

from ..errors import TraceError


@dataclass
class LoadResult:
    path: str
    format: str            # 'kineto-json', 'kineto-json.gz', 'nsys-sqlite', 'nsys-rep'
    source: str            # 'kineto' or 'nsys' (the `source` column of every row)
    producer: str = ""     # 'torch 2.11.0', 'nsys 2025.3.1', ... when known
    start_ns: int | None = None
    end_ns: int | None = None
    events: int = 0        # rows loaded into the store
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TraceInput:
    """One input as the analysis reads it, where it is more than a path: `path` is the
    user's file, and errors and warnings name it so; `sqlite` an inflated copy of a
    .sqlite.gz already made (by the rank split), read instead of inflating it again;
    `process` a globalPid whose rows alone are loaded (one rank of a multi-process Nsight
    Systems export); `shown` how the report and its warnings name it (default: path)."""
    path: str
    sqlite: str | None = None
    process: int | None = None
    shown: str | None = None

    @property
    def name(self) -> str:
        return self.shown or self.path


def trace_input(item: "str | TraceInput") -> TraceInput:
    return item if isinstance(item, TraceInput) else TraceInput(str(item))


# ---- compressed inputs -------------------------------------------------------------------

# A gzip-compressed input is inflated to at most this many times its size, or to
# INFLATE_FLOOR bytes where that is more (small files). Real traces inflate 10-32x (the
# fixtures and public traces: docs/reliability.md); deflate can reach 1032x, so without a
# bound a 2 MB file became 3.7 GB in the temporary folder (or in memory) before anything
# said no. The bound is checked while inflating: no more than it is ever written.
MAX_INFLATE_RATIO = 100
INFLATE_FLOOR = 64 << 20


def inflate_limit(path: str) -> int:
    """The most bytes the gzip file at path may inflate to."""
    return max(MAX_INFLATE_RATIO * os.path.getsize(path), INFLATE_FLOOR)


def too_large_text(limit: int) -> str:
    return (f"inflates to more than {limit / 2**20:,.0f} MiB ({MAX_INFLATE_RATIO}x its size, "
            f"at least {INFLATE_FLOOR >> 20} MiB): not a trace a profiler writes (a gzip bomb?)")


def gzip_trailer_size(path: str) -> int:
    """The uncompressed size the gzip trailer records (of its last member, modulo 2**32): a
    lower bound of the real size (0 where unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(-4, 2)
            return int.from_bytes(f.read(4), "little")
    except OSError:
        return 0


def inflate_bounded(path: str, dest: str, shown: str | None = None) -> str:
    """The gzip file at path inflated into dest, at most inflate_limit(path) bytes (checked
    while writing; the partial file is removed): TraceError naming the user's file
    (`shown`) if it is more, corrupt, or cannot be written (a full disk)."""
    shown = shown or path
    limit = inflate_limit(path)
    # Where the trailer says more than the bound (a truncated file's last bytes say anything),
    # the stream is first inflated without being written: a file that is too large then
    # costs no disk at all.
    try:
        too_large = gzip_trailer_size(path) > limit and _inflates_past(path, limit)
    except (EOFError, zlib.error, OSError):
        too_large = False   # (corrupt: said below, in the words of the copy)
    if too_large:
        raise TraceError(shown, too_large_text(limit))
    written = 0
    try:
        with gzip.open(path, "rb") as src, open(dest, "wb") as out:
            while True:
                chunk = src.read(1 << 20)
                if not chunk:
                    break
                written += len(chunk)
                if written > limit:
                    raise TraceError(shown, too_large_text(limit))
                out.write(chunk)
    except TraceError:
        _remove(dest)
        raise
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        _remove(dest)
        raise TraceError(shown, f"gzip data is corrupt ({e})") from None
    except OSError as e:
        _remove(dest)
        if e.errno is None:   # gzip's own errors carry no errno
            raise TraceError(shown, f"gzip data is corrupt ({e})") from None
        raise TraceError(shown, f"cannot inflate it into {os.path.dirname(dest)}: "
                                f"{e.strerror or e}") from None
    except BaseException:
        _remove(dest)
        raise
    return dest


def _inflates_past(path: str, limit: int) -> bool:
    n = 0
    with gzip.open(path, "rb") as src:
        while chunk := src.read(1 << 20):
            n += len(chunk)
            if n > limit:
                return True
    return False


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
