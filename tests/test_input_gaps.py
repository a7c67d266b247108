"""Input fetching seen from the OS side in hand-made nsys captures (breakdown._input_gaps), and
steps from Optimizer.step / step-like annotations counted on one thread (stepfinder._one_thread).

Traces are built event by event (nsys_factory / kineto_factory) and go through the real
loaders and analysis.analyze; the per-step buckets are read back from the store.
"""
import duckdb
import pytest

from navdoctor.analysis import analyze
from navdoctor.breakdown import INPUT_OPEN_CALLS, OS_WAIT_CALLS, PRODUCER_WAIT_CALLS
from kineto_factory import KinetoTrace
from nsys_factory import NsysExport

MS = 1_000_000
STEP_NS = 10 * MS
STEPS = 4
MAIN = 4242          # pid and tid of the launching (main) thread
WORKER = 77          # another thread of the same process
# Each step: kernel A on [1, 2] ms and kernel B on [8, 9] ms, each launched 5..1 us before it
# starts. No CUDA call of the process runs from A's launch end to B's launch start: the gap
# [0.999, 7.995] ms. The GPU is idle in it before A starts and from 2 ms to 7.995 ms.
GAP = (999_000, 7_995_000)
GAP_GPU_IDLE_NS = (1 * MS - GAP[0]) + (GAP[1] - 2 * MS)          # 5.996 ms


def nsys_trace(tmp_path, name, os_calls=(), dataloader=None):
    """STEPS navdoctor.step ranges of 10 ms with the two kernels above, no CPU ops, and the
    given OS runtime calls in every step: (start_ns, end_ns, call, tid, pid), times relative
    to the step's start."""
    x = NsysExport(pid=MAIN)
    x.gpu()
    for n in range(STEPS):
        t0 = n * STEP_NS
        x.step(n, t0, t0 + STEP_NS)
        x.kernel(t0 + 1 * MS, t0 + 2 * MS, "ampere_sgemm_128x64_tn")
        x.kernel(t0 + 8 * MS, t0 + 9 * MS, "ampere_sgemm_128x64_tn")
        for s, e, call, tid, pid in os_calls:
            x.osrt(t0 + s, t0 + e, call, tid=tid, pid=pid)
        if dataloader is not None:
            x.dataloader_wait(t0 + dataloader[0], t0 + dataloader[1])
    return str(x.write(tmp_path / f"{name}.sqlite"))


def breakdown_rows(tmp_path, path):
    db = tmp_path / (path.rsplit("/", 1)[-1] + ".duckdb")
    analyze([path], [], str(db))
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("""
            SELECT step_num, step_ns, compute_ns, comm_ns, copy_ns, data_ns, sync_ns, launch_ns,
                   host_ns, idle_ns
            FROM step_breakdown ORDER BY step_num""").fetchall()
        origins = {r[0] for r in con.execute("SELECT DISTINCT origin FROM steps").fetchall()}
        n_os = con.execute("SELECT count(*) FROM os_calls").fetchone()[0]
        n_cpu = con.execute("SELECT count(*) FROM cpu_ops").fetchone()[0]
    finally:
        con.close()
    # the shape this code path is for: nsys steps, OS calls, no host ops
    assert origins == {"nvtx"}
    assert n_cpu == 0
    assert len(rows) == STEPS
    out = []
    for step_num, step_ns, *buckets in rows:
        assert step_ns == STEP_NS
        assert sum(buckets) == step_ns and min(buckets) >= 0
        b = dict(zip(("compute", "comm", "copy", "data", "sync", "launch", "host", "idle"), buckets))
        # The question here is data or not: a gap that is not input is host-side time, in the
        # 'host' bucket when no CUDA call breaks it for 200 us, else launch (verdict.md, "Host work").
        b["host_side"] = b["launch"] + b["host"]
        out.append(b)
    return out, n_os


def test_constants_keep_the_gil_out_of_producer_waits():
    # The GIL waits (condition variables, mutexes) are OS waits but not waits for a producer.
    for call in ("pthread_cond_wait", "pthread_cond_timedwait", "pthread_mutex_lock"):
        assert call in OS_WAIT_CALLS and call not in PRODUCER_WAIT_CALLS
    for call in ("poll", "select", "epoll_wait", "recv", "sem_wait", "sem_timedwait"):
        assert call in PRODUCER_WAIT_CALLS
    assert "openat" in INPUT_OPEN_CALLS and "open" in INPUT_OPEN_CALLS
    assert not set(INPUT_OPEN_CALLS) & set(OS_WAIT_CALLS)


def test_baseline_without_os_input_is_launch(tmp_path):
    # Reference: an OS call that is neither an open nor a wait ('read' on the main thread)
    # leaves the GPU-idle time as launch overhead.
    steps, n_os = breakdown_rows(tmp_path, nsys_trace(
        tmp_path, "baseline", [(3 * MS, 3 * MS + 100_000, "write", MAIN, MAIN)]))
    assert n_os == STEPS
    for b in steps:
        assert b["compute"] == 2 * MS
        assert b["data"] == 0 and b["idle"] == 0
        assert b["host_side"] == 8 * MS
        assert b["host"] >= GAP_GPU_IDLE_NS - 10_000   # the 7 ms without a CUDA call: host work


@pytest.mark.parametrize("call", ["openat", "open64", "fopen"])
def test_file_opened_by_another_thread_of_the_process_is_data(tmp_path, call):
    # A worker thread of the launching process opens the next file inside the gap: the
    # GPU-idle part of the whole gap is input fetching.
    steps, _ = breakdown_rows(tmp_path, nsys_trace(
        tmp_path, f"open-{call}", [(3 * MS, 3 * MS + 50_000, call, WORKER, MAIN)]))
    for b in steps:
        assert b["data"] == GAP_GPU_IDLE_NS
        assert b["compute"] == 2 * MS
        assert b["host_side"] == STEP_NS - 2 * MS - GAP_GPU_IDLE_NS
        assert b["data"] / STEP_NS == pytest.approx(0.5996)


def test_file_opened_by_another_process_is_not_data(tmp_path):
    steps, n_os = breakdown_rows(tmp_path, nsys_trace(
        tmp_path, "open-other-pid", [(3 * MS, 3 * MS + 50_000, "openat", 5555, 5555)]))
    assert n_os == STEPS
    for b in steps:
        assert b["data"] == 0
        assert b["host_side"] == 8 * MS


def test_open_between_steps_makes_only_that_gap_data(tmp_path):
    # An open at 9.5 ms falls in the gap from B's launch (7.999 ms) to the next step's A
    # launch (10.995 ms), not in the middle gap: its GPU-idle part, [7.999, 8] and [9, 10] ms
    # of this step and [0, 0.995] ms of the next, becomes data; the middle gap stays launch. The last step's trailing stretch
    # is no gap (no CUDA call closes it), nor is the first step's lead (none opens it).
    steps, _ = breakdown_rows(tmp_path, nsys_trace(
        tmp_path, "open-between", [(9_500_000, 9_550_000, "openat", WORKER, MAIN)]))
    lead = 995_000
    for n, b in enumerate(steps):
        want = (MS + 1000 if n < STEPS - 1 else 0) + (lead if n > 0 else 0)
        assert b["data"] == want, n
        assert b["host_side"] == 8 * MS - want, n


@pytest.mark.parametrize("call", ["poll", "epoll_wait", "select", "recv", "sem_wait"])
def test_next_caller_waiting_for_a_producer_most_of_the_gap_is_data(tmp_path, call):
    # The thread whose CUDA call ends the gap (the main thread) waits 4 of the gap's ~7 ms.
    steps, _ = breakdown_rows(tmp_path, nsys_trace(
        tmp_path, f"wait-{call}", [(2_500_000, 6_500_000, call, MAIN, MAIN)]))
    for b in steps:
        assert b["data"] == GAP_GPU_IDLE_NS
        assert b["idle"] == 0
        assert b["compute"] == 2 * MS


def test_producer_waits_add_up(tmp_path):
    # Two waits of 2 ms each: together more than half of the gap.
    steps, _ = breakdown_rows(tmp_path, nsys_trace(tmp_path, "wait-two", [
        (2_200_000, 4_200_000, "poll", MAIN, MAIN), (4_500_000, 6_500_000, "sem_wait", MAIN, MAIN)]))
    for b in steps:
        assert b["data"] == GAP_GPU_IDLE_NS


def test_producer_wait_under_half_the_gap_is_not_data(tmp_path):
    # 2 ms of a ~7 ms gap: an OS wait of the launching thread (idle), the rest launch.
    steps, _ = breakdown_rows(tmp_path, nsys_trace(
        tmp_path, "wait-short", [(3 * MS, 5 * MS, "poll", MAIN, MAIN)]))
    for b in steps:
        assert b["data"] == 0
        assert b["idle"] == 2 * MS
        assert b["host_side"] == 6 * MS


def test_producer_wait_of_a_thread_that_does_not_close_the_gap_is_not_data(tmp_path):
    # A worker thread polling is not the launching thread waiting for its input.
    steps, _ = breakdown_rows(tmp_path, nsys_trace(
        tmp_path, "wait-other-thread", [(2_500_000, 6_500_000, "poll", WORKER, MAIN)]))
    for b in steps:
        assert b["data"] == 0
        assert b["host_side"] == 8 * MS


@pytest.mark.parametrize("call", ["pthread_cond_wait", "pthread_cond_timedwait", "pthread_mutex_lock"])
def test_gil_wait_filling_the_gap_is_not_data(tmp_path, call):
    # The main thread waits on the GIL through the whole gap: contention between the
    # process's own threads, so an OS wait (idle), not input.
    steps, _ = breakdown_rows(tmp_path, nsys_trace(
        tmp_path, f"gil-{call}", [(GAP[0], GAP[1], call, MAIN, MAIN)]))
    for b in steps:
        assert b["data"] == 0
        assert b["idle"] == GAP_GPU_IDLE_NS
        assert b["compute"] == 2 * MS
        assert b["host_side"] == STEP_NS - 2 * MS - GAP_GPU_IDLE_NS


def test_gil_wait_does_not_turn_an_open_gap_into_less_data(tmp_path):
    # A GIL wait next to a file open: the open still makes the gap input fetching.
    steps, _ = breakdown_rows(tmp_path, nsys_trace(tmp_path, "gil-and-open", [
        (GAP[0], GAP[1], "pthread_cond_wait", MAIN, MAIN),
        (3 * MS, 3 * MS + 50_000, "openat", WORKER, MAIN)]))
    for b in steps:
        assert b["data"] == GAP_GPU_IDLE_NS and b["idle"] == 0


def test_traces_with_dataloader_ranges_do_not_use_os_gaps(tmp_path):
    # With DataLoader ranges the trace says where the data waits are; a file open elsewhere
    # is not guessed to be one.
    steps, _ = breakdown_rows(tmp_path, nsys_trace(
        tmp_path, "with-dataloader", [(3 * MS, 3 * MS + 50_000, "openat", WORKER, MAIN)],
        dataloader=(9_200_000, 9_300_000)))
    for b in steps:
        assert b["data"] == 100_000      # only the DataLoader range itself


# --- steps from annotations on one thread (Kineto's gpu_user_annotation copy) ------------------

ITER_US = 1000.0
N_ITERS = 8


def kineto_annotated(tmp_path, name, closes: bool, gpu_copy: bool = True):
    """N_ITERS iterations of 1 ms without ProfilerStep: two kernels each, and a user
    annotation `name` on the host thread around the second one (the optimizer step when
    `closes`, else a range that opens the iteration). With gpu_copy, Kineto's copy of the
    annotation on the GPU timeline (cat gpu_user_annotation, pid = device, tid = stream),
    where the annotated kernel runs."""
    t = KinetoTrace()
    for i in range(N_ITERS):
        ts = i * ITER_US
        if not closes:
            t.x("user_annotation", name, ts + 1, ITER_US - 2)
            if gpu_copy:
                t.x("gpu_user_annotation", name, ts + 20, ITER_US - 30, pid=0, tid="stream 7")
        t.launch_kernel("ampere_sgemm_128x64_tn", ts + 10, ts + 20, 500)
        if closes:
            t.x("user_annotation", name, ts + 700, 100)
            if gpu_copy:
                t.x("gpu_user_annotation", name, ts + 720, 150, pid=0, tid="stream 7")
        t.launch_kernel("void at::native::sgd_update_kernel<float>", ts + 710, ts + 720, 150)
    return t.write(tmp_path / f"{name.replace('#', '_').replace('.', '_')}-{gpu_copy}.json")


def inferred(tmp_path, path):
    db = tmp_path / (path.rsplit("/", 1)[-1] + ".duckdb")
    a = analyze([path], [], str(db))
    con = duckdb.connect(str(db), read_only=True)
    try:
        # the host windows (the last step's window runs on to the end of its GPU work)
        steps = con.execute(
            "SELECT cpu_start_ns, cpu_end_ns FROM steps ORDER BY cpu_start_ns").fetchall()
        inf = con.execute("SELECT method, steps FROM step_inference").fetchall()
        copies = con.execute(
            "SELECT count(*) FROM nvtx_ranges WHERE domain = 'gpu_user_annotation'").fetchone()[0]
        host = con.execute("""SELECT start_ns, end_ns FROM nvtx_ranges
                              WHERE domain = 'user_annotation' ORDER BY start_ns""").fetchall()
        cpu = con.execute("SELECT cpu_start_ns FROM steps ORDER BY cpu_start_ns").fetchall()
    finally:
        con.close()
    return a, steps, inf, copies, host, [r[0] for r in cpu]


@pytest.mark.parametrize("gpu_copy", [True, False])
def test_optimizer_steps_counted_once_despite_the_gpu_copy(tmp_path, gpu_copy):
    a, steps, inf, copies, host, cpu_starts = inferred(tmp_path, kineto_annotated(
        tmp_path, "Optimizer.step#SGD.step", closes=True, gpu_copy=gpu_copy))
    assert copies == (N_ITERS if gpu_copy else 0)      # the copy is loaded ...
    # ... but only one thread's ranges close steps: N optimizer steps close N-1 whole
    # iterations, not the 2N-1 (alternating 20 us / 980 us) windows of both timelines.
    assert inf == [("optimizer", N_ITERS - 1)]
    assert len(steps) == N_ITERS - 1
    assert a.verdict.per_trace[0].step_origin == "inferred:optimizer"
    for s, e in steps:
        assert e - s == pytest.approx(ITER_US * 1000, abs=1000)
    # the steps are cut at the host's optimizer ends, not at the GPU copy's
    assert cpu_starts == [e for _, e in host][:-1]


@pytest.mark.parametrize("gpu_copy", [True, False])
def test_step_annotation_counted_once_despite_the_gpu_copy(tmp_path, gpu_copy):
    a, steps, inf, copies, host, cpu_starts = inferred(tmp_path, kineto_annotated(
        tmp_path, "train_step", closes=False, gpu_copy=gpu_copy))
    assert copies == (N_ITERS if gpu_copy else 0)
    assert inf == [("annotation", N_ITERS - 1)]
    assert len(steps) == N_ITERS - 1
    for s, e in steps:
        assert e - s == pytest.approx(ITER_US * 1000, abs=1000)
    # the steps open at the host's ranges, not at the GPU copy's
    assert cpu_starts == [s for s, _ in host][:-1]


ENGINE = 4343        # the autograd engine's thread: launches the backward pass


def two_launcher_trace(tmp_path, name, main_sleeps):
    """Each 10 ms step: the main thread launches kernel A [1, 2] ms, the engine thread two
    kernels in [2, 3] ms and then waits in pthread_cond_wait until the step ends; the main thread works on
    the CPU from 3 ms to the end (no CUDA call), sleeping in [5, 8] ms when main_sleeps."""
    x = NsysExport(pid=MAIN)
    x.gpu()
    for n in range(STEPS):
        t0 = n * STEP_NS
        x.step(n, t0, t0 + STEP_NS)
        x.kernel(t0 + 1 * MS, t0 + 2 * MS, "ampere_sgemm_128x64_tn")
        for k in range(2):      # the engine thread launches the most kernels, as in a real step
            corr = x.runtime(t0 + 1_990_000 + k * 1000, t0 + 1_990_500 + k * 1000,
                             "cudaLaunchKernel_v7000", tid=ENGINE)
            x.kernel(t0 + 2 * MS + k * 500_000, t0 + 2_500_000 + k * 500_000,
                     "ampere_sgemm_128x64_tn", launch=None, corr=corr)
        x.osrt(t0 + 3 * MS, t0 + STEP_NS, "pthread_cond_wait", tid=ENGINE)
        if main_sleeps:
            x.osrt(t0 + 5 * MS, t0 + 8 * MS, "nanosleep", tid=MAIN)
    return str(x.write(tmp_path / f"{name}.sqlite"))


def test_one_launching_thread_waiting_is_not_idle(tmp_path):
    # The engine thread waits while the main thread computes on the CPU: host work, not idle
    # (seen on an H200: CPU post-processing after a training step read as idle).
    rows, _ = breakdown_rows(tmp_path, two_launcher_trace(tmp_path, "busy_main", main_sleeps=False))
    for b in rows[1:-1]:        # (the first and last steps lack a CUDA call before / after)
        assert b["idle"] == 0
        assert b["host"] >= 6 * MS          # [3, 10] ms less the launch stretch at its edges


def test_every_launching_thread_waiting_is_idle(tmp_path):
    rows, _ = breakdown_rows(tmp_path, two_launcher_trace(tmp_path, "sleeping_main", main_sleeps=True))
    for b in rows[1:-1]:
        assert b["idle"] == 3 * MS          # both threads wait in [5, 8] ms
        assert b["host"] >= 3 * MS
