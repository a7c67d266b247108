"""The Nsight Systems SQLite loader, on synthetic exports built by tests/nsys_factory.py."""
from __future__ import annotations

import os
import sqlite3
import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nsys_factory import CLASS_BACKTRACE, CLASS_DRIVER, NsysExport, global_tid  # noqa: E402

from navdoctor import store  # noqa: E402
from navdoctor.errors import TraceError  # noqa: E402
from navdoctor.kernelnames import tensor_core_kernel  # noqa: E402
from navdoctor.loaders import nsys  # noqa: E402

GEMM_TC = "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn"
GEMM_FP32 = "ampere_sgemm_128x64_tn"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"


@pytest.fixture
def con():
    c = store.open_store()
    yield c
    c.close()


def rows(con, sql, *params):
    return con.execute(sql, list(params)).fetchall()


def full_export() -> NsysExport:
    """One process, three steps of a small training loop, every table nsys can fill."""
    x = NsysExport(pid=4242)
    x.gpu(gpu_id=0, cuda_id=0)
    x.thread_name(4242, "python")
    x.thread_name(4250, "pt_data_worker", pid=4250)
    for i in range(3):
        x.step(i, i * 10_000_000, (i + 1) * 10_000_000 - 1)
    x.dataloader_wait(10, 400_000)
    x.kernel(1_000_000, 3_000_000, GEMM_TC, grid=(8, 4, 1), block=(256, 1, 1), regs=128,
             static_smem=1024, dynamic_smem=49152)
    x.kernel(3_100_000, 3_200_000, ADD, stream=13)
    x.kernel(13_000_000, 14_000_000, GEMM_FP32)
    x.memcpy(4_000_000, 5_000_000, 1 << 20, "HtoD", src="pageable", dst="device")
    x.memcpy(5_500_000, 5_600_000, 4096, "DtoH", src="device", dst="pinned")
    x.memcpy(5_700_000, 5_750_000, 8192, "DtoD", src="device", dst="device")
    x.memset(5_800_000, 5_810_000, 512)
    x.sync(6_000_000, 8_000_000, "stream")
    x.sync(8_100_000, 8_150_000, "stream_wait")          # GPU-side wait: not a host wait
    x.sync(8_200_000, 9_000_000, "context")              # cudaDeviceSynchronize
    x.sync(9_100_000, 9_200_000, "event")
    x.runtime(9_300_000, 9_400_000, "cudaMemcpy_v3020")  # a blocking copy
    x.runtime(9_500_000, 9_600_000, "cuLaunchKernel", event_class=CLASS_DRIVER)
    x.runtime(9_500_000, 9_600_000, "cudaLaunchKernel_v7000", corr=999, event_class=CLASS_BACKTRACE)
    x.nvtx(100, None, "a mark")                          # marks have no end: not ranges
    x.nvtx(300, 900, "forward", domain="navdoctor.model")
    x.nvtx(1_000, 2_000, "registered range", registered=True)
    x.nvtx(2_000, 3_000, "start/end range", start_end=True, tid=4243)
    x.nvtx(20, 30, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")
    x.osrt(50, 150, "pthread_cond_wait")
    x.osrt(200, 260, "read", tid=4250, pid=4250)
    x.memory(100, 1 << 20)
    x.memory(200, 1 << 21)
    x.memory(300, 1 << 20, alloc=False)
    x.memory(400, 4096, kind="pinned")                   # host memory: not a GPU allocation
    return x


# ------------------------------------------------------------------------------ sniffing --

def test_content_sniffing(tmp_path):
    sq = full_export().write(tmp_path / "trace.bin")      # any name: content decides
    assert nsys.is_nsys_sqlite(str(sq))
    js = tmp_path / "trace.sqlite"
    js.write_text('{"traceEvents": []}')
    assert not nsys.is_nsys_sqlite(str(js))
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00\x01binary report")
    assert nsys.is_nsys_rep(str(rep)) and not nsys.is_nsys_sqlite(str(rep))
    sq_named_rep = tmp_path / "export.nsys-rep"
    sq_named_rep.write_bytes(sq.read_bytes())
    assert not nsys.is_nsys_rep(str(sq_named_rep))       # SQLite content wins over the name
    assert not nsys.is_nsys_rep(str(sq))


# ------------------------------------------------------------------------------- mapping --

def test_full_export_rows_and_enums(con, tmp_path):
    path = full_export().write(tmp_path / "trace.sqlite")
    res = nsys.load_nsys_sqlite(con, str(path), 7)
    assert res.format == "nsys-sqlite" and res.source == "nsys"
    assert res.producer == "nsys 2024.6.2.225"
    assert res.warnings == []
    assert (res.start_ns, res.end_ns) == (0, 29_999_999)

    k = rows(con, """SELECT trace_id, source, device_id, stream_id, name, start_ns, end_ns, dur_ns,
                            grid_x, grid_y, grid_z, block_x, registers_per_thread,
                            shared_memory_bytes, est_occupancy, uses_tensor_cores
                     FROM kernels ORDER BY start_ns""")
    assert k[0] == (7, "nsys", 0, 7, GEMM_TC, 1_000_000, 3_000_000, 2_000_000, 8, 4, 1, 256, 128,
                    1024 + 49152, None, True)
    assert k[1][3:5] == (13, ADD) and k[1][-1] is None
    assert k[2][4] == GEMM_FP32 and k[2][-1] is False
    # Every kernel is linked to its launch call by correlation id.
    assert rows(con, """SELECT count(*) FROM kernels k JOIN runtime_calls r
                        ON r.trace_id = k.trace_id AND r.correlation_id = k.correlation_id
                        WHERE r.is_launch""") == [(3,)]

    assert rows(con, "SELECT kind, src_memory, dst_memory, bytes, dur_ns FROM memcpy ORDER BY start_ns") == [
        ("HtoD", "pageable", "device", 1 << 20, 1_000_000),
        ("DtoH", "device", "pinned", 4096, 100_000),
        ("DtoD", "device", "device", 8192, 50_000)]
    assert rows(con, "SELECT bytes, start_ns, end_ns, dur_ns FROM memset") == [(512, 5_800_000, 5_810_000, 10_000)]


def test_runtime_calls_pid_tid_api_and_flags(con, tmp_path):
    path = full_export().write(tmp_path / "trace.sqlite")
    nsys.load_nsys_sqlite(con, str(path), 1)
    r = {name: (pid, tid, api, launch, sync) for pid, tid, api, name, launch, sync in rows(
        con, "SELECT pid, tid, api, name, is_launch, is_sync FROM runtime_calls")}
    assert r["cudaLaunchKernel"] == (4242, 4242, "runtime", True, False)
    assert r["cuLaunchKernel"] == (4242, 4242, "driver", True, False)
    assert r["cudaMemcpyAsync"][3:] == (False, False)
    assert r["cudaStreamSynchronize"][3:] == (False, True)
    assert r["cudaDeviceSynchronize"][3:] == (False, True)
    assert r["cudaStreamWaitEvent"][3:] == (False, False)
    assert r["cudaMemcpy"][3:] == (False, True)
    # nsys's entry-point version suffix is dropped, the per-thread-stream one kept.
    assert "cudaLaunchKernel_v7000" not in r
    # The backtrace-class row duplicates a call; it is not one.
    assert rows(con, "SELECT count(*) FROM runtime_calls WHERE correlation_id = 999") == [(0,)]
    assert rows(con, "SELECT count(*) FROM runtime_calls") == [(13,)]  # 3+3+1 launches/copies/memset, 4 syncs, 2 more


def test_sync_events_from_cupti_records(con, tmp_path):
    path = full_export().write(tmp_path / "trace.sqlite")
    nsys.load_nsys_sqlite(con, str(path), 1)
    assert rows(con, "SELECT pid, tid, kind, name, start_ns, end_ns, dur_ns FROM sync_events ORDER BY start_ns") == [
        (4242, 4242, "stream", "cudaStreamSynchronize", 6_000_000, 8_000_000, 2_000_000),
        (4242, 4242, "device", "cudaDeviceSynchronize", 8_200_000, 9_000_000, 800_000),
        (4242, 4242, "event", "cudaEventSynchronize", 9_100_000, 9_200_000, 100_000),
        (4242, 4242, "memcpy", "cudaMemcpy", 9_300_000, 9_400_000, 100_000)]


def test_sync_events_derived_when_no_synchronization_table(con, tmp_path):
    x = NsysExport()
    x.sync(1_000, 5_000, "stream", record=False)
    x.sync(6_000, 9_000, "context", record=False)
    x.sync(10_000, 11_000, "stream_wait", record=False)
    x.runtime(12_000, 13_000, "cudaMemcpy_v3020")
    x.kernel(20_000, 30_000, ADD)
    path = x.write(tmp_path / "t.sqlite")
    nsys.load_nsys_sqlite(con, str(path), 1)
    assert rows(con, "SELECT kind, name, dur_ns FROM sync_events ORDER BY start_ns") == [
        ("stream", "cudaStreamSynchronize", 4_000),
        ("device", "cudaDeviceSynchronize", 3_000),
        ("memcpy", "cudaMemcpy", 1_000)]


def test_nvtx_ranges_steps_and_dataloader_waits(con, tmp_path):
    path = full_export().write(tmp_path / "trace.sqlite")
    nsys.load_nsys_sqlite(con, str(path), 3)
    ranges = rows(con, "SELECT pid, tid, name, domain, start_ns, end_ns, dur_ns FROM nvtx_ranges ORDER BY start_ns, name")
    names = [r[2] for r in ranges]
    assert "a mark" not in names and "navdoctor.model" not in names   # marks and domain events
    assert (4242, 4242, "forward", "navdoctor.model", 300, 900, 600) in ranges
    assert (4242, 4242, "registered range", None, 1_000, 2_000, 1_000) in ranges  # textId -> StringIds
    assert (4242, 4243, "start/end range", None, 2_000, 3_000, 1_000) in ranges
    assert rows(con, "SELECT step_num, start_ns, end_ns, dur_ns, origin FROM steps ORDER BY step_num") == [
        (0, 0, 9_999_999, 9_999_999, "nvtx"), (1, 10_000_000, 19_999_999, 9_999_999, "nvtx"),
        (2, 20_000_000, 29_999_999, 9_999_999, "nvtx")]
    assert rows(con, "SELECT name, start_ns, end_ns FROM dataloader_waits ORDER BY start_ns") == [
        ("navdoctor.dataloader_next", 10, 400_000),
        ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 20, 30)]
    assert rows(con, "SELECT DISTINCT trace_id, source FROM steps") == [(3, "nsys")]


def test_api_name_suffixes(con, tmp_path):
    x = NsysExport()
    for i, name in enumerate(["cudaLaunchKernel_v7000", "cudaMemcpyAsync_ptsz",
                              "cudaMemcpyAsync_v3020_ptsz", "cuLaunchKernelEx", "cudaGraphLaunch_v10000"]):
        x.runtime(i * 100, i * 100 + 50, name)
    nsys.load_nsys_sqlite(con, str(x.write(tmp_path / "t.sqlite")), 1)
    assert rows(con, "SELECT name, is_launch FROM runtime_calls ORDER BY start_ns") == [
        ("cudaLaunchKernel", True), ("cudaMemcpyAsync_ptsz", False), ("cudaMemcpyAsync_ptsz", False),
        ("cuLaunchKernelEx", True), ("cudaGraphLaunch", True)]


def test_whole_graph_traces_stand_in_for_their_kernels(con, tmp_path):
    x = NsysExport()
    x.kernel(0, 100, ADD)
    path = x.write(tmp_path / "t.sqlite")
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER,
            streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
            graphId INTEGER NOT NULL, graphExecId INTEGER NOT NULL);
        INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (1000, 5000, 0, 1, NULL, 7, 42, 0, 3, 4);""")
    db.commit()
    db.close()
    res = nsys.load_nsys_sqlite(con, str(path), 1)
    assert rows(con, "SELECT name, dur_ns, correlation_id FROM kernels ORDER BY start_ns") == [
        (ADD, 100, 1), ("[CUDA graph 3]", 4000, 42)]
    assert any("--cuda-graph-trace=node" in w for w in res.warnings)


def test_profiler_step_ranges_used_when_no_navdoctor_steps(con, tmp_path):
    x = NsysExport()
    x.step(5, 0, 1_000, name="ProfilerStep")
    x.step(6, 1_000, 2_500, name="ProfilerStep")
    x.kernel(100, 200, ADD)
    nsys.load_nsys_sqlite(con, str(x.write(tmp_path / "t.sqlite")), 1)
    assert rows(con, "SELECT step_num, dur_ns FROM steps ORDER BY 1") == [(5, 1_000), (6, 1_500)]


def test_os_calls_threads_device_and_memory(con, tmp_path):
    path = full_export().write(tmp_path / "trace.sqlite")
    nsys.load_nsys_sqlite(con, str(path), 1)
    assert rows(con, "SELECT pid, tid, name, start_ns, end_ns, dur_ns FROM os_calls ORDER BY start_ns") == [
        (4242, 4242, "pthread_cond_wait", 50, 150, 100), (4250, 4250, "read", 200, 260, 60)]
    assert rows(con, "SELECT pid, tid, name FROM threads ORDER BY tid") == [
        (4242, 4242, "python"), (4250, 4250, "pt_data_worker")]
    assert rows(con, "SELECT * FROM device_info") == [
        (1, "nsys", 0, "NVIDIA H100 80GB HBM3", 85520809984, 132, 9, 0, 2048)]
    assert rows(con, """SELECT device_type, device_id, ts_ns, bytes_delta, total_allocated, total_reserved
                        FROM memory_events ORDER BY ts_ns""") == [
        ("cuda", 0, 100, 1 << 20, None, 1 << 20),
        ("cuda", 0, 200, 1 << 21, None, 3 << 20),
        ("cuda", 0, 300, -(1 << 20), None, 2 << 20)]


def test_device_info_follows_the_process_cuda_ordinal(con, tmp_path):
    # CUDA_VISIBLE_DEVICES=1: the process's device 0 is the machine's GPU 1.
    x = NsysExport(pid=77)
    x.gpu(gpu_id=0, cuda_id=None, name="GPU zero")
    x.gpu(gpu_id=1, cuda_id=0, name="GPU one", smCount=114)
    x.kernel(10, 20, ADD)
    nsys.load_nsys_sqlite(con, str(x.write(tmp_path / "t.sqlite")), 1)
    assert rows(con, "SELECT device_id, name, sm_count FROM device_info") == [(0, "GPU one", 114)]


def test_times_keep_all_64_bits(con, tmp_path):
    x = NsysExport()
    big = (1 << 62) + 123_456_789_012_345  # far beyond float precision
    x.kernel(big, big + 7, ADD, launch=None)
    nsys.load_nsys_sqlite(con, str(x.write(tmp_path / "t.sqlite")), 1)
    assert rows(con, "SELECT start_ns, end_ns, dur_ns FROM kernels") == [(big, big + 7, 7)]


# ------------------------------------------------------------------ versions and gaps --

@pytest.mark.parametrize("enum_columns", [("name",), ("label",), ("name", "label")])
def test_enum_tables_with_name_or_label_only(con, tmp_path, enum_columns):
    path = full_export().write(tmp_path / "t.sqlite", enum_columns=enum_columns)
    nsys.load_nsys_sqlite(con, str(path), 1)
    assert rows(con, "SELECT kind, src_memory, dst_memory FROM memcpy ORDER BY start_ns") == [
        ("HtoD", "pageable", "device"), ("DtoH", "device", "pinned"), ("DtoD", "device", "device")]
    assert [r[0] for r in rows(con, "SELECT kind FROM sync_events ORDER BY start_ns")] == [
        "stream", "device", "event", "memcpy"]
    assert rows(con, "SELECT count(*) FROM nvtx_ranges WHERE name = 'a mark'") == [(0,)]
    assert rows(con, "SELECT api FROM runtime_calls WHERE name = 'cuLaunchKernel'") == [("driver",)]


def test_exports_without_enum_tables_use_documented_values(con, tmp_path):
    path = full_export().write(tmp_path / "t.sqlite", with_enums=False)
    res = nsys.load_nsys_sqlite(con, str(path), 1)
    assert rows(con, "SELECT kind, src_memory FROM memcpy ORDER BY start_ns") == [
        ("HtoD", "pageable"), ("DtoH", "device"), ("DtoD", "device")]
    assert rows(con, "SELECT count(*) FROM steps") == [(3,)]
    assert rows(con, "SELECT api FROM runtime_calls WHERE name = 'cuLaunchKernel'") == [("driver",)]
    assert res.warnings == []


def test_older_kernel_and_nvtx_columns(con, tmp_path):
    """Exports of older nsys: no mangledName/greenContextId, NVTX text only, no domainId."""
    db = sqlite3.connect(tmp_path / "old.sqlite")
    db.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO StringIds VALUES (1, 'volta_h884gemm_64x64_ldg8_nn'), (2, 'h884gemm'),
                                     (3, 'cudaLaunchKernel_v7000');
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT NOT NULL, end INT NOT NULL,
            deviceId INT NOT NULL, contextId INT NOT NULL, streamId INT NOT NULL,
            correlationId INT NOT NULL, globalPid INT NOT NULL, demangledName INT NOT NULL,
            shortName INT NOT NULL, launchType INT NOT NULL, cacheConfig INT NOT NULL,
            registersPerThread INT NOT NULL, gridX INT NOT NULL, gridY INT NOT NULL,
            gridZ INT NOT NULL, blockX INT NOT NULL, blockY INT NOT NULL, blockZ INT NOT NULL,
            staticSharedMemory INT NOT NULL, dynamicSharedMemory INT NOT NULL,
            localMemoryPerThread INT NOT NULL, localMemoryTotal INT NOT NULL, gridId INT NOT NULL,
            sharedMemoryExecuted INT NOT NULL);
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (100, 200, 0, 1, 7, 5, 0, 1, 2, 0, 0, 64,
            1, 1, 1, 128, 1, 1, 0, 0, 0, 0, 1, 0);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT NOT NULL, end INT NOT NULL,
            globalTid INT NOT NULL, correlationId INT NOT NULL, nameId INT NOT NULL,
            returnValue INT NOT NULL);
        CREATE TABLE NVTX_EVENTS (start INT NOT NULL, end INT, eventType INT NOT NULL,
            rangeId INT, category INT, color INT, text TEXT, globalTid INT);
        CREATE TABLE TARGET_INFO_GPU (id INT NOT NULL, name TEXT NOT NULL, busLocation TEXT,
            totalMemory INT NOT NULL, smCount INT NOT NULL, computeCapability TEXT);
        INSERT INTO TARGET_INFO_GPU VALUES (0, 'Tesla V100-SXM2-16GB', '0000:00:1e.0',
            16945512448, 80, '7.0');
    """)
    gt = global_tid(99, 100)
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (50, 90, ?, 5, 3, 0)", (gt,))
    db.execute("INSERT INTO NVTX_EVENTS VALUES (0, 1000, 59, NULL, NULL, NULL, 'navdoctor.step#1', ?)", (gt,))
    db.commit()
    db.close()
    res = nsys.load_nsys_sqlite(con, str(tmp_path / "old.sqlite"), 1)
    assert rows(con, "SELECT name, uses_tensor_cores, shared_memory_bytes FROM kernels") == [
        ("volta_h884gemm_64x64_ldg8_nn", True, 0)]
    assert rows(con, "SELECT pid, tid, api, is_launch FROM runtime_calls") == [(99, 100, "runtime", True)]
    assert rows(con, "SELECT step_num, dur_ns FROM steps") == [(1, 1000)]
    assert rows(con, "SELECT device_id, name, sm_count, compute_major, compute_minor FROM device_info") == [
        (0, "Tesla V100-SXM2-16GB", 80, 7, 0)]
    assert res.producer == "nsys"


def test_missing_tables_give_warnings_not_errors(con, tmp_path):
    x = NsysExport()
    x.gpu()
    path = x.write(tmp_path / "cpu_only.sqlite")          # StringIds, TARGET_INFO_*, META only
    res = nsys.load_nsys_sqlite(con, str(path), 1)
    text = " | ".join(res.warnings)
    assert "no CUDA kernels in this export" in text
    assert "no CUDA API calls" in text
    assert "NVTX" in text
    assert res.events == 1                                # the device_info row
    assert rows(con, "SELECT count(*) FROM kernels") == [(0,)]
    assert (res.start_ns, res.end_ns) == (0, 1_000_000_000)  # from ANALYSIS_DETAILS


def test_empty_kernel_table_warns(con, tmp_path):
    x = NsysExport()
    x.runtime(0, 10, "cudaGetDevice_v3020")
    path = x.write(tmp_path / "t.sqlite", keep_empty=("CUPTI_ACTIVITY_KIND_KERNEL",))
    res = nsys.load_nsys_sqlite(con, str(path), 1)
    assert any("no CUDA kernels" in w for w in res.warnings)


def test_missing_string_table_warns_and_loads(con, tmp_path):
    x = full_export()
    path = x.write(tmp_path / "t.sqlite", omit=("StringIds",))
    res = nsys.load_nsys_sqlite(con, str(path), 1)
    assert any("StringIds" in w for w in res.warnings)
    assert rows(con, "SELECT count(*), count(name) FROM kernels") == [(3, 0)]


def test_two_exports_in_one_store(con, tmp_path):
    a = full_export().write(tmp_path / "a.sqlite")
    x = NsysExport()
    x.kernel(0, 10, GEMM_FP32)
    b = x.write(tmp_path / "b.sqlite")
    nsys.load_nsys_sqlite(con, str(a), 1)
    nsys.load_nsys_sqlite(con, str(b), 2)
    assert rows(con, "SELECT trace_id, count(*) FROM kernels GROUP BY 1 ORDER BY 1") == [(1, 3), (2, 1)]
    # No helper tables are left behind.
    assert rows(con, "SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE '_nsys%'") == [(0,)]


def test_odd_characters_in_path(con, tmp_path):
    d = tmp_path / "dir with space?#%"
    d.mkdir()
    path = full_export().write(d / "tr ace#1.sqlite")
    res = nsys.load_nsys_sqlite(con, str(path), 1)
    assert res.events > 0


# ------------------------------------------------------------------------------ errors --

def test_non_nsys_sqlite_is_rejected(con, tmp_path):
    p = tmp_path / "other.sqlite"
    db = sqlite3.connect(p)
    db.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    db.commit()
    db.close()
    with pytest.raises(TraceError) as e:
        nsys.load_nsys_sqlite(con, str(p), 1)
    assert "not an Nsight Systems export" in str(e.value)
    assert "\n" not in str(e.value)


def test_garbage_file_is_rejected(con, tmp_path):
    p = tmp_path / "garbage.sqlite"
    p.write_bytes(os.urandom(4096))
    with pytest.raises(TraceError) as e:
        nsys.load_nsys_sqlite(con, str(p), 1)
    assert "\n" not in str(e.value)


def test_corrupt_sqlite_is_rejected_in_one_line(con, tmp_path):
    good = full_export().write(tmp_path / "good.sqlite").read_bytes()
    p = tmp_path / "corrupt.sqlite"
    p.write_bytes(good[:100] + os.urandom(len(good) - 100))   # valid header, garbage pages
    with pytest.raises(TraceError) as e:
        nsys.load_nsys_sqlite(con, str(p), 1)
    assert "\n" not in str(e.value) and str(p) in str(e.value)
    assert rows(con, "SELECT count(*) FROM kernels") == [(0,)]


def test_truncated_sqlite_is_rejected(con, tmp_path):
    good = full_export().write(tmp_path / "good.sqlite").read_bytes()
    p = tmp_path / "truncated.sqlite"
    p.write_bytes(good[: len(good) // 3])
    with pytest.raises(TraceError) as e:
        nsys.load_nsys_sqlite(con, str(p), 1)
    assert "malformed" in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------- bulk-copy paths --

def _many_kernels(n: int, sparse: bool = False) -> NsysExport:
    x = NsysExport()
    for i in range(n):
        x.kernel(1_000 + 10 * i, 1_005 + 10 * i, GEMM_TC if i % 3 == 0 else ADD,
                 launch="cudaLaunchKernel_v7000" if i % 2 else None, grid=(i % 7 + 1, 1, 1))
    return x


def _check_many(con, n):
    assert rows(con, "SELECT count(*), sum(dur_ns), min(start_ns), max(end_ns), sum(grid_x) FROM kernels") == [
        (n, 5 * n, 1_000, 1_005 + 10 * (n - 1), sum(i % 7 + 1 for i in range(n)))]
    assert rows(con, "SELECT count(*) FROM kernels WHERE uses_tensor_cores") == [((n + 2) // 3,)]


def test_chunked_copy_across_many_chunks(con, tmp_path, monkeypatch):
    monkeypatch.setattr(nsys, "_CHUNK", 97)
    monkeypatch.setattr(nsys, "_WORKERS", 3)
    path = _many_kernels(2_000).write(tmp_path / "t.sqlite")
    nsys.load_nsys_sqlite(con, str(path), 1)
    _check_many(con, 2_000)
    assert rows(con, "SELECT count(*) FROM runtime_calls") == [(1_000,)]


STORE_TABLES = ["kernels", "memcpy", "memset", "runtime_calls", "sync_events", "nvtx_ranges",
                "steps", "dataloader_waits", "os_calls", "threads", "device_info", "memory_events"]


def _store_contents(path, monkeypatch, **patches) -> dict:
    """Every store table (rows sorted) and the warnings, after loading path with the
    loader's module attributes patched."""
    with monkeypatch.context() as m:
        for name, value in patches.items():
            m.setattr(nsys, name, value)
        c = store.open_store()
        res = nsys.load_nsys_sqlite(c, str(path), 1)
    out = {t: c.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in STORE_TABLES}
    out["warnings"] = sorted(res.warnings)
    c.close()
    return out


def test_streamed_tables_equal_one_chunk_whatever_the_chunking(tmp_path, monkeypatch):
    """Kernels and CUDA calls go straight into the store chunk by chunk, with checkpoints in
    between: the rows are those of one chunk holding everything."""
    path = full_export_with_many(tmp_path)
    whole = _store_contents(path, monkeypatch, _CHUNK=1_000_000)
    assert whole["kernels"] and whole["runtime_calls"]
    for chunk in (1, 7, 64):
        assert _store_contents(path, monkeypatch, _CHUNK=chunk, _CHECKPOINT_ROWS=50) == whole


def test_a_failed_chunk_resumes_row_by_row(tmp_path, monkeypatch):
    """A chunk the text path cannot read: the rows before it stay, the rest are read one
    Python value at a time, and the store holds each row once."""
    path = full_export_with_many(tmp_path)
    whole = _store_contents(path, monkeypatch, _CHUNK=1_000_000)
    real = nsys._int_chunks

    def fails_on_third_chunk(src, table, cols):
        for i, a in enumerate(real(src, table, cols)):
            if i == 2:
                raise nsys._FastPathError(table, int(a[0, 0]))
            yield a

    got = _store_contents(path, monkeypatch, _CHUNK=16, _int_chunks=fails_on_third_chunk)
    assert got == whole


def full_export_with_many(tmp_path) -> Path:
    """The full export (every table and enum) plus a few hundred kernels and calls."""
    x = full_export()
    for i in range(300):
        x.kernel(5_000_000 + 10 * i, 5_000_005 + 10 * i, GEMM_TC if i % 3 == 0 else ADD,
                 launch="cudaLaunchKernel_v7000" if i % 2 else None, grid=(i % 7 + 1, 1, 1))
    return x.write(tmp_path / "many.sqlite")


def test_sparse_rowids_are_streamed(con, tmp_path, monkeypatch):
    monkeypatch.setattr(nsys, "_CHUNK", 50)
    path = _many_kernels(300).write(tmp_path / "t.sqlite")
    db = sqlite3.connect(path)  # spread rowids far apart, as after deletes
    db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET rowid = rowid * 100000")
    db.commit()
    db.close()
    nsys.load_nsys_sqlite(con, str(path), 1)
    _check_many(con, 300)


def test_fallback_row_path(con, tmp_path, monkeypatch):
    def broken(*a, **k):
        raise nsys._FastPathError("test")
        yield  # pragma: no cover

    monkeypatch.setattr(nsys, "_int_chunks", broken)
    path = _many_kernels(200).write(tmp_path / "t.sqlite")
    nsys.load_nsys_sqlite(con, str(path), 1)
    _check_many(con, 200)
    assert rows(con, "SELECT count(*) FROM steps") == [(0,)]


def test_a_view_is_refused_not_read(con, tmp_path):
    """nsys writes tables only: a view under a name navdoctor reads is the file's own SQL
    (an endless recursive query in tests/test_hostile_inputs.py), never run."""
    path = _many_kernels(100).write(tmp_path / "t.sqlite")
    db = sqlite3.connect(path)
    db.executescript("""ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO kernels_raw;
                        CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS SELECT * FROM kernels_raw;""")
    db.close()
    with pytest.raises(TraceError, match="'CUPTI_ACTIVITY_KIND_KERNEL' is a view in this file"):
        nsys.load_nsys_sqlite(con, str(path), 1)
    assert rows(con, "SELECT count(*) FROM kernels") == [(0,)]


# ---------------------------------------------------------------------------- .nsys-rep --

def test_convert_without_nsys_says_how_to_get_it(tmp_path, monkeypatch):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00report")
    monkeypatch.setattr(nsys, "find_nsys", lambda exe=None: None)
    with pytest.raises(TraceError) as e:
        nsys.convert_nsys_rep(str(rep), str(tmp_path / "out"))
    msg = str(e.value)
    assert "install Nsight Systems" in msg and "nsys export --type sqlite" in msg
    assert "\n" not in msg


def test_explicit_missing_nsys_is_not_replaced(tmp_path):
    assert nsys.find_nsys(str(tmp_path / "no-such-nsys")) is None


def _fake_nsys(tmp_path, export: Path, fail: bool = False) -> Path:
    """A stand-in for `nsys` that records its arguments and copies a prepared export."""
    script = tmp_path / "nsys"
    log = tmp_path / "nsys-args.txt"
    if fail:
        body = 'echo "ERROR: report is corrupt" >&2; exit 1'
    else:
        body = (f'out=""; prev=""; for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done; '
                f'cp "{export}" "$out"')
    script.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.mark.skipif(os.name != "posix", reason="uses a shell script as a fake nsys")
def test_convert_runs_nsys_export_and_reuses_result(con, tmp_path):
    export = full_export().write(tmp_path / "prepared.sqlite")
    fake = _fake_nsys(tmp_path, export)
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00report")
    out_dir = tmp_path / "out"
    out = nsys.convert_nsys_rep(str(rep), str(out_dir), nsys_exe=str(fake))
    assert out == str(out_dir / "run.sqlite")
    args = (tmp_path / "nsys-args.txt").read_text().split()
    assert args[:3] == ["export", "--type", "sqlite"] and "--force-overwrite=false" in args
    assert args[-1] == str(rep)
    assert nsys.load_nsys_sqlite(con, out, 1).events > 0
    # A second conversion reuses the up-to-date export instead of running nsys again.
    assert nsys.convert_nsys_rep(str(rep), str(out_dir), nsys_exe=str(fake)) == out
    assert len((tmp_path / "nsys-args.txt").read_text().splitlines()) == 1


@pytest.mark.skipif(os.name != "posix", reason="uses a shell script as a fake nsys")
def test_convert_failure_is_one_line(tmp_path):
    fake = _fake_nsys(tmp_path, tmp_path / "none.sqlite", fail=True)
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00report")
    with pytest.raises(TraceError) as e:
        nsys.convert_nsys_rep(str(rep), str(tmp_path / "out"), nsys_exe=str(fake))
    assert "report is corrupt" in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------- kernel names --

@pytest.mark.parametrize("name, expected", [
    (GEMM_TC, True),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", True),
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNN", True),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>(Params)", True),
    ("volta_h884gemm_64x64_ldg8_nn", True),
    ("turing_fp16_s1688cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1", True),
    ("sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_stage4_warpsize2x2x1_g1_tensor16x8x16_kernel", True),
    ("sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x8_kernel", True),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Flash_fwd_params)", True),
    (GEMM_FP32, False),
    ("void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>(int, int)", False),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_kernel_cublas", False),
    ("cutlass_80_simt_sgemm_128x64_8x5_nn_align1", False),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>(float)", False),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", False),
    (ADD, None),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(cudnnTensorStruct)", None),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>()", None),
    ("triton_tem_fused_addmm_0", None),
    ("", None),
])
def test_tensor_core_kernel(name, expected):
    assert tensor_core_kernel(name) is expected
