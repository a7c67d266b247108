"""Hostile files and interrupted runs: no hang, no lost output, no injection.

Each test generates its hostile file (small: kB to a few MB on disk) and runs the real
command line in a process of its own, with a timeout, so that a hang fails instead of hanging
CI. docs/reliability.md ("Hostile files and interrupted runs") lists the cases with what the
user sees. What each asserts:

- an input navdoctor cannot use: exit 2 and one line, `navdoctor: error: <the user's file>:
  ...`, no traceback, quickly;
- nothing the user had is changed or lost (the file's bytes, the reports beside it), and no
  temporary file outgrows its input or outlives the run;
- what a name or a rule holds reaches the terminal and the Markdown as text, never as markup
  or an escape sequence.
"""
from __future__ import annotations

import gzip
import hashlib
import re
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, sigint_as_in_a_terminal
from kineto_factory import KinetoTrace
from nsys_factory import NsysExport
from ranks_factory import ALLREDUCE

SMALL_KINETO = FIXTURES / "gpu" / "memory_item_sync" / "kineto.json.gz"


# ---- helpers --------------------------------------------------------------------------------

def _env(tmp_path: Path, **extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    tmp = tmp_path / "TMPDIR"
    tmp.mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp)   # what the run leaves there is checked
    env.update({k: str(v) for k, v in extra.items()})
    return env


def nd(tmp_path: Path, *args, timeout: float = 60, env: dict | None = None, **kw):
    """`navdoctor ARGS` as a process of its own; its temporary folder is tmp_path/TMPDIR."""
    return subprocess.run([sys.executable, "-m", "navdoctor.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env=env or _env(tmp_path), cwd=tmp_path, **kw)


def nd_watched(tmp_path: Path, *args, timeout: float = 60, env: dict | None = None):
    """nd(), sampling the size of the run's temporary folder every 10 ms: (result, peak
    bytes, seconds)."""
    env = env or _env(tmp_path)
    tmp = Path(env["TMPDIR"])
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "navdoctor.cli", *map(str, args)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=tmp_path)
    peak = 0
    done = threading.Event()
    out: dict = {}

    def talk():
        try:
            out["stdout"], out["stderr"] = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:   # a hang: the test fails, it does not hang
            p.kill()
            out["stdout"], out["stderr"] = p.communicate()
            out["stderr"] += f"\n(killed after {timeout} s)"
        finally:
            done.set()
    th = threading.Thread(target=talk, daemon=True)
    th.start()
    while not done.wait(0.01):
        peak = max(peak, _tree_bytes(tmp))
    th.join()
    return (subprocess.CompletedProcess(p.args, p.returncode, out["stdout"], out["stderr"]),
            peak, time.monotonic() - t0)


def _tree_bytes(d: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(d):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def one_line_error(r, path, text: str) -> str:
    """exit 2, and stderr ends in one error line naming the user's file, no traceback."""
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("navdoctor: error")]
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(errors) == 1 and lines[-1] == errors[0], r.stderr
    assert errors[0].startswith(f"navdoctor: error: {path}: "), errors[0]
    assert text in errors[0], errors[0]
    return errors[0]


def temp_left(tmp_path: Path) -> list[str]:
    return sorted(os.listdir(tmp_path / "TMPDIR"))


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def small_export() -> NsysExport:
    x = NsysExport()
    x.gpu()
    for n in range(3):
        x.step(n, n * 10_000_000, n * 10_000_000 + 9_000_000)
        x.kernel(n * 10_000_000 + 1_000_000, n * 10_000_000 + 8_000_000, "ampere_sgemm_128x64_tn")
    return x


def processes_export(path: Path, processes: int = 2) -> Path:
    """One export of a job of `processes` processes (pids 100, 200, ...), one GPU each, an
    NCCL all-reduce per step."""
    ms = 1_000_000
    exp = NsysExport(pid=100)
    t0 = 10 * ms
    for n in range(4):
        end = t0 + 12 * ms
        for i in range(processes):
            exp.pid = exp.tid = 100 * (i + 1)
            exp.step(n, t0, end + ms)
            for k in range(3):
                exp.kernel(t0 + (k + 1) * 2 * ms, t0 + (k + 2) * 2 * ms, "volta_sgemm_128x64_nn",
                           device=i)
            exp.kernel(t0 + 9 * ms, end, ALLREDUCE, short="ncclKernel_AllReduce_RING_LL_Sum_float",
                       device=i, stream=13)
        t0 = end + 2 * ms
    return exp.write(path)


# ---- 1. files that made the run hang ----------------------------------------------------------

def test_export_whose_kernels_are_an_endless_view(tmp_path):
    """CUPTI_ACTIVITY_KIND_KERNEL as a view over an endless recursive query: its SQL is never
    run (only tables are read); the run used to never end, deaf to Ctrl-C."""
    path = small_export().write(tmp_path / "endless.sqlite")
    con = sqlite3.connect(path)
    con.executescript("""
        ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO kernels_real;
        CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS
            WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t)
            SELECT k.* FROM kernels_real k, t;""")
    con.close()
    before = digest(path)
    t0 = time.monotonic()
    r = nd(tmp_path, "analyze", path, "--json", tmp_path / "r.json", timeout=30)
    one_line_error(r, path, "'CUPTI_ACTIVITY_KIND_KERNEL' is a view in this file, not a table")
    assert time.monotonic() - t0 < 20
    assert digest(path) == before and not (tmp_path / "r.json").exists()
    assert temp_left(tmp_path) == []


def test_export_whose_strings_are_a_costly_view(tmp_path):
    """StringIds as a cross join of eight copies of itself (10^16 rows)."""
    path = small_export().write(tmp_path / "join.sqlite")
    con = sqlite3.connect(path)
    con.executescript("""
        ALTER TABLE StringIds RENAME TO s;
        CREATE VIEW StringIds AS SELECT a.id AS id, a.value AS value
            FROM s a, s b, s c, s d, s e, s f, s g, s h;""")
    con.close()
    r = nd(tmp_path, "analyze", path, timeout=30)
    one_line_error(r, path, "'StringIds' is a view in this file, not a table")


def test_multi_process_export_with_a_delete_trigger(tmp_path):
    """A job export whose tables have DELETE, INSERT and UPDATE triggers that write 1 MB per
    row they see (the file of the report wrote 10 GB at each: the temporary folder grew ~1 GB
    every 15 s, deaf to Ctrl-C): splitting it into ranks copied it and deleted from the copy,
    firing them. Now each rank reads the user's file with its process's rows: the job is
    analysed, no trigger fires, the file is unchanged, nothing is made beside it, and the
    temporary folder stays smaller than the export."""
    (tmp_path / "job").mkdir()
    path = processes_export(tmp_path / "job" / "trigger.sqlite")
    con = sqlite3.connect(path)
    bomb = "INSERT INTO junk VALUES (zeroblob(1000000));"
    con.executescript(f"""
        CREATE TABLE junk (x BLOB);
        CREATE TRIGGER on_delete AFTER DELETE ON CUPTI_ACTIVITY_KIND_KERNEL BEGIN {bomb} END;
        CREATE TRIGGER on_insert AFTER INSERT ON CUPTI_ACTIVITY_KIND_KERNEL BEGIN {bomb} END;
        CREATE TRIGGER on_update AFTER UPDATE ON StringIds BEGIN {bomb} END;""")
    con.close()
    before, beside = digest(path), sorted(os.listdir(path.parent))
    r, peak, seconds = nd_watched(tmp_path, "analyze", path, "--workers", "1", "--json",
                                  tmp_path / "job.json", "-q", timeout=120)
    assert r.returncode == 0, r.stderr
    job = json.loads((tmp_path / "job.json").read_text())["job"]
    assert job["ranks"] == 2
    assert [x["path"] for x in job["per_rank"]] == [f"{path} (process {p})" for p in (100, 200)]
    assert digest(path) == before and sorted(os.listdir(path.parent)) == beside
    assert peak < path.stat().st_size, peak   # no copy of the export, let alone one per rank
    assert temp_left(tmp_path) == []


def _gzip_trace(path: Path, text_parts, level: int = 1) -> Path:
    with gzip.open(path, "wb", compresslevel=level) as f:
        for part in text_parts:
            f.write(part.encode() if isinstance(part, str) else part)
    return path


def _events(pad: int = 0) -> str:
    t = KinetoTrace()
    for n in range(3):
        t.step(n, n * 1000, 900)
        t.launch_kernel("ampere_sgemm_128x64_tn", n * 1000 + 10, n * 1000 + 20, 800)
    if pad:   # incompressible bytes: the file's size (and its inflate bound) grows with them
        t.events[0]["args"] = {"pad": os.urandom(pad).hex()}
    return json.dumps(t.events)[1:-1]


def test_gzipped_trace_with_whitespace_beyond_its_bound(tmp_path):
    """97 kB that inflate to 100 MB of whitespace after the events froze the run at 0% CPU
    (the pipe writer gave up and DuckDB waited for a pipe nobody opened). It is more than the
    inflate bound (100x, at least 64 MiB): refused while streaming, in about a second."""
    path = _gzip_trace(tmp_path / "ws.json.gz", ['{"traceEvents": [', _events(), "]",
                                                 *[" " * (1 << 20)] * 80, "}"], level=9)
    assert path.stat().st_size < 200_000
    t0 = time.monotonic()
    r = nd(tmp_path, "analyze", path, "--json", tmp_path / "r.json", timeout=60)
    one_line_error(r, path, "inflates to more than 64 MiB (100x its size, at least 64 MiB)")
    assert time.monotonic() - t0 < 30
    assert temp_left(tmp_path) == []


def test_gzipped_trace_with_whitespace_within_its_bound(tmp_path):
    """66 MB inflated (of a 0.9 MB file: within 100x) with 64 MB of whitespace after the
    events: valid JSON, read (the streamed path gives way to the whole-document read) with
    the verdict of the same trace without the whitespace."""
    events = _events(pad=450_000)
    path = _gzip_trace(tmp_path / "ws.json.gz", ['{"traceEvents": [', events, "]",
                                                 *[" " * (1 << 20)] * 64, "}"])
    plain = _gzip_trace(tmp_path / "plain.json.gz", ['{"traceEvents": [', events, "]}"])
    r = nd(tmp_path, "analyze", path, "--json", tmp_path / "ws.json", "-q", timeout=90)
    assert r.returncode == 0, r.stderr
    assert nd(tmp_path, "analyze", plain, "--json", tmp_path / "plain.json", "-q").returncode == 0
    got, want = (json.loads((tmp_path / n).read_text())["verdict"] for n in ("ws.json", "plain.json"))
    assert (got["bound"], got["steps"], got["shares"]) == (want["bound"], want["steps"], want["shares"])


def test_plain_trace_with_a_long_run_of_whitespace(tmp_path):
    """30 MB of whitespace after the events of an uncompressed trace: it was refused ('Out of
    Memory Error: failed to allocate 2.3 GiB': the whole-document read asked DuckDB for 40x
    the file's size); read in time linear in its size."""
    path = tmp_path / "ws.json"
    with open(path, "w") as f:
        f.write('{"traceEvents": [' + _events() + "]")
        for _ in range(30):
            f.write(" " * (1 << 20))
        f.write("}")
    r = nd(tmp_path, "analyze", path, "--json", tmp_path / "r.json", "-q", timeout=90)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "r.json").read_text())["verdict"]["steps"] == 3


# ---- 2. temporary disk ------------------------------------------------------------------------

def _export_bomb(tmp_path: Path, zero_mb: int, honest_trailer: bool = True) -> Path:
    """An export followed by zero_mb MB of zeros, gzipped (~1000x)."""
    data = small_export().write(tmp_path / "export.sqlite").read_bytes()
    (tmp_path / "export.sqlite").unlink()
    path = _gzip_trace(tmp_path / "bomb.sqlite.gz", [data, *[bytes(1 << 20)] * zero_mb], level=6)
    if not honest_trailer:   # the trailer's size: 0 (a lower bound no more)
        raw = bytearray(path.read_bytes())
        raw[-4:] = bytes(4)
        path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("honest_trailer", [True, False])
def test_compressed_export_inflating_past_its_bound(tmp_path, honest_trailer):
    """A .sqlite.gz was inflated into TMPDIR without limit, twice (1.9 MB became 3.7 GB).
    Now at most 100x its size (at least 64 MiB), counted while inflating: refused, naming the
    user's file; nothing is written where the trailer already says too much, no more than
    the bound where it lies; nothing is left."""
    path = _export_bomb(tmp_path, 200, honest_trailer)
    r, peak, seconds = nd_watched(tmp_path, "analyze", path, timeout=60)
    one_line_error(r, path, "inflates to more than 64 MiB")
    assert peak <= (0 if honest_trailer else (64 << 20) + (1 << 20)), peak
    assert temp_left(tmp_path) == []


def test_compressed_export_error_names_the_users_file(tmp_path):
    """An error inside a .sqlite.gz named the temporary copy ('/tmp/navdoctor-xxx/
    input1.sqlite: ...'), a file the user never had."""
    path = _gzip_trace(tmp_path / "bad.sqlite.gz", [b"SQLite format 3\x00" + b"\x00junk" * 400])
    r = nd(tmp_path, "analyze", path)
    one_line_error(r, path, "corrupt or unreadable SQLite file")


def test_splitting_a_job_export_copies_nothing(tmp_path):
    """Six processes: the split wrote six copies of the whole export (each then pruned); now
    the ranks read the user's file (peak temporary disk under the export's size)."""
    path = processes_export(tmp_path / "six.sqlite", processes=6)
    r, peak, _ = nd_watched(tmp_path, "analyze", path, "--workers", "1", "--json",
                            tmp_path / "six.json", "-q", timeout=180)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "six.json").read_text())["job"]["ranks"] == 6
    assert peak < path.stat().st_size, (peak, path.stat().st_size)


# ---- 3. outputs that replaced one another -----------------------------------------------------

@pytest.mark.parametrize("a,b", [("--json", "--db"), ("--html", "--db"), ("--json", "--markdown"),
                                 ("--json", "--profile"), ("--markdown", "--html")])
def test_two_outputs_at_one_path(tmp_path, a, b):
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = nd(tmp_path, "analyze", SMALL_KINETO, a, out, b, out)
    one_line_error(r, out, "is the path of both")
    assert not out.exists() and not Path(str(out) + ".wal").exists()
    assert time.monotonic() - t0 < 15   # refused before any work


def _run_dir(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    shutil.copy(SMALL_KINETO, d / "kineto.json.gz")
    (d / "report.json").write_text('{"schema_version": "2.11", "tool": "navdoctor 0.1.0", '
                                   '"run": {"dir": "%s"}, "diagnose": "own report"}\n' % d)
    return d


@pytest.mark.parametrize("option,name", [("--json", "report.json"), ("--html", "report.html")])
def test_compare_never_replaces_a_runs_own_report(tmp_path, option, name):
    a, b = _run_dir(tmp_path, "runA"), _run_dir(tmp_path, "runB")
    before = (a / "report.json").read_text()
    r = nd(tmp_path, "compare", a, b, option, a / name)
    one_line_error(r, a / name, "is a file of the run folder of an input")
    assert (a / "report.json").read_text() == before and not (a / "report.html").exists()


def test_ranks_report_in_the_ranks_folder_reruns_the_same(tmp_path):
    """`analyze --ranks DIR --json DIR/report.json` read its own report as a rank on the
    rerun, and failed; the rerun now gives the same report."""
    d = tmp_path / "ranks"
    shutil.copytree(FIXTURES / "synthetic" / "job-straggler", d)
    runs = [nd(tmp_path, "analyze", "--ranks", d, "--workers", "1", "--json", d / "report.json",
               "-q", timeout=120) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[1].stderr
    report = json.loads((d / "report.json").read_text())
    assert report["job"]["ranks"] == 4 and len(report["inputs"]) == 4


# ---- 4. a crash in step finding ---------------------------------------------------------------

def test_identical_kernels_overlapping_by_one_microsecond(tmp_path):
    """50 identical kernels without markers, each starting 1 us before the last ends (the
    median gap -1 us): 'navdoctor: error: ZeroDivisionError', no report. Now steps are
    inferred and the report written."""
    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1000 + i * 10,
               "dur": 11} for i in range(50)]
    path = tmp_path / "overlap.json"
    path.write_text(json.dumps({"traceEvents": events}))
    r = nd(tmp_path, "analyze", path, "--json", tmp_path / "r.json", "-q")
    assert r.returncode == 0 and "Error" not in r.stderr, r.stderr
    assert json.loads((tmp_path / "r.json").read_text())["verdict"]["steps"] > 0


# ---- 5. memory of rule functions and caches --------------------------------------------------

def _rule(directory: Path, rule_id: str, query: str, **fields) -> Path:
    directory.mkdir(exist_ok=True)
    doc = {"id": rule_id, "title": fields.pop("title", rule_id), "category": "other",
           "severity": "low", "query": query, "condition": fields.pop("condition", "n > 0"),
           "message": fields.pop("message", "n = {n}"), **fields}
    path = directory / f"{rule_id}.yaml"
    path.write_text(json.dumps(doc))   # (JSON is YAML)
    return path


def test_rule_functions_on_long_names_keep_no_memory():
    """collective_kind() and communication_kernel() in a rule over 5 000 names of 10 000
    characters: their caches kept every name (100 MB here; 20 000 names: +220 MB resident;
    DuckDB's memory limit does not cover Python's). In the locked-down store the rules run
    in, names over 512 characters bypass the caches (nothing of the names is kept)."""
    import tracemalloc

    import duckdb
    from navdoctor import engine, store
    con = duckdb.connect()
    store.create_schema(con)
    engine.lock_down(con)
    names = "'ncclKernel_AllReduce_' || repeat('x', 10000) || i"
    tracemalloc.start()
    try:
        n = con.execute(f"SELECT count(collective_kind({names})) + count(communication_kernel({names})) "
                        "FROM range(5000) t(i)").fetchone()[0]
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        con.close()
    assert n == 10000   # classified, not refused
    assert held < 5 << 20, held   # (long names in a cache are a 16-byte digest each)


def test_name_caches_hold_no_long_name():
    """The loaders' cache of kernel classifications, fed 2 000 distinct names of 20 000
    characters (40 MB): long names are kept by a 16-byte digest, not whole."""
    import tracemalloc
    from navdoctor.kernelnames import communication_kernel, tensor_core_kernel
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(2000):
            name = f"ampere_sgemm_{i}_" + "x" * 20000
            tensor_core_kernel(name)
            communication_kernel(name)
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert held < 5 << 20, held


def test_a_large_rule_file_is_parsed_not_cached(tmp_path):
    """One 2 MB rule file went whole into the rule-parse cache, which every later analysis
    read (one of 100 MB: 825 MB instead of 105 MB). Texts over 256 kB are parsed each time;
    the cache file stays under 4 MiB."""
    rules = tmp_path / "big"
    _rule(rules, "big-rule", "SELECT 1 AS n", description="x" * (2 << 20))
    cache = tmp_path / "cache"
    env = _env(tmp_path, NAVDOCTOR_CACHE_DIR=cache)
    for _ in range(2):
        r = nd(tmp_path, "rules", "list", "--rules", rules, env=env)
        assert r.returncode == 0 and "big-rule" in r.stdout, r.stderr
    sizes = [p.stat().st_size for p in cache.glob("rules-parsed-*.json")]
    assert sizes and max(sizes) < 1 << 20, sizes


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "too-large"])
def test_rule_file_that_is_no_rule_file(tmp_path, kind):
    """A rule file linked to /dev/zero read until memory ran out, and the error did not name
    it; a named pipe blocked the run."""
    rules = tmp_path / "rules"
    rules.mkdir()
    bad = rules / "bad.yaml"
    if kind == "dev-zero":
        bad.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(bad)
    else:
        bad.write_text("# " + "x" * (5 << 20))
    r = nd(tmp_path, "analyze", SMALL_KINETO, "--rules", rules, timeout=30)
    one_line_error(r, bad, "not a regular file" if kind != "too-large" else "a rule file is at most 4 MiB")


# ---- 6. interrupted and failed runs -----------------------------------------------------------

def test_a_failed_run_leaves_no_database(tmp_path):
    """A failed run left its --db (and .wal), and the retry was refused as 'already exists'."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": ')
    db = tmp_path / "t.duckdb"
    one_line_error(nd(tmp_path, "analyze", bad, "--db", db), bad, "truncated or malformed JSON")
    assert not db.exists() and not Path(str(db) + ".wal").exists()
    r = nd(tmp_path, "analyze", SMALL_KINETO, "--db", db, "-q")
    assert r.returncode == 0 and db.exists(), r.stderr


def _endless_rule(tmp_path: Path) -> Path:
    return _rule(tmp_path / "endless", "endless", "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL "
                 "SELECT n + 1 FROM t) SELECT count(*) AS n FROM t").parent


@pytest.mark.parametrize("sig,code,lines", [
    (signal.SIGTERM, 143, ("navdoctor: terminated",)),
    (signal.SIGINT, 130, ("navdoctor: interrupted", "navdoctor: aborted"))])
def test_a_signal_ends_the_run_within_a_second(tmp_path, sig, code, lines):
    """SIGTERM ended the run with 143 and no message, leaving temporary folders (and the
    partial --db). Sent while a rule runs (endless, with a 60 s limit): the run ends within a
    second, one line, no --db, nothing left in TMPDIR."""
    db = tmp_path / "t.duckdb"
    env = _env(tmp_path, NAVDOCTOR_RULE_TIME_LIMIT_S=60)
    p = subprocess.Popen([sys.executable, "-m", "navdoctor.cli", "analyze", str(SMALL_KINETO),
                          "--rules", str(_endless_rule(tmp_path)), "--db", str(db)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=tmp_path, preexec_fn=sigint_as_in_a_terminal)
    seen = []
    for raw in p.stderr:   # until the rules run
        seen.append(raw)
        if "evaluating" in raw:
            break
    time.sleep(0.5)
    t0 = time.monotonic()
    p.send_signal(sig)
    try:
        rest = p.stderr.read()
        p.wait(timeout=10)
    finally:
        p.kill()
    assert time.monotonic() - t0 < 2.0
    err = "".join(seen) + rest
    assert p.returncode == code and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] in lines
    assert not db.exists() and not Path(str(db) + ".wal").exists()
    assert temp_left(tmp_path) == []


def test_a_signal_stops_a_statement_of_sqlite(tmp_path):
    """SQLite looks at no signal: Ctrl-C inside a statement of its own was ignored until the
    statement ended (never, for an endless one). The export's connections call back into
    Python (errors.sqlite_progress), where the handler notes the signal and stops it."""
    path = small_export().write(tmp_path / "t.sqlite")
    code = textwrap.dedent(f"""
        import os, signal, sqlite3, sys, threading, time
        from navdoctor import errors
        from navdoctor.loaders.nsys import open_export
        signal.signal(signal.SIGTERM, errors.note_terminate)
        con = open_export({str(path)!r})
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
        t0 = time.monotonic()
        try:
            con.execute("WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) "
                        "SELECT count(*) FROM t").fetchall()
        except sqlite3.OperationalError as e:
            print(errors.interrupted(e), round(time.monotonic() - t0, 1))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                       env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    stopped, seconds = r.stdout.split()
    assert stopped == "True" and float(seconds) < 1.5


def test_sigterm_during_a_job_ends_its_workers_quietly(tmp_path):
    """SIGTERM to navdoctor while its rank workers run: it died at once (exit 143, no line),
    and each worker, its parent gone, printed a BrokenPipeError traceback. Now the run ends
    its pool (the workers end quietly), says so in one line, exit 143; Ctrl-C, which a
    terminal sends to every process of the group, is left to the parent by the workers."""
    p = subprocess.Popen([sys.executable, "-m", "navdoctor.cli", "analyze", "--ranks",
                          str(FIXTURES / "synthetic" / "job-straggler"), "--workers", "2",
                          "--rules", str(_endless_rule(tmp_path))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=_env(tmp_path, NAVDOCTOR_RULE_TIME_LIMIT_S=60), cwd=tmp_path)
    seen = []
    for raw in p.stderr:
        seen.append(raw)
        if "local processes" in raw:
            break
    time.sleep(4)   # the workers have started and run the endless rule
    p.send_signal(signal.SIGTERM)
    try:
        rest = p.stderr.read()   # (until every worker, which shares the pipe, is gone)
        p.wait(timeout=30)
    finally:
        p.kill()
    err = "".join(seen) + rest
    assert p.returncode == 143 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == "navdoctor: terminated"


# ---- 7. injection ---------------------------------------------------------------------------

HOSTILE_NAME = ("evil<!-- hidden --> [x](http://example.com) <img src=x> | `tick` *b* "
                "\x1b]52;c;cGF5bG9hZA==\x07 \x1b]0;title\x07 \x1b]8;;http://e\x1b\\link\x1b]8;;\x1b\\ "
                "\x1b[2J \x9b31m \r\nfake line")


def test_a_code_block_cannot_be_closed_by_its_code():
    """The answer's code in a Markdown summary: a fence longer than any run of backticks in it,
    each line kept and made safe for a terminal."""
    from navdoctor.textsafe import markdown_block
    block = markdown_block("a = 1\n```\nb = '\x1b]52;c;x\x07'", "python")
    assert block[0] == "````python" and block[-1] == "````"
    assert block[1:3] == ["a = 1", "```"] and "\x1b" not in "".join(block)


def test_names_and_rule_texts_are_text_in_markdown_and_on_the_terminal(tmp_path):
    """A kernel name holding '<!--' hid the rest of a GitHub step summary; names, file names
    and rule texts went into the Markdown raw, and OSC sequences in them (clipboard, window
    title, links) reached the terminal."""
    t = KinetoTrace()
    for n in range(3):
        t.step(n, n * 1000, 900)
        t.launch_kernel(HOSTILE_NAME, n * 1000 + 10, n * 1000 + 20, 800)
    trace = Path(t.write(tmp_path / "evil<!--name.json"))
    rules = tmp_path / "rules"
    _rule(rules, "evil-rule", "SELECT any_value(name) AS top_kernel, count(*) AS n FROM kernels",
          title="Title <!-- \x1b]0;pwned\x07", message="kernel {top_kernel}",
          remedies=[{"title": "do <b>this</b>", "text": "[click](http://e) \x1b[8m",
                     "code": "x = `y`\x1b]52;c;eA==\x07"}])
    md = tmp_path / "summary.md"
    r = nd(tmp_path, "analyze", trace, "--rules", rules, "--markdown", md)
    assert r.returncode == 0, r.stderr
    for stream in (r.stdout, r.stderr, md.read_text()):
        assert not any(c in stream for c in "\x1b\x07\x9b\r"), repr(stream[:3000])
    assert "\\x1b]52;c;cGF5bG9hZA==\\x07" in r.stdout   # shown, as text
    assert not any(line.startswith("fake line") for line in r.stdout.splitlines())
    text = md.read_text()
    first, rest = text.split("\n", 1)
    assert first.startswith("<!-- navdoctor report")
    # no markup but navdoctor's own: no HTML tag or comment, no link, no image
    assert set(re.findall(r"(?<!\\)<[/!A-Za-z][^\s>]*", rest)) <= {"<sub", "</sub"}, rest
    assert not re.search(r"(?<!\\)\]\(", rest), rest
    assert "Title \\<!--" in rest and "evil\\<!--name.json" in rest
    assert "do \\<b\\>this\\</b\\>: \\[click\\](http://e)" in rest
    assert "``x = `y`\\x1b]52;c;eA==\\x07``" in rest   # the code span holds it whole


# ---- 8. errors without a name, or raw -------------------------------------------------------

def test_deeply_nested_rule_yaml(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    deep = rules / "deep.yaml"
    deep.write_text("x: " + "[" * 50000 + "]" * 50000)
    one_line_error(nd(tmp_path, "rules", "check", rules), deep, "nested too deeply")


def test_deeply_nested_json_before_the_events(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"deviceProperties": ' + "[" * 100000 + "]" * 100000
                    + ', "traceEvents": [' + _events() + "]}")
    r = nd(tmp_path, "analyze", path, "--json", tmp_path / "r.json", "-q")
    assert r.returncode == 0 and "RecursionError" not in r.stderr, r.stderr


def test_deeply_nested_sql_fails_its_rule_alone(tmp_path):
    """400 nested calls in one rule aborted the whole run (RecursionError, no file named)."""
    rules = tmp_path / "rules"
    _rule(rules, "deep-sql", "SELECT " + "abs(" * 400 + "1" + ")" * 400 + " AS n")
    r = nd(tmp_path, "analyze", SMALL_KINETO, "--rules", rules, "--json", tmp_path / "r.json", "-q")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    errors = {e["rule"]: e["error"] for e in report["rule_errors"]}
    assert "nested too deeply" in errors["deep-sql"] and str(rules / "deep-sql.yaml") in errors["deep-sql"]
    assert report["findings"]   # the other rules ran


def test_world_size_past_what_a_job_can_have(tmp_path):
    """world_size >= 2^31 failed with a DuckDB conversion error after every rank ran."""
    paths = []
    for rank in range(2):
        t = KinetoTrace(distributed={"backend": "nccl", "rank": rank, "world_size": 2**31})
        t.step(0, 0, 900)
        t.launch_kernel("k", 10, 20, 800)
        paths.append(t.write(tmp_path / f"rank{rank}.json"))
    t0 = time.monotonic()
    one_line_error(nd(tmp_path, "analyze", *paths), paths[0], "more ranks than a job can have")
    assert time.monotonic() - t0 < 15


@pytest.mark.parametrize("option,where,text", [
    ("--db", "missing/t.duckdb", "directory missing does not exist"),
    ("--json", "newdir/", "is a directory (--json needs a file path)"),
    ("--db", "newdir/", "is a directory (--db needs a file path)")])
def test_output_path_refused_before_any_work(tmp_path, option, where, text):
    """A --db in a missing folder ended in a raw IOException, and --json newdir/ failed once
    the whole analysis was done."""
    t0 = time.monotonic()
    r = nd(tmp_path, "analyze", SMALL_KINETO, option, where)
    one_line_error(r, where, text)
    assert time.monotonic() - t0 < 15


def test_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
    """A full disk read 'navdoctor: error: OSError: [Errno 28] ...'."""
    from navdoctor import cli
    from navdoctor import report as report_mod
    out = tmp_path / "r.json"

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(report_mod.os, "fsync", full)
    monkeypatch.setattr(sys, "argv", ["navdoctor", "analyze", str(SMALL_KINETO), "--json", str(out), "-q"])
    with pytest.raises(SystemExit) as e:
        cli.run()
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert err.strip() == f"navdoctor: error: {out}: cannot write: No space left on device (the file is as it was)"
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".navdoctor-")]


def test_terminal_that_cannot_show_unicode(tmp_path):
    """A kernel name in Unicode on a Latin-1 terminal: UnicodeEncodeError once the analysis
    was done, no report shown. Now what the terminal cannot show is shown as an escape."""
    t = KinetoTrace()
    for n in range(3):
        t.step(n, n * 1000, 900)
        t.launch_kernel("ядро_卷积_kernel", n * 1000 + 10, n * 1000 + 20, 800)
    trace = t.write(tmp_path / "u.json")
    rules = tmp_path / "rules"
    _rule(rules, "name-rule", "SELECT any_value(name) AS top_kernel, 1 AS n FROM kernels",
          message="kernel {top_kernel}")
    r = nd(tmp_path, "analyze", trace, "--rules", rules,
           env=_env(tmp_path, PYTHONIOENCODING="latin-1"))
    assert r.returncode == 0 and "Error" not in r.stderr, r.stderr
    assert "\\u044f\\u0434\\u0440\\u043e_\\u5377\\u79ef_kernel" in r.stdout


def test_no_cache_under_a_home_that_does_not_exist(tmp_path):
    """HOME=/nonexistent (a service account): the rule caches created it (as root) and wrote
    there."""
    home = tmp_path / "nonexistent"
    env = _env(tmp_path, HOME=home)
    for key in ("NAVDOCTOR_CACHE_DIR", "XDG_CACHE_HOME"):
        env.pop(key, None)
    r = nd(tmp_path, "analyze", SMALL_KINETO, "-q", env=env)
    assert r.returncode == 0, r.stderr
    assert not home.exists()
