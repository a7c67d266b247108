"""The fast paths added for large traces (issue #7) give what the plain paths give.

- Kineto: the events array read through several pipes (cut between top-level events) loads
  the same rows as one pipe and as the whole-document path, plain and gzipped, also when
  names and args are full of text that looks like an event boundary;
- the integer fast path for µs timestamps equals the DECIMAL conversion;
- the *_in_steps views (ASOF join when steps do not overlap) hold the rows of the range join;
- DuckDB's memory is bounded and spills go to a private folder.
"""
from __future__ import annotations

import json
import random
import re

import duckdb
import pytest

from navdoctor import breakdown, steady, stepjoin, store, views
from navdoctor.errors import NavdoctorError, TraceError
from navdoctor.loaders import kineto
from navdoctor.loaders.kineto import load_kineto
from conftest import FIXTURES
from kineto_factory import KinetoTrace

TABLES = ["kernels", "memcpy", "memset", "runtime_calls", "cpu_ops", "nvtx_ranges", "steps",
          "dataloader_waits", "sync_events", "memory_events", "threads", "device_info"]
TRICKY = ['}, {"ph": "X"', "}\n,\n{", '"}, {"', "a]}", "plain", "{}", "],[", "\\\"}, {"]


def tricky_trace(n_steps: int = 40, seed: int = 7, tricky: bool = False) -> KinetoTrace:
    """A trace of n_steps steps; with tricky, names and args hold event-boundary look-alikes
    (a cut there must never be taken)."""
    rnd = random.Random(seed)
    pick = (lambda: rnd.choice(TRICKY)) if tricky else (lambda: "")
    t = KinetoTrace("modern")
    ts = 0.0
    for s in range(n_steps):
        t.step(s, ts, 900.5)
        for i in range(12):
            name = f"aten::op{i} {pick()}"
            t.op(name, ts + 10 + i * 60, 50.25)
            t.x("python_function", f"f.py({i}): g {pick()}", ts + 11 + i * 60, 20,
                **{"Python id": i, "nested": [{"a": pick()}, {"b": [1, {"c": 2}]}] if tricky
                   else {"a": [1, 2]}})
            t.launch_kernel(f"k{i % 3}", ts + 12 + i * 60, ts + 20 + i * 60, 30.125,
                            grid=[i + 1, 1, 1], block=[128, 1, 1])
        t.memcpy("HtoD", "Pageable", "Device", ts + 800, ts + 805, 40, 1_000_000 + s)
        t.sync(ts + 850, 30)
        t.memory(ts + 860, 10**9 + s)
        ts += 1000
    t.dataloader(5.0, 100)
    return t


def contents(con: duckdb.DuckDBPyConnection) -> dict:
    return {tb: con.execute(f"SELECT * FROM {tb} ORDER BY ALL").fetchall() for tb in TABLES}


def load(path, monkeypatch, segment=None, whole_document=False, streamed=None, batch=None):
    with monkeypatch.context() as m:
        if segment is not None:
            m.setattr(kineto, "_SEGMENT", segment)
        if batch is not None:
            m.setattr(kineto, "_BATCH_PIPES", batch)
        if whole_document:
            m.setattr(kineto, "_read_streaming", lambda con, p, c, rows, whole=None: False)
        elif streamed is not None:
            real = kineto._read_streaming
            m.setattr(kineto, "_read_streaming",
                      lambda con, p, c, rows, whole=None:
                      streamed.append(real(con, p, c, rows, whole)) or streamed[-1])
        con = store.open_store()
        res = load_kineto(con, str(path), 1)
        return contents(con), res


@pytest.mark.parametrize("gz", [False, True])
def test_tricky_text_loads_the_same_rows(tmp_path, monkeypatch, gz):
    path = tricky_trace(tricky=True).write(tmp_path / "t.json", gz=gz)
    whole, _ = load(path, monkeypatch, whole_document=True)
    for segment in (1500, 4096, None):
        got, _ = load(path, monkeypatch, segment=segment)
        assert got == whole, segment


@pytest.mark.parametrize("gz", [False, True])
def test_pieces_load_the_same_rows(tmp_path, monkeypatch, gz):
    path = tricky_trace().write(tmp_path / "t.json", gz=gz)
    pieces = []
    real = kineto.os.mkfifo

    def counting(fifo, *a, **kw):
        pieces.append(fifo)
        return real(fifo, *a, **kw)

    monkeypatch.setattr(kineto.os, "mkfifo", counting)
    streamed: list[bool] = []
    one, res1 = load(path, monkeypatch, streamed=streamed)
    assert len(pieces) == 1
    pieces.clear()
    many, res2 = load(path, monkeypatch, segment=4096, streamed=streamed)
    assert len(pieces) > 10
    pieces.clear()
    # batches of 3 pipes: the events go into the store batch by batch
    batched, res4 = load(path, monkeypatch, segment=4096, batch=3, streamed=streamed)
    assert len(pieces) > 10
    assert streamed == [True, True, True]  # all through the pipes, none fell back
    whole, res3 = load(path, monkeypatch, whole_document=True)
    assert one == many == batched == whole
    assert res1.events == res2.events == res3.events == res4.events
    assert res1.warnings == res2.warnings == res3.warnings == res4.warnings
    assert (res1.start_ns, res1.end_ns) == (res3.start_ns, res3.end_ns) == (res4.start_ns, res4.end_ns)
    assert len(one["kernels"]) == 40 * 12 and len(one["steps"]) == 40


@pytest.mark.parametrize("inflate_max", [0, 2000, None])
def test_gzipped_pieces_inflated_or_streamed_load_the_same_rows(tmp_path, monkeypatch, inflate_max):
    """A small gzipped trace is inflated into memory and its pieces written at once; a large
    one (here: _INFLATE_MAX 0) streams through _StreamPieces; one whose gzip trailer
    understates its size (2**32 wraps: here the trailer is believed, and the inflated bytes
    pass _INFLATE_MAX = 2000) streams what it already inflated, then the rest."""
    path = tricky_trace().write(tmp_path / "t.json", gz=True)
    whole, res0 = load(path, monkeypatch, whole_document=True)
    with monkeypatch.context() as m:
        if inflate_max is not None:
            m.setattr(kineto, "_INFLATE_MAX", inflate_max)
            m.setattr(kineto, "gzip_trailer_size", lambda p: 0)
        for segment, min_piece in ((None, None), (4096, None), (None, 1000)):
            if min_piece is not None:
                m.setattr(kineto, "_MIN_PIECE", min_piece)
            streamed: list[bool] = []
            got, res = load(path, monkeypatch, segment=segment, streamed=streamed, batch=3)
            assert streamed == [True]
            assert got == whole, (segment, min_piece)
            assert (res.events, res.warnings) == (res0.events, res0.warnings)


def test_a_small_trace_is_cut_into_one_piece_per_core(monkeypatch):
    monkeypatch.setattr(kineto.os, "cpu_count", lambda: 2)
    assert kineto._piece_count(100) == 1
    assert kineto._piece_count(24 << 20) == 2
    assert kineto._piece_count(100 << 20) == 3   # one per _SEGMENT
    monkeypatch.setattr(kineto.os, "cpu_count", lambda: 64)
    assert kineto._piece_count(24 << 20) == 6    # pieces of _MIN_PIECE at least
    assert kineto._piece_count(1 << 30) == 32


def test_a_cut_inside_a_string_is_never_taken(tmp_path, monkeypatch):
    """Names made of event-boundary look-alikes: wherever the cuts land, the rows are right
    (a cut inside a string makes a piece malformed, and the whole-document path reads it)."""
    t = KinetoTrace("modern")
    for i in range(300):
        t.op('x}, {"ph": "X", "name": "fake"}, {' * 30 + str(i), i * 10, 5)
    path = t.write(tmp_path / "t.json")
    whole, _ = load(path, monkeypatch, whole_document=True)
    for segment in (512, 1000, 3333, 10**6):
        got, _ = load(path, monkeypatch, segment=segment)
        assert got == whole, segment
    assert len(whole["cpu_ops"]) == 300


def test_malformed_middle_is_still_an_error(tmp_path, monkeypatch):
    path = tricky_trace(10).write(tmp_path / "t.json")
    text = open(path).read()
    bad = tmp_path / "bad.json"
    cut = text.index('}, {"ph"', len(text) // 2) + 1  # between two events, mid-array
    bad.write_text(text[:cut] + ", {{{" + text[cut:])
    with pytest.raises(TraceError, match="malformed"):
        load(bad, monkeypatch, segment=2048)


US = ["0", "-0", "5381300149300.03", "5381300149300.123", "1.5", "1.", ".5", "-.5", "12.3456",
      "1e3", " 7", "+5", "9999999999999.999", "99999999999999", "-1234567890123.4",
      "1_000", "abc", "", "0.0004996", "3999999999999999.9996", "4000000000000000", None,
      # where DECIMAL(18,3) and DECIMAL(38,6) part (_us_to_ns): 15-16 integer digits, 4+
      # decimals (rounded by either), exponents, and what neither cast reads
      "999999999999999.999", "999999999999999.9995", "-999999999999999.999",
      "1000000000000000.001", "0.0005", "-0.0005", "0.0004999", "2.4995", "-2.4995",
      "2.4996", "1.5e-4", "1.2345678e2", "1E3", "-1.5e2", "nan", "inf", "0x10", "1.2.3",
      "9223372036854775.807", "12 ", "0.000", "-0.000"]


def test_us_to_ns_fast_path_equals_decimal():
    con = duckdb.connect()
    exact = (f"CASE WHEN abs(TRY_CAST(x AS DECIMAL(38,6))) < {kineto._MAX_ABS_US} "
             "THEN CAST(round(TRY_CAST(x AS DECIMAL(38,6)) * 1000) AS BIGINT) END")
    rows = con.execute(f"SELECT x, {kineto._us_to_ns('x')}, {exact} FROM unnest(?) t(x)",
                       [US]).fetchall()
    for x, fast, slow in rows:
        assert fast == slow, x
    assert dict((r[0], r[1]) for r in rows)["5381300149300.03"] == 5381300149300030


def test_int_of_equals_coalesce():
    con = duckdb.connect()
    values = ["7", "-3", "stream 7", "stream -2", "x", "", "1.5", "99999999999999999999", None]
    old = ("COALESCE(TRY_CAST(x AS BIGINT), TRY_CAST(NULLIF(regexp_extract(CAST(x AS VARCHAR), "
           "'(-?[0-9]+)', 1), '') AS BIGINT))")
    rows = con.execute(f"SELECT x, {kineto._int_of('x')}, {old} FROM unnest(?) t(x)",
                       [values]).fetchall()
    for x, new, was in rows:
        assert new == was, x


def _store_with_steps(steps):
    con = store.open_store()
    for i, (s, e) in enumerate(steps):
        con.execute("INSERT INTO steps VALUES (1, 'kineto', ?, ?, ?, ?, 'ProfilerStep', ?, ?)",
                    [i, s, e, None if s is None or e is None else e - s, s, e])
    rnd = random.Random(3)
    for j in range(400):
        t0 = rnd.randrange(-50, 1200)
        con.execute("INSERT INTO kernels (trace_id, source, name, start_ns, end_ns, dur_ns) "
                    "VALUES (1, 'kineto', ?, ?, ?, 5)", [f"k{j}", t0, t0 + 5])
    return con


def _break_down_and_make_views(con) -> None:
    """Steps as their own breakdown rows (no time in any bucket), then the views."""
    con.execute(breakdown.BREAKDOWN_DDL)
    con.execute("""INSERT INTO step_breakdown SELECT trace_id, source, step_num, start_ns, end_ns,
                   end_ns - start_ns, 0, 0, 0, 0, 0, 0, 0, 0, false FROM steps""")
    views.create_views(con)


def _assert_kernels_in_steps_is_the_range_join(con) -> None:
    got = con.execute("SELECT name, step_num FROM kernels_in_steps ORDER BY ALL").fetchall()
    want = con.execute("""
        SELECT x.name, st.step_num FROM kernels x JOIN steady_steps st
          ON x.trace_id = st.trace_id AND x.start_ns >= st.start_ns AND x.start_ns < st.end_ns
        ORDER BY ALL""").fetchall()
    assert got == want and want


_NESTED = [(0, 1200)] + [(10 * i, 10 * i + 3) for i in range(100)]       # one step holds many
_RANDOM = [(s, s + random.Random(s).randrange(1, 300))
           for s in random.Random(5).sample(range(-20, 1200), 60)]         # overlaps everywhere


@pytest.mark.parametrize("bins", [True, False])
@pytest.mark.parametrize("steps", [
    [(0, 100), (100, 250), (300, 300), (400, 1000), (None, 50), (1000, None)],  # no overlap
    [(0, 100), (50, 250), (400, 1000)],                                           # overlap
    [(0, 100), (0, 100), (200, 300)],                                             # same start
    [(100, 131)], [(5, 1205)], _NESTED, _RANDOM,
])
@pytest.mark.parametrize("small,few", [(False, False), (True, False), (True, True)])
def test_in_steps_views_equal_the_range_join(steps, bins, small, few, monkeypatch):
    """Time bins (a hash join) when the steps spread over them, else the ASOF or range join
    (and, in a small store, whenever no two steps overlap, the ASOF join, or the range join
    where no trace keeps more than RANGE_MAX_STEPS steps): the rows of the range join
    either way."""
    if not small:
        monkeypatch.setattr(stepjoin, "ASOF_MAX_EVENTS", -1)
    if not few:
        monkeypatch.setattr(stepjoin, "RANGE_MAX_STEPS", -1)
    if not bins:
        monkeypatch.setattr(stepjoin, "MAX_STEPS_PER_BIN", -1)
    con = _store_with_steps(steps)
    _break_down_and_make_views(con)
    # Too few steps for a stall: every step with a duration is kept.
    assert len(steps) >= steady.STALL_MIN_STEPS or con.execute("SELECT count(*) FROM steady_steps").fetchone()[0] == \
        sum(1 for s, e in steps if s is not None and e is not None and e > s)
    _assert_kernels_in_steps_is_the_range_join(con)
    assert stepjoin.bins_fit(con) == bins
    if small:
        sql = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'kernels_in_steps'").fetchone()[0]
        assert (" ASOF " in sql) == (not stepjoin.steps_overlap(con, "start_ns", "end_ns")
                                     and not stepjoin.few_steps(con))
        assert stepjoin.few_steps(con) == (few and con.execute(
            "SELECT count(*) FROM steady_steps").fetchone()[0] <= stepjoin.RANGE_MAX_STEPS)


def test_memory_is_bounded_and_spills_in_a_private_folder(monkeypatch):
    monkeypatch.delenv(store.MEMORY_LIMIT_ENV, raising=False)
    con = store.open_store()
    limit, tmp = con.execute("SELECT current_setting('memory_limit'), "
                             "current_setting('temp_directory')").fetchone()
    assert limit == duckdb.connect().execute("SET memory_limit='1GB'; "
                                             "SELECT current_setting('memory_limit')").fetchone()[0]
    assert tmp != ".tmp" and "navdoctor-spill-" in tmp
    monkeypatch.setenv(store.MEMORY_LIMIT_ENV, "3GB")
    assert store.open_store().execute("SELECT current_setting('memory_limit')").fetchone()[0] == \
        duckdb.connect().execute("SET memory_limit='3GB'; SELECT current_setting('memory_limit')").fetchone()[0]
    for bad in ("3GB'; DROP TABLE steps; --", "4", "lots"):
        monkeypatch.setenv(store.MEMORY_LIMIT_ENV, bad)
        with pytest.raises(NavdoctorError, match="not a size"):
            store.open_store()


def test_a_bad_memory_limit_stops_every_command_but_its_help(monkeypatch, tmp_path):
    from click.testing import CliRunner
    from navdoctor.cli import main
    monkeypatch.setenv(store.MEMORY_LIMIT_ENV, "lots")
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": []}')
    for command in ("analyze", "diagnose", "verify"):
        helped = CliRunner().invoke(main, [command, "--help"])
        assert helped.exit_code == 0 and "Usage:" in helped.output, helped.output
    import subprocess
    import sys
    refused = subprocess.run([sys.executable, "-m", "navdoctor.cli", "analyze", str(trace)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "not a size" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


# The sync cycles as the two ASOF joins computed them before issue #19 (a reference).
_SYNC_CYCLES_BY_ASOF = f"""
    WITH y AS (
        SELECT trace_id, pid, tid, start_ns, end_ns,
               lead(start_ns) OVER (PARTITION BY trace_id, pid, tid ORDER BY start_ns) AS next_sync
        FROM sync_events),
    yy AS (
        SELECT trace_id, pid IS NULL AS pn, COALESCE(pid, 0) AS pv, tid IS NULL AS tn,
               COALESCE(tid, 0) AS tv, end_ns, next_sync
        FROM y WHERE next_sync > end_ns),
    r AS (
        SELECT trace_id, pid IS NULL AS pn, COALESCE(pid, 0) AS pv, tid IS NULL AS tn,
               COALESCE(tid, 0) AS tv, start_ns,
               count(*) OVER (PARTITION BY trace_id, pid, tid ORDER BY start_ns
                              RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS upto
        FROM runtime_calls
        WHERE start_ns IS NOT NULL
          AND (is_launch OR name ILIKE '%memcpy%' OR name ILIKE '%memset%')),
    counted AS (
        SELECT yy.trace_id, yy.end_ns, yy.next_sync,
               COALESCE(b.upto, 0) - COALESCE(a.upto, 0) AS n
        FROM yy
        ASOF LEFT JOIN r a
          ON a.trace_id = yy.trace_id AND a.pn = yy.pn AND a.pv = yy.pv AND a.tn = yy.tn
         AND a.tv = yy.tv AND a.start_ns < yy.end_ns
        ASOF LEFT JOIN r b
          ON b.trace_id = yy.trace_id AND b.pn = yy.pn AND b.pv = yy.pv AND b.tn = yy.tn
         AND b.tv = yy.tv AND b.start_ns < yy.next_sync)
    SELECT trace_id, end_ns AS s, next_sync AS e
    FROM counted
    GROUP BY trace_id, end_ns, next_sync
    HAVING sum(n) <= {breakdown.MAX_LAUNCHES_BETWEEN_SYNCS}"""


@pytest.mark.parametrize("seed", range(6))
def test_sync_cycles_equal_the_asof_joins(seed):
    """One sorted pass over calls and cycle ends counts what the two ASOF joins counted:
    threads with NULL pid/tid, calls at the very time a cycle starts or ends, duplicate syncs,
    two traces."""
    rnd = random.Random(seed)
    con = store.open_store()
    threads = [(1, 1), (1, 2), (None, 3), (2, None), (None, None)]
    names = ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaEventRecord"]
    for trace in (1, 2):
        for _ in range(300):
            pid, tid = rnd.choice(threads)
            t0 = rnd.randrange(0, 2000)
            name = rnd.choice(names)
            con.execute("INSERT INTO runtime_calls (trace_id, source, pid, tid, name, start_ns, "
                        "end_ns, dur_ns, is_launch, is_sync) VALUES (?, 'x', ?, ?, ?, ?, ?, 1, ?, false)",
                        [trace, pid, tid, name, t0, t0 + 1, name == "cudaLaunchKernel"])
        for _ in range(60):
            pid, tid = rnd.choice(threads)
            t0 = rnd.randrange(0, 2000)
            for _ in range(rnd.choice([1, 1, 2])):  # now and then the same sync twice
                con.execute("INSERT INTO sync_events (trace_id, source, pid, tid, kind, start_ns, "
                            "end_ns, dur_ns) VALUES (?, 'x', ?, ?, 'stream', ?, ?, 1)",
                            [trace, pid, tid, t0, t0 + rnd.choice([0, 1, 7])])
    want = con.execute(f"SELECT * FROM ({_SYNC_CYCLES_BY_ASOF}) ORDER BY ALL").fetchall()
    assert want and breakdown.streaming_windows(con)
    for streaming in (False, True):   # counted per thread; counted in one pass of all threads
        got = con.execute(f"SELECT * FROM ({breakdown.sync_cycles_sql(streaming)}) ORDER BY ALL").fetchall()
        assert got == want


@pytest.mark.parametrize("overlap", [False, True])
def test_step_alignment_with_bins_equals_the_joins(overlap, monkeypatch):
    """The calls of each step's host window, found through time bins, move the steps as the
    ASOF join (windows apart) or the range join (windows overlapping) moved them; so does a
    small store, which does not try the bins."""
    def aligned(bins: bool, small: bool = False):
        with monkeypatch.context() as m:
            if not small:
                m.setattr(stepjoin, "ASOF_MAX_EVENTS", -1)
            if not bins:
                m.setattr(stepjoin, "MAX_STEPS_PER_BIN", -1)
            rnd = random.Random(11)
            con = store.open_store()
            for i in range(30):
                s = 1000 * i
                e = s + (1500 if overlap and i % 4 == 0 else 600)
                con.execute("INSERT INTO steps VALUES (1, 'nsys', ?, ?, ?, ?, 'nvtx', ?, ?)",
                            [i, s, e, e - s, s, e])
            for corr in range(400):
                t0 = rnd.randrange(0, 31000)
                con.execute("INSERT INTO runtime_calls (trace_id, source, correlation_id, name, "
                            "start_ns, end_ns, dur_ns, is_launch, is_sync) "
                            "VALUES (1, 'nsys', ?, 'cudaLaunchKernel', ?, ?, 5, true, false)",
                            [corr, t0, t0 + 5])
                lag = rnd.choice([10, 200_000])
                con.execute("INSERT INTO kernels (trace_id, source, correlation_id, name, start_ns, "
                            "end_ns, dur_ns) VALUES (1, 'nsys', ?, 'k', ?, ?, 50)",
                            [corr, t0 + lag, t0 + lag + 50])
            assert stepjoin.bins_fit(con, "steps", "cpu_start_ns", "cpu_end_ns") == bins
            breakdown.align_steps_to_gpu(con)
            return con.execute("SELECT * FROM steps ORDER BY ALL").fetchall()

    assert aligned(True) == aligned(False) == aligned(True, small=True)


def test_steps_that_all_span_the_trace_do_not_use_bins():
    """Steps that each cover the whole trace would list every step in every bin: the check
    counts the entries without listing them, and the views keep the range join."""
    steps = [(0, 1200)] * 300 + [(i, i + 1) for i in range(0, 1200, 100)]
    con = _store_with_steps(steps)
    _break_down_and_make_views(con)
    assert not stepjoin.bins_fit(con)
    _assert_kernels_in_steps_is_the_range_join(con)


def _batched_equals_whole(path, monkeypatch, **kw):
    """Through pipes of ~2 kB, 2 to a batch (many batches), the rows and the load result are
    those of the whole-document path."""
    streamed: list[bool] = []
    got, res = load(path, monkeypatch, segment=2048, batch=2, streamed=streamed)
    whole, res_w = load(path, monkeypatch, whole_document=True)
    assert got == whole
    assert (res.events, res.warnings, res.start_ns, res.end_ns) == \
        (res_w.events, res_w.warnings, res_w.start_ns, res_w.end_ns)
    return streamed, got


@pytest.mark.parametrize("gz", [False, True])
def test_what_needs_the_whole_trace_is_decided_over_all_batches(tmp_path, monkeypatch, gz):
    """Steps, blocking runtime calls (dropped once a cuda_sync event appears in a later
    batch), thread names and ac2g flows of a legacy trace (the flow of a kernel in one batch
    and the kernel in another) come out as one pass over the whole trace gives them."""
    t = tricky_trace(30)
    legacy = KinetoTrace("legacy")
    for s in range(30):
        legacy.step(s, s * 1000, 900)
        for i in range(6):
            legacy.launch_kernel(f"k{i}", s * 1000 + 10 + i * 50, s * 1000 + 20 + i * 50, 30)
    # the flows of the first steps at the end of the array: other batches than their kernels
    flows = [e for e in legacy.events if e.get("cat") == "ac2g"][:20]
    legacy.events = [e for e in legacy.events if e not in flows] + flows
    for at in (0, len(legacy.events)):   # the same thread named in two batches
        legacy.events.insert(at, {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1,
                                  "ts": legacy._ts(0), "args": {"name": "python"}})
    streamed, rows = _batched_equals_whole(legacy.write(tmp_path / "l.json", gz=gz), monkeypatch)
    assert streamed == [True]
    assert len(rows["steps"]) == 30 and len(rows["threads"]) == 1
    assert sum(1 for k in rows["kernels"] if k[4] is not None) == 180   # correlation from flows
    # a cuda_sync event near the end: the blocking runtime calls gathered so far are dropped
    t.cuda_sync(50_000, 3)
    streamed, rows = _batched_equals_whole(t.write(tmp_path / "t.json", gz=gz), monkeypatch)
    assert streamed == [True]
    assert [r[5] for r in rows["sync_events"]] == ["Stream Sync"]


@pytest.mark.parametrize("gz", [False, True])
def test_a_null_in_a_later_batch_takes_the_rows_out_again(tmp_path, monkeypatch, gz):
    """A null in the events array (which only the whole-document path skips right) found in a
    later batch, after earlier batches went into the store: their rows are taken out, the
    whole-document path reads the trace, and the store holds each row once."""
    t = tricky_trace(30)
    t.events.insert(len(t.events) * 3 // 4, None)
    streamed, rows = _batched_equals_whole(t.write(tmp_path / "t.json", gz=gz), monkeypatch)
    assert streamed == [False]
    assert len(rows["kernels"]) == 30 * 12


def test_memory_limit_bytes():
    con = duckdb.connect()
    for limit, expect in (("1GB", 1e9), ("512MB", 512e6), ("2GiB", 2 * 2**30)):
        con.execute(f"SET memory_limit = '{limit}'")
        assert store.memory_limit_bytes(con) == pytest.approx(expect, rel=0.01)


def test_needs_checkpoint_at_its_share_of_the_limit():
    """Both loaders checkpoint when DuckDB's memory passes store.CHECKPOINT_SHARE of its limit."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS x FROM range(2000000)")
    used = con.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchall()[0][0]
    assert used > 0
    assert store.needs_checkpoint(con, used / store.CHECKPOINT_SHARE * 0.9)
    assert not store.needs_checkpoint(con, used / store.CHECKPOINT_SHARE * 1.1)


def test_job_views_without_ranks_keep_their_columns():
    """Outside a job the job views are views of no rows, with the columns and types of the
    real ones (which rules bind against); with ranks they are the real views."""
    from navdoctor.views import job as job_views
    con = store.open_store()
    con.execute(breakdown.BREAKDOWN_DDL)
    job_views.create_job_views(con)
    real = {v: con.execute(f"DESCRIBE {v}").fetchall() for v in job_views.JOB_VIEWS}
    job_views.create_or_empty_job_views(con)
    for v in job_views.JOB_VIEWS:
        assert con.execute(f"DESCRIBE {v}").fetchall() == real[v]
        assert con.execute(f"SELECT count(*) FROM {v}").fetchone()[0] == 0
        assert "WHERE false" in con.execute(
            f"SELECT sql FROM duckdb_views() WHERE view_name = '{v}'").fetchone()[0]
    con.execute("INSERT INTO ranks VALUES (1, 0, 2, 'nccl', 'p', 'compute', 1.0)")
    job_views.create_or_empty_job_views(con)
    assert "WHERE false" not in con.execute(
        "SELECT sql FROM duckdb_views() WHERE view_name = 'job_summary'").fetchone()[0]


def _store_for_rules():
    from navdoctor import analysis
    con = store.connect_new(None)
    analysis.prepare_store(con, [str(FIXTURES / "gpu" / "io_jpeg_decode" / "kineto.json.gz")])
    return con


def test_rules_on_two_threads_give_what_one_gives(monkeypatch):
    from navdoctor import engine
    from navdoctor.rules import Rule, load_rules
    rules = load_rules([]) + [
        Rule(id="fails", title="t", category="io", severity="low", query="SELECT nope FROM kernels",
             condition="n > 0", message="m"),
        Rule(id="fires", title="t", category="io", severity="low",
             query="SELECT trace_id, count(*) AS n FROM kernels GROUP BY trace_id",
             condition="n > 0", message="{n} kernels")]
    con = _store_for_rules()
    got = {}
    for workers in ("1", "2", "3"):
        monkeypatch.setenv("NAVDOCTOR_RULE_WORKERS", workers)
        ev = engine.evaluate_rules(con, rules)
        got[workers] = ([(f.rule.id, f.metrics, f.message) for f in ev.findings],
                        [(f.rule_id, f.error) for f in ev.failures], ev.evaluated)
    assert got["1"] == got["2"] == got["3"]
    assert "fires" in {f[0] for f in got["2"][0]} and [f[0] for f in got["2"][1]] == ["fails"]


def test_rules_read_the_snapshot_of_trace_summary_as_they_read_the_view(monkeypatch):
    """Rule cursors hold trace_summary as a temporary table (engine.SNAPSHOT_VIEWS): every
    rule gives the rows it gives on the view, and the store keeps its view and no table more."""
    from navdoctor import engine
    from navdoctor.rules import load_rules, sql_params
    rules = load_rules([])
    con = _store_for_rules()
    tables = con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()
    cur = engine.rule_cursor(con)
    assert cur.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary "
                       "AND table_name = 'trace_summary'").fetchone()[0] == 1
    for rule in rules:
        q, p = rule.query, sql_params(rule)
        assert cur.execute(q, p).fetchall() == con.execute(q, p).fetchall(), rule.id
    cur.close()
    assert con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall() == tables
    assert con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'trace_summary'"
                       ).fetchone()[0] == 1


def test_ctrl_c_stops_the_rules_that_run(monkeypatch):
    """Ctrl-C while two rules run on their threads: KeyboardInterrupt in the caller, both
    queries stopped, and the store's connection closes (no cursor left busy)."""
    import _thread
    import signal
    import threading
    import time
    from navdoctor import engine
    from navdoctor.rules import Rule
    slow = [Rule(id=f"slow{i}", title="t", category="io", severity="low",
                 query="SELECT count(*) AS n FROM range(100000000000) t(i) WHERE i % 7 = 3",
                 condition="n < 0", message="m") for i in range(3)]
    monkeypatch.setenv("NAVDOCTOR_RULE_WORKERS", "2")
    con = _store_for_rules()
    # Ctrl-C as a terminal delivers it: a suite started as a background job (`pytest &`, some
    # CI runners) inherits SIGINT ignored, and interrupt_main then does nothing
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(0.5, _thread.interrupt_main).start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.evaluate_rules(con, slow, time_limit_s=60)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.perf_counter() - t0 < 10
    con.close()


def test_ctrl_c_while_a_rule_cursor_is_made_is_not_swallowed():
    """rule_cursor copies SNAPSHOT_VIEWS into temp tables and leaves a view it cannot copy to
    the rules (any duckdb.Error); DuckDB reports Ctrl-C as duckdb.InterruptException, a
    duckdb.Error, which must stop the analysis, not be taken for a view it cannot copy."""
    from navdoctor import engine

    class Cursor:
        closed = False

        def execute(self, sql):
            raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

        def close(self):
            Cursor.closed = True

    class Con:
        def cursor(self):
            return Cursor()

    with pytest.raises(KeyboardInterrupt):
        engine.rule_cursor(Con())
    assert Cursor.closed

    class Failing(Cursor):
        def execute(self, sql):
            raise duckdb.CatalogException("no such view")

    class Con2:
        def cursor(self):
            return Failing()

    assert isinstance(engine.rule_cursor(Con2()), Failing)    # other errors: left to the views


def test_ctrl_c_while_a_worker_makes_its_snapshots_stops_the_rules(monkeypatch):
    """With two workers each makes its cursor's SNAPSHOT_VIEWS itself; a Ctrl-C there is
    raised in the caller, and no rule runs on that cursor."""
    from navdoctor import engine
    from navdoctor.rules import load_rules
    monkeypatch.setenv("NAVDOCTOR_RULE_WORKERS", "2")
    con = store.open_store()
    made = []

    def interrupted(cur):
        made.append(cur)
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "add_snapshots", interrupted)
    ran = []
    monkeypatch.setattr(engine, "run_query", lambda *a, **k: ran.append(a) or [])
    with pytest.raises(KeyboardInterrupt):
        engine.evaluate_rules(con, load_rules([], {})[:4])
    assert len(made) == 2 and not ran
    con.close()


def test_rules_run_one_at_a_time_on_a_large_store(monkeypatch):
    from navdoctor import engine
    monkeypatch.delenv("NAVDOCTOR_RULE_WORKERS", raising=False)
    con = _store_for_rules()
    assert engine.rule_workers(con) == min(2, __import__("os").cpu_count() or 1)
    monkeypatch.setattr(engine, "PARALLEL_RULES_MAX_ROWS", 100)
    assert engine.rule_workers(con) == 1
    monkeypatch.setenv("NAVDOCTOR_RULE_WORKERS", "3")
    assert engine.rule_workers(con) == 3


# ---- issue #19, the phases after the load --------------------------------------------------

def _random_calls(con, rnd: random.Random, traces=(1, 2), n: int = 400) -> None:
    """CUDA calls of several threads (NULL pid or tid among them), nested and overlapping, at
    equal times, with gaps around HOST_WORK_GAP_NS (one less, equal, one more), of two traces;
    one thread launches too little to count as a launching thread."""
    gap = breakdown.HOST_WORK_GAP_NS
    threads = [(1, 1), (1, 2), (None, 3), (2, None), (None, None), (1, 9)]
    for trace in traces:
        t = rnd.randrange(0, 1000)
        for _ in range(n):
            pid, tid = rnd.choice(threads)
            launch = (pid, tid) != (1, 9) or rnd.random() < 0.01
            t += rnd.choice([0, 0, 1, 50, 3_000, gap - 1, gap, gap + 1, 3 * gap, 90_000])
            dur = rnd.choice([0, 1, 10, 2_000, gap, 5 * gap])
            rows = [(t, t + dur)]
            if rnd.random() < 0.3:   # a driver call nested in the runtime call
                rows.append((t + dur // 3, t + dur // 2))
            for s, e in rows:
                con.execute("INSERT INTO runtime_calls (trace_id, source, pid, tid, name, start_ns, "
                            "end_ns, dur_ns, is_launch, is_sync) VALUES (?, 'x', ?, ?, ?, ?, ?, ?, ?, false)",
                            [trace, pid, tid, "cudaLaunchKernel" if launch else "cudaEventRecord",
                             s, e, e - s, launch])


@pytest.mark.parametrize("seed", range(6))
def test_host_work_gaps_by_bin_equal_the_definition(seed):
    """The stretches without a launching thread's call, from time bins of HOST_WORK_GAP_NS,
    are those of the definition (every call against the latest end before it)."""
    rnd = random.Random(seed)
    con = store.open_store()
    _random_calls(con, rnd)
    got = con.execute(f"SELECT * FROM ({breakdown.host_work_gaps_sql()}) ORDER BY ALL").fetchall()
    want = con.execute(f"SELECT * FROM ({breakdown.host_work_gaps_by_call_sql()}) ORDER BY ALL").fetchall()
    assert got == want and want


def test_host_work_gaps_with_a_call_that_ends_before_it_starts():
    """Bins hold only when no call ends before it starts: otherwise the definition runs."""
    rnd = random.Random(1)
    con = store.open_store()
    _random_calls(con, rnd, traces=(1,))
    # a call ending before it starts, first of its bin: the call right after it closes a gap too
    for s, e in [(10**12, 10**12 + 100), (10**12 + 10**7, 10**12 + 10**6), (10**12 + 10**7 + 1, 10**12 + 10**7 + 9)]:
        con.execute("INSERT INTO runtime_calls (trace_id, source, pid, tid, name, start_ns, end_ns, "
                    "dur_ns, is_launch, is_sync) VALUES (1, 'x', 1, 1, 'cudaLaunchKernel', ?, ?, ?, true, false)",
                    [s, e, e - s])
    assert con.execute(f"SELECT * FROM ({breakdown.host_work_gaps_sql()}) ORDER BY ALL").fetchall() != \
        con.execute(f"SELECT * FROM ({breakdown.host_work_gaps_by_call_sql()}) ORDER BY ALL").fetchall()
    breakdown._host_work_gaps(con)
    got = con.execute("SELECT * FROM _host_work_gaps ORDER BY ALL").fetchall()
    want = con.execute(f"SELECT * FROM ({breakdown.host_work_gaps_by_call_sql()}) ORDER BY ALL").fetchall()
    assert got == want and want


# The sweep as it was before issue #19: the edges grouped by time first (a reference).
_SWEEP_GROUPED = """
    WITH edges AS (
        SELECT trace_id, s AS ts, {packed} AS delta, NULL::BIGINT AS step_mark FROM _iv
        UNION ALL SELECT trace_id, e, -({packed}), NULL FROM _iv
        UNION ALL SELECT trace_id, start_ns, CAST(0 AS HUGEINT),
                         CASE WHEN end_ns IS NOT NULL THEN start_ns END FROM steps
        UNION ALL SELECT trace_id, end_ns, CAST(0 AS HUGEINT), NULL FROM steps),
    points AS (
        SELECT trace_id, ts, sum(delta) AS delta, max(step_mark) AS step_mark
        FROM edges GROUP BY trace_id, ts),
    running AS (
        SELECT trace_id, ts,
               lead(ts) OVER (PARTITION BY trace_id ORDER BY ts) AS next_ts,
               sum(delta) OVER w AS n, max(step_mark) OVER w AS step_start
        FROM points
        WINDOW w AS (PARTITION BY trace_id ORDER BY ts
                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))
    SELECT trace_id, ts, next_ts, next_ts - ts AS len, {flags}, step_start
    FROM running WHERE next_ts IS NOT NULL AND next_ts > ts"""


def _sweep_reference() -> str:
    bits = breakdown._COUNT_BITS
    packed = ("CASE kind " + " ".join(f"WHEN '{k}' THEN CAST(1 AS HUGEINT) << {bits * i}"
                                      for i, k in enumerate(breakdown._KINDS))
              + " ELSE CAST(0 AS HUGEINT) END")
    flags = ", ".join(f"((n >> {bits * i}) & {(1 << bits) - 1}) > 0 AS {k}"
                      for i, k in enumerate(breakdown._KINDS))
    return _SWEEP_GROUPED.format(packed=packed, flags=flags)


@pytest.mark.parametrize("seed", range(6))
def test_sweep_equals_the_sweep_over_grouped_edges(seed):
    """Segments, flags and step starts as when the edges at one time were grouped first: many
    intervals at the same times, nested, of every kind, steps that touch, overlap or lack an
    end, two traces."""
    rnd = random.Random(seed)
    con = store.open_store()
    con.execute("CREATE TEMP TABLE _iv (trace_id INTEGER, kind VARCHAR, s BIGINT, e BIGINT)")
    for trace in (1, 2):
        for _ in range(300):
            s = rnd.randrange(0, 500) * rnd.choice([1, 1, 10])
            con.execute("INSERT INTO _iv VALUES (?, ?, ?, ?)",
                        [trace, rnd.choice(breakdown._KINDS), s, s + rnd.choice([1, 5, 40, 700])])
        t = 0
        for i in range(25):
            s = t + rnd.choice([0, 0, 3, 60])
            e = s + rnd.choice([50, 200, 400])
            con.execute("INSERT INTO steps VALUES (?, 'x', ?, ?, ?, ?, 'nvtx', ?, ?)",
                        [trace, i, s, None if i == 24 else e, e - s, s, e])
            t = e - rnd.choice([0, 0, 20])   # now and then the next step starts before this ends
    want = con.execute(f"SELECT * FROM ({_sweep_reference()}) ORDER BY ALL").fetchall()
    assert want
    assert breakdown.streaming_windows(con)
    for traces in (None, [1, 2]):   # one ordered window; each trace's sorted rows streamed
        got = con.execute(f"SELECT * FROM ({breakdown.sweep_sql(traces)}) ORDER BY ALL").fetchall()
        assert got == want
    assert con.execute(f"SELECT count(*) FROM ({breakdown.sweep_sql([])})").fetchone()[0] == 0


def _rule(rule_id: str):
    from navdoctor.rules import load_rules
    return next(r for r in load_rules([]) if r.id == rule_id)


def _rows(con, query: str, rule) -> list:
    from navdoctor.rules import sql_params
    return con.execute(query, sql_params(rule)).fetchall()


def _gpu_store(seed: int):
    """Two traces of kernels and copies (overlapping across streams, at equal times, a few
    without an end or ending before they start in trace 2), steps, breakdown and views."""
    rnd = random.Random(seed)
    con = store.open_store()
    for trace in (1, 2):
        t = 0
        for i in range(8):
            con.execute("INSERT INTO steps VALUES (?, 'nsys', ?, ?, ?, ?, 'nvtx', ?, ?)",
                        [trace, i, t, t + 10_000_000, 10_000_000, t, t + 10_000_000])
            t += 10_000_000
        for j in range(150):
            s = rnd.randrange(-1_000_000, 81_000_000)
            e = s + rnd.choice([0, 1, 2_000, 50_000, 999_999, 1_000_000, 3_000_000])
            if trace == 2 and j % 37 == 0:
                e = rnd.choice([None, s - 5])
            table = rnd.choice(["kernels", "kernels", "memcpy"])
            con.execute(f"INSERT INTO {table} (trace_id, source, correlation_id, name, start_ns, "
                        "end_ns, dur_ns) VALUES (?, 'nsys', ?, ?, ?, ?, ?)" if table == "kernels" else
                        f"INSERT INTO {table} (trace_id, source, correlation_id, kind, start_ns, "
                        "end_ns, dur_ns) VALUES (?, 'nsys', ?, ?, ?, ?, ?)",
                        [trace, j, rnd.choice(["k", None, "HtoD"]), s, e, None if e is None else e - s])
    # trace 3: an activity without an end, and one ending before it starts, right after the
    # first start of their bin: each is a gap closer of its own
    for i in range(2):
        con.execute("INSERT INTO steps VALUES (3, 'nsys', ?, ?, ?, 5000000, 'nvtx', ?, ?)",
                    [i, 5_000_000 * i, 5_000_000 * i + 5_000_000, 5_000_000 * i, 5_000_000 * i + 5_000_000])
    for j, (s, e) in enumerate([(0, 100), (4_000_000, None), (4_000_001, 4_000_050),
                                (4_000_002, 3_000_000), (4_000_003, 4_000_004), (9_000_000, 9_000_010)]):
        con.execute("INSERT INTO kernels (trace_id, source, correlation_id, name, start_ns, end_ns) "
                    "VALUES (3, 'nsys', ?, 'k', ?, ?)", [j, s, e])
    breakdown.compute_breakdown(con)
    views.create_views(con)
    return con


# gpu-idle-gaps as it was before issue #19: every activity in order (a reference).
_GPU_IDLE_GAPS_ORDERED = """
ordered AS (
    SELECT trace_id, s, max(e) OVER (PARTITION BY trace_id ORDER BY s, e
           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM act),"""


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("min_gap_us", [1000, 999.9995, 2.5, 0.0004, 0, -3])
def test_gpu_idle_gaps_by_bin_equal_every_activity_in_order(seed, min_gap_us):
    rule = _rule("gpu-idle-gaps")
    rule.params["min_gap_us"] = min_gap_us
    query = rule.query
    start, end = query.index("-- A gap runs from"), query.index("long_gaps AS (")
    reference = query[:start] + _GPU_IDLE_GAPS_ORDERED + "\n" + query[end:]
    con = _gpu_store(seed)
    got, want = sorted(_rows(con, query, rule)), sorted(_rows(con, reference, rule))
    assert got == want
    assert want or min_gap_us <= 0


def test_rules_that_test_names_once_equal_the_test_on_every_row():
    """training_kernel(), the exported-kernel and the allocator expressions, and
    is_graph_launch_api() run once per distinct name: the same figures as on every row
    (names repeated, NULL, of training and TensorRT kernels, allocator and graph calls)."""
    rnd = random.Random(4)
    con = store.open_store()
    kernel_names = ["volta_sgemm_128x64_nn", "autograd::engine::evaluate_function: AddmmBackward0",
                    "void at::native::fused_adam_kernel", "trt_volta_h884cudnn_256x64", None,
                    "myelin_fused", "elementwise_kernel"]
    call_names = ["cudaLaunchKernel", "cudaGraphLaunch", "cuGraphLaunch_ptsz", "cudaMalloc",
                  "cudaFreeHost", "cuMemAlloc_v2", "cudaFreeAsync", None, "cudaMemcpyAsync"]
    for trace in (1, 2):
        for i in range(6):
            con.execute("INSERT INTO steps VALUES (?, 'nsys', ?, ?, ?, 1000, 'nvtx', ?, ?)",
                        [trace, i, 1000 * i, 1000 * i + 1000, 1000 * i, 1000 * i + 1000])
        for j in range(400):
            s = rnd.randrange(0, 6000)
            name = rnd.choice(kernel_names[: 7 if trace == 1 else 3])
            con.execute("INSERT INTO kernels (trace_id, source, correlation_id, name, start_ns, "
                        "end_ns, dur_ns) VALUES (?, 'nsys', ?, ?, ?, ?, 3)", [trace, j, name, s, s + 3])
            name = rnd.choice(call_names)
            launch = name is not None and ("Launch" in name)
            con.execute("INSERT INTO runtime_calls (trace_id, source, pid, tid, name, start_ns, "
                        "end_ns, dur_ns, is_launch, is_sync) VALUES (?, 'nsys', 1, 1, ?, ?, ?, ?, ?, false)",
                        [trace, name, s, s + 2 + j % 5, 2 + j % 5, launch])
    breakdown.compute_breakdown(con)
    views.create_views(con)
    per_row = con.execute("""
        SELECT trace_id, count(*) FILTER (WHERE training_kernel(name)) / nullif(count(*), 0),
               count(*) FILTER (WHERE regexp_matches(lower(name),
                   '(^|[^a-z])(trt|tensorrt|myelin)|__myl_|onnxruntime'))
        FROM kernels GROUP BY trace_id ORDER BY trace_id""").fetchall()
    assert {r[0]: r[1] for r in per_row}[1] not in (0, None) and per_row[0][2] > 0
    export = _rule("compute-inference-export")
    export.params["min_compute_share"] = 0.0
    rows = _rows(con, export.query, export)
    got = sorted((r[0], r[6], r[7]) for r in rows)
    assert got == [(t, share or 0, n) for t, share, n in per_row]
    budget = _rule("realtime-frame-budget")
    got = sorted((r[0], r[-1]) for r in _rows(con, budget.query, budget))
    assert got == [(t, share or 0) for t, share, _ in per_row]
    # the allocator calls: the expression on every row
    churn = _rule("memory-allocator-churn")
    allocator = ("regexp_matches(name, '^(cudaMalloc|cudaFree|cuMemAlloc|cuMemFree|cudaMallocHost"
                 "|cudaHostAlloc|cudaFreeHost|cuMemAllocHost|cuMemHostAlloc|cuMemFreeHost)"
                 "(_v[0-9]+|_ptsz|_ptds)*$')")
    want = con.execute(f"""
        SELECT trace_id, count(name), sum(dur_ns) FROM runtime_calls_in_steps WHERE {allocator}
        GROUP BY trace_id ORDER BY trace_id""").fetchall()
    got = sorted((r[0], round(r[4] * 6), round(r[6] * 6 * 1e6)) for r in _rows(con, churn.query, churn))
    assert got == [tuple(w) for w in want] and all(w[1] for w in want)
    # launch_calls: the view as it was, is_graph_launch_api() on every call
    want = con.execute("""
        WITH r AS (
            SELECT trace_id, dur_ns, is_graph_launch_api(name) AS is_graph
            FROM runtime_calls_in_steps WHERE is_launch),
        counted AS (
            SELECT s.trace_id,
                   count(r.dur_ns) FILTER (WHERE r.is_graph) / s.steps AS graph_launches_per_step,
                   count(r.dur_ns) FILTER (WHERE NOT r.is_graph) / s.steps AS eager_launches_per_step,
                   avg(r.dur_ns) FILTER (WHERE r.is_graph) / 1e3 AS graph_launch_us,
                   avg(r.dur_ns) FILTER (WHERE NOT r.is_graph) / 1e3 AS eager_launch_us
            FROM trace_summary s LEFT JOIN r USING (trace_id)
            GROUP BY s.trace_id, s.steps)
        SELECT *, graph_launches_per_step >= 1
                  AND eager_launches_per_step <= 20 AS graphed
        FROM counted ORDER BY ALL""").fetchall()
    assert con.execute("SELECT * FROM launch_calls ORDER BY ALL").fetchall() == want
    assert all(w[1] > 0 and w[2] > 0 for w in want)



@pytest.mark.parametrize("seed", range(3))
def test_the_usual_call_of_a_tie_does_not_depend_on_row_order(seed):
    """mode() named whichever of two equally frequent values it met first, which changed with
    the order a join emitted rows (seen on a public nsys export: cudaFree and cudaFreeHost, 6
    each per step): the rules now take the greatest."""
    rnd = random.Random(seed)
    con = store.open_store()
    con.execute("INSERT INTO inputs VALUES (1, 't.sqlite', 'nsys-sqlite', 'nsys', NULL, 0, 4000, 0, [])")
    for i in range(4):
        con.execute("INSERT INTO steps VALUES (1, 'nsys', ?, ?, ?, 1000, 'nvtx', ?, ?)",
                    [i, 1000 * i, 1000 * i + 1000, 1000 * i, 1000 * i + 1000])
        con.execute("INSERT INTO kernels (trace_id, source, name, start_ns, end_ns, dur_ns) "
                    "VALUES (1, 'nsys', 'k', ?, ?, 100)", [1000 * i + 500, 1000 * i + 600])
    calls = [(n, 1000 * i + 10 * j) for i in range(4) for j, n in enumerate(
        ["cudaFree", "cudaFreeHost", "cudaMalloc", "cudaFree", "cudaFreeHost", "cudaLaunchKernel"])]
    rnd.shuffle(calls)
    for name, t in calls:
        con.execute("INSERT INTO runtime_calls (trace_id, source, pid, tid, name, start_ns, end_ns, "
                    "dur_ns, is_launch, is_sync) VALUES (1, 'nsys', 1, 1, ?, ?, ?, 5, ?, false)",
                    [name, t, t + 5, name == "cudaLaunchKernel"])
        sync = "cudaStreamSynchronize" if (t // 10) % 2 else "cudaDeviceSynchronize"   # 3 each
        con.execute("INSERT INTO sync_events (trace_id, source, pid, tid, kind, name, start_ns, end_ns, "
                    "dur_ns) VALUES (1, 'nsys', 1, 1, 'stream', ?, ?, ?, 5)", [sync, t, t + 5])
    breakdown.compute_breakdown(con)
    views.create_views(con)
    from navdoctor.engine import run_query
    for rule_id, usual in (("memory-allocator-churn", "cudaFreeHost"),
                           ("memory-sync-stalls", "cudaStreamSynchronize"),
                           ("memory-frequent-sync-calls", "cudaStreamSynchronize")):
        assert [r["usual_call"] for r in run_query(con, _rule(rule_id))] == [usual], rule_id


def _insert(con, table: str, columns: str, rows: list) -> None:
    store.insert_rows(con, table, rows, [c.strip() for c in columns.split(",")])


def _breakdown_store(seed: int):
    """Two traces with kernels (some communication), copies, syncs, CUDA calls of two threads,
    DataLoader waits and OS waits, and steps that touch, leave gaps, are empty, lack a start or
    an end, or end before they start."""
    rnd = random.Random(seed)
    con = store.open_store()
    rows = {t: [] for t in ("steps", "kernels", "memcpy", "runtime_calls", "sync_events",
                            "dataloader_waits", "os_calls")}
    for trace in (1, 2):
        con.execute("INSERT INTO inputs VALUES (?, 't', 'nsys-sqlite', 'nsys', NULL, 0, 0, 0, [])", [trace])
        t, i = 0, 0
        while t < 90_000:
            s = t + rnd.choice([0, 0, 0, 700])
            e = s + rnd.choice([3_000, 6_000, 9_000])
            shape = rnd.random()
            row = (s, e) if shape < 0.8 else (s, s) if shape < 0.85 else (None, e) if shape < 0.9 \
                else (s, None) if shape < 0.95 else (s, s - 40)
            rows["steps"].append((trace, i, row[0], row[1], row[0], row[1]))
            t, i = e, i + 1
        for j in range(150):
            s = rnd.randrange(-2_000, 95_000)
            d = rnd.choice([1, 30, 100, 400])
            comm = rnd.random() < 0.1
            rows["kernels"].append((trace, j, "ncclKernel" if comm else "k", s, s + d, d, comm))
            if j % 5 == 0:
                rows["memcpy"].append((trace, s + d + 7, s + d + 57))
            tid = rnd.choice([1, 2])
            c = s - rnd.choice([5, 300, 250_000])
            rows["runtime_calls"].append((trace, tid, j, c, c + 4))
            if j % 4 == 0:
                rows["sync_events"].append((trace, tid, s + 100, s + 180))
            if j % 7 == 0:
                rows["dataloader_waits"].append((trace, s, s + 900))
                rows["os_calls"].append((trace, tid, s, s + 2000))
    _insert(con, "steps", "trace_id, source, step_num, start_ns, end_ns, dur_ns, origin, "
            "cpu_start_ns, cpu_end_ns",
            [(tr, "nsys", i, s, e, None, "nvtx", s, e) for tr, i, s, e, _, _ in rows["steps"]])
    _insert(con, "kernels", "trace_id, source, correlation_id, name, start_ns, end_ns, dur_ns, "
            "is_communication", [(tr, "nsys", *r) for tr, *r in rows["kernels"]])
    _insert(con, "memcpy", "trace_id, source, kind, start_ns, end_ns, dur_ns",
            [(tr, "nsys", "HtoD", s, e, 50) for tr, s, e in rows["memcpy"]])
    _insert(con, "runtime_calls", "trace_id, source, pid, tid, correlation_id, name, start_ns, "
            "end_ns, dur_ns, is_launch, is_sync",
            [(tr, "nsys", 7, tid, j, "cudaLaunchKernel", s, e, 4, True, False)
             for tr, tid, j, s, e in rows["runtime_calls"]])
    _insert(con, "sync_events", "trace_id, source, pid, tid, kind, name, start_ns, end_ns, dur_ns",
            [(tr, "nsys", 7, tid, "stream", "cudaStreamSynchronize", s, e, 80)
             for tr, tid, s, e in rows["sync_events"]])
    _insert(con, "dataloader_waits", "trace_id, source, pid, tid, name, start_ns, end_ns, dur_ns",
            [(tr, "nsys", 7, 1, "w", s, e, 900) for tr, s, e in rows["dataloader_waits"]])
    _insert(con, "os_calls", "trace_id, source, pid, tid, name, start_ns, end_ns, dur_ns",
            [(tr, "nsys", 7, tid, "futex", s, e, 2000) for tr, tid, s, e in rows["os_calls"]])
    return con


@pytest.mark.parametrize("seed", range(5))
def test_step_sums_while_streaming_equal_the_sums_of_the_segments(seed):
    """The per-step totals summed as the sweep streams (no segment written) equal those summed
    from the written segments (the HTML report's path), on steps that touch, leave gaps, are
    empty, lack a start or an end, or end before they start."""
    def breakdown_of(keep_segments: bool):
        con = _breakdown_store(seed)
        assert not stepjoin.steps_overlap(con, "start_ns", "end_ns")
        breakdown.compute_breakdown(con, keep_segments=keep_segments)
        return con.execute("SELECT * FROM step_breakdown ORDER BY ALL").fetchall()
    streamed, from_segments = breakdown_of(False), breakdown_of(True)
    assert streamed == from_segments
    # compute, comm, copy, data, sync and launch time in the steps (host and idle need host
    # gaps and OS waits of every launching thread)
    assert all(sum(r[i] for r in streamed) > 0 for i in range(6, 12))


@pytest.mark.parametrize("seed", range(5))
def test_step_sums_without_nested_host_intervals_are_the_same(seed, monkeypatch):
    """The streamed per-step totals with the host intervals that lie inside another left out
    of the sweep (breakdown._drop_nested) equal those of the sweep of all of them: CPU ops
    nested several deep on two threads, overlapping across threads, duplicated, touching,
    sharing a start or an end, with CUDA calls inside them, and a trace without ops."""

    def ops(con, trace: int) -> None:
        rows = []

        def tree(s: int, e: int, depth: int, tid: int) -> None:
            rows.append((tid, s, e))
            if rnd.random() < 0.1:
                rows.append((tid, s, e))                    # the same op twice
            t = s
            while depth < 4 and t < e:
                a = t + rnd.choice([0, 0, 5, 40])
                b = min(e, a + rnd.choice([1, 30, 200, 900]))
                if b > a:
                    tree(a, b, depth + 1, tid)
                t = b
        t = -1_000
        while t < 95_000:
            s = t + rnd.choice([0, 10, 500, 3_000])
            e = s + rnd.choice([200, 2_000, 7_000])
            tree(s, e, 0, rnd.choice([1, 2]))
            t = e if rnd.random() < 0.7 else s + (e - s) // 2   # now and then overlapping
        _insert(con, "cpu_ops", "trace_id, source, pid, tid, name, category, start_ns, end_ns, dur_ns",
                [(trace, "kineto", 7, tid, "op", "cpu_op", s, e, e - s) for tid, s, e in rows])

    def breakdown_of(drop_nested: bool):
        nonlocal rnd
        rnd = random.Random(seed)
        con = _breakdown_store(seed)
        ops(con, 1)             # trace 2 keeps its steps as host intervals
        assert not stepjoin.steps_overlap(con, "start_ns", "end_ns")
        seen = []

        def drop(con):
            assert con.execute("SELECT count(*) FROM _iv WHERE kind = 'p'").fetchone()[0] == 0
            if drop_nested:
                dropped(con)
            else:   # every one of them
                con.execute(f"INSERT INTO _iv SELECT * FROM ({breakdown._HOST_INTERVALS}) "
                            "WHERE s IS NOT NULL AND e IS NOT NULL AND e > s")
            seen.append(con.execute("SELECT count(*) FROM _iv WHERE kind = 'p'").fetchone()[0])
        with monkeypatch.context() as m:
            m.setattr(breakdown, "_drop_nested", drop)
            breakdown.compute_breakdown(con)
        assert len(seen) == 1
        counts.append(seen[0])
        return con.execute("SELECT * FROM step_breakdown ORDER BY ALL").fetchall()
    dropped = breakdown._drop_nested
    counts = []
    rnd = None
    without, every = breakdown_of(True), breakdown_of(False)
    assert without == every
    assert counts[0] < counts[1] / 4   # most host intervals were left out
    assert any(r[0] == 1 and any(r[6:14]) for r in every)   # trace 1's steps have time


_FIXTURES = __import__("pathlib").Path(__file__).resolve().parent.parent / "fixtures"


def _rule_stores():
    """Stores to run the rewritten rules on: generated ones (every kind of interval, names
    repeated and NULL, activities without an end), and fixtures whose ops these rules read."""
    for seed in range(2):
        con = _breakdown_store(seed)
        breakdown.compute_breakdown(con)
        views.create_views(con)
        yield f"generated {seed}", con
    yield "gpu 0", _gpu_store(0)
    from navdoctor import analysis
    for name in ("synthetic/compute-conv-bias-before-batchnorm-fires.json",
                 "synthetic/compute-half-matmul-unaligned-fires.json",
                 "synthetic/memory-cpu-tensor-copied-to-gpu-fires.json",
                 "synthetic/compute-inference-export-fires.sqlite",
                 "synthetic/memory-allocator-churn-fires.sqlite",
                 "gpu/memory_item_sync/kineto.json.gz", "gpu/io_jpeg_decode/nsys.sqlite.gz"):
        con = store.connect_new(None)
        analysis.prepare_store(con, [str(_FIXTURES / name)])
        yield name, con


def test_rewritten_rules_return_what_they_returned_before():
    """Each built-in rule that issue #19 rewrote (tests/data/rules_before_issue19.yaml holds
    its query as it was) returns the same rows, on generated stores and fixtures."""
    import yaml
    from navdoctor.rules import sql_params
    before = yaml.safe_load((__import__("pathlib").Path(__file__).parent / "data" /
                             "rules_before_issue19.yaml").read_text())["queries"]
    fired = set()
    for label, con in _rule_stores():
        for rule_id, old in before.items():
            rule = _rule(rule_id)
            params = sql_params(rule)
            if "$nsys_ns_per_cuda_call" in old:     # then a param, now the tracer_cost view's
                from navdoctor.views.summary import NSYS_NS_PER_CUDA_CALL
                old_params = {**params, "nsys_ns_per_cuda_call": NSYS_NS_PER_CUDA_CALL}
            else:
                old_params = params
            result = con.execute(old, old_params)
            want = sorted(result.fetchall(), key=repr)
            # the columns the query had then (a rule may have gained columns since)
            cols = ", ".join(f'"{d[0]}"' for d in result.description)
            got = sorted(con.execute(f"SELECT {cols} FROM ({rule.query}) AS now", params).fetchall(),
                         key=repr)
            assert got == want, (label, rule_id)
            if want:
                fired.add(rule_id)
    assert fired == set(before)   # every rule returned rows somewhere


def test_the_command_ends_with_what_run_gives(tmp_path):
    """cli.console (the `navdoctor` command) ends the process without the interpreter's
    teardown: the report on stdout is whole, the exit codes and one-line errors are run()'s."""
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    code = "from navdoctor.cli import console; console()"
    trace = str(FIXTURES / "gpu" / "io_jpeg_decode" / "kineto.json.gz")
    ok = subprocess.run([sys.executable, "-c", code, "analyze", trace, "-q", "--json", "-"],
                        env=env, cwd=tmp_path, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["verdict"]
    bad = subprocess.run([sys.executable, "-c", code, "analyze", str(tmp_path / "none.json")],
                         env=env, cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1 and "no such file" in bad.stderr
    usage = subprocess.run([sys.executable, "-c", code, "analyze"], env=env, cwd=tmp_path,
                           capture_output=True, text=True)
    assert usage.returncode == 2 and len(usage.stderr.strip().splitlines()) == 1


def test_the_batch_database_is_gone_after_a_load(tmp_path):
    """A batch of events lives in an in-memory database attached for the load (kineto._EV),
    so that two connections insert from it; it is detached after the load, loaded or not."""
    con = store.open_store()
    load_kineto(con, str(FIXTURES / "gpu" / "io_jpeg_decode" / "kineto.json.gz"), 1)
    names = {r[0] for r in con.execute("SELECT database_name FROM duckdb_databases()").fetchall()}
    assert kineto._SCRATCH not in names
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] > 0
    bad = tmp_path / "cut.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": ')
    with pytest.raises(TraceError):
        load_kineto(con, str(bad), 2)
    names = {r[0] for r in con.execute("SELECT database_name FROM duckdb_databases()").fetchall()}
    assert kineto._SCRATCH not in names


def test_inserts_on_two_connections_raise_the_first_failing_statement():
    con = duckdb.connect()
    con.execute("CREATE TABLE a (x INTEGER); CREATE TABLE b (x INTEGER); CREATE TABLE c (x INTEGER)")
    with pytest.raises(duckdb.Error, match="nope_one"):
        kineto._run_on_two(con, ["INSERT INTO a SELECT 1", "INSERT INTO b SELECT nope_one",
                                 "INSERT INTO c SELECT nope_two"], [])
    kineto._run_on_two(con, ["INSERT INTO a SELECT 2", "INSERT INTO b SELECT 3"],
                       ["CREATE TEMP TABLE t AS SELECT 4 AS x"])
    assert con.execute("SELECT (SELECT sum(x) FROM b), (SELECT x FROM t)").fetchone() == (3, 4)


def test_inserts_restore_duckdbs_threads():
    """The two-connection inserts run with one DuckDB thread each, and leave the setting as
    they found it, failing or not."""
    con = duckdb.connect()
    con.execute("SET threads = 3")
    con.execute("CREATE TABLE a (x INTEGER); CREATE TABLE b (x INTEGER)")
    kineto._run_on_two(con, ["INSERT INTO a SELECT current_setting('threads')",
                             "INSERT INTO b SELECT current_setting('threads')"], [])
    assert con.execute("SELECT (SELECT x FROM a), (SELECT x FROM b)").fetchone() == (1, 1)
    with pytest.raises(duckdb.Error):
        kineto._run_on_two(con, ["INSERT INTO a SELECT nope"], [])
    assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 3


def test_event_kind_is_the_category_filter_it_replaces():
    """_ev's kind column stands for `ph = 'X' AND cat IN CAT_...` in the inserts: each
    category list maps to one kind, and any other event (not complete, no category, another
    category) to 0 or _K_OTHER, as the filters it replaced would read it."""
    for cats, kind in ((kineto.CAT_KERNEL, kineto._K_KERNEL), (kineto.CAT_MEMCPY, kineto._K_MEMCPY),
                       (kineto.CAT_MEMSET, kineto._K_MEMSET), (kineto.CAT_RUNTIME, kineto._K_RUNTIME),
                       (kineto.CAT_CPU_OP, kineto._K_CPU_OP)):
        names = set(re.findall(r"'([^']*)'", cats))
        assert {c for c, k in kineto._KIND_OF_CAT.items() if k == kind} == names
    con = duckdb.connect()
    rows = [("X", "kernel"), ("i", "kernel"), ("X", None), (None, "kernel"), ("X", "ac2g"),
            ("X", "gpu_user_annotation"), ("X", "user_annotation"), ("X", "cuda_sync"),
            ("M", None), ("X", "python_function")]
    got = con.execute(f"SELECT {kineto._kind_of('ph', 'cat')} FROM (SELECT unnest(?) AS ph, "
                      "unnest(?) AS cat)", [[r[0] for r in rows], [r[1] for r in rows]]).fetchall()
    assert [g[0] for g in got] == [kineto._K_KERNEL, 0, 0, 0, kineto._K_OTHER,
                                   kineto._K_GPU_ANNOTATION, kineto._K_ANNOTATION, kineto._K_SYNC,
                                   0, kineto._K_CPU_OP]


def test_kernels_classified_as_the_sql_functions_did():
    """_classify_kernels (names classified in Python, one UPDATE) gives each kernel what the
    two UPDATEs through tensor_core_kernel() / communication_kernel() gave: only NULL columns
    filled, a kernel without a name keeps uses_tensor_cores NULL and gets is_communication
    FALSE."""
    from navdoctor import analysis
    names = ["ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", "ampere_sgemm_128x64_tn",
             "ncclKernel_AllReduce_RING_LL_Sum_float", "elementwise_kernel", None, "", "x'y\"z"]
    results = []
    for classify in ("sql", "python"):
        con = duckdb.connect()
        store.create_schema(con)
        for i, name in enumerate(names * 3):
            preset = i >= 2 * len(names)     # the third copy: what a loader already set
            con.execute("INSERT INTO kernels (trace_id, source, name, start_ns, end_ns, dur_ns, "
                        "uses_tensor_cores, is_communication) VALUES (1, 'kineto', ?, ?, ?, 1, ?, ?)",
                        [name, i, i + 1, True if preset and i % 2 else None,
                         True if preset and i % 3 else None])
        if classify == "sql":
            con.execute("""
                UPDATE kernels SET uses_tensor_cores = m.tc
                FROM (SELECT name, tensor_core_kernel(name) AS tc
                      FROM (SELECT DISTINCT name FROM kernels WHERE uses_tensor_cores IS NULL)) m
                WHERE kernels.name = m.name AND kernels.uses_tensor_cores IS NULL""")
            con.execute("""
                UPDATE kernels SET is_communication = m.comm
                FROM (SELECT name, communication_kernel(name) AS comm
                      FROM (SELECT DISTINCT name FROM kernels WHERE is_communication IS NULL)) m
                WHERE kernels.name IS NOT DISTINCT FROM m.name AND kernels.is_communication IS NULL""")
        else:
            analysis._classify_kernels(con)
        results.append(con.execute("SELECT * FROM kernels ORDER BY start_ns").fetchall())
        con.close()
    assert results[0] == results[1]
    assert {r[-2] for r in results[1]} == {True, False, None}


@pytest.mark.parametrize("path", ["streamed", "whole document"])
def test_kineto_kernels_classified_as_they_are_inserted(tmp_path, monkeypatch, path):
    """The Kineto loader gives each kernel the uses_tensor_cores / is_communication of its
    name (kernelnames), in either read path, so the analysis has nothing left to classify."""
    from navdoctor import analysis
    from navdoctor.kernelnames import communication_kernel, tensor_core_kernel
    if path == "whole document":
        monkeypatch.setattr(kineto, "_read_streaming", lambda *a: False)
    t = KinetoTrace("modern")
    names = ["ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", "ampere_sgemm_128x64_tn",
             "ncclKernel_AllReduce_RING_LL_Sum_float", "elementwise_kernel", "it's"]
    for s in range(3):
        t.step(s, s * 1000.0, 900.0)
        for i, name in enumerate(names):
            t.launch_kernel(name, s * 1000.0 + 10 * i + 1, s * 1000.0 + 10 * i + 5, 3.0)
    doc = t.document()
    for e in doc["traceEvents"]:   # and a kernel without a name
        if e.get("cat") == "kernel" and e.get("name") == "it's" and "name" in e:
            del e["name"]
            break
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    con = store.open_store()
    load_kineto(con, str(path), 1)
    rows = con.execute("SELECT name, uses_tensor_cores, is_communication FROM kernels").fetchall()
    assert len(rows) == 3 * len(names) and (None, None, False) in rows
    assert all((tc, comm) == (tensor_core_kernel(n), communication_kernel(n)) for n, tc, comm in rows)
    before = con.execute("SELECT * FROM kernels ORDER BY ALL").fetchall()
    analysis._classify_kernels(con)
    assert con.execute("SELECT * FROM kernels ORDER BY ALL").fetchall() == before


def test_a_trace_inflated_early_loads_the_same_rows(tmp_path, monkeypatch):
    """A small gzipped trace inflated on a thread before the load (kineto.EarlyInflate, one
    zlib call) loads the rows of the plain load; whatever that call cannot take (a plain
    file, a gzipped export, corrupt data, several gzip members) is left to the load, which
    then says or reads what it did before."""
    import gzip as gz
    path = tricky_trace(tricky=True).write(tmp_path / "t.json", gz=True)
    plain, res0 = load(path, monkeypatch)
    early = kineto.inflate_early(str(path))
    assert early is not None
    con = store.open_store()
    res = load_kineto(con, str(path), 1, early)
    assert contents(con) == plain and (res.events, res.warnings) == (res0.events, res0.warnings)
    assert early.result() is None   # taken once, by the load

    assert kineto.inflate_early(str(tricky_trace().write(tmp_path / "p.json"))) is None
    sqlite_gz = tmp_path / "e.sqlite.gz"
    sqlite_gz.write_bytes(gz.compress(b"SQLite format 3\x00" + b"\x00" * 100))
    assert kineto.inflate_early(str(sqlite_gz)) is None
    # two gzip members: the load reads both (as gzip.open does); the early inflate gives up
    with open(path, "rb") as f:
        doc = f.read()
    text = gz.decompress(doc)
    two = tmp_path / "two.json.gz"
    two.write_bytes(gz.compress(text[:1000]) + gz.compress(text[1000:]))
    early = kineto.inflate_early(str(two))
    assert early is not None and early.result() is None
    con = store.open_store()
    load_kineto(con, str(two), 1, kineto.inflate_early(str(two)))
    assert contents(con) == plain
    # corrupt: the same error as without it
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(doc[:len(doc) // 2] + bytes(64) + doc[len(doc) // 2 + 64:])
    errors = []
    for e in (None, kineto.inflate_early(str(bad))):
        with pytest.raises(TraceError) as info:
            load_kineto(store.open_store(), str(bad), 1, e)
        errors.append(str(info.value))
    assert errors[0] == errors[1]


def test_training_kernel_macro_equals_the_python_function():
    """training_kernel() is an SQL macro (no Python function, so no numpy): TRUE / FALSE as
    kernelnames.training_kernel gives them, for NULL, '', every word of the pattern in any
    case, and each character of each word replaced by any of the first 0x250 code points and
    by those that Python and DuckDB lower or fold differently (K, İ, ı, ſ, ẞ, fullwidth)."""
    from navdoctor import kernelnames
    con = store.open_store()
    words = kernelnames._TRAINING.pattern.replace("?", "").split("|") + ["adam_"]
    odd = [0x130, 0x131, 0x17F, 0x212A, 0x212B, 0x1E9E, 0xFF21, 0xFF41, 0x0307]
    names: list = [None, "", "void at::native::fused_adam_kernel<float>", "Wgrad", "BACKWARD",
                   "sgd", "x_bwd", "bwdx", "AdamW_", "adam_w", "multi_tensor_applyX"]
    for w in words:
        names += [w, w.upper(), w.title(), f"pre {w} post", w.swapcase()]
        for i in range(len(w)):
            for cp in list(range(1, 0x250)) + odd:
                names.append(w[:i] + chr(cp) + w[i + 1:])
                names.append(w[:i] + chr(cp).upper() + w[i + 1:])
            names.append(w[:i] + "\u0130" + "\u0307" + w[i + 1:])
    con.execute("CREATE TABLE n (i INTEGER, name VARCHAR)")
    store.insert_rows(con, "n", list(enumerate(names)))
    got = dict(con.execute("SELECT i, training_kernel(name) FROM n").fetchall())
    want = {i: kernelnames.training_kernel(n) for i, n in enumerate(names)}
    assert got == want and sum(want.values()) > 300
    with pytest.raises(ValueError):
        kernelnames.sql_case_blind("cuda|mpi")   # an 'i' that ends a word
    with pytest.raises(ValueError):
        kernelnames.sql_case_blind("^sgd")


def test_the_python_functions_only_where_sql_names_them():
    """store.FUNCTIONS are registered (numpy imported) only for rules that name one: the
    built-in rules call none; a store made without them has the macros and no function."""
    from navdoctor import engine
    from navdoctor.rules import load_rules
    rules = load_rules()
    assert rules and not engine.rules_use_functions(rules)
    assert store.uses_functions("SELECT Tensor_Core_Kernel(name) FROM kernels")
    assert store.uses_functions("SELECT 1 -- collective_kind() later")
    assert not store.uses_functions("SELECT training_kernel(name) FROM kernels")
    con = duckdb.connect()
    store.create_schema(con, functions=False)
    assert con.execute("SELECT training_kernel('x_bwd_y')").fetchone()[0] is True
    for name in store.FUNCTIONS:
        with pytest.raises(duckdb.CatalogException):
            con.execute(f"SELECT {name}('ncclKernel_AllReduce')")
    con = store.open_store()
    assert con.execute("SELECT collective_kind('ncclKernel_AllReduce_RING_LL_Sum_f32'), "
                       "tensor_core_kernel('ampere_sgemm_128x64_tn')").fetchone() == ("allreduce", False)


def _analyze_in_a_process(tmp_path, trace, extra_rules: str | None = None):
    """`navdoctor analyze` as the console command runs it, with the modules it imported."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    code = ("import os, sys\n"
            "_exit = os._exit\n"
            "def ex(c):\n"
            "    print('NUMPY', 'numpy' in sys.modules, file=sys.stderr); _exit(c)\n"
            "os._exit = ex\n"
            "from navdoctor.cli import console; console()")
    args = [sys.executable, "-c", code, "analyze", str(trace), "-q", "--json", "-"]
    if extra_rules:
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "mine.yaml").write_text(extra_rules)
        args += ["--rules", str(tmp_path / "mine")]
    run = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout), "NUMPY True" in run.stderr


def test_analyze_does_not_import_numpy_unless_a_rule_calls_a_python_function(tmp_path):
    """numpy (~35 ms) is only imported by what needs it: DuckDB's Python functions, steps
    inferred from the call sequence, the nsys loader. A Kineto trace with steps and the
    built-in rules need none; a rule of the user's that calls tensor_core_kernel() gets it
    and runs."""
    trace = FIXTURES / "gpu" / "nav_default" / "kineto.json.gz"
    report, numpy_imported = _analyze_in_a_process(tmp_path, trace)
    assert report["verdict"] and not numpy_imported
    mine = """
rules:
  - id: my-tensor-core-kernels
    category: compute
    severity: info
    title: Tensor-core kernels
    description: Counts the kernels that tensor_core_kernel() classifies.
    query: |
      SELECT trace_id, count(*) FILTER (WHERE tensor_core_kernel(name) IS NOT NULL) AS n
      FROM kernels GROUP BY trace_id
    condition: n >= 0
    message: "{n} matmul or convolution kernels"
    remedies:
      - title: none
        text: none
"""
    report, numpy_imported = _analyze_in_a_process(tmp_path, trace, mine)
    assert numpy_imported and not report["rule_errors"]
    assert any(f["rule"] == "my-tensor-core-kernels" for f in report["findings"])


def test_rules_joined_to_one_aggregate_per_trace_return_what_their_subqueries_did():
    """The built-in rules whose per-trace figures were one correlated subquery each
    (tests/data/rules_before_perf10.yaml holds their queries as they were) return the same
    rows, with the same column names and types, on generated stores, the fixtures each of them
    fires on, and a Kineto + nsys pair analysed together (a rule given columns since, as
    io-dataloader-wait its loader wait timed without a tracer, is compared on the old ones:
    these stores have no such timing). (The order of a multi-trace store's
    rows follows the plan, as before; only a tie of time at stake between two traces where the
    primary trace did not decide would show it in a report.)"""
    import yaml
    from navdoctor import analysis
    from navdoctor.rules import sql_params
    before = yaml.safe_load((__import__("pathlib").Path(__file__).parent / "data" /
                             "rules_before_perf10.yaml").read_text())["queries"]

    def stores():
        yield from _rule_stores()
        for name in ("launch-indexing-python-loop-fires.json", "launch-per-tensor-optimizer-fires.json",
                     "launch-zero-grad-fills-fires.json", "memory-um-page-faults-fires.sqlite"):
            con = store.connect_new(None)
            analysis.prepare_store(con, [str(_FIXTURES / "synthetic" / name)])
            yield name, con
        con = store.connect_new(None)
        analysis.prepare_store(con, [str(_FIXTURES / "gpu" / d / f) for d, f in
                                     (("io_jpeg_decode", "kineto.json.gz"), ("nav_default", "nsys.sqlite.gz"))])
        yield "pair", con

    fired = set()
    for label, con in stores():
        for rule_id, old in before.items():
            rule = _rule(rule_id)
            params = sql_params(rule)
            new_cur = con.execute(rule.query, params)
            new_rows = new_cur.fetchall()
            new_desc = [(d[0], str(d[1])) for d in new_cur.description]
            old_cur = con.execute(old, params)
            want = sorted(old_cur.fetchall(), key=repr)
            want_desc = [(d[0], str(d[1])) for d in old_cur.description]
            names = [n for n, _ in new_desc]
            keep = [names.index(n) for n, _ in want_desc if n in names]
            got = sorted((tuple(r[i] for i in keep) for r in new_rows), key=repr)
            got_desc = [new_desc[i] for i in keep]
            assert (got, got_desc) == (want, want_desc), (label, rule_id)
            if want:
                fired.add(rule_id)
    assert fired == set(before)   # every rule returned rows somewhere


# ---- analyze without pydantic (rules.py's plain rules, report.py's build_report_lite) -----

def test_analyze_imports_no_pydantic_once_the_rules_were_validated(tmp_path):
    """The first run validates the rule files (pydantic) and keeps their dumps by their
    texts; the next runs make the rules from them and the report without pydantic, and write
    the same JSON report."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, NAVDOCTOR_CACHE_DIR=str(tmp_path / "cache"))
    code = ("import os, sys\n"
            "_exit = os._exit\n"
            "def ex(c):\n"
            "    print('PYDANTIC', 'pydantic' in sys.modules, file=sys.stderr); _exit(c)\n"
            "os._exit = ex\n"
            "from navdoctor.cli import console; console()")
    trace = FIXTURES / "gpu" / "nav_default" / "kineto.json.gz"
    outs = []
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", code, "analyze", str(trace), "-q", "--json", "-"],
                             env=env, cwd=tmp_path, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        outs.append((run.stdout, "PYDANTIC True" in run.stderr))
    assert outs[0][1] and not outs[1][1]
    assert outs[0][0] == outs[1][0] and json.loads(outs[1][0])["findings"]


def test_lite_fields_are_the_report_models_fields():
    """report.LITE_FIELDS: each model's fields, in order, with the annotation written in
    report_models.py and its default (or required)."""
    import ast
    import inspect
    from pydantic_core import PydanticUndefined
    from navdoctor import report, report_models
    written = {c.name: {s.target.id: ast.unparse(s.annotation) for s in c.body
                        if isinstance(s, ast.AnnAssign)}
               for c in ast.parse(inspect.getsource(report_models)).body
               if isinstance(c, ast.ClassDef)}
    for name, fields in report.LITE_FIELDS.items():
        model = getattr(report_models, name)
        assert [f[0] for f in fields] == list(model.model_fields), name
        for field, ann, default in fields:
            info = model.model_fields[field]
            if (name, field) == ("Report", "job"):
                assert written[name][field] == "JobOut | None" and info.default is None
                continue
            assert written[name][field] == ann, (name, field)
            if default is report._REQUIRED:
                assert info.is_required(), (name, field)
            elif default is report._NEW_DICT:
                assert info.default_factory is dict
            else:
                assert info.default is not PydanticUndefined and info.default == default, (name, field)
            meta = [(getattr(m, "ge", None), getattr(m, "le", None)) for m in info.metadata]
            assert (report._LITE_RANGES.get((name, field)) is not None) == bool(meta), (name, field)


@pytest.mark.parametrize("trace", ["gpu/nav_default/kineto.json.gz", "gpu/nav_default/nsys.sqlite.gz",
                                   "gpu/launch_python_loop/kineto.json.gz",
                                   "gpu/mixed/h100_fcn50_data_0.4.nsys.sqlite.gz",
                                   "gpu/mixed/h100r15_convnexttiny_copy_0.25.nsys.sqlite.gz"])
def test_the_lite_report_is_the_models_report(trace):
    """build_report_lite gives what build_report does (dump, JSON, terminal and Markdown
    text), without pydantic's models where every value has its field's type, and the
    models' report where one has not (a Decimal, a tuple, inf in a finding's evidence)."""
    import decimal
    from navdoctor.analysis import analyze
    from navdoctor.report import (LiteModel, build_report, build_report_lite, render_markdown,
                                  render_terminal, report_to_json)
    from navdoctor.rules import load_rules
    path = FIXTURES / trace
    if not path.exists():
        pytest.skip(f"{trace} not in this checkout")
    measured = {"unprofiled_step_ms": 21.58, "unprofiled_loader_wait_ms": 3.2} if "fcn50" in trace else \
        {"unprofiled_step_ms": 100.6} if "convnext" in trace else {}
    a = analyze([str(path)], load_rules([]), **measured)
    lite, model = build_report_lite(a), build_report(a)
    assert isinstance(lite, LiteModel)
    # (its bool kept lite too)
    assert ("unprofiled_loader_wait_ms" in measured) == (model.verdict.loader_wait is not None)
    if "convnext" in trace:       # compute's findings lead a memory-bound step (report 2.11)
        assert model.verdict.findings_lead == "compute" != model.verdict.bound
    assert lite.model_dump(mode="json") == model.model_dump(mode="json")
    assert report_to_json(lite) == report_to_json(model)
    assert render_terminal(lite) == render_terminal(model)
    assert render_markdown(lite) == render_markdown(model)
    assert lite.to_model() == model
    if a.findings:
        for odd in (decimal.Decimal("1.5"), (1, 2), float("inf"), float("nan")):
            a.findings[0].metrics["odd"] = odd
            lite, model = build_report_lite(a), build_report(a)
            assert not isinstance(lite, LiteModel)
            assert report_to_json(lite) == report_to_json(model)


def test_plain_rules_behave_as_the_models():
    """rules.Rule: validated by rule_models.Rule when made from fields (its errors), its
    model_dump the model's, equal by fields, a deep copy of its own."""
    from pydantic import ValidationError
    from navdoctor import rule_models
    from navdoctor.rules import Rule
    fields = dict(id="r1", title="t", category="io", severity="low", query="SELECT 1 AS n",
                  condition="n > x", message="m", params={"x": 1, "y": 2.5, "s": "a", "b": True},
                  remedies=[{"title": "do", "verify": "amp"}],
                  examples=[{"expect": "fire", "traces": "t.json", "metrics": {"n": {"min": 1}}}])
    rule, model = Rule(**fields), rule_models.Rule(**fields)
    assert rule.model_dump() == model.model_dump()
    assert rule.model_dump(mode="json") == model.model_dump(mode="json")
    assert rule.examples[0].metrics["n"].min == 1.0 and rule.examples[0].trace_list == ["t.json"]
    assert rule.remedies[0].verify == "amp" and rule == Rule(**fields)
    copy = rule.model_copy(deep=True)
    copy.params["x"] = 5
    assert rule.params["x"] == 1 and copy != rule
    for bad in ({"condition": "__import__('os')"}, {"category": "nope"}, {"extra": 1}):
        with pytest.raises(ValidationError):
            Rule(**{**fields, **bad})


def test_insert_rows_stores_what_executemany_stores():
    """store.insert_rows (one statement; the inferred steps, the compute headroom and the
    report's chosen steps go in with it) stores the rows executemany stores, in their order:
    NULLs anywhere, a column of NULLs only, integers past 32 bits, integers in a DOUBLE
    column, booleans and strings; no rows is no statement."""
    rows = [(1, None, 2**40, 1, True, "a"), (2, "x", None, 2.5, None, None),
            (3, "y", -5, None, False, "it's")]
    got, want = store.open_store(), store.open_store()
    for con in (got, want):
        con.execute("CREATE TABLE t (i INTEGER, s VARCHAR, b BIGINT, d DOUBLE, f BOOLEAN, "
                    "n VARCHAR)")
    store.insert_rows(got, "t", rows)
    store.insert_rows(got, "t", [])
    store.insert_rows(got, "t", [(4, None, None, None, None, None)])
    want.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)", rows + [(4, None, None, None, None, None)])
    assert got.execute("SELECT * FROM t").fetchall() == want.execute("SELECT * FROM t").fetchall()
