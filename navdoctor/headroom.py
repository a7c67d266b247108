"""Compute headroom: how much of a step's kernel time the standard compute remedies (bf16
autocast, channels_last) can be expected to remove, from the kernels' names alone.

The breakdown says how long the GPU computes; it cannot say whether that time would shrink.
A compute-bound LR-ASPP MobileNetV3 (depthwise convolutions, normalisation, resampling: memory-
bound kernels) gained nothing from bf16 + channels_last on an H100 or an H200, while a ResNet-50
whose TF32 convolutions and cuDNN layout conversions took ~40% of its kernel time gained 1.26x
(docs/accuracy.md, "Compute headroom"). The kernels' names tell the two apart (kernelnames.compute_remedy_family),
and each family is given the share of its time the remedies remove (SAVED_FRACTION, below).

The result is the table compute_headroom, one row per trace, per steady step (ns):
kernel_ns, layout_ns, fp32_tensor_core_ns, fp32_cuda_core_ns, half_ns, depthwise_ns, saved_ns
(none where depthwise convolutions take DEPTHWISE_SHARE of the kernel time), and the
costliest kernel of the first three families (top_layout_kernel, ...). The verdict
settles a close call between compute and a cause of GPU idle time by it, the report's
estimated_gain["compute"] takes it as its expected figure, and rules read it
(docs/verdict.md, "Compute headroom").
"""
from __future__ import annotations

import duckdb

from . import store
from .kernelnames import compute_remedy_family, depthwise_conv

# The share of a family's kernel time the remedies are expected to remove:
# - layout conversions: all of it (channels_last hands cuDNN the NHWC it converts to);
# - TF32 tensor-core math: half (bf16's dense tensor-core peak is twice TF32's on A100, H100,
#   H200 and B200, by NVIDIA's data sheets);
# - fp32 CUDA-core math: 7/8 (bf16 tensor cores peak at ~15x fp32 CUDA cores on A100/H100; the
#   corpus's fp32 workloads measured 10.4x for an MLP and 4.3x for a ResNet-50 step with bf16,
#   docs/accuracy.md, "Step time before and after each remedy": 8x is under what they gave).
# Everything else is taken to stay as it is (memory-bound kernels, already-half math).
SAVED_FRACTION = {"layout": 1.0, "fp32_tensor_core": 0.5, "fp32_cuda_core": 0.875}
FAMILIES = ("layout", "fp32_tensor_core", "fp32_cuda_core", "half")
# A network whose depthwise (direct) convolutions take this share of its kernel time or more
# is expected to gain nothing from bf16 + channels_last together: on the 16-model H100 sweep
# the five such networks (22-28%: LR-ASPP and DeepLabV3 on MobileNetV3, MobileNetV3 in
# inference and training, EfficientNet-B0) gave 0.72-1.12x (channels_last alone 0.65-1.32x,
# slowing their depthwise convolutions on the segmenters), while ConvNeXt-T at 12.9% gave
# 2.43x from its fp32 linear layers; the line sits between (docs/accuracy.md, "Compute headroom",
# the held-out models: the four held-out networks over it gave
# 0.48-1.04x). The mixed corpus's 42 LR-ASPP and DeepLabV3 points measured 0.88-1.05x for
# the pair.
DEPTHWISE_SHARE = 0.18
HEADROOM_COLUMNS = ("kernel_ns", *(f"{f}_ns" for f in FAMILIES), "depthwise_ns", "saved_ns")


def depthwise_limited(depthwise: float, kernel: float) -> bool:
    """Whether depthwise convolutions take DEPTHWISE_SHARE of the kernel time or more (then
    nothing is expected from the compute remedies)."""
    return bool(kernel) and depthwise >= DEPTHWISE_SHARE * kernel


def create_compute_headroom(con: duckdb.DuckDBPyConnection) -> None:
    """The compute_headroom table, from kernels_in_steps and the steady steps (views.py).
    Communication kernels are not compute and are left out."""
    per_name = con.execute("""
        SELECT trace_id, name, sum(dur_ns) FROM kernels_in_steps
        WHERE NOT coalesce(is_communication, false) GROUP BY ALL""").fetchall()
    steps = dict(con.execute(
        "SELECT trace_id, count(*) FROM steady_steps GROUP BY trace_id").fetchall())
    totals: dict[int, dict[str, float]] = {}
    top: dict[tuple[int, str], tuple[float, str]] = {}   # (trace, family) -> its costliest kernel
    for trace_id, name, ns in per_name:
        t = totals.setdefault(trace_id, dict.fromkeys(("kernel", *FAMILIES, "depthwise", "saved"), 0.0))
        ns = float(ns or 0)
        t["kernel"] += ns
        if depthwise_conv(name):
            t["depthwise"] += ns
        family = compute_remedy_family(name)
        if family:
            t[family] += ns
            t["saved"] += ns * SAVED_FRACTION.get(family, 0.0)
            if (trace_id, family) not in top or (ns, name) > top[trace_id, family]:
                top[trace_id, family] = (ns, name)
    for t in totals.values():
        if depthwise_limited(t["depthwise"], t["kernel"]):
            t["saved"] = 0.0
    con.execute("""
        CREATE OR REPLACE TABLE compute_headroom (
            trace_id INTEGER, kernel_ns BIGINT, layout_ns BIGINT, fp32_tensor_core_ns BIGINT,
            fp32_cuda_core_ns BIGINT, half_ns BIGINT, depthwise_ns BIGINT, saved_ns BIGINT,
            top_layout_kernel VARCHAR, top_fp32_tensor_core_kernel VARCHAR,
            top_fp32_cuda_core_kernel VARCHAR)""")
    # per step, in whole ns as every *_ns column of the store
    rows = [(tid, *(round(t[k] / max(steps.get(tid, 1), 1)) for k in ("kernel", *FAMILIES, "depthwise", "saved")),
             *(top.get((tid, f), (0, None))[1] for f in FAMILIES[:3]))
            for tid, t in sorted(totals.items())]
    store.insert_rows(con, "compute_headroom", rows)


def speedup_without_share(share: float) -> float:
    """The step's speed-up if `share` of it went away and nothing else changed (at most 100x):
    the figure of every estimate of the report and of a close call's gains."""
    return round(1.0 / max(1.0 - share, 0.01), 2)


def expected_speedup(saved_ns: float, step_ns: float) -> float:
    """The step's expected speed-up if saved_ns of it went away."""
    if step_ns <= 0 or saved_ns <= 0:
        return 1.0
    return speedup_without_share(saved_ns / step_ns)
