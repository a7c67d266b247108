"""The Kineto loader on traces shaped like torch 1.8 and torch 2.x ones."""
import duckdb
import pytest

from navdoctor import store
from navdoctor.errors import TraceError
from navdoctor.loaders.kineto import load_kineto
from kineto_factory import KinetoTrace


def build(style):
    t = KinetoTrace(style)
    t.step(4, 0, 1000.5)
    t.dataloader(1.25, 200)
    t.op("aten::conv2d", 210, 50)
    t.launch_kernel("ampere_sgemm_128x64_tn", 220, 230.125, 300.75, grid=[10, 2, 1],
                    block=[128, 1, 1], **{"est. achieved occupancy %": 40, "registers per thread": 64})
    t.memcpy("HtoD", "Pageable", "Device", 600, 610, 100, 4_000_000)
    t.sync(800, 150)
    t.memory(900, 70 * 10**9)
    return t


def load(path):
    con = store.open_store()
    return con, load_kineto(con, str(path), 1)


@pytest.mark.parametrize("gz", [False, True])
def test_modern_trace_rows_and_exact_ns(tmp_path, gz):
    con, res = load(build("modern").write(tmp_path / "t.json", gz=gz))
    assert res.format == ("kineto-json.gz" if gz else "kineto-json")
    base = 1_700_000_000_000_000  # base_us in ns
    k = con.execute("SELECT name, start_ns, dur_ns, device_id, stream_id, correlation_id, grid_x, "
                    "block_x, est_occupancy, registers_per_thread FROM kernels").fetchall()
    assert k == [("ampere_sgemm_128x64_tn", base + 230_125, 300_750, 0, 7, 1, 10, 128, 0.4, 64)]
    assert con.execute("SELECT step_num, start_ns - ?, dur_ns FROM steps", [base]).fetchall() == [(4, 0, 1_000_500)]
    assert con.execute("SELECT kind, src_memory, dst_memory, bytes FROM memcpy").fetchall() == [
        ("HtoD", "pageable", "device", 4_000_000)]
    assert con.execute("SELECT dur_ns FROM dataloader_waits").fetchall() == [(200_000,)]
    assert con.execute("SELECT kind, dur_ns FROM sync_events").fetchall() == [("stream", 150_000)]
    assert con.execute("SELECT device_type, total_reserved FROM memory_events").fetchall() == [("cuda", 70 * 10**9)]
    assert con.execute("SELECT name, total_memory_bytes, sm_count FROM device_info").fetchall() == [
        ("Test GPU", 80 * 10**9, 132)]
    assert con.execute("SELECT is_launch FROM runtime_calls WHERE name = 'cudaLaunchKernel'").fetchall() == [(True,)]


@pytest.mark.parametrize("gz", [False, True])
def test_stream_wait_event_is_no_host_wait(tmp_path, gz):
    """Kineto's cuda_sync records: "Stream Sync" blocks the host, "Stream Wait Event" (a stream
    told to wait for an event, cudaStreamWaitEvent) does not and is no sync event, as in the
    nsys loader; its presence still means the sync records replace the blocking runtime calls."""
    t = build("modern")
    for name, at in (("Stream Wait Event", 300), ("Stream Sync", 810)):
        t.cuda_sync(at, 40, name)
    con, _ = load(t.write(tmp_path / "t.json", gz=gz))
    assert con.execute("SELECT name, kind, dur_ns FROM sync_events").fetchall() == [("Stream Sync", "stream", 40_000)]
    t.events = [e for e in t.events if e.get("name") != "Stream Sync"]
    con, _ = load(t.write(tmp_path / "w.json", gz=gz))
    assert con.execute("SELECT count(*) FROM sync_events").fetchone()[0] == 0


def test_cuda_sync_records_go_to_the_waiting_host_thread(tmp_path):
    """Kineto writes cuda_sync records on the GPU's row (pid 0, tid: the stream). The host
    thread that waited is the one of the runtime call with the same correlation id; on the
    GPU's row a sync has no launches between it and the next, so a host launching 200 kernels
    between two syncs read as one long sync stall (the breakdown's sync cycles count a thread's
    launches). With the records on the host thread that stretch is launch time."""
    from navdoctor.analysis import analyze
    t = KinetoTrace("modern")
    t.step(1, 0, 5_000)
    for i, at in enumerate((10, 4_900)):          # two syncs, the host's calls and CUPTI's records
        t.corr += 1
        t.x(t.cats["runtime"], "cudaStreamSynchronize", at, 20, correlation=t.corr)
        t.cuda_sync(at, 20, correlation=t.corr)
    for i in range(200):                            # 200 launches of tiny kernels in between
        c = 100 + i * 23
        t.launch_kernel("k", c, c + 20, 2)
    path = t.write(tmp_path / "t.json")
    con, _ = load(path)
    assert con.execute("SELECT DISTINCT pid, tid FROM sync_events").fetchall() == \
        con.execute("SELECT DISTINCT pid, tid FROM runtime_calls WHERE name = 'cudaStreamSynchronize'").fetchall()
    v = analyze([str(path)], []).verdict
    assert v.bound == "launch" and v.shares["sync"] < 0.05, v.shares


def test_cuda_sync_records_of_a_merged_trace_find_their_own_process(tmp_path):
    """Correlation ids restart in each process: in a trace holding two processes' events, a
    sync record goes to the call with its id that holds its start, pid and tid together."""
    t = KinetoTrace("modern")
    for pid, at in ((100, 1_000), (200, 5_000)):
        for corr, dt in ((1, 0), (2, 500)):
            t.x(t.cats["runtime"], "cudaStreamSynchronize", at + dt, 40, correlation=corr, pid=pid, tid=pid + 1)
            t.cuda_sync(at + dt + 1, 30, correlation=corr)
    con, _ = load(t.write(tmp_path / "merged.json"))
    rows = con.execute("SELECT start_ns - min(start_ns) OVER () AS at, pid, tid FROM sync_events ORDER BY 1").fetchall()
    assert [(pid, tid) for _, pid, tid in rows] == [(100, 101), (100, 101), (200, 201), (200, 201)]


def test_legacy_trace_uses_pid_tid_and_flows(tmp_path):
    con, res = load(build("legacy").write(tmp_path / "old.json"))
    k = con.execute("SELECT device_id, stream_id, correlation_id FROM kernels").fetchall()
    assert k == [(0, 7, 1)]  # correlation recovered from the ac2g flow
    assert con.execute("SELECT correlation_id FROM runtime_calls WHERE name = 'cudaLaunchKernel'").fetchall() == [(1,)]
    assert con.execute("SELECT count(*) FROM steps").fetchall() == [(1,)]
    assert con.execute("SELECT count(*) FROM cpu_ops WHERE name LIKE 'ProfilerStep%'").fetchall() == [(0,)]


def test_string_pid_and_odd_events_are_tolerated(tmp_path):
    t = build("modern")
    t.events.append({"ph": "X", "cat": "kernel", "name": "neg", "pid": "0", "tid": "stream 7", "ts": 5, "dur": -3})
    t.events.append({"ph": "X", "cat": "kernel", "name": "nodur", "pid": 0, "tid": 7, "ts": 5})
    t.events.append({"ph": "X", "cat": "kernel", "name": "strts", "pid": 0, "tid": 7, "ts": "12.5", "dur": "1.5"})
    t.events.append(42)
    con, res = load(t.write(tmp_path / "odd.json"))
    names = {r[0] for r in con.execute("SELECT name FROM kernels").fetchall()}
    assert "strts" in names and "neg" not in names and "nodur" not in names
    assert any("missing or negative 'dur'" in w for w in res.warnings)


@pytest.mark.parametrize("content, message", [
    (b'{"traceEvents": [{"ph": "X"', "truncated or malformed JSON"),
    (b'{"hello": 1}', "no 'traceEvents'"),
    (b'{"traceEvents": []}', "trace is empty"),
    (b'[1, 2, 3]', "no 'traceEvents'"),
])
def test_bad_documents(tmp_path, content, message):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(TraceError, match=message):
        load(p)
