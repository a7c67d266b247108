"""`navdoctor compare` on generated captures with known step times and noise: the interval
covers the true ratio, A/A pairs say no change, the gates trip where they must, and bad input
is one line with exit 2."""
import json
import random

import pytest

from navdoctor.compare import analyse_capture, compare_captures
from navdoctor.kernelnames import kernel_family
from navdoctor.rules import load_rules
from nsys_factory import NsysExport

MS = 1_000_000


def capture(tmp_path, name, step_ms=10.0, noise=0.02, steps=20, seed=0, pageable_mb=0, drift=0.0):
    """A GPU-bound run: each step one long GEMM (step_ms with relative noise) and a short
    elementwise kernel, optionally a pageable host-to-device copy; with drift, the later half
    of the steps is that much slower (a run whose level moves while it runs)."""
    rng = random.Random(seed)
    x = NsysExport()
    x.gpu()
    t = 0
    for i in range(steps):
        level = step_ms * (1 + drift if i >= steps // 2 else 1)
        dur = int(level * MS * (1 + rng.gauss(0, noise)))
        x.step(i, t, t + dur)
        copy_ns = 3 * MS if pageable_mb else 0      # ~10 GB/s from pageable memory
        x.kernel(t + 20_000, t + dur - 300_000 - copy_ns,
                 "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(Params)")
        x.kernel(t + dur - 280_000 - copy_ns, t + dur - 30_000 - copy_ns,
                 "void at::native::vectorized_elementwise_kernel<4, float>(int, float*)")
        if pageable_mb:
            x.memcpy(t + dur - 20_000 - copy_ns, t + dur - 20_000, pageable_mb << 20, "HtoD",
                     src="pageable")
        t += dur
    return str(x.write(tmp_path / f"{name}.sqlite"))


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def test_interval_covers_the_true_ratio(tmp_path, rules):
    before = [analyse_capture(capture(tmp_path, f"b{k}", 10.0, seed=1 + k), rules) for k in range(3)]
    after = [analyse_capture(capture(tmp_path, f"a{k}", 9.0, seed=20 + k), rules) for k in range(3)]
    r = compare_captures(before, after)
    assert r.step_time.ci[0] <= 10 / 9 <= r.step_time.ci[1], r.step_time
    assert r.step_time.result == "faster"
    assert r.class_change == {"before": "compute", "after": "compute"}


def test_one_capture_a_side_measures_its_run_to_run_term(tmp_path, rules):
    """One capture a side: the steps are the samples, and the run-to-run term is measured from
    the captures themselves (their halves read as two runs). Steady steps show a 10% change as
    faster; the same change between captures whose level moves by 15% while they run stays
    within the noise, and the note says what the interval is made of."""
    b = analyse_capture(capture(tmp_path, "b", 10.0, seed=1), rules)
    steady = compare_captures([b], [analyse_capture(capture(tmp_path, "a", 9.0, seed=2), rules)])
    st = steady.step_time
    assert st.method == "steps" and st.statistic == "mean"
    assert st.ci[0] <= 10 / 9 <= st.ci[1] and st.result == "faster", st
    assert st.run_to_run.source == "halves of each capture" and st.run_to_run.factor < 1.05
    assert any("run-to-run term" in n and "halves of each capture" in n for n in steady.notes)
    bd = analyse_capture(capture(tmp_path, "bd", 10.0, seed=1, drift=0.15), rules)
    ad = analyse_capture(capture(tmp_path, "ad", 9.0, seed=2, drift=-0.15), rules)
    drifting = compare_captures([bd], [ad]).step_time
    assert drifting.run_to_run.factor > 1.15
    assert drifting.step_ci[0] > 1.05                       # the steps alone would call it
    assert drifting.result == "no change beyond the noise", drifting
    large = compare_captures([bd], [analyse_capture(capture(tmp_path, "a2", 4.0, seed=3), rules)])
    assert large.step_time.result == "faster", large.step_time


def test_a_a_pairs_say_no_change(tmp_path, rules):
    results = []
    for k in range(6):
        b = analyse_capture(capture(tmp_path, f"aa_b{k}", seed=10 + k), rules)
        a = analyse_capture(capture(tmp_path, f"aa_a{k}", seed=100 + k), rules)
        results.append(compare_captures([b], [a]).step_time.result)
    assert results.count("no change beyond the noise") == len(results), results


def test_several_captures_per_side(tmp_path, rules):
    before = [analyse_capture(capture(tmp_path, f"mb{k}", 10.0, seed=k), rules) for k in range(3)]
    after = [analyse_capture(capture(tmp_path, f"ma{k}", 12.0, seed=50 + k), rules) for k in range(3)]
    r = compare_captures(before, after)
    assert r.step_time.result == "slower"
    assert r.step_time.slowdown_ci[0] <= 0.2 <= r.step_time.slowdown_ci[1]
    assert r.step_time.method == "between runs" and r.step_time.run_to_run is None
    assert any("between runs, Welch's t" in n for n in r.notes)
    assert len(r.before.captures) == 3


def test_gate_on_a_ten_percent_slowdown(cli, tmp_path):
    b = [capture(tmp_path, f"gb{k}", 10.0, noise=0.005, seed=3 + k) for k in range(3)]
    a = [capture(tmp_path, f"ga{k}", 11.0, noise=0.005, seed=30 + k) for k in range(3)]
    args = ["compare", "--before", *b, "--after", *a]
    slow = cli(*args, "--fail-if-slower", "5", "-q")
    assert slow.returncode == 1 and "--fail-if-slower" in slow.stderr
    ok = cli(*args, "--fail-if-slower", "20", "-q")
    assert ok.returncode == 0, ok.stderr


def test_new_findings_and_what_changed(cli, tmp_path):
    b = capture(tmp_path, "nb", 10.0, seed=5)
    a = capture(tmp_path, "na", 10.0, seed=6, pageable_mb=32)
    out = tmp_path / "cmp.json"
    r = cli("compare", b, a, "--json", out, "--fail-on-new", "memory")
    assert r.returncode == 1 and "new finding(s) in memory" in r.stderr
    j = json.loads(out.read_text())
    assert j["schema_version"] == "2.0"
    assert "memory-pageable-copies" in j["findings"]["appeared"]
    copy = next(x for x in j["buckets"] if x["bucket"] == "copy")
    assert copy["after_ms"] > copy["before_ms"]
    assert "COMPARE" in r.stdout


def test_report_and_run_directory_inputs(cli, tmp_path):
    b = capture(tmp_path, "rb", 10.0, seed=7)
    report = tmp_path / "before.json"
    assert cli("analyze", b, "--json", report, "-q").returncode == 0
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "nsys.sqlite").write_bytes(open(capture(tmp_path, "ra", 10.0, seed=8), "rb").read())
    r = cli("compare", report, run_dir, "--json", "-")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["before"]["captures"][0]["inputs"] == [b]
    assert j["after"]["captures"][0]["inputs"] == [str(run_dir / "nsys.sqlite")]


@pytest.mark.parametrize("args, message", [
    (["missing_before.sqlite", "missing_after.sqlite"], "no such file"),
    (["only_one"], "BEFORE and AFTER"),
])
def test_bad_input_is_one_line(cli, tmp_path, args, message):
    r = cli("compare", *args, cwd=tmp_path)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr


def test_a_directory_without_traces(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    b = capture(tmp_path, "eb", seed=9)
    r = cli("compare", b, tmp_path / "empty")
    assert r.returncode == 2 and "not a trace file nor a `navdoctor diagnose` run directory" in r.stderr


def test_kernel_families_match_across_shapes():
    assert kernel_family("void at::native::vectorized_elementwise_kernel<4, float>(int, float*)") == \
        kernel_family("void at::native::vectorized_elementwise_kernel<8, c10::BFloat16>(int, c10::BFloat16*)")
    assert kernel_family("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(Params)") \
        == "cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4"


PUBLIC = __import__("pathlib").Path(__file__).resolve().parent.parent.parent / "shared" / "public-traces"


@pytest.mark.skipif(not PUBLIC.exists(), reason="../shared/public-traces absent")
def test_public_before_after_pair(rules):
    b = analyse_capture(str(PUBLIC / "nsysai_h100x2_fastvideo_train_before" / "mfu_2gpu_before.sqlite"), rules)
    a = analyse_capture(str(PUBLIC / "nsysai_h100x2_fastvideo_train_after" / "mfu_2gpu_after.sqlite"), rules)
    r = compare_captures([b], [a])
    assert r.step_time.ci[0] < r.step_time.speedup < r.step_time.ci[1]
    assert any(k.name == "ncclDevKernel_SendRecv" and k.delta_ms > 0 for k in r.kernels)
    assert r.buckets[BUCKET_INDEX["comm"]]["after_ms"] > r.buckets[BUCKET_INDEX["comm"]]["before_ms"]
    assert any("inferred" in n for n in r.notes)


BUCKET_INDEX = {b: i for i, b in enumerate(__import__("navdoctor.breakdown", fromlist=["BUCKETS"]).BUCKETS)}


def test_one_step_a_side_gives_no_verdict_and_no_gate(cli, tmp_path):
    b = capture(tmp_path, "1b", 10.0, steps=2, seed=11)
    a = capture(tmp_path, "1a", 14.0, steps=2, seed=12)
    r = cli("compare", b, a, "--fail-if-slower", "1", "--json", "-")
    assert r.returncode == 0, r.stderr                       # the gate needs steps to stand on
    st = json.loads(r.stdout)["step_time"]
    assert st["comparable"] is False and st["result"] == "no change beyond the noise"
    assert "too few steps" in st["detail"]


def test_report_paths_relative_to_the_report(cli, tmp_path):
    work = tmp_path / "run1"
    work.mkdir()
    capture(work, "t", 10.0, seed=13)
    assert cli("analyze", "t.sqlite", "--json", "r.json", "-q", cwd=work).returncode == 0
    r = cli("compare", work / "r.json", work / "r.json", "--json", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["before"]["captures"][0]["inputs"] == [str(work / "t.sqlite")]
    assert any("same capture" not in n for n in json.loads(r.stdout)["notes"])


def test_a_compare_result_is_not_a_capture(cli, tmp_path):
    b = capture(tmp_path, "cb", seed=14)
    out = tmp_path / "cmp.json"
    assert cli("compare", b, b, "--json", out, "-q").returncode == 0
    r = cli("compare", out, b)
    assert r.returncode == 2 and "a compare result" in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("navdoctor: error")]
    assert len(errors) == 1 and "Traceback" not in r.stderr


def test_json_never_replaces_an_input_report(cli, tmp_path):
    b = capture(tmp_path, "jb", seed=15)
    report = tmp_path / "before.json"
    assert cli("analyze", b, "--json", report, "-q").returncode == 0
    kept = report.read_text()
    r = cli("compare", report, b, "--json", report)
    assert r.returncode == 2 and "is one of the inputs" in r.stderr
    assert report.read_text() == kept
