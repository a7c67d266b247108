"""Steps inferred for traces without step markers (navdoctor/stepfinder.py): generated hand-made
captures with a start-up, a steady period with jitter and a tear-down."""
import random

import numpy as np
import pytest

from navdoctor.analysis import analyze
from navdoctor.rules import load_rules
from navdoctor.stepfinder import find_period
from kineto_factory import KinetoTrace
from nsys_factory import NsysExport

US = 1000  # ns


def _iteration_kernels(rng, n=40):
    """One iteration's launch sequence: a few kernel names reused, as a real net does."""
    names = ["conv_fwd", "bn_fwd", "relu_fwd", "conv_fwd", "bn_fwd", "add", "gemm_fwd",
             "loss", "gemm_bwd", "conv_dgrad", "conv_wgrad", "bn_bwd", "relu_bwd", "sgd_update"]
    return [names[i % len(names)] if i % 7 else f"block{i // 7}_kernel" for i in range(n)]


def hand_made_nsys(tmp_path, iterations=30, pause_ms=5.0, jitter=0.2, seed=0,
                   name="hand.sqlite", with_tail=True):
    """A plain `nsys profile` of a training script: no NVTX. Start-up: context creation,
    module loading and a cold first iteration (other kernels, 300 ms); then `iterations`
    steady iterations, each a host pause (data loading, jittered) followed by an HtoD copy and
    the same 40 kernels (~2 ms); then tear-down."""
    rng = random.Random(seed)
    x = NsysExport()
    x.gpu()
    t = 0
    x.runtime(t, t + 200_000 * US, "cuInit")
    t += 250_000 * US
    for i in range(30):  # module loading, cudnn autotuning: kernels found nowhere else
        x.kernel(t + 5 * US, t + 9_000 * US, f"autotune_candidate_{i}")
        t += 10_000 * US
    seq = _iteration_kernels(rng)
    for it in range(iterations):
        pause = pause_ms * (1 + rng.uniform(-jitter, jitter)) * 1e6
        t += int(pause)
        x.memcpy(t + 6 * US, t + 106 * US, 1 << 20)
        t += 110 * US
        for k in seq:
            x.kernel(t + 6 * US, t + 50 * US, k)
            t += 50 * US
    if with_tail:
        t += 2_000 * US
        for i in range(5):   # checkpoint saving, process exit
            x.kernel(t + 6 * US, t + 1_000 * US, f"teardown_{i}")
            x.memcpy(t + 1_100 * US, t + 5_000 * US, 1 << 26, kind="DtoH")
            t += 20_000 * US
    return x.write(tmp_path / name)


def trace_verdict(path):
    a = analyze([str(path)], load_rules())
    return a, a.verdict.per_trace[0]


def test_period_found_and_start_up_cut(tmp_path):
    a, tv = trace_verdict(hand_made_nsys(tmp_path))
    assert tv.step_origin == "inferred:period"
    assert 28 <= tv.steps <= 30          # 30 iterations; the first may be cut at its pause
    iteration_ms = 5.0 + 0.11 + 40 * 0.05
    assert abs(tv.step_ms - iteration_ms) / iteration_ms < 0.1
    note = next(w for w in a.warnings if "inferred" in w)
    assert "period of the CUDA call sequence" in note and "start-up" in note
    # the start-up (cuInit, 300 ms of autotuning kernels) is left out
    assert tv.step_inference["start_up_ms"] > 500


def test_period_survives_jitter_and_other_seeds(tmp_path):
    for seed in range(4):
        _, tv = trace_verdict(hand_made_nsys(tmp_path, iterations=20, jitter=0.5, seed=seed,
                                             name=f"j{seed}.sqlite"))
        assert tv.step_origin == "inferred:period" and 18 <= tv.steps <= 20, seed


def test_compute_bound_period_without_host_pauses(tmp_path):
    # The host never pauses (GPU-bound, the host runs ahead): the period is still found, and
    # the step time is the GPU's.
    _, tv = trace_verdict(hand_made_nsys(tmp_path, pause_ms=0.0, jitter=0.0))
    assert tv.step_origin == "inferred:period" and 27 <= tv.steps <= 30


def test_no_period_falls_back_to_gpu_window(tmp_path):
    rng = random.Random(1)
    x = NsysExport()
    t = 0
    for i in range(300):   # every kernel different: nothing repeats
        x.kernel(t + 6 * US, t + rng.randint(10, 400) * US, f"kernel_{i}_{rng.random()}")
        t += 500 * US
    a, tv = trace_verdict(x.write(tmp_path / "random.sqlite"))
    assert tv.step_origin == "gpu-window" and tv.steps >= 3
    assert any("no repeating structure found" in w for w in a.warnings)


def test_a_trace_without_structure_is_no_error(tmp_path):
    x = NsysExport()
    x.kernel(1_000, 50_000, "only_kernel")
    a, tv = trace_verdict(x.write(tmp_path / "one.sqlite"))
    assert tv.steps >= 1 and a.verdict.bound != ""


def test_a_small_capture_is_one_step_over_its_gpu_work(tmp_path):
    """A hand-made capture of a few kernels behind a long start-up (the CUDA context and the
    first allocation: 2 s of cudaMalloc) and a tear-down: too few kernels to cut windows, so
    one step from the call that launched the first kernel to the end of the last. The
    start-up must not be the step: as a whole-trace step it read launch-bound, 99% launch."""
    x = NsysExport()
    x.runtime(0, 2_000_000_000, "cudaMalloc_v3020")                 # context + first allocation
    t = 2_000_100_000
    for i in range(12):                                             # 12 kernels of 300 us, back to back
        x.kernel(t, t + 300 * US, f"conv_{i}", launch_at=(t - 20 * US, t - 15 * US))
        t += 310 * US
    x.sync(t, t + 50 * US, api="cudaDeviceSynchronize")
    x.runtime(t + 100 * US, t + 200_000_000, "cudaFree_v3020")     # tear-down
    a, tv = trace_verdict(x.write(tmp_path / "small.sqlite"))
    assert tv.step_origin == "gpu-window" and tv.steps == 1
    assert tv.step_ms == pytest.approx((t - (2_000_100_000 - 15 * US)) / 1e6, rel=0.02)
    assert tv.bound == "compute"
    note = next(w for w in a.warnings if "too little GPU work" in w)
    assert "start-up 2000.1 ms" in note and "tear-down 200.0 ms" in note


def test_the_gpu_work_step_starts_where_its_first_operation_was_issued(tmp_path):
    """The step over a small trace's GPU work starts at the end of the call that issued its
    first operation: not at a first launch's start that loaded the modules for 500 ms, and not
    at another process's call that reuses the operation's correlation id (ids restart in each
    process) at the capture's start."""
    x = NsysExport()
    x.runtime(0, 1_000_000_000, "cudaMalloc_v3020")
    t = 1_500_000_000
    first = x.kernel(t, t + 300 * US, "conv_0", launch_at=(t - 500_000_000, t - 10 * US))
    x.runtime(1_000, 2_000, "cudaLaunchKernel_v7000", corr=first, pid=7777)   # another process
    for i in range(1, 8):
        s = t + i * 310 * US
        x.kernel(s, s + 300 * US, f"conv_{i}", launch_at=(s - 20 * US, s - 15 * US))
    a, tv = trace_verdict(x.write(tmp_path / "lazy.sqlite"))
    assert tv.step_origin == "gpu-window" and tv.steps == 1
    assert tv.step_ms == pytest.approx((7 * 310 * US + 300 * US + 10 * US) / 1e6, rel=0.01)
    assert tv.bound == "compute"


def test_the_gpu_work_step_keeps_the_dataloader_wait_that_fed_it(tmp_path):
    """A single batch: 150 ms of host set-up, a 50 ms DataLoader wait, then five kernels. The
    wait fed the work and stays in the step (data); what came before it is start-up."""
    k = KinetoTrace()
    k.op("aten::empty", 0, 150_000)
    k.dataloader(150_000, 50_000)
    for j in range(5):
        k.launch_kernel(f"k{j}", 200_010 + j * 300, 200_020 + j * 300, 280)
    a, tv = trace_verdict(k.write(tmp_path / "one.json"))
    assert tv.step_origin == "gpu-window" and tv.steps == 1
    assert tv.step_ms == pytest.approx(51.5, abs=0.5)
    assert a.verdict.class_shares["io"] > 0.9


def kineto_loop(tmp_path, *, dataloader=True, modules=False, iterations=12, name="k.json"):
    """A user's own torch.profiler.profile() without a schedule: no ProfilerStep#N. A cold
    first iteration (a 400 ms wait), then iterations of a 5 ms DataLoader wait + 4 ms of
    kernels."""
    t, ts = KinetoTrace(), 1000.0
    t.launch_kernel("warmup_kernel", ts, ts + 10, 5)
    ts += 50_000
    for it in range(iterations):
        wait = 400_000.0 if it == 0 else 5_000.0
        if dataloader:
            t.dataloader(ts, wait)
        if modules:
            t.x("python_function", "nn.Module: Net_0", ts + wait, 4_100)
            t.x("python_function", "nn.Module: Conv2d_1", ts + wait + 10, 2_000)
        for j in range(8):
            t.launch_kernel(f"k{j}", ts + wait + 20 + j * 500, ts + wait + 30 + j * 500, 480)
        ts += wait + 4_200
    return t.write(tmp_path / name)


def test_kineto_without_schedule_uses_dataloader_waits(tmp_path):
    a, tv = trace_verdict(kineto_loop(tmp_path))
    assert tv.step_origin == "inferred:dataloader"
    assert tv.steps == 10                  # 12 waits: 11 steps, the cold first one cut
    assert abs(tv.step_ms - 9.2) < 0.3
    assert abs(tv.shares["data"] - 5 / 9.2) < 0.05
    assert a.verdict.bound == "io"         # 5 of 9.2 ms waiting, 4 computing: data leads


def test_kineto_module_calls_without_dataloader(tmp_path):
    _, tv = trace_verdict(kineto_loop(tmp_path, dataloader=False, modules=True))
    # 12 calls bound 11 steps; the cold 400 ms wait falls before the first call, so no
    # step holds it and none is cut as start-up.
    assert tv.step_origin == "inferred:module" and tv.steps == 11
    assert abs(tv.step_ms - 9.2) < 0.3


def test_find_period_prefers_the_step_over_a_repeated_block():
    # 12 identical 10-call blocks and 20 other calls per step: the block repeats too, but
    # only the step repeats everything.
    block = list(range(10))
    step = list(range(100, 110)) + block * 12 + list(range(200, 210))
    seq = np.array(step * 15, dtype=np.int64)
    p, score = find_period(seq)
    assert p == len(step) and score > 0.99


def test_find_period_none_for_noise():
    rng = np.random.default_rng(0)
    assert find_period(rng.integers(0, 10_000, 5_000)) is None


def test_find_period_a_repeated_layer_that_does_not_divide_the_step_is_not_the_step():
    # 96 identical layers and one other call per step: the layer's period scores within a
    # hair of the step's (0.988), but it does not divide the step, so it is a part of it.
    layer = [1, 2, 3, 4, 5]
    step = [100] + layer * 96
    p, _ = find_period(np.array(step * 12, dtype=np.int64))
    assert p == len(step)


def test_step_of_identical_layers_is_cut_at_the_host_pauses(tmp_path):
    # A batch-1 deep narrow MLP: every call of a step is one of 48 identical layers, so the
    # calls repeat every layer; only the host's pause before each step (the next input) shows
    # where a step begins. The step is the 48 layers, not one layer.
    x = NsysExport()
    x.gpu()
    t = 0
    x.runtime(t, t + 100_000 * US, "cuInit")
    t += 150_000 * US
    for it in range(25):
        t += 2_000 * US                     # the host prepares the next input
        for _layer in range(48):
            for k in ("gemm", "bias_add", "relu", "dropout_mask", "residual_add"):
                x.kernel(t + 4 * US, t + 9 * US, k)
                t += 10 * US
    a, tv = trace_verdict(x.write(tmp_path / "layers.sqlite"))
    assert tv.step_origin == "inferred:period"
    assert 22 <= tv.steps <= 25, tv.steps
    step_ms = 2.0 + 48 * 5 * 0.010
    assert abs(tv.step_ms - step_ms) / step_ms < 0.1, tv.step_ms


def test_a_longer_pause_every_few_steps_does_not_merge_them(tmp_path):
    # A data wait before every iteration, and a longer one every 4th (a round of DataLoader
    # workers, periodic logging): each iteration is still a step.
    x = NsysExport()
    x.gpu()
    t = 0
    x.runtime(t, t + 100_000 * US, "cuInit")
    t += 150_000 * US
    seq = _iteration_kernels(random.Random(0))
    for it in range(32):
        t += (5_000 if it % 4 == 0 else 1_000) * US
        for k in seq:
            x.kernel(t + 6 * US, t + 50 * US, k)
            t += 50 * US
    _, tv = trace_verdict(x.write(tmp_path / "rounds.sqlite"))
    assert tv.step_origin == "inferred:period"
    assert 28 <= tv.steps <= 32, tv.steps


# _call_sequence's queries as they were before the token dictionaries (they sorted and grouped
# every call by its kernel's name: 18 s and over DuckDB's 1 GB limit on a 5 M-kernel trace).
_CALLS_BEFORE = """
    WITH k AS (SELECT correlation_id, min(name) AS name FROM kernels
               WHERE trace_id = {t} AND correlation_id IS NOT NULL GROUP BY ALL),
    r AS (SELECT r.start_ns, r.end_ns, COALESCE(k.name, r.name) AS token
          FROM runtime_calls r LEFT JOIN k ON k.correlation_id = r.correlation_id
          WHERE r.trace_id = {t} AND r.pid IS NOT DISTINCT FROM $pid
            AND r.tid IS NOT DISTINCT FROM $tid
            AND (r.is_launch OR r.is_sync OR r.name ILIKE '%memcpy%' OR r.name ILIKE '%memset%'))
    SELECT start_ns, end_ns, dense_rank() OVER (ORDER BY token) AS tok FROM r
    WHERE start_ns IS NOT NULL ORDER BY start_ns"""
_KERNELS_BEFORE = """
    SELECT start_ns, end_ns, dense_rank() OVER (ORDER BY name) AS tok FROM kernels
    WHERE trace_id = {t} AND start_ns IS NOT NULL ORDER BY start_ns"""


def _generated_calls(seed: int, with_calls: bool):
    """A store with CUDA calls of two threads (launches, syncs, memcpy and memset calls,
    other calls) and kernels: names repeated, NULL, equal to an API's name; several kernels of
    one launch (a graph), launches without a kernel, kernels without a launch; ends and
    starts NULL. Starts are distinct (the order of equal starts is the database's)."""
    from navdoctor import store
    rnd = random.Random(seed)
    con = store.open_store()
    names = ["gemm", "conv", "relu", None, "cudaMemcpyAsync", "z_last", "a_first"]
    apis = ["cudaLaunchKernel", "cudaGraphLaunch", "cudaStreamSynchronize", "cudaMemcpyAsync",
            "cudaMemsetAsync", "cudaGetDevice", None, None]
    starts = rnd.sample(range(1, 10_000_000), 8000)
    kernel_starts = iter(starts[2000:])
    calls, kernels = [], []
    for i, s in enumerate(starts[:2000]):
        api = rnd.choice(apis)
        corr = None if rnd.random() < 0.05 else i
        # a launch of no recorded name (some without a kernel: their token is NULL, ranked last)
        launch = api in ("cudaLaunchKernel", "cudaGraphLaunch") or (api is None and i % 2 == 0)
        if with_calls:
            calls.append((1, "nsys", 7, rnd.choice([1, 1, 1, 2]), corr, api,
                          None if rnd.random() < 0.02 else s, s + 5, 5, launch,
                          api == "cudaStreamSynchronize"))
        for j in range(rnd.choice([0, 1, 1, 1, 3]) if launch or not with_calls else 0):
            ks = next(kernel_starts)
            kernels.append((1, "nsys", corr if rnd.random() < 0.97 else 10_000 + i,
                            rnd.choice(names), None if rnd.random() < 0.02 else ks, ks + 3, 3))
    store.insert_rows(con, "runtime_calls", calls, ["trace_id", "source", "pid", "tid",
                      "correlation_id", "name", "start_ns", "end_ns", "dur_ns", "is_launch", "is_sync"])
    store.insert_rows(con, "kernels", kernels, ["trace_id", "source", "correlation_id", "name",
                                                "start_ns", "end_ns", "dur_ns"])
    return con


@pytest.mark.parametrize("with_calls", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_call_sequence_tokens_are_what_sorting_by_name_gave(seed, with_calls):
    """_call_sequence (tokens numbered through small dictionaries of names) gives the calls,
    their order and the very token numbers that dense_rank() over every call's name gave: on
    generated stores (CUDA calls, or kernels only) and on a real capture without markers."""
    from navdoctor import analysis, stepfinder, store
    from conftest import ROOT
    cons = [_generated_calls(seed, with_calls)]
    if seed == 0 and with_calls:
        real = store.connect_new(None)
        analysis.prepare_store(real, [str(ROOT / "fixtures" / "gpu" / "handmade" /
                                          "train_w0.nsys.sqlite.gz")])
        cons.append(real)
    for con in cons:
        got = stepfinder._call_sequence(con, 1)
        main = con.execute("SELECT pid, tid FROM runtime_calls WHERE trace_id = 1 AND is_launch "
                           "GROUP BY ALL ORDER BY count(*) DESC LIMIT 1").fetchone()
        if main is not None:
            want = con.execute(_CALLS_BEFORE.format(t=1), {"pid": main[0], "tid": main[1]}).fetchnumpy()
        else:
            want = con.execute(_KERNELS_BEFORE.format(t=1)).fetchnumpy()
        assert got is not None and got[3] == ("CUDA call" if with_calls else "kernel")
        for i, col in enumerate(("start_ns", "end_ns", "tok")):
            assert np.array_equal(got[i], np.asarray(want[col], dtype=np.int64)), col
        assert len(np.unique(got[2])) >= 5
