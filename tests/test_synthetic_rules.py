"""Rules that no real capture in fixtures/ triggers, checked on traces built event by event:
blocking file reads (Nsight Systems OS runtime trace), GPU memory near capacity, low
occupancy of long non-matmul kernels, and exposed communication (no multi-GPU capture yet)."""
import pytest

from navdoctor.analysis import analyze
from navdoctor.rules import load_rules
from kineto_factory import KinetoTrace
from nsys_factory import NsysExport

MS = 1_000_000


def nsys_reads(tmp_path, read_ms: float):
    """Five 10 ms steps; in each a DataLoader worker blocks in read() for read_ms."""
    e = NsysExport()
    e.gpu()
    for n in range(5):
        t0 = n * 10 * MS
        e.step(n, t0, t0 + 10 * MS)
        e.kernel(t0 + 1 * MS, t0 + 9 * MS, "ampere_sgemm_128x64_tn")
        e.osrt(t0 + MS // 2, t0 + MS // 2 + int(read_ms * MS), "read", tid=77)
    return str(e.write(tmp_path / f"reads{read_ms}.sqlite"))


def kineto_memory(tmp_path, used_fraction: float):
    t = KinetoTrace()
    for n in range(3):
        t.step(n, n * 1000, 1000)
        t.launch_kernel("ampere_sgemm_128x64_tn", n * 1000 + 10, n * 1000 + 20, 900)
        t.memory(n * 1000 + 5, int(80e9 * used_fraction))
    return t.write(tmp_path / f"mem{used_fraction}.json", device_mem=80 * 10**9)


def kineto_occupancy(tmp_path, occupancy_pct: float):
    """Steps filled with long elementwise kernels at the given achieved occupancy."""
    t = KinetoTrace()
    for n in range(3):
        t.step(n, n * 1000, 1000)
        for i in range(4):
            t.launch_kernel("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
                            n * 1000 + 10 + i * 200, n * 1000 + 20 + i * 200, 180,
                            **{"est. achieved occupancy %": occupancy_pct})
    return t.write(tmp_path / f"occ{occupancy_pct}.json")


def nsys_collectives(tmp_path, exposed_ms: float):
    """Five 10 ms steps: 6 ms of compute, and an all-reduce that runs 5 ms, of which
    exposed_ms after the compute has ended (the rest overlaps the compute)."""
    e = NsysExport()
    e.gpu()
    for n in range(5):
        t0 = n * 10 * MS
        e.step(n, t0, t0 + 10 * MS)
        e.kernel(t0 + MS // 2, t0 + 6 * MS + MS // 2, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n")
        start = t0 + 6 * MS + MS // 2 + int(exposed_ms * MS) - 5 * MS
        e.kernel(start, start + 5 * MS, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 stream=21)
    return str(e.write(tmp_path / f"nccl{exposed_ms}.sqlite"))


def kineto_optimizer(tmp_path, per_tensor_ops: int):
    """Steps whose optimizer step runs per_tensor_ops aten::add_ (one per parameter), or a
    single foreach op when per_tensor_ops is 0."""
    t = KinetoTrace()
    for n in range(4):
        s = n * 10_000
        t.step(n, s, 9_000)
        t.launch_kernel("ampere_sgemm_128x64_tn", s + 10, s + 20, 5_000)
        t.x(t.cats["annotation"], "Optimizer.step#SGD.step", s + 6_000, 2_900)
        if per_tensor_ops:
            for i in range(per_tensor_ops):
                t.op("aten::add_", s + 6_010 + i * (2_800 / per_tensor_ops), 2)
        else:
            t.op("aten::_foreach_add_", s + 6_010, 50)
    return t.write(tmp_path / f"opt{per_tensor_ops}.json")


def kineto_zero_grad(tmp_path, fills: int):
    t = KinetoTrace()
    for n in range(4):
        s = n * 10_000
        t.step(n, s, 9_000)
        t.launch_kernel("ampere_sgemm_128x64_tn", s + 10, s + 20, 5_000)
        t.x(t.cats["annotation"], "Optimizer.zero_grad#SGD.zero_grad", s + 6_000, 500)
        for i in range(fills):
            t.op("aten::zero_", s + 6_010 + i * (480 / fills), 1)
    return t.write(tmp_path / f"zero{fills}.json")


def nsys_frames(tmp_path, frame_ms: float, training: bool = False):
    """Ten inference frames of frame_ms (a convolution each), or training steps (a dgrad and
    an optimizer kernel besides) when training."""
    e = NsysExport()
    e.gpu()
    for n in range(10):
        t0 = int(n * frame_ms * MS)
        end = int(t0 + frame_ms * MS)
        e.step(n, t0, end)
        e.kernel(t0 + MS // 10, end - MS // 2, "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc")
        if training:
            e.kernel(end - MS // 2 + 10_000, end - MS // 4, "sm90_xmma_dgrad_implicit_gemm_bf16bf16")
            e.kernel(end - MS // 4 + 10_000, end - 10_000, "void at::native::multi_tensor_apply_kernel<SGD>(int)")
    return str(e.write(tmp_path / f"frames{frame_ms}{'t' if training else ''}.sqlite"))


def test_frame_budget_is_for_inference(tmp_path):
    fired = {f.rule.id for f in analyze([nsys_frames(tmp_path, 150, training=True)], load_rules()).findings}
    assert "realtime-frame-budget" not in fired
    budget = {f.rule.id: f for f in analyze([nsys_frames(tmp_path, 50)],
                                            load_rules(overrides={"realtime-frame-budget.budget_ms": "33"})).findings}
    assert "realtime-frame-budget" in budget
    assert budget["realtime-frame-budget"].metrics["over_budget"] == 10


# rule -> (builder, value where it must fire, value where it must not)
SYNTHETIC_CASES = {
    "io-blocking-file-reads": (nsys_reads, 3.0, 0.2),
    "gpu-memory-near-capacity": (kineto_memory, 0.95, 0.5),
    "compute-low-occupancy": (kineto_occupancy, 10, 60),
    "memory-exposed-communication": (nsys_collectives, 3.0, 0.5),
    "launch-per-tensor-optimizer": (kineto_optimizer, 160, 0),
    "launch-zero-grad-fills": (kineto_zero_grad, 60, 0),
    "realtime-frame-budget": (nsys_frames, 150, 50),
}


@pytest.mark.parametrize("rule", sorted(SYNTHETIC_CASES))
def test_rule_fires_and_holds_back(tmp_path, rule):
    build, fire_value, quiet_value = SYNTHETIC_CASES[rule]
    rules = load_rules()
    assert rule in {f.rule.id for f in analyze([build(tmp_path, fire_value)], rules).findings}
    assert rule not in {f.rule.id for f in analyze([build(tmp_path, quiet_value)], rules).findings}
