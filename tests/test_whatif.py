"""The what-if model (navdoctor/whatif.py, docs/verdict.md "Predicted speed-ups"): a step
replayed from its graph gives the traced step; each remedy's transformation moves the step the
way the remedy does on captures where it must and leaves it where it must not; remedies fit the
GPU and what the trace shows already on; the report carries the figures."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from navdoctor import analysis, store, whatif
from navdoctor.gpus import gpu_spec

GPU = Path(__file__).resolve().parent.parent / "fixtures" / "gpu"


def _capture(path: Path, unprofiled_ms: float | None = None):
    con = store.connect_new(None)
    try:
        analysis.prepare_store(con, [str(path)], unprofiled_step_ms=unprofiled_ms)
        return whatif.capture(con, 1)
    finally:
        con.close()


@pytest.fixture(scope="module")
def caps():
    return {name: _capture(GPU / name / "nsys.sqlite.gz") for name in
            ("memory_item_sync", "launch_batch1_small", "io_jpeg_decode", "compute_convnet",
             "memory_pageable_copy", "nav_realtime_graphs", "memory_item_sync_fixed")}


@pytest.mark.parametrize("name", ["memory_item_sync", "launch_batch1_small", "io_jpeg_decode",
                                  "compute_convnet", "memory_pageable_copy"])
def test_the_traced_step_replays_as_traced(caps, name):
    cap = caps[name]
    replayed = sum(whatif.replay(g) for g in cap.graphs) / len(cap.graphs)
    traced = sum(g.traced_ns for g in cap.graphs) / len(cap.graphs)
    assert abs(replayed / traced - 1) < 0.2, (name, replayed / 1e6, traced / 1e6)


def test_the_host_scale_meets_the_step_timed_without_a_tracer(caps):
    """Given a step timed without a tracer that the host's time sets, the replay of the graph
    without the tracer's share is that step; without one, the prior is used and said."""
    cap = caps["launch_batch1_small"]
    traced = sum(g.traced_ns for g in cap.graphs) / len(cap.graphs)
    w = whatif.predict(cap, 0.7 * traced)
    assert w.host_scale_from.startswith("measured") and w.host_scale < 1.0
    assert abs(w.baseline_ms * 1e6 / (0.7 * traced) - 1) < 0.03
    assert whatif.predict(cap).host_scale_from == "prior"


def _expected(cap, rid, **kw):
    return whatif.predict(cap, **kw).predictions[rid]


def test_cuda_graphs_help_a_launch_bound_step_and_not_a_gpu_bound_one(caps):
    assert _expected(caps["launch_batch1_small"], "cuda_graphs").expected > 2.0
    assert _expected(caps["compute_convnet"], "cuda_graphs").expected < 1.1


def test_fewer_syncs_help_a_step_that_reads_the_gpu_each_layer(caps):
    assert _expected(caps["memory_item_sync"], "fewer_syncs").expected > 1.3
    # the fixed workload reads once: nothing left to remove
    p = _expected(caps["memory_item_sync_fixed"], "fewer_syncs")
    assert p.expected is None or p.expected < 1.1


def test_workers_help_a_loader_bound_step_only(caps):
    assert _expected(caps["io_jpeg_decode"], "num_workers").expected > 3.0
    p = _expected(caps["compute_convnet"], "num_workers")
    assert p.expected is None and "nothing in the trace" in p.why_not


def test_pinned_copies_help_pageable_copies(caps):
    assert _expected(caps["memory_pageable_copy"], "pin_memory").expected > 1.3


def test_low_precision_helps_fp32_convolutions(caps):
    assert _expected(caps["compute_convnet"], "amp_bf16").expected > 1.3


def test_graphed_steps_are_not_told_to_use_graphs(caps):
    p = _expected(caps["nav_realtime_graphs"], "cuda_graphs")
    assert p.expected is None and p.why_not.startswith("already on")


def test_remedies_fit_the_gpu(caps):
    """A V100 (no bf16, no TF32): bf16 is not advised, fp16 is, from the V100's own peaks; an
    unknown GPU gets no autocast figure."""
    cap = caps["compute_convnet"]
    v100 = whatif.Capture(cap.trace_id, cap.source, "Tesla V100-SXM2-16GB", (7, 0), cap.graphs, {})
    preds = whatif.predict(v100).predictions
    assert preds["amp_bf16"].expected is None and "no bf16" in preds["amp_bf16"].why_not
    assert preds["amp_fp16"].expected and preds["amp_fp16"].expected > 1.0
    unknown = whatif.Capture(cap.trace_id, cap.source, "Some Accelerator 9000", None, cap.graphs, {})
    p = whatif.predict(unknown).predictions["amp_bf16"]
    assert p.expected is None and "unknown GPU" in p.why_not
    h200 = whatif.predict(cap).predictions
    assert h200["amp_fp16"].expected is None and "bf16" in h200["amp_fp16"].why_not


def test_gpu_table():
    assert gpu_spec("NVIDIA H200").name == "H200" and gpu_spec("NVIDIA H100 80GB HBM3").name == "H100"
    assert not gpu_spec("Tesla V100-PCIE-32GB").bf16 and not gpu_spec("Tesla T4").tf32
    assert gpu_spec(None, (8, 0)).name == "A100" and gpu_spec("Instinct MI300X").generation == "cdna3"
    assert gpu_spec("mystery") is None
    # the saved share of a TF32 matmul is the GPU's own: bf16 twice TF32 on Hopper
    assert gpu_spec("H100").saved_fraction("fp32_tensor_core") == pytest.approx(0.5, abs=0.01)


def test_a_prior_scale_widens_the_range(caps):
    cap = caps["launch_batch1_small"]
    traced = sum(g.traced_ns for g in cap.graphs) / len(cap.graphs)
    measured = _expected(cap, "cuda_graphs", unprofiled_ns=0.7 * traced)
    prior = _expected(cap, "cuda_graphs")
    assert prior.high / prior.low > measured.high / measured.low


def test_every_remedy_has_a_range_and_the_rules_name_known_remedies():
    from navdoctor.rules import load_rules
    ranges = whatif.calibration().get("ranges", {})
    assert "default" in ranges
    named = {r.whatif for rule in load_rules() for r in rule.remedies if r.whatif}
    assert named <= set(whatif.TRANSFORMS), named - set(whatif.TRANSFORMS)


def test_the_report_carries_the_figures(cli, tmp_path):
    """Each remedy with a figure carries it and its range; the first remedy is the largest;
    a remedy the trace shows already on is left out."""
    out = tmp_path / "r.json"
    r = cli("analyze", GPU / "memory_item_sync" / "nsys.sqlite.gz", "--json", out, "-q")
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    figures = [m for f in rep["findings"] for m in f["remedies"] if m.get("speedup_expected")]
    assert figures and all(m["speedup_range"][0] <= m["speedup_expected"] <= m["speedup_range"][1]
                           for m in figures)
    first = rep["first_remedy"]
    assert first and first["speedup_expected"] == max(m["speedup_expected"] for m in figures)
    assert rep["verdict"]["whatif"]["inputs"]["replay_error"] is not None
    sync = next(f for f in rep["findings"] if f["rule"] == "memory-sync-stalls")
    assert sync["speedup_expected"] == max(m.get("speedup_expected") or 0 for m in sync["remedies"])
    assert sync["speedup_if_removed"] >= sync["speedup_expected"]
    graphed = tmp_path / "g.json"
    cli("analyze", GPU / "nav_realtime_graphs" / "nsys.sqlite.gz", "--json", graphed, "-q")
    rg = json.loads(graphed.read_text())
    assert not any(m.get("whatif") == "cuda_graphs" for f in rg["findings"] for m in f["remedies"])


def test_a_profiler_inflated_launch_share_promises_no_graph_speed_up(cli, tmp_path):
    """The seed article's case: a torch.profiler trace with shapes and stacks of a step the GPU
    sets (compute_convnet_fixed: bf16 + channels_last, ~30 ms of GPU work a step) reads
    launch-bound by its inflated launch share. The confidence says so, and CUDA graphs are not
    promised a speed-up: the figure uses the prior for such traces, with a wider range."""
    out = tmp_path / "k.json"
    r = cli("analyze", GPU / "compute_convnet_fixed" / "kineto.json.gz", "--json", out, "-q")
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    v = rep["verdict"]
    assert v["bound"] == "launch" and v["confidence"] <= 0.6
    assert any("records shapes or Python stacks" in n and "confidence is lowered" in n for n in v["notes"])
    w = v["whatif"]
    assert w["inputs"]["host_scale_from"] == "prior"
    g = w["remedies"]["cuda_graphs"]
    assert g["expected"] < 1.2 and g["high"] / g["low"] > 2.0
    assert not rep["first_remedy"] or rep["first_remedy"]["whatif"] != "cuda_graphs"


def _synthetic_step(host_per_launch_ns: float, kernel_ns: float, launches: int = 40,
                    post_cpu_ns: float = 0.0) -> whatif.StepGraph:
    """A step of fp32 convolutions (TF32 tensor-core kernels), each launch after a CPU stretch
    of the model's own work, and an optional post-processing stretch after its last sync."""
    items = []
    for i in range(launches):
        items.append(whatif.Item("cpu", host_per_launch_ns * 0.6, phase="model"))
        items.append(whatif.Item("launch", host_per_launch_ns * 0.4, [whatif.Op(
            "kernel", 7, kernel_ns, "sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw",
            "fp32_tensor_core")]))
    items.append(whatif.Item("sync", 5_000))
    if post_cpu_ns:
        items.append(whatif.Item("cpu", post_cpu_ns, phase="post"))
    g = whatif.StepGraph(1, 1, items, 0.0)
    g.traced_ns = whatif.replay(g)
    return g


def test_autocast_costs_a_host_bound_step_in_units_of_its_own_host_cost_per_op(monkeypatch):
    """bf16 autocast casts each weight and dispatches every op on the host: on a step the
    host sets, that is a slowdown, and on a host twice as slow it costs twice the time; on a
    step the GPU sets, the kernels' gain shows."""
    monkeypatch.setattr(whatif, "CALIBRATION_OVERRIDE", {"params": {}})     # the defaults, not a fit
    h100 = gpu_spec("H100")
    fast, slow = _synthetic_step(10_000, 2_000), _synthetic_step(20_000, 2_000)
    assert whatif.host_per_op(slow) == pytest.approx(2 * whatif.host_per_op(fast))

    def added(g):
        return whatif.replay(whatif._low_precision(g, h100)) - whatif.replay(g)
    assert added(fast) > 0 and added(slow) == pytest.approx(2 * added(fast), rel=0.05)
    gpu_bound = _synthetic_step(10_000, 200_000)
    assert whatif.replay(whatif._low_precision(gpu_bound, h100)) < 0.8 * whatif.replay(gpu_bound)


def test_the_tracer_share_leaves_long_cpu_work_as_traced():
    """The tracer's cost is per call: scaling the host for it shrinks the model's launches and
    the short stretches between them, not the post-processing after the last sync."""
    g = _synthetic_step(10_000, 2_000, post_cpu_ns=5_000_000)
    half = whatif.scaled_host(g, 0.5)
    post = [it.dur for it in half.items if it.phase == "post"]
    model = [it.dur for it in half.items if it.kind == "cpu" and it.phase == "model"]
    assert post == [5_000_000] and model[0] == pytest.approx(3_000)
    assert whatif.replay(g, host_scale=0.5) == pytest.approx(whatif.replay(half), rel=1e-6)


def test_a_step_the_gpu_sets_takes_the_prior_host_scale(caps):
    """Where the GPU sets the step, every scale of the host replays to the step timed without
    a tracer: the tracer's share is not measured there, and the prior stands (the traced host
    time taken whole would lengthen the host's part of every remedy)."""
    cap = caps["compute_convnet"]
    replayed = sum(whatif.replay(g) for g in cap.graphs) / len(cap.graphs)
    w = whatif.predict(cap, replayed)
    assert w.host_scale == pytest.approx(whatif.param(f"host_scale_prior_{cap.source}"))
    assert w.host_scale_from == "measured (prior within its range)"


@pytest.mark.parametrize("name, aten", [
    ("void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel<3, float, int>(...)", True),
    ("at::native::{anonymous}::conv_depthwise3d_cuda_kernel<float, float, 3, 3, 3, 1, 1, 1, 1, 1, 1>", True),
    ("conv2d_c1_k1_nhwc", False),
    ("void cudnn::cnn::conv2d_grouped_direct_kernel<false, true, float, float>(...)", False),
])
def test_aten_depthwise_kernels_are_told_from_cudnns(name, aten):
    from navdoctor.kernelnames import aten_depthwise_conv, depthwise_conv
    assert depthwise_conv(name) and aten_depthwise_conv(name) is aten


def _loader_step(load_ns: float, kernel_ns: float, sync: bool) -> whatif.StepGraph:
    """A step that loads its batch on the loop's thread, then launches 10 kernels (and waits
    for them, where sync)."""
    items = [whatif.Item("data", load_ns, phase="pre")]
    for _ in range(10):
        items.append(whatif.Item("launch", 5_000, [whatif.Op("kernel", 7, kernel_ns / 10, "k")]))
    if sync:
        items.append(whatif.Item("sync", 5_000))
    return whatif.StepGraph(1, 1, items, 0.0)


def test_a_loader_overlapping_the_gpu_keeps_its_work_on_the_host():
    """The wait measured without a tracer is the GPU's: a loader whose work overlaps the GPU's
    queued kernels shows none, yet its 10 ms stay the host's, and bound the step once the GPU's
    part halves (the measured 0 ms taken as the loader's time promised the full 2x)."""
    g = _loader_step(10e6, 15e6, sync=False)
    assert whatif.data_idle(g) == pytest.approx(0.0, abs=1e3)
    kept = whatif.with_data_wait(g, 0.0)
    assert sum(it.dur for it in kept.items if it.kind == "data") == pytest.approx(10e6)
    halved = whatif.StepGraph(1, 1, [whatif.Item(it.kind, it.dur, [whatif.with_dur(op, op.dur / 2) for op in it.ops],
                                                 it.name, it.phase) for it in kept.items], 0.0)
    assert whatif.replay(kept) / whatif.replay(halved) < 1.5


def test_a_loader_the_gpu_waits_for_is_shortened_to_the_measured_wait():
    """Where the GPU waits on the loader (the step syncs), the traced wait longer than the one
    measured without a tracer is the tracer's: shortened until the replayed GPU wait is the
    measured one."""
    g = _loader_step(10e6, 5e6, sync=True)
    assert whatif.data_idle(g) == pytest.approx(10e6, rel=0.02)
    shortened = whatif.with_data_wait(g, 4e6)
    assert whatif.data_idle(shortened) == pytest.approx(4e6, rel=0.02)


def test_the_compute_line_says_the_kernels_gain_and_the_replayed_step_apart(cli):
    """The seed article's script on a host that sets its step: by kernel names bf16 +
    channels_last would speed it up, while the replay, with autocast's host cost, expects a
    slowdown; the report says both, each as what it is."""
    seed = GPU / "advice-h100-slow-host" / "seed" / "nsys.sqlite.gz"
    r = cli("analyze", seed, "--unprofiled-step-ms", "6.8")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "compute remedies" in x)
    kernels = float(line.split("~")[1].split("x")[0])
    replayed = float(line.split("autocast's host cost (both): expected ")[1].split("x")[0])
    assert kernels > 1.05 and replayed < 1.0, line


def test_a_graphed_step_pays_no_host_cast_per_weight():
    """A step that replays one CUDA graph of 50 TF32 kernels after 2 ms of Python: the graph
    replays autocast's casts with its kernels, so bf16 costs the host no op per weight (each
    cast once cost half the step's Python, and bf16 was expected at 0.08x)."""
    kernels = [whatif.Op("kernel", 7, 40_000, "sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw",
                         "fp32_tensor_core") for _ in range(50)]
    g = whatif.StepGraph(1, 1, [whatif.Item("cpu", 2_000_000, phase="model"),
                                whatif.Item("launch", 12_000, kernels, "cudaGraphLaunch"),
                                whatif.Item("sync", 5_000)], 0.0)
    g.traced_ns = whatif.replay(g)
    after = whatif.replay(whatif._low_precision(g, gpu_spec("H100")))
    assert whatif.replay(g) / after > 0.9


def _window(blocking_first: bool) -> whatif.StepGraph:
    """A training step's host window: the loss read (a sync), then 20 launches with 300 us of
    Python before each; or the same with the read at the end, and 2 ms of CPU after it."""
    launches = []
    for _ in range(20):
        launches.append(whatif.Item("cpu", 300_000))
        launches.append(whatif.Item("launch", 5_000, [whatif.Op("kernel", 7, 200_000, "k")]))
    sync = [whatif.Item("sync", 5_000)]
    items = ([whatif.Item("cpu", 10_000), *sync, *launches] if blocking_first
             else [whatif.Item("cpu", 10_000), *launches, *sync, whatif.Item("cpu", 2e6)])
    g = whatif.StepGraph(1, 1, items, 0.0)
    whatif.place_host_work(g)
    return g


def test_a_window_that_begins_at_the_previous_read_has_no_post_processing():
    """nsys step windows can begin at the previous iteration's blocking read (its
    loss.item()): the Python between the launches that follow is the model's, not
    post-processing (which the tracer's share leaves unscaled); after a read that ends the
    step's GPU work, CPU time is post-processing."""
    rotated = _window(blocking_first=True)
    assert not [it for it in rotated.items if it.phase == "post"]
    # (it copies nothing in: the CPU before its first launch is the model's too)
    assert sum(it.dur for it in rotated.items if it.phase == "model") == pytest.approx(20 * 300_000 + 10_000)
    ending = _window(blocking_first=False)
    assert [it.dur for it in ending.items if it.phase == "post"] == [2e6]


def _prologue_step(copy_in: bool) -> whatif.StepGraph:
    """1 ms of CPU, then (where copy_in) a copy of the input to the GPU, then 30 launches with
    Python between them, then the output read back."""
    items = [whatif.Item("cpu", 1e6)]
    if copy_in:
        items.append(whatif.Item("launch", 5_000, [whatif.Op("copy", 7, 20_000, copy_kind="HtoD", bytes=1 << 20)]))
    for _ in range(30):
        items += [whatif.Item("cpu", 20_000), whatif.Item("launch", 5_000, [whatif.Op("kernel", 7, 3_000, "k")])]
    items.append(whatif.Item("copy", 5_000, [whatif.Op("copy", 7, 5_000, copy_kind="DtoH", bytes=4000)]))
    g = whatif.StepGraph(1, 1, items, 0.0)
    whatif.place_host_work(g)
    return g


def test_cuda_graphs_replace_the_models_python_but_keep_the_inputs_preparation():
    """A step that copies nothing to the GPU has no input prepared on the host: the CPU before
    its first kernel is the model's Python, which a graph replay does not run. A step that
    copies its input in prepared it on the host first: that stays."""
    no_input = _prologue_step(copy_in=False)
    assert no_input.items[0].phase == "model"
    graphed = whatif._cuda_graphs(no_input, None)
    assert whatif.replay(graphed) < 0.3e6
    with_input = _prologue_step(copy_in=True)
    assert with_input.items[0].phase == "pre"
    assert whatif.replay(whatif._cuda_graphs(with_input, None)) > 1e6


def test_a_loader_window_that_begins_at_the_previous_read_keeps_only_its_tail_as_post():
    """As Nsight Systems cut a training loop with its loader on the loop's thread: the previous
    loss read, the DataLoader wait, the batch copied in from pageable memory (the window's last
    blocking call), then the forward, backward and optimizer launches with Python between
    them, and 1 ms of logging after the last launch. The Python between the launches is the
    model's; the logging after them is post-processing."""
    items = [whatif.Item("sync", 5_000), whatif.Item("data", 50e6),
             whatif.Item("copy", 5_000, [whatif.Op("copy", 7, 2e6, copy_kind="HtoD", src="pageable", bytes=20 << 20)])]
    for _ in range(40):
        items += [whatif.Item("cpu", 100_000), whatif.Item("launch", 5_000, [whatif.Op("kernel", 7, 200_000, "k")])]
    items.append(whatif.Item("cpu", 1e6))
    g = whatif.StepGraph(1, 1, items, 0.0)
    whatif.place_host_work(g)
    assert [it.dur for it in g.items if it.phase == "post"] == [1e6]
    assert sum(it.dur for it in g.items if it.phase == "model") == pytest.approx(40 * 100_000)


def test_a_scalar_copied_in_is_not_an_input_prepared_on_the_host():
    """An 8-byte tensor copied to the GPU mid-model (a scale, a shape) does not make the CPU
    before the first kernel preprocessing."""
    items = [whatif.Item("cpu", 1e6), whatif.Item("launch", 5_000, [whatif.Op("kernel", 7, 3_000, "k")]),
             whatif.Item("launch", 5_000, [whatif.Op("copy", 7, 1_000, copy_kind="HtoD", bytes=8)]),
             whatif.Item("launch", 5_000, [whatif.Op("kernel", 7, 3_000, "k")])]
    g = whatif.StepGraph(1, 1, items, 0.0)
    whatif.place_host_work(g)
    assert g.items[0].phase == "model"


def test_predicting_again_gives_the_same_figures_and_leaves_the_steps_as_they_were(caps):
    """predict keeps each capture's replayed base steps for the next call: no remedy's
    transformation may change them."""
    cap = caps["launch_batch1_small"]
    first = whatif.predict(cap, 3e6)
    key = next(k for k in cap.scales if k[0] == 3e6)

    def cached_steps():
        return [[(it.kind, it.dur, it.phase, [(op.kind, op.dur) for op in it.ops]) for it in g.items]
                for g in cap.scales[key][2]]
    before = cached_steps()
    again = whatif.predict(cap, 3e6)
    assert cached_steps() == before
    assert {k: p.expected for k, p in first.predictions.items()} == {k: p.expected for k, p in again.predictions.items()}
    assert any(p.expected for p in first.predictions.values())


def _logits_step(copy_in_bytes: int) -> whatif.StepGraph:
    """A segmenter's step: (where copy_in_bytes) its frame copied in, 20 kernels, its fp32
    logits (160 MiB) copied back with a blocking copy, then 30 ms of numpy post-processing."""
    items = [whatif.Item("cpu", 1e6)]
    if copy_in_bytes:
        items.append(whatif.Item("launch", 5_000, [whatif.Op("copy", 7, 200_000, copy_kind="HtoD",
                                                             bytes=copy_in_bytes)]))
    items += [whatif.Item("launch", 5_000, [whatif.Op("kernel", 7, 100_000, "k")]) for _ in range(20)]
    items += [whatif.Item("copy", 5_000, [whatif.Op("copy", 7, 20e6, copy_kind="DtoH", bytes=160 << 20)]),
              whatif.Item("cpu", 30e6)]
    g = whatif.StepGraph(1, 1, items, 0.0)
    whatif.place_host_work(g)
    return g


def test_post_processing_on_the_gpu_copies_back_what_the_snippet_keeps(monkeypatch):
    """Reducing on the GPU before copying back (the remedy's snippet: a uint8 mask): the
    copy of the logits shrinks to reduced_copy_factor of them where the step copied nothing
    in, and to at most the input's size where it did; the CPU post-processing becomes GPU
    work. A step without a large copy back keeps its copies as they are."""
    # the snippet copies a uint8 mask: 1 byte a pixel for 4 x ~20 of the fp32 logits; the
    # shipped calibration does not fit it, so it carries the same value
    assert whatif.PARAM_DEFAULTS["reduced_copy_factor"] == pytest.approx(1 / 80)
    assert whatif.calibration()["params"]["reduced_copy_factor"] == pytest.approx(1 / 80)
    monkeypatch.setattr(whatif, "CALIBRATION_OVERRIDE", {"params": {}})     # the defaults, not a fit

    def copy_back_ns(g):
        return [op.dur for it in g.items for op in it.ops if op.kind == "copy" and op.copy_kind == "DtoH"]
    no_input = whatif._host_work_to_gpu(_logits_step(0), "post")
    assert copy_back_ns(no_input) == [pytest.approx(20e6 * whatif.PARAM_DEFAULTS["reduced_copy_factor"])]
    assert not [it for it in no_input.items if it.kind == "cpu" and it.phase == "post"]
    framed = whatif._host_work_to_gpu(_logits_step(6 << 20), "post")      # a 1080p uint8 frame
    assert copy_back_ns(framed) == [pytest.approx(20e6 * 6 / 160)]
    before = whatif.replay(_logits_step(0))
    assert whatif.replay(no_input) < 0.2 * before
    small = _logits_step(0)
    for it in small.items:
        it.ops = [op if op.kind != "copy" else
                  whatif.Op("copy", 7, 20_000, copy_kind="DtoH", bytes=4000) for op in it.ops]
    assert copy_back_ns(whatif._host_work_to_gpu(small, "post")) == [20_000]
