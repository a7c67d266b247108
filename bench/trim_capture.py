"""Turn `navdoctor diagnose` run directories into small test fixtures.

    python bench/trim_capture.py RUNS_DIR DEST [--max-mb 15]

RUNS_DIR holds one folder per corpus entry (as `bench/run_corpus.py --runs-dir` writes them:
RUNS_DIR/<id>/<run>/{kineto.json.gz, nsys.sqlite, report.json}). For each entry's latest run,
DEST/<id>/ gets kineto.json.gz as captured, nsys.sqlite.gz without the tables navdoctor never
reads and that make exports large (OS-runtime call stacks, the profiler's own overhead and
diagnostics), and report.json. Then DEST is packed into archives of at most --max-mb each
(DEST-1.tar, DEST-2.tar, ...) so that each can travel back from a machine with a per-file limit.
"""
from __future__ import annotations

import argparse
import gzip
import shutil
import sqlite3
import sys
import tarfile
from pathlib import Path

UNREAD_TABLES = ("OSRT_CALLCHAINS", "PROFILER_OVERHEAD", "DIAGNOSTIC_EVENT", "SAMPLING_CALLCHAINS",
                 "COMPOSITE_EVENTS", "SCHED_EVENTS")


def trim_sqlite(src: Path, dest_gz: Path) -> None:
    tmp = dest_gz.with_suffix("")          # DEST/<id>/nsys.sqlite
    shutil.copyfile(src, tmp)
    con = sqlite3.connect(tmp)
    present = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for table in UNREAD_TABLES:
        if table in present:
            con.execute(f'DROP TABLE "{table}"')
    con.commit()
    con.execute("VACUUM")
    con.close()
    with open(tmp, "rb") as f, gzip.open(dest_gz, "wb", compresslevel=9) as out:
        shutil.copyfileobj(f, out)
    tmp.unlink()


def folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.iterdir()) / 1e6


def latest_run(entry_dir: Path) -> Path | None:
    runs = sorted((d for d in entry_dir.iterdir() if d.is_dir() and (d / "kineto.json.gz").exists()),
                  key=lambda d: d.name)
    return runs[-1] if runs else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs_dir", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--max-mb", type=float, default=15.0)
    opts = p.parse_args()
    opts.dest.mkdir(parents=True, exist_ok=True)
    for entry_dir in sorted(d for d in opts.runs_dir.iterdir() if d.is_dir()):
        run = latest_run(entry_dir)
        if run is None:
            print(f"{entry_dir.name}: no captured run", file=sys.stderr)
            continue
        out = opts.dest / entry_dir.name
        out.mkdir(exist_ok=True)
        shutil.copyfile(run / "kineto.json.gz", out / "kineto.json.gz")
        if (run / "nsys.sqlite").exists():
            trim_sqlite(run / "nsys.sqlite", out / "nsys.sqlite.gz")
        for name in ("report.json", "torch-pass.log", "nsys-pass.log", "status-timing.json",
                     "status-timing2.json"):
            if (run / name).exists():
                shutil.copyfile(run / name, out / name)
        print(f"{entry_dir.name}: {folder_mb(out):.1f} MB")
    pack(opts.dest, opts.max_mb)
    return 0


def pack(dest: Path, max_mb: float) -> None:
    """Greedy: entries in name order, a new archive whenever the next would pass max_mb."""
    parts: list[list[Path]] = [[]]
    used = 0.0
    for entry in sorted(d for d in dest.iterdir() if d.is_dir()):
        size = folder_mb(entry)
        if parts[-1] and used + size > max_mb:
            parts.append([])
            used = 0.0
        parts[-1].append(entry)
        used += size
    for i, entries in enumerate(parts, 1):
        archive = dest.parent / f"{dest.name}-{i}.tar"
        with tarfile.open(archive, "w") as tar:
            for entry in entries:
                tar.add(entry, arcname=entry.name)
        print(f"{archive}: {archive.stat().st_size / 1e6:.1f} MB, {[e.name for e in entries]}")


if __name__ == "__main__":
    sys.exit(main())
