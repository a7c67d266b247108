"""The verdict policy (docs/verdict.md, "Policy") and the buckets it rests on: communication and
host work are their own buckets, a cause of GPU idle time owning 20% of the step binds it, a GPU
job without its GPU timeline gets no class, and the report's gains are upper bounds."""
import json
from pathlib import Path

import pytest

from navdoctor.analysis import analyze
from navdoctor.report import build_report
from navdoctor.rules import load_rules
from navdoctor.verdict import decide
from conftest import FIXTURES
from kineto_factory import KinetoTrace
from nsys_factory import NsysExport

US = 1000
MS = 1_000_000
PUBLIC = Path(__file__).resolve().parent.parent.parent / "shared" / "public-traces"
GPU = FIXTURES / "gpu"


def cls(io=0.0, compute=0.0, memory=0.0, launch=0.0):
    return {"io": io, "compute": compute, "memory": memory, "launch": launch}


@pytest.mark.parametrize("shares, bound", [
    (cls(compute=0.56, io=0.33, launch=0.05), "io"),        # GPU idles a third waiting on data
    (cls(compute=0.46, io=0.51), "io"),                     # detection inference, 51% in waits
    (cls(compute=0.75, io=0.22), "io"),                     # 20% binds even with 75% compute
    (cls(compute=0.85, io=0.12, launch=0.03), "compute"),   # no cause reaches 20%
    (cls(compute=0.40, io=0.30, launch=0.25), "balanced"),  # two causes within 10 points
    (cls(compute=0.10, memory=0.62), "memory"),
    (cls(compute=0.20, io=0.10, launch=0.15), "balanced"),  # nothing owns enough
    (cls(), "unknown"),
])
def test_policy_on_gpu_runs(shares, bound):
    assert decide(shares, has_gpu=True, steps=10)[0] == bound


def test_cpu_only_runs_are_judged_by_the_largest_class():
    assert decide(cls(compute=0.56, io=0.33), has_gpu=False, steps=10)[0] == "compute"


def _steps(x, n, body):
    t = 0
    for i in range(n):
        x.step(i, t, t + 10 * MS)
        body(x, t)
        t += 10 * MS
    return x


def test_exposed_communication_is_memory_not_compute(tmp_path):
    # 3 ms of compute then 6 ms of all-reduce with nothing beside it, per 10 ms step.
    def body(x, t):
        x.kernel(t + 100 * US, t + 3 * MS, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64")
        x.kernel(t + 3 * MS, t + 9 * MS, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 stream=13)
    a = analyze([str(_steps(NsysExport(), 6, body).write(tmp_path / "ddp.sqlite"))], load_rules())
    assert a.verdict.shares["comm"] == pytest.approx(0.6, abs=0.02)
    assert a.verdict.shares["compute"] == pytest.approx(0.29, abs=0.02)
    assert a.verdict.bound == "memory"
    assert "memory-exposed-communication" in {f.rule.id for f in a.findings}


def test_communication_hidden_behind_compute_costs_nothing(tmp_path):
    # The all-reduce runs on its own stream while the backward pass computes: overlapped.
    def body(x, t):
        x.kernel(t + 100 * US, t + 9 * MS, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64")
        x.kernel(t + 2 * MS, t + 8 * MS, "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
                 stream=13)
    a = analyze([str(_steps(NsysExport(), 6, body).write(tmp_path / "overlap.sqlite"))], load_rules())
    assert a.verdict.shares["comm"] == 0
    assert a.verdict.bound == "compute"
    assert "memory-exposed-communication" not in {f.rule.id for f in a.findings}


def _frame_loop(tmp_path, name, cpu_stretch):
    """Per 10 ms step: 200 tiny kernels launched every 20 us (4 ms), then 5 ms in which the
    host either works without a CUDA call (cpu_stretch) or keeps launching tiny kernels."""
    def body(x, t):
        s = t + 50 * US
        for _ in range(200):
            x.kernel(s + 8 * US, s + 10 * US, "elementwise_kernel", launch_at=(s, s + 6 * US))
            s += 20 * US
        if not cpu_stretch:
            for _ in range(250):
                x.kernel(s + 8 * US, s + 10 * US, "elementwise_kernel", launch_at=(s, s + 6 * US))
                s += 20 * US
    return _steps(NsysExport(), 6, body).write(tmp_path / name)


def test_host_work_without_launches_is_its_own_bucket(tmp_path):
    a = analyze([str(_frame_loop(tmp_path, "cpu.sqlite", cpu_stretch=True))], load_rules())
    assert a.verdict.shares["host"] == pytest.approx(0.5, abs=0.06)
    assert a.verdict.class_shares["io"] >= a.verdict.shares["host"]
    b = analyze([str(_frame_loop(tmp_path, "launches.sqlite", cpu_stretch=False))], load_rules())
    assert b.verdict.shares["host"] < 0.12     # only the ~1 ms between steps
    assert b.verdict.bound == "launch"


def test_gains_expected_and_bound_in_the_report(tmp_path):
    a = analyze([str(_frame_loop(tmp_path, "cpu.sqlite", cpu_stretch=True))], load_rules())
    r = json.loads(build_report(a).model_dump_json())
    v = r["verdict"]
    io = v["class_shares"]["io"]
    g = v["estimated_gain"]["io"]
    assert g["speedup_expected"] == pytest.approx(1 / (1 - io), rel=0.01)
    # the class shares are of the step without the tracer's own cost (nsys): so is the step
    step = (v.get("tracer_cost") or {}).get("step_ms") or v["step_ms"]
    assert g["step_ms_without"] == pytest.approx(step * (1 - io), rel=0.01)
    # the bound: the traced step over the GPU's own work (kernels and copies stay for io)
    work = sum(v["shares"][b] for b in ("compute", "comm", "copy"))
    assert work < 1 - io          # this trace's GPU idles for other causes too: the bound is higher
    assert g["speedup_up_to"] == pytest.approx(1 / work, rel=0.01)
    # ... so the step it cannot go under is the GPU's own work in the traced step
    assert g["step_ms_at_least"] == pytest.approx(v["step_ms"] * work, rel=0.01)
    assert g["step_ms_at_least"] < g["step_ms_without"]
    # per finding (report 3.0): its expected figure is its best remedy's (the what-if model's),
    # never the step without its whole time, which is speedup_if_removed, a bound
    for f in r["findings"]:
        if f["at_stake_share"] > 0:
            assert f["speedup_if_removed"] == pytest.approx(1 / (1 - f["at_stake_share"]), rel=0.01)
        figures = [m["speedup_expected"] for m in f["remedies"] if m.get("speedup_expected")]
        assert f["speedup_expected"] == (max(figures) if figures else None)
        if f["speedup_expected"]:
            lo, hi = f["speedup_range"]
            assert lo <= f["speedup_expected"] <= hi
        if f["category"] in v["estimated_gain"] and f["speedup_up_to"]:
            assert f["speedup_up_to"] >= v["estimated_gain"][f["category"]]["speedup_up_to"]


def test_gain_bound_without_a_gpu_is_the_expected_figure():
    from navdoctor.gains import estimated_gain
    cls = {"io": 0.3, "compute": 0.6, "memory": 0.0, "launch": 0.1}
    shares = {"compute": 0.55, "comm": 0.0, "copy": 0.0, "data": 0.3, "sync": 0.0, "launch": 0.15,
              "host": 0.0, "idle": 0.0}
    g = estimated_gain(cls, 10.0, shares)
    assert g["io"]["speedup_up_to"] == pytest.approx(1 / 0.55, rel=0.01)
    assert "memory" not in g       # no time, no gain
    assert g["launch"]["speedup_up_to"] == pytest.approx(1 / 0.55, rel=0.01)
    assert g["compute"]["speedup_up_to"] == g["compute"]["speedup_expected"] == pytest.approx(2.5, rel=0.01)
    cpu = estimated_gain(cls, 10.0, None)
    assert all(x["speedup_up_to"] == x["speedup_expected"] for x in cpu.values())

def test_gpu_job_without_gpu_timeline_gets_no_class(tmp_path):
    # CPU ops of a distributed GPU job, its kernels filtered out of the capture.
    t = KinetoTrace()
    for i in range(4):
        s = i * 10_000
        t.step(i, s, 9_000)
        t.op("aten::linear", s + 100, 3_000)
        t.x(t.cats["annotation"], "nccl:all_reduce", s + 4_000, 200)
    a = analyze([str(t.write(tmp_path / "no_gpu.json"))], load_rules())
    assert a.verdict.bound == "unknown"
    assert any("GPU job without its GPU timeline" in n for n in a.verdict.notes)


def test_cpu_only_run_is_still_judged(tmp_path):
    t = KinetoTrace()
    for i in range(4):
        s = i * 10_000
        t.step(i, s, 9_000)
        t.op("aten::conv2d", s + 100, 8_000)
        # with_stack: torch asks whether cuDNN is enabled even on a CPU run
        t.x("python_function", "<built-in function _get_cudnn_enabled>", s + 150, 1)
    a = analyze([str(t.write(tmp_path / "cpu.json"))], load_rules())
    assert a.verdict.bound == "compute"


@pytest.mark.skipif(not PUBLIC.exists(), reason="../shared/public-traces absent")
def test_nccl_kernels_are_not_judged_as_compute_on_a_real_dlrm_trace():
    paths = sorted((PUBLIC / "param_dlrm_v100_8ranks").glob("worker0_*.json"))
    a = analyze([str(paths[0])], load_rules())
    fired = {f.rule.id for f in a.findings}
    assert "compute-low-occupancy" not in fired           # fired on ncclKernel_SendRecv before
    assert a.verdict.shares["comm"] > 0.1


@pytest.mark.skipif(not PUBLIC.exists(), reason="../shared/public-traces absent")
def test_public_cpu_ops_only_capture_of_a_gpu_job_is_unknown():
    a = analyze([str(PUBLIC / "hta_rank_non_gpu_cpuops_only" / "rank_non_gpu.json.gz")], load_rules())
    assert a.verdict.bound == "unknown"


@pytest.mark.skipif(not PUBLIC.exists(), reason="../shared/public-traces absent")
def test_optimizer_patterns_on_a_real_v100_trace():
    # HTA's V100 ResNet trace: SGD without foreach (404 add_ per step), zero_grad filling 808
    # gradients per step; a trace with a foreach optimizer and set_to_none does not fire.
    fired = {f.rule.id for f in analyze([str(PUBLIC / "hta_df_index_resolver_v100_rank1of2" /
                                             "df_index_resolver.json.gz")], load_rules()).findings}
    assert {"launch-per-tensor-optimizer", "launch-zero-grad-fills"} <= fired
    quiet = {f.rule.id for f in analyze([str(GPU / "compute_convnet" / "kineto.json.gz")],
                                        load_rules()).findings}
    assert not quiet & {"launch-per-tensor-optimizer", "launch-zero-grad-fills"}


def test_compute_rule_takes_out_the_tracer_cost_the_verdict_takes_out():
    """compute-gpu-bound judges an nsys step without the tracer's cost, as the verdict does:
    both read the tracer_cost view. The H100 mixed-corpus copy 0.1 point is the case that
    needs it (59% compute traced, 70% without the tracer's 7 ms)."""
    mixed = GPU / "mixed"
    a = analyze([str(mixed / "h100_copy_0.1.nsys.sqlite.gz")], load_rules())
    cost = a.verdict.tracer_cost
    assert cost and cost["ms_per_step"] > 1
    f = next(f for f in a.findings if f.rule.id == "compute-gpu-bound")
    assert f.metrics["tracer_ms"] == pytest.approx(cost["ms_per_step"], abs=1e-3)
    assert f.metrics["compute_share_untraced"] == pytest.approx(a.verdict.class_shares["compute"], abs=1e-3)
    assert f.metrics["compute_share"] < 0.60 <= f.metrics["compute_share_untraced"]


def test_a_class_that_depends_on_the_tracer_cost_says_so():
    """An nsys trace's class is also decided at no tracer correction and at twice the assumed
    cost per CUDA call; where they differ the verdict names the alternatives, is less sure,
    and says so (H100 launch 0.45: launch without the correction, compute with it)."""
    mixed = GPU / "mixed"
    a = analyze([str(mixed / "h100_launch_0.45.nsys.sqlite.gz")], load_rules())
    v = a.verdict
    assert v.class_by_tracer_cost == {"0": "launch", "5000": v.bound, "10000": "compute"}
    assert v.bound == "compute" and v.confidence <= 0.6
    assert any("depends on what the tracing cost per CUDA call" in n for n in v.notes)
    r = json.loads(build_report(a).model_dump_json())
    assert r["verdict"]["class_by_tracer_cost"]["0"] == "launch"
    # a class that no plausible tracer cost changes: nothing said, confidence kept
    b = analyze([str(mixed / "h100_data_0.6.nsys.sqlite.gz")], load_rules())
    assert b.verdict.class_by_tracer_cost is None and b.verdict.confidence >= 0.8
    assert not any("depends on what Nsight Systems' tracing cost" in n for n in b.verdict.notes)


def test_gain_bound_is_the_gpu_work_of_the_traced_step():
    """With a tracer cost taken out (nsys), the expected figures are of the step without it and
    the bound of the traced step: step_ms_at_least is the GPU's own work, whatever the base."""
    nav = GPU / "nav_default"
    r = json.loads(build_report(analyze([str(nav / "nsys.sqlite.gz")], load_rules())).model_dump_json())
    v = r["verdict"]
    assert v["tracer_cost"]["step_ms"] < v["step_ms"]          # a correction was made
    work_ms = v["step_ms"] * sum(v["shares"][b] for b in ("compute", "comm", "copy"))
    g = v["estimated_gain"]["launch"]
    assert g["step_ms_at_least"] == pytest.approx(work_ms, rel=0.01)
    assert g["speedup_up_to"] == pytest.approx(v["step_ms"] / work_ms, rel=0.01)
    assert g["step_ms_without"] == pytest.approx(v["tracer_cost"]["step_ms"] / g["speedup_expected"], rel=0.01)


@pytest.mark.parametrize("shares, bound, close_to", [
    (cls(compute=0.75, io=0.22), "io", ["compute"]),          # just over the 20% line
    (cls(compute=0.84, io=0.15), "compute", ["io"]),          # just under it
    (cls(compute=0.70, memory=0.28), "memory", None),         # 8 points over: firm
    (cls(compute=0.88, launch=0.12), "compute", None),        # 8 points under: firm
    (cls(compute=0.25, io=0.22, memory=0.05), "io", None),    # compute too small to be the other class
    (cls(compute=0.40, io=0.30, launch=0.25), "balanced", None),
])
def test_close_calls_near_the_cause_line(shares, bound, close_to):
    """A verdict whose largest cause of GPU idle time is within CLOSE_BAND of the 20% line is a
    close call: it names the class on the other side of the line (docs/verdict.md, "Close calls")."""
    from navdoctor.verdict import close_call
    got, _ = decide(shares, has_gpu=True, steps=10)
    assert got == bound
    assert close_call(shares, got, True, None) == close_to
    assert close_call(shares, got, False, None) is None        # CPU-only runs: not this policy


def test_close_call_in_the_report_and_its_confidence():
    """On a real capture near the line (H100 host 0.2: io 22% of the step) the verdict names
    the other class, says why, and is less sure than the same shares far from it. Its ResNet-50
    runs TF32 convolutions with cuDNN's layout conversions, so the compute remedies are expected
    to give more than the io share (unprofiled: compute 1.26x, io 1.23x): compute, close to io."""
    a = analyze([str(GPU / "mixed" / "h100_host_0.2.nsys.sqlite.gz")], load_rules())
    v = a.verdict
    assert v.bound == "compute" and v.close_to == ["io"]
    assert v.close_call_gains["compute"] > v.close_call_gains["io"] == 1.28
    assert any(n.startswith("a close call: io owns 22%") for n in v.notes)
    assert any(n.startswith("the close call is named by what each class's remedies") for n in v.notes)
    r = build_report(a)
    assert r.verdict.close_to == ["io"] and r.verdict.per_trace[0].close_to == ["io"]
    assert r.verdict.close_call_gains == v.close_call_gains
    from navdoctor.report import render_markdown, render_terminal
    assert "close call with io" in render_terminal(r, color=False)
    assert "close call with io" in render_markdown(r)
    from navdoctor.reporters.html import render_report_html
    assert 'id="nd-close">close call with io<' in render_report_html(r, None)
    far = analyze([str(GPU / "mixed" / "h100_host_0.6.nsys.sqlite.gz")], load_rules()).verdict
    assert far.close_to is None and not any(n.startswith("a close call") for n in far.notes)


def test_close_call_says_how_to_settle_it():
    """A close call gives the `navdoctor verify` command that measures both classes' remedies
    (those navdoctor can apply), with diagnose's script where there is one; none otherwise."""
    from navdoctor.report import render_markdown, render_terminal
    from navdoctor.verify.remedies import REMEDIES
    a = analyze([str(GPU / "mixed" / "h100_host_0.2.nsys.sqlite.gz")], load_rules())
    r = build_report(a, {"script": "train.py", "args": ["--epochs", "1"]})
    cmd = r.verdict.settle_command
    assert cmd.startswith("navdoctor verify --remedy ") and cmd.endswith(" train.py --epochs 1")
    ids = cmd.split()[3].split(",")
    assert all(i in REMEDIES for i in ids) and len(ids) == len(set(ids))
    cats = {f.category for f in r.findings for x in f.remedies if x.verify in ids}
    assert cats == {"compute"}      # host work's remedies are code changes: said, not measured
    line = next(x for x in render_terminal(r, color=False).splitlines() if "settle the close call" in x)
    assert line.strip() == f"settle the close call: {cmd} (io: no remedy navdoctor can apply, " \
                           "try the code changes in its findings)"
    assert f"settle the close call: `{cmd}`" in render_markdown(r)
    from navdoctor.reporters.html import render_report_html
    assert '<div id="nd-settle">settle the close call: <code>navdoctor verify' in render_report_html(r, None)
    assert build_report(a).verdict.settle_command.endswith("SCRIPT [ARGS...]")
    far = build_report(analyze([str(GPU / "mixed" / "h100_host_0.6.nsys.sqlite.gz")], load_rules()))
    assert far.verdict.settle_command is None
    assert "settle the close call" not in render_terminal(far, color=False)


def test_a_finding_reads_expected_from_its_remedy_and_bound_as_a_bound():
    """A finding's text gives its best remedy's expected speed-up with its range, and the
    bound labelled as one: '60% ... expected 1.40x (1.20-1.65x); bound 5.51x', never the step
    without its time as an expectation (1/(1 - 0.60) = 2.5x)."""
    from navdoctor.report import stake_text
    from navdoctor.report_models import FindingOut

    def finding(share, expected, rng):
        return FindingOut(rule="r", title="t", category="launch", severity="high", message="m",
                          evidence={}, at_stake_ms_per_step=21.66, at_stake_share=share,
                          speedup_expected=expected, speedup_range=rng, speedup_up_to=5.51,
                          speedup_if_removed=2.5, traces=[1], remedies=[])

    text = stake_text(finding(0.60, 1.40, [1.20, 1.65]))
    assert "expected 1.40x (1.20-1.65x)" in text and "bound 5.51x" in text and "2.50x" not in text
    none = stake_text(finding(0.60, None, None))
    assert "expected" not in none and "bound 5.51x" in none

