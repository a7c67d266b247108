"""The what-if model: a step of the trace replayed as a dependency graph, and each remedy as a
transformation of that graph replayed again (the approach of Daydream, USENIX ATC 2020: a
graph built from CUPTI traces, transformed per optimisation and simulated).

The graph of one step, from the store:
- the host's timeline: CPU stretches, CUDA API calls in call order (the launching threads
  merged: the main thread waits while autograd's thread launches the backward), DataLoader
  waits;
- each launch's GPU work (kernels, copies, memsets, by correlation id) on its stream, in
  stream order;
- blocking calls (stream/device/event synchronisation, synchronous copies), which hold the
  host until the GPU work they wait for is done.

replay() runs the graph: the host advances through its items; a GPU op starts when its
launch call has returned and its stream is free; a blocking call returns when the GPU work
it waits for is done. A step is replayed several times in a row and the steady period taken,
so GPU work queued by one step delays the next as it does in the run. The traced host times
hold the tracer's own cost, spread over every op the host runs; they are scaled down first
(host_scale: to the step timed without a tracer where it was, else a prior for the tracer), so
the replay is of the run without a tracer.

A remedy's expected speed-up is replay(graph) / replay(transformed graph); its range comes from
how far measured remedies fell from the replay's cross-validated figure on the calibration
corpus (whatif_calibration.json, made by bench/advice/calibrate.py; docs/accuracy.md, "Predicted
speed-ups"). Each transformation's parameters are in that file too.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import duckdb

from .gpus import GpuSpec, gpu_spec
from .kernelnames import aten_depthwise_conv, compute_remedy_family, depthwise_conv, workload_traits
from .verdict import heavy_profiler

CALIBRATION_FILE = Path(__file__).resolve().parent / "whatif_calibration.json"
MIN_INPUT_BYTES = 4096    # a copy to the GPU from this size on can be a step's input
STEPS_REPLAYED = 3        # the steady steps closest to the median step, each replayed
REPLAY_REPEATS = 4        # a step run this many times back to back; the last two give its period


@dataclass(slots=True)
class Op:
    """GPU work one call started."""
    kind: str                 # 'kernel', 'copy', 'memset'
    stream: int
    dur: float                # ns
    name: str = ""
    family: str | None = None       # kernelnames.compute_remedy_family
    depthwise: bool = False
    copy_kind: str | None = None    # 'HtoD', 'DtoH', ...
    src: str | None = None          # 'pageable', 'pinned', 'device', ...
    dst: str | None = None
    bytes: int = 0


@dataclass(slots=True)
class Item:
    """One stretch of the host's timeline."""
    kind: str                 # 'cpu', 'data', 'call', 'launch', 'sync', 'copy'
    dur: float                # ns the host spends in it (for 'sync'/'copy': the call's own cost)
    ops: list[Op] = field(default_factory=list)
    name: str = ""
    phase: str | None = None        # 'pre', 'model', 'post' (placed by place_host_work)


@dataclass
class StepGraph:
    trace_id: int
    step_num: int
    items: list[Item]
    traced_ns: float          # the step as traced (host window)
    latency_scale: float = 1.0      # the host's scale (scaled_host): launch and wake-up latencies are host time too

    def clone(self) -> "StepGraph":
        """A copy whose items a transformation may change. Ops are shared: a transformation
        replaces an op (with_dur) rather than changing it (copy.deepcopy of a step of
        thousands of launches is ~10x slower)."""
        return StepGraph(self.trace_id, self.step_num,
                         [Item(it.kind, it.dur, list(it.ops), it.name, it.phase)
                          for it in self.items], self.traced_ns, self.latency_scale)


def with_dur(op: Op, dur: float) -> Op:
    """A copy of op lasting dur."""
    return dataclasses.replace(op, dur=dur)


# ---- building the graph from the store ----------------------------------------------------

def _steps_to_replay(con: duckdb.DuckDBPyConnection, trace_id: int) -> list[tuple]:
    """The steady steps closest to the trace's median step: (step_num, host start, host end)."""
    return con.execute(f"""
        SELECT step_num, coalesce(cpu_start_ns, start_ns), coalesce(cpu_end_ns, end_ns)
        FROM steady_steps WHERE trace_id = ? AND coalesce(cpu_end_ns, end_ns) > coalesce(cpu_start_ns, start_ns)
        ORDER BY abs(dur_ns - (SELECT median(dur_ns) FROM steady_steps WHERE trace_id = ?)), step_num
        LIMIT {STEPS_REPLAYED}""", [trace_id, trace_id]).fetchall()


def _ops_by_correlation(con, trace_id: int, start: int, end: int) -> dict[int, list[Op]]:
    """GPU work of the calls made in [start, end), by correlation id, in GPU start order."""
    rows = con.execute("""
        WITH calls AS (SELECT DISTINCT correlation_id FROM runtime_calls
                       WHERE trace_id = $t AND start_ns >= $s AND start_ns < $e
                         AND correlation_id IS NOT NULL)
        SELECT 'kernel', k.correlation_id, k.stream_id, k.dur_ns, k.name, NULL, NULL, NULL, 0, k.start_ns
        FROM kernels k JOIN calls USING (correlation_id) WHERE k.trace_id = $t
        UNION ALL
        SELECT 'copy', m.correlation_id, m.stream_id, m.dur_ns, m.kind, m.kind, m.src_memory, m.dst_memory,
               coalesce(m.bytes, 0), m.start_ns
        FROM memcpy m JOIN calls USING (correlation_id) WHERE m.trace_id = $t
        UNION ALL
        SELECT 'memset', s.correlation_id, s.stream_id, s.dur_ns, 'memset', NULL, NULL, NULL,
               coalesce(s.bytes, 0), s.start_ns
        FROM memset s JOIN calls USING (correlation_id) WHERE s.trace_id = $t
        ORDER BY 10""", {"t": trace_id, "s": start, "e": end}).fetchall()
    out: dict[int, list[Op]] = {}
    for kind, corr, stream, dur, name, ck, src, dst, nbytes, _start in rows:
        fam = compute_remedy_family(name) if kind == "kernel" else None
        out.setdefault(corr, []).append(Op(kind, int(stream or 0), float(dur or 0), name or "", fam,
                                           kind == "kernel" and depthwise_conv(name), ck, src, dst,
                                           int(nbytes or 0)))
    return out


def build_step(con, trace_id: int, step_num: int, start: int, end: int) -> StepGraph:
    """The graph of one step's host window [start, end)."""
    calls = con.execute("""
        SELECT start_ns, end_ns, name, correlation_id, coalesce(is_launch, false), coalesce(is_sync, false)
        FROM runtime_calls WHERE trace_id = ? AND start_ns >= ? AND start_ns < ?
        ORDER BY start_ns, end_ns""", [trace_id, start, end]).fetchall()
    waits = con.execute("""
        SELECT start_ns, end_ns FROM dataloader_waits WHERE trace_id = ? AND end_ns > ? AND start_ns < ?
        ORDER BY start_ns""", [trace_id, start, end]).fetchall()
    ops = _ops_by_correlation(con, trace_id, start, end)
    items: list[Item] = []
    cursor = float(start)

    def host_gap(until: float) -> None:
        """CPU time from cursor to `until`, the part inside DataLoader waits as 'data'."""
        nonlocal cursor
        if until <= cursor:
            return
        t = cursor
        for ws, we in waits:
            if we <= t or ws >= until:
                continue
            if ws > t:
                items.append(Item("cpu", ws - t))
            a, b = max(ws, t), min(we, until)
            items.append(Item("data", b - a))
            t = b
        if until > t:
            items.append(Item("cpu", until - t))
        cursor = until

    # What a call costs the host by itself: a blocking call's time beyond it is waiting, which
    # the replay works out from the GPU work it waits for; a launch held longer than
    # MAX_LAUNCH_NS waited for room in the GPU's queue, which the replay models too.
    own = param("blocking_call_ns")
    max_launch = param("max_launch_ns")
    for cs, ce, name, corr, is_launch, is_sync in calls:
        host_gap(float(cs))
        dur = max(0.0, float(ce) - max(float(cs), cursor))
        cursor = max(cursor, float(ce))
        work = ops.get(corr, []) if corr is not None else []
        if is_sync and "memcpy" in (name or "").lower() and work:
            items.append(Item("copy", min(dur, own), work, name))
        elif is_sync:      # (every blocking call is replayed as waiting for all the GPU's work)
            items.append(Item("sync", min(dur, own), [], name))
        elif any(op.kind == "copy" and "pageable" in (op.src or "", op.dst or "") for op in work):
            # a copy from or to pageable memory returns once the copy is done, even when
            # called async: the host's own part is the call less the copy
            copy_ns = sum(op.dur for op in work if op.kind == "copy")
            items.append(Item("copy", max(0.0, min(dur - copy_ns, max_launch)), work, name))
        elif is_launch or work:
            items.append(Item("launch", min(dur, max_launch), work, name))
        else:
            items.append(Item("call", dur, [], name))
    host_gap(float(end))
    g = StepGraph(trace_id, step_num, items, float(end - start))
    place_host_work(g)
    return g


def place_host_work(g: StepGraph) -> None:
    """Each CPU stretch placed against the step's GPU work: 'pre' before the step's first
    copy to the GPU or first kernel launch (decoding, preprocessing), 'post' after its last
    blocking copy or blocking call (post-processing of the results), 'model' between (Python
    and framework overhead around the model's launches).
    Where a step begins at the model (a frame loop's steps are its model's calls), the host's
    work between a copy of results back and the next copy of an input holds both this frame's
    post-processing and the next frame's preprocessing; it is split between them by the bytes
    each copy moves (the work on either side scales with the data it handles)."""
    items = g.items
    first = next((i for i, it in enumerate(items) if it.kind in ("launch", "copy")), None)
    # a step that copies no input to the GPU (nothing of MIN_INPUT_BYTES or more: a scalar or a
    # shape is not an input) prepared none on the host: its CPU time before the first launch is
    # the model's own Python (module calls, argument checks)
    copies_in = any(op.kind == "copy" and op.copy_kind == "HtoD" and (op.bytes >= MIN_INPUT_BYTES or not op.bytes)
                    for it in items for op in it.ops)
    last = max((i for i, it in enumerate(items) if it.kind in ("copy", "sync")), default=None)
    if last is not None:
        # A window that launches most of its GPU work after its last blocking call (one that
        # begins at the previous iteration's loss.item(), or reads a result mid-step): the CPU
        # between those launches is the model's Python; post-processing is what follows the
        # step's last launch.
        gpu_after = sum(op.dur for it in items[last + 1:] if it.kind == "launch" for op in it.ops)
        gpu_all = sum(op.dur for it in items for op in it.ops)
        if gpu_all and gpu_after > 0.5 * gpu_all:
            last = max(i for i, it in enumerate(items) if it.kind == "launch")

    def moved(it, kind):
        return sum(op.bytes for op in it.ops if op.kind == "copy" and op.copy_kind == kind)
    back = max((i for i, it in enumerate(items) if moved(it, "DtoH")), default=None)
    into = next((i for i, it in enumerate(items) if back is not None and i > back and moved(it, "HtoD")), None)
    split = None
    if back is not None and into is not None:
        out_b, in_b = moved(items[back], "DtoH"), moved(items[into], "HtoD")
        split = (back, into, out_b / (out_b + in_b))
    placed: list[Item] = []
    for i, it in enumerate(items):
        if it.kind not in ("cpu", "data", "call"):
            placed.append(it)
            continue
        if first is None or i < first:
            it.phase = "pre" if copies_in or first is None or it.kind == "data" else "model"
        elif split and split[0] < i < split[1] and it.kind == "cpu":
            post = split[2]
            placed.append(Item("cpu", it.dur * post, [], it.name, "post"))
            it.dur *= 1.0 - post
            it.phase = "pre"
        elif last is not None and i > last:
            it.phase = "post"
        else:
            it.phase = "model"
        placed.append(it)
    g.items = placed


def tracer_slowed(it: Item) -> bool:
    """Whether the tracer's cost is in this stretch of host time: the calls, launches and
    copies it records, and the short CPU stretches between the model's ops (Python and
    framework work around each op). Not pre- or post-processing (the phases place_host_work
    gives: decoding, resizing, numpy work on results), nor a CPU stretch of long_cpu_ns or
    more: a tracer whose cost is per call adds next to nothing to them."""
    if it.kind in ("call", "launch", "copy"):
        return True
    return it.kind == "cpu" and it.dur < param("long_cpu_ns") and it.phase not in ("pre", "post")


def scaled_host(g: StepGraph, scale: float) -> StepGraph:
    """The graph with the host's own time around the model's ops (its calls, launches and the
    CPU time between them) times `scale`: the run without the tracer, whose cost is per op the
    host runs, not only per CUDA call it records (host_scale finds the scale); the host time
    tracer_slowed leaves out is kept as traced."""
    out = g.clone()
    for it in out.items:
        if tracer_slowed(it):
            it.dur *= scale
    out.latency_scale *= scale
    return out


def _with_data_scaled(g: StepGraph, scale: float) -> StepGraph:
    out = g.clone()
    for it in out.items:
        if it.kind == "data":
            it.dur *= scale
    return out


def with_data_wait(g: StepGraph, data_ns: float | None) -> StepGraph:
    """The graph with its DataLoader waits shortened until the GPU's wait on them, replayed,
    is the wait measured without a tracer (per step), where it was measured and the traced
    waits give more (the tracer slows the loader's Python). The measured figure is the GPU's
    idle time, not the loader's: a loader on the loop's thread whose work overlaps the GPU's
    queued work shows no GPU wait, yet its work is still the host's, and becomes the step's
    floor once a remedy shortens the GPU's part."""
    traced = sum(it.dur for it in g.items if it.kind == "data")
    if data_ns is None or not traced or data_idle(g) <= data_ns:
        return g
    lo, hi = 0.0, 1.0
    for _ in range(12):
        mid = (lo + hi) / 2
        if data_idle(_with_data_scaled(g, mid)) > data_ns:
            hi = mid
        else:
            lo = mid
    return _with_data_scaled(g, lo)


def host_scale(graphs: list[StepGraph], unprofiled_ns: float | None, prior: float) -> tuple[float, str]:
    """How much of the traced host time remains without the tracer: the scale at which the
    replayed step equals the step timed without a tracer. Where a range of scales gives that
    step (the GPU or the waits set it, not the host), the prior fitted on the calibration
    corpus, if inside the range; without a timed step, the prior. Returns (scale, how).
    graphs: the steps with their DataLoader waits already set (with_data_wait)."""

    def step(sc: float) -> float:
        return sum(replay(g, host_scale=sc) for g in graphs) / len(graphs)
    if not unprofiled_ns:
        return prior, "prior"
    lo, hi = param("host_scale_min"), 1.0
    if step(lo) > unprofiled_ns * 1.005:     # even the least host time replays too slow
        return lo, "measured"
    if step(hi) <= unprofiled_ns * 1.005:
        top = hi        # the traced host fits inside the timed step: no scale is ruled out
    else:
        for _ in range(14):        # the largest scale whose replay is at most the timed step
            mid = (lo + hi) / 2
            if step(mid) <= unprofiled_ns * 1.005:
                lo = mid
            else:
                hi = mid
        top = lo
    if prior <= top and abs(step(prior) - step(top)) <= 0.01 * unprofiled_ns:   # prior inside the flat range
        return prior, "measured (prior within its range)"
    return top, "measured"


# ---- replay -------------------------------------------------------------------------------

def data_idle(g: StepGraph) -> float:
    """The GPU's idle time per step while the host is in the step's DataLoader waits
    (replayed; ns)."""
    idle: list[float] = []
    replay(g, data_idle_out=idle)
    return sum(idle[-2:]) / 2 if len(idle) >= 2 else sum(idle)


def replay(g: StepGraph, repeats: int = REPLAY_REPEATS, queue_depth: int = 1024,
           host_scale: float = 1.0, data_idle_out: list[float] | None = None) -> float:
    """The steady period of the step (ns): the graph run `repeats` times back to back, the
    period taken over the last two runs. A GPU op starts launch_latency_ns after its launch
    call returns (or when its stream is free); a blocking call returns sync_latency_ns after
    the work it waits for is done. At most queue_depth launches wait on the GPU at once (a
    launch into a full queue blocks the host, as CUDA's does). host_scale multiplies the
    host's own time as scaled_host does; data_idle_out, where given, receives each run's GPU
    idle time during the DataLoader waits."""
    launch_lat = param("launch_latency_ns") * g.latency_scale * host_scale
    sync_lat = param("sync_latency_ns") * g.latency_scale * host_scale
    host = 0.0
    free: dict[int, float] = {}
    pending: list[float] = []       # end times of queued GPU ops (for the launch queue)
    marks = []
    for _ in range(repeats):
        idle = 0.0
        for it in g.items:
            kind = it.kind
            if kind in ("cpu", "call"):
                # (tracer_slowed only where it matters: this loop is the replay's hot path)
                host += it.dur * (host_scale if host_scale == 1.0 or tracer_slowed(it) else 1.0)
            elif kind == "data":
                if data_idle_out is not None:      # the part of the wait after the GPU ran dry
                    idle += max(0.0, host + it.dur - max(host, max(free.values(), default=0.0)))
                host += it.dur
            elif kind == "launch":
                if len(pending) >= queue_depth:
                    pending.sort()
                    host = max(host, pending[len(pending) - queue_depth])
                    pending = [p for p in pending if p > host]
                host += it.dur * host_scale
                for op in it.ops:
                    start = max(host + launch_lat, free.get(op.stream, 0.0))
                    free[op.stream] = start + op.dur
                    pending.append(free[op.stream])
            elif kind == "sync":
                done = max(free.values(), default=0.0)
                host = max(host + it.dur, done + sync_lat)
                pending = []
            elif kind == "copy":
                host += it.dur * host_scale
                busy = max(free.values(), default=0.0)
                for op in it.ops:
                    start = max(host + launch_lat, busy)
                    free[op.stream] = busy = start + op.dur
                host = busy + sync_lat
                pending = []
        marks.append(max(host, max(free.values(), default=0.0)))
        if data_idle_out is not None:
            data_idle_out.append(idle)
    return (marks[-1] - marks[-3]) / 2 if len(marks) >= 3 else marks[-1]


# ---- remedies as transformations ----------------------------------------------------------

CALIBRATION_OVERRIDE: dict = {}    # set while bench/advice/calibrate.py fits the parameters


def calibration() -> dict:
    """The fitted parameters and ranges (whatif_calibration.json)."""
    return CALIBRATION_OVERRIDE or _calibration_file()


@lru_cache(maxsize=1)
def _calibration_file() -> dict:
    try:
        return json.loads(CALIBRATION_FILE.read_text())
    except (OSError, ValueError):
        return {"params": {}, "ranges": {}}


# The model's parameters before calibration (whatif_calibration.json holds the fitted ones).
PARAM_DEFAULTS = {
    "launch_latency_ns": 4_000, "sync_latency_ns": 10_000, "blocking_call_ns": 5_000,
    "max_launch_ns": 50_000, "min_call_ns": 2_000, "host_scale_min": 0.2, "long_cpu_ns": 200_000,
    "host_scale_prior_nsys": 0.6, "host_scale_prior_kineto": 0.6, "prior_range_widen": 1.15,
    # torch.profiler with record_shapes/with_stack: no measured remedy to fit it on; the seed
    # article's ResNet-50 (31.6 ms a step under nsys, 43.7 ms with shapes, memory and stacks on
    # an H200) puts it well under the plain profiler's, and its range is widened twice over
    "host_scale_prior_kineto_heavy": 0.35,
    "graph_launch_ns": 12_000, "graph_kernel_gap_ns": 600,
    "matmul_efficiency": 0.6, "other_kernel_factor": 0.8, "bandwidth_bound_ns": 20_000,
    # autocast's host cost in units of the step's own host cost per op (host_per_op): the
    # dispatch on every op, and the cast op of each weight
    "autocast_dispatch_ops": 0.1, "autocast_cast_ops": 0.5,
    "cast_kernel_ns": 2_500, "depthwise_half_factor": 1.0, "depthwise_channels_last_factor": 1.2,
    "depthwise_half_channels_last_factor": 1.2,
    "workers": 8, "worker_handover_factor": 0.15, "pinned_over_pageable": 2.0,
    # (a uint8 mask of about 20 classes' fp32 logits: Cityscapes' 19, torchvision's VOC weights' 21)
    "host_to_gpu_ratio": 0.05, "min_moved_host_ns": 200_000, "reduced_copy_factor": 1 / 80,
}


def param(name: str) -> float:
    """A fitted parameter, else its default."""
    value = calibration().get("params", {}).get(name)
    return float(value if value is not None else PARAM_DEFAULTS[name])


def _cuda_graphs(g: StepGraph, spec: GpuSpec | None) -> StepGraph | None:
    """Each stretch of launches between two blocking points (syncs, blocking copies, data
    waits) captured once and replayed: its launch calls, the CPU time between them and the
    model's own CPU time just before the first (its Python up to its first kernel) become one
    graph launch; its kernels run back to back on their streams. Pre- and post-processing
    around the stretch stays."""
    out = g.clone()
    items, new = out.items, []
    graph_launch = param("graph_launch_ns")
    per_kernel_gpu = param("graph_kernel_gap_ns")
    i, replaced = 0, 0
    while i < len(items):
        if items[i].kind != "launch":
            new.append(items[i])
            i += 1
            continue
        j = i      # a stretch: launches and the CPU/calls between them, up to a blocking point
        last_launch = i
        while j < len(items) and items[j].kind in ("launch", "cpu", "call"):
            if items[j].kind == "launch":
                last_launch = j
            j += 1
        stretch = items[i:last_launch + 1]
        launches = [it for it in stretch if it.kind == "launch"]
        if len(launches) >= 2:
            while new and new[-1].kind in ("cpu", "call") and new[-1].phase == "model":
                new.pop()       # the model's Python before its first kernel: not run by a replay
            ops = [with_dur(op, op.dur + per_kernel_gpu) for it in launches for op in it.ops]
            new.append(Item("launch", graph_launch, ops, "cudaGraphLaunch"))
            replaced += len(launches)
        else:
            new.extend(stretch)
        i = last_launch + 1
    if replaced < 2:
        return None
    out.items = new
    return out


def host_per_op(g: StepGraph) -> float:
    """The host's cost of one op of the model on this host and run (ns): the median, over
    eager launches (one kernel or copy each; a graph's launch holds many), of the launch call
    and the model's own CPU time since the previous launch (its Python and framework work).
    Costs that scale with the ops a remedy adds are figured in it, so they follow the host's
    speed rather than a constant from another machine."""
    costs, since = [], 0.0
    for it in g.items:
        if it.kind in ("cpu", "call") and it.phase in (None, "model"):
            since += it.dur
        elif it.kind == "launch":
            if len(it.ops) <= 1:        # an eager op's launch, not a graph's
                costs.append(since + it.dur)
            since = 0.0
        elif it.kind != "cpu":
            since = 0.0
    return statistics.median(costs) if costs else param("min_call_ns")


def _low_precision(g: StepGraph, spec: GpuSpec | None, with_layout: bool = False) -> StepGraph | None:
    """bf16 autocast (fp16 below Ampere): each matmul/convolution kernel shortened by the share
    its GPU's half-precision peak removes (gpus.GpuSpec.saved_fraction, times an efficiency
    fitted on measured runs), other long kernels (memory-bound: elementwise, normalisation,
    cuDNN's direct depthwise convolutions) by the bytes they no longer move, ATen's depthwise
    kernels by their own fitted factor (another with channels_last, which sends them through
    layout conversions). Autocast's own cost: per weight a cast kernel and a
    cast op on the host, and dispatch time on every op, both in units of this step's own host
    cost per op (host_per_op)."""
    if spec is None:
        return None
    out = g.clone()
    eff = param("matmul_efficiency")
    other = param("other_kernel_factor")
    per_op = host_per_op(g)
    dispatch = param("autocast_dispatch_ops") * per_op
    cast_host = param("autocast_cast_ops") * per_op
    cast_ns = param("cast_kernel_ns")
    long_ns = param("bandwidth_bound_ns")

    def cast(stream: int) -> Item:
        return Item("launch", cast_host, [Op("kernel", stream, cast_ns, "cast")], "cast")
    new_items = []
    changed = False
    for it in out.items:
        if it.kind == "launch" and it.ops:
            extra: list[Item] = []
            ops = []
            # a CUDA graph's launch replays its casts with its kernels: no host op per weight
            graphed = len(it.ops) > 1
            for op in it.ops:
                fam = op.family
                if op.kind != "kernel":
                    pass
                elif fam in ("fp32_tensor_core", "fp32_cuda_core"):
                    saved = spec.saved_fraction(fam) or 0.0
                    op = with_dur(op, op.dur * (1.0 - eff * saved))
                    changed = True
                    extra.append(cast(op.stream))
                elif op.depthwise and aten_depthwise_conv(op.name):
                    op = with_dur(op, op.dur * param("depthwise_half_channels_last_factor"
                                                     if with_layout else "depthwise_half_factor"))
                    extra.append(cast(op.stream))
                elif op.depthwise:       # cuDNN's direct kernels: memory-bound, half the bytes
                    if op.dur >= long_ns:
                        op = with_dur(op, op.dur * other)
                    if with_layout:          # as _channels_last does
                        op = with_dur(op, op.dur * param("depthwise_channels_last_factor"))
                    extra.append(cast(op.stream))
                elif fam == "layout" and with_layout:
                    op = with_dur(op, 0.0)
                    changed = True
                elif fam is None and op.dur >= long_ns:
                    # a long memory-bound kernel moves half the bytes; a short one is bound by
                    # its launch and latency, not by its bytes
                    op = with_dur(op, op.dur * other)
                ops.append(op)
            if graphed:
                ops = [*ops, *(c_op for c in extra for c_op in c.ops)]
                extra = []
            it.ops = ops
            it.dur += dispatch
            new_items.extend(extra)
        new_items.append(it)
    if not changed:
        return None
    out.items = new_items
    return out


def _channels_last(g: StepGraph, spec: GpuSpec | None) -> StepGraph | None:
    """cuDNN's layout conversions (NCHW <-> NHWC) gone; depthwise convolutions slowed by a
    fitted factor (channels_last slowed them on MobileNetV3-style networks)."""
    out = g.clone()
    changed = False
    slow = param("depthwise_channels_last_factor")
    for it in out.items:
        ops = []
        for op in it.ops:
            if op.kind == "kernel" and op.family == "layout":
                op = with_dur(op, 0.0)
                changed = True
            elif op.kind == "kernel" and op.depthwise:
                op = with_dur(op, op.dur * slow)
            ops.append(op)
        it.ops = ops
    return out if changed else None


def _bf16_channels_last(g: StepGraph, spec: GpuSpec | None) -> StepGraph | None:
    return _low_precision(g, spec, with_layout=True)


def _num_workers(g: StepGraph, spec: GpuSpec | None) -> StepGraph | None:
    """DataLoader workers: the loop's own batch loading (its DataLoader waits) done by W
    processes meanwhile; a wait stays where the workers cannot keep up: (load time per batch +
    hand-over cost) / W - the rest of the step, at least 0."""
    out = g.clone()
    data = [it for it in out.items if it.kind == "data"]
    load = sum(it.dur for it in data)
    if load <= 0:
        return None
    workers = param("workers")
    handover = param("worker_handover_factor")
    rest = replay(StepGraph(g.trace_id, g.step_num, [it for it in out.items if it.kind != "data"],
                            g.traced_ns))
    left = max(0.0, load * (1 + handover) / workers - rest)
    for k, it in enumerate(data):
        it.dur = left if k == 0 else 0.0
    return out


def _pinned_copies(g: StepGraph, spec: GpuSpec | None) -> StepGraph | None:
    """pin_memory and non_blocking: copies from pageable memory at pinned bandwidth, and the
    host no longer blocked by them (a blocking copy becomes an asynchronous launch)."""
    out = g.clone()
    speed = param("pinned_over_pageable")
    changed = False
    for k, it in enumerate(out.items):
        pageable = [op for op in it.ops if op.kind == "copy" and "pageable" in (op.src or "", op.dst or "")]
        if not pageable:
            continue
        it.ops = [with_dur(op, op.dur / speed) if op in pageable else op for op in it.ops]
        if it.kind == "copy" and pageable[0].copy_kind == "HtoD":
            out.items[k] = Item("launch", param("min_call_ns"), it.ops, it.name)
        elif it.kind == "launch":      # an async copy from pageable memory stages it first
            it.dur = min(it.dur, param("min_call_ns"))
        changed = True
    return out if changed else None


def _host_work_to_gpu(g: StepGraph, phase: str) -> StepGraph | None:
    """Pre- or post-processing moved from the host to the GPU: its CPU time becomes GPU work a
    fitted fraction as long, on the model's stream, and a large copy back of the results
    shrinks to what is left after reducing them on the GPU."""
    out = g.clone()
    ratio = param("host_to_gpu_ratio")
    moved = sum(it.dur for it in out.items if it.kind == "cpu" and it.phase == phase)
    if moved <= param("min_moved_host_ns"):
        return None
    stream = next((op.stream for it in out.items for op in it.ops if op.kind == "kernel"), 0)
    new = []
    inserted = False
    for it in out.items:
        if it.kind == "cpu" and it.phase == phase:
            if not inserted:
                new.append(Item("launch", param("min_call_ns"),
                                [Op("kernel", stream, moved * ratio, f"{phase}-processing")], phase))
                inserted = True
            continue
        new.append(it)
    if phase == "post":
        # the copy back then carries the reduced result (a mask, boxes, a blended frame): at most
        # the size of the input the step copied in (a frame at the camera's resolution), else
        # reduced_copy_factor of what it copied: the remedy's snippet (rules/io.yaml) copies
        # a uint8 mask, 1 byte a pixel where the fp32 logits of C classes take 4C. (Any copy
        # back of 1 MiB or more in a step that copied nothing in is taken so, a detector's
        # outputs too, whose kept boxes are smaller still.)
        copied_in = max((op.bytes for it in new for op in it.ops
                         if op.kind == "copy" and op.copy_kind == "HtoD"), default=0)
        for it in new:
            it.ops = [with_dur(op, op.dur * min(1.0, (copied_in / op.bytes) if copied_in
                                                else param("reduced_copy_factor")))
                      if op.kind == "copy" and op.copy_kind == "DtoH" and op.bytes >= 1 << 20 else op
                      for op in it.ops]
    out.items = new
    return out


def _fewer_syncs(g: StepGraph, spec: GpuSpec | None) -> StepGraph | None:
    """The step's blocking reads kept on the GPU (metrics accumulated there and read once
    every N steps): its synchronising calls gone, the small copies back made asynchronous; one
    read per step stays where the step ended on one."""
    syncs = [i for i, it in enumerate(g.items) if it.kind in ("sync", "copy")]
    if len(syncs) < 2:
        return None
    out = g.clone()
    keep = syncs[-1]
    new = []
    for i, it in enumerate(out.items):
        if i in syncs and i != keep:
            if it.kind == "copy":
                new.append(Item("launch", it.dur, it.ops, it.name))
            continue
        new.append(it)
    out.items = new
    return out


# remedy id -> its transformation (each function's docstring says what it does); the ids are
# navdoctor verify's where it can apply them, else a code change's. cuda_graphs_rest is the
# graphs of a step that already replays some (what it still launches eagerly); amp_fp16 the
# autocast of a GPU without bf16.
TRANSFORMS = {
    "cuda_graphs": _cuda_graphs, "cuda_graphs_rest": _cuda_graphs,
    "amp_bf16": _low_precision, "amp_fp16": _low_precision,
    "channels_last": _channels_last, "amp_channels_last": _bf16_channels_last,
    "num_workers": _num_workers, "pin_memory": _pinned_copies,
    "gpu_preprocess": lambda g, s: _host_work_to_gpu(g, "pre"),
    "gpu_postprocess": lambda g, s: _host_work_to_gpu(g, "post"),
    "fewer_syncs": _fewer_syncs,
}


@dataclass
class Prediction:
    remedy: str
    expected: float | None          # the step's expected speed-up (as is / with the remedy)
    low: float | None
    high: float | None
    step_ms: float | None           # the step expected with the remedy
    why_not: str | None = None      # why there is no figure (not applicable, already on...)

    def as_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass
class WhatIf:
    trace_id: int
    gpu: str | None
    baseline_ms: float              # the replayed step without the tracer
    traced_ms: float                # the traced step, as the trace shows it
    replay_error: float             # replayed traced step / traced step - 1
    host_scale: float               # the traced host time left without the tracer
    host_scale_from: str            # 'measured' (a step timed without a tracer) or 'prior'
    steps: list[int]
    predictions: dict[str, Prediction]

    def inputs(self) -> dict:
        return {"trace_id": self.trace_id, "gpu": self.gpu, "steps_replayed": self.steps,
                "traced_step_ms": round(self.traced_ms, 3), "replayed_step_ms": round(self.baseline_ms, 3),
                "replay_error": round(self.replay_error, 4),
                "host_scale": round(self.host_scale, 3), "host_scale_from": self.host_scale_from,
                "calibration": calibration().get("version")}


def _range(remedy: str) -> tuple[float, float]:
    """Where measured / replayed fell for this remedy on the calibration corpus, figured with
    parameters fitted without the point's own network (cross-validated): a 90%
    interval (5th and 95th percentiles, widened to hold the expectation), else a wide default."""
    r = calibration().get("ranges", {}).get(remedy) or calibration().get("ranges", {}).get("default")
    return (float(r[0]), float(r[1])) if r else (0.8, 1.25)


def _already_on(con, trace_id: int, kernel_time: dict[str | None, float]) -> dict[str, str]:
    """Remedies the trace shows are already in use, and what shows it (kernel_time: the
    steps' kernel time by name)."""
    on = {}
    fam_ns: dict[str | None, float] = {}
    for name, ns in kernel_time.items():
        fam = compute_remedy_family(name)
        fam_ns[fam] = fam_ns.get(fam, 0.0) + float(ns or 0)
    math_ns = sum(v for f, v in fam_ns.items() if f in ("half", "fp32_tensor_core", "fp32_cuda_core"))
    if math_ns and fam_ns.get("half", 0.0) >= 0.8 * math_ns:
        on["amp_bf16"] = "the matmul and convolution kernels already run in half precision"
        on["amp_fp16"] = on["amp_bf16"]
        on["amp_channels_last"] = on["amp_bf16"]
    graphs = con.execute("SELECT max(graph_launches_per_step) FROM launch_calls WHERE trace_id = ?",
                         [trace_id]).fetchone()
    if graphs and graphs[0] and graphs[0] >= 1:
        on["cuda_graphs"] = ("the steps replay CUDA graphs (what is left eager: capture the rest "
                             "of the step)")
    pinned = con.execute("""
        SELECT count(*) FILTER (WHERE src_memory = 'pinned'), count(*) FILTER (WHERE src_memory = 'pageable')
        FROM memcpy_in_steps WHERE trace_id = ? AND kind = 'HtoD'""", [trace_id]).fetchone()
    if pinned and pinned[0] and not pinned[1]:
        on["pin_memory"] = "copies to the GPU already come from pinned memory"
    workers = con.execute("""SELECT count(*) FROM dataloader_waits_in_steps
                             WHERE trace_id = ? AND name ILIKE '%MultiProcessing%'""", [trace_id]).fetchone()
    if workers and workers[0]:
        on["num_workers"] = "the DataLoader already has workers"
    return on


@dataclass
class Capture:
    """What the replay needs of one trace, read from the store once (the graphs of the steps
    replayed, the GPU, the remedies already on); picklable, so a corpus can be scored again
    without its stores."""
    trace_id: int
    source: str
    gpu_name: str | None
    capability: tuple[int, int] | None
    graphs: list[StepGraph]
    already_on: dict[str, str]
    traits: dict[str, bool] = field(default_factory=dict)   # kernelnames.workload_traits
    # host_scale's answer, the steps as replayed without the tracer, their replayed step and the
    # traced steps' replayed step, by (step timed without a tracer, loader wait, parameters):
    # the calibration asks for the same ones many times
    scales: dict = field(default_factory=dict, repr=False)

    @property
    def spec(self) -> GpuSpec | None:
        return gpu_spec(self.gpu_name, self.capability)


def capture(con: duckdb.DuckDBPyConnection, trace_id: int) -> Capture | None:
    """The replay's inputs from one trace of the store (None without steps or kernels)."""
    steps = _steps_to_replay(con, trace_id)
    if not steps or not con.execute("SELECT count(*) FROM kernels WHERE trace_id = ?",
                                    [trace_id]).fetchone()[0]:
        return None
    dev = con.execute("""SELECT name, compute_major, compute_minor FROM device_info WHERE trace_id = ?
                         ORDER BY device_id LIMIT 1""", [trace_id]).fetchone()
    source = con.execute("SELECT source FROM inputs WHERE trace_id = ?", [trace_id]).fetchone()[0]
    if source == "kineto" and heavy_profiler(con, trace_id):
        source = "kineto_heavy"     # shapes or stacks recorded: its own prior for the host's share
    kernel_time = dict(con.execute("""SELECT name, sum(dur_ns) FROM kernels_in_steps WHERE trace_id = ?
                                      GROUP BY name""", [trace_id]).fetchall())
    return Capture(trace_id, source, dev[0] if dev else None,
                   (int(dev[1]), int(dev[2] or 0)) if dev and dev[1] is not None else None,
                   [build_step(con, trace_id, s, a, b) for s, a, b in steps],
                   _already_on(con, trace_id, kernel_time), workload_traits(kernel_time))


def predict(cap: Capture, unprofiled_ns: float | None = None, loader_wait_ns: float | None = None,
            remedies: list[str] | None = None) -> WhatIf:
    """The replay's expectation for each remedy: the step without a tracer replayed as is and
    transformed, unprofiled_ns (the step timed without a tracer, where it was) fixing how much
    of the traced host time is the tracer's."""
    spec = cap.spec
    graphs = cap.graphs
    traced_actual = sum(g.traced_ns for g in graphs) / len(graphs)
    prior = param(f"host_scale_prior_{cap.source}")
    key = (unprofiled_ns, loader_wait_ns, prior, param("launch_latency_ns"), param("sync_latency_ns"),
           param("host_scale_min"), param("long_cpu_ns"))
    if key not in cap.scales:
        waited = [with_data_wait(g, loader_wait_ns) for g in graphs]
        scale, how = host_scale(waited, unprofiled_ns, prior)
        # (transformations clone the steps they change: these are never altered)
        bases = [scaled_host(g, scale) for g in waited]
        cap.scales[key] = (scale, how, bases, sum(replay(g) for g in bases) / len(bases),
                           sum(replay(g) for g in graphs) / len(graphs))
    scale, how, bases, base, traced = cap.scales[key]
    on = cap.already_on
    preds: dict[str, Prediction] = {}
    for rid in remedies or list(TRANSFORMS):
        fn = TRANSFORMS[rid]
        if rid in on:
            preds[rid] = Prediction(rid, None, None, None, None, f"already on: {on[rid]}")
            continue
        if rid == "amp_bf16" and spec is not None and not spec.bf16:
            preds[rid] = Prediction(rid, None, None, None, None,
                                    f"{spec.name} has no bf16 arithmetic (fp16 autocast instead)")
            continue
        if rid == "amp_fp16" and spec is not None and spec.bf16:
            preds[rid] = Prediction(rid, None, None, None, None, f"{spec.name} has bf16: bf16 autocast instead")
            continue
        if rid.startswith("amp") and spec is None:
            preds[rid] = Prediction(rid, None, None, None, None,
                                    "unknown GPU: its arithmetic peaks are not known, so no figure")
            continue
        transformed = [fn(g, spec) for g in bases]
        if any(t is None for t in transformed):
            preds[rid] = Prediction(rid, None, None, None, None, "nothing in the trace for it to change")
            continue
        after = sum(replay(t) for t in transformed) / len(transformed)
        if after <= 0:
            continue
        replayed = base / after
        lo, hi = _range(rid)
        if how == "prior":          # no step timed without a tracer: the tracer's share assumed
            widen = param("prior_range_widen") ** (2 if cap.source == "kineto_heavy" else 1)
            lo, hi = lo / widen, hi * widen
        preds[rid] = Prediction(rid, replayed, replayed * lo, replayed * hi, base * 1e-6 / replayed)
    return WhatIf(cap.trace_id, spec.name if spec else cap.gpu_name, base * 1e-6,
                  traced_actual * 1e-6, traced / traced_actual - 1 if traced_actual else 0.0,
                  scale, how, [g.step_num for g in graphs], preds)


# The remedy a rule's `verify:` id stands for where the rule names no `whatif:` of its own.
VERIFY_TO_WHATIF = {"num_workers": "num_workers", "pin_memory": "pin_memory", "amp_bf16": "amp_bf16",
                    "amp_fp16": "amp_fp16", "channels_last": "channels_last", "cuda_graphs": "cuda_graphs"}


def for_trace(con: duckdb.DuckDBPyConnection, trace_id: int | None) -> dict | None:
    """The what-if model's figures for one trace of the store, as the report carries them
    (verdict.whatif): its inputs and, per remedy, the expected speed-up and its range or why
    there is none. The step timed without a tracer, where it was (unprofiled_step), fixes how
    much of the traced host time is the tracer's."""
    if trace_id is None:
        return None
    cap = capture(con, trace_id)
    if cap is None:
        return None
    row = con.execute("SELECT step_ns, loader_wait_ns FROM unprofiled_step WHERE trace_id = ?",
                      [trace_id]).fetchone()
    w = predict(cap, float(row[0]) if row and row[0] else None,
                float(row[1]) if row and row[1] is not None else None)
    low_precision = "amp_bf16" if (cap.spec is None or cap.spec.bf16) else "amp_fp16"
    remedies = {k: p.as_dict() for k, p in w.predictions.items()
                if not (k.startswith("amp") and k != "amp_channels_last" and k != low_precision
                        and p.expected is None)}
    return {"inputs": w.inputs(), "remedies": remedies, "low_precision": low_precision,
            "workload": cap.traits,
            "bf16": cap.spec.bf16 if cap.spec else None, "tf32": cap.spec.tf32 if cap.spec else None}
