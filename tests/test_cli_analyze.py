"""`navdoctor analyze` as a user runs it: reports, exit codes, and one-line errors."""
import gzip
import json
import sqlite3
from pathlib import Path

import pytest

from navdoctor.report import REPORT_SCHEMA_VERSION

FIX = Path(__file__).resolve().parent.parent / "fixtures"
IO_PAIR = [FIX / "gpu/io_jpeg_decode/kineto.json.gz", FIX / "gpu/io_jpeg_decode/nsys.sqlite.gz"]


def test_terminal_report_verdict_first_and_json(cli, tmp_path):
    out = tmp_path / "r.json"
    r = cli("analyze", *IO_PAIR, "--json", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("VERDICT  I/O-bound")
    report = json.loads(out.read_text())
    assert report["schema_version"] == REPORT_SCHEMA_VERSION
    assert report["verdict"]["bound"] == "io" and 0 <= report["verdict"]["confidence"] <= 1
    assert set(report["verdict"]["shares"]) == {"compute", "comm", "copy", "data", "sync", "launch",
                                                "host", "idle"}
    f = report["findings"][0]
    assert {"rule", "category", "severity", "message", "evidence", "remedies"} <= set(f)
    assert [i["format"] for i in report["inputs"]] == ["kineto-json.gz", "nsys-sqlite.gz"]


def test_json_to_stdout_is_only_json(cli):
    r = cli("analyze", IO_PAIR[0], "--json", "-")
    assert r.returncode == 0
    assert json.loads(r.stdout)["verdict"]["bound"] == "io"


def test_fail_on_exit_codes(cli):
    assert cli("analyze", IO_PAIR[0], "--fail-on", "io", "-q").returncode == 1
    assert cli("analyze", IO_PAIR[0], "--fail-on", "launch", "-q").returncode == 0
    r = cli("analyze", IO_PAIR[0], "--fail-on", "disk")
    assert r.returncode == 2 and "disk" in r.stderr


def test_db_is_kept_and_never_overwritten(cli, tmp_path):
    import duckdb
    db = tmp_path / "t.duckdb"
    assert cli("analyze", IO_PAIR[1], "--db", db, "-q").returncode == 0
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] > 0
    assert con.execute("SELECT count(*) FROM step_breakdown").fetchone()[0] == 5
    con.close()
    before = db.read_bytes()
    r = cli("analyze", IO_PAIR[1], "--db", db, "-q")
    assert r.returncode == 2 and "already exists" in r.stderr
    assert db.read_bytes() == before


def test_user_rules_and_param_override(cli, tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "id: many-kernels\ntitle: Many kernels\ncategory: launch\nseverity: low\n"
        "query: SELECT trace_id, count(*) / 5 AS per_step FROM kernels_in_steps GROUP BY trace_id\n"
        "condition: per_step > n\nparams: {n: 10}\nmessage: '{per_step:.0f} kernels per step'\n")
    r = cli("analyze", IO_PAIR[0], "--rules", tmp_path, "--json", "-")
    assert "many-kernels" in [f["rule"] for f in json.loads(r.stdout)["findings"]]
    r = cli("analyze", IO_PAIR[0], "--rules", tmp_path, "--set", "many-kernels.n=1e9", "--json", "-")
    assert "many-kernels" not in [f["rule"] for f in json.loads(r.stdout)["findings"]]


def test_rules_list_and_check(cli, tmp_path):
    r = cli("rules", "list")
    assert r.returncode == 0 and "io-dataloader-wait" in r.stdout
    (tmp_path / "bad.yaml").write_text("id: x1\ntitle: t\ncategory: io\nseverity: low\n"
                                       "query: SELECT nope FROM kernels\ncondition: a > 1\nmessage: m\n")
    r = cli("rules", "check", tmp_path)
    assert r.returncode == 2 and "bad.yaml" in r.stderr and "x1" in r.stderr and "query" in r.stderr


def _write(tmp_path, name, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("make, expect", [
    (lambda d: _write(d, "t.json", b'{"traceEvents": [{"ph": "X", "na'), "truncated or malformed"),
    (lambda d: _write(d, "t.json", b"not json at all"), "unrecognised content"),
    (lambda d: _write(d, "t.json.gz", b'{"traceEvents": []}'), "trace is empty"),
    (lambda d: _write(d, "fake.json.gz", b"\x1f\x8b\x08\x00garbage"), "gzip"),
    (lambda d: _write(d, "empty.json", b""), "file is empty"),
    (lambda d: d, "is a directory"),
    (lambda d: d / "missing.json", "no such file"),
])
def test_bad_input_one_line_exit_2(cli, tmp_path, make, expect):
    r = cli("analyze", make(tmp_path))
    assert r.returncode == 2
    assert expect in r.stderr
    errors = [l for l in r.stderr.splitlines() if not l.startswith("navdoctor: loading")]
    assert "Traceback" not in r.stderr and len(errors) == 1 and errors[0].startswith("navdoctor: error:")


def test_sqlite_that_is_not_nsys(cli, tmp_path):
    p = tmp_path / "other.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE t (a)")
    con.commit()
    con.close()
    r = cli("analyze", p)
    assert r.returncode == 2 and "not an Nsight Systems export" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_rule_file_is_usage_error(cli, tmp_path):
    (tmp_path / "r.yaml").write_text("id: [broken\n")
    r = cli("analyze", IO_PAIR[0], "--rules", tmp_path)
    assert r.returncode == 2 and "r.yaml" in r.stderr and "YAML syntax error" in r.stderr


def test_rule_with_invalid_sql_is_a_usage_error(cli, tmp_path):
    (tmp_path / "r.yaml").write_text("id: broken-sql\ntitle: t\ncategory: io\nseverity: low\n"
                                     "query: SELECT no_such_column FROM kernels\ncondition: a > 1\nmessage: m\n")
    r = cli("analyze", IO_PAIR[0], "--rules", tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "r.yaml" in r.stderr and "broken-sql" in r.stderr and "query" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_json_never_replaces_a_file_that_is_not_a_report(cli, tmp_path):
    import shutil
    trace = tmp_path / "t.json.gz"
    shutil.copy(IO_PAIR[0], trace)
    before = trace.read_bytes()
    r = cli("analyze", trace, "--json", trace)
    assert r.returncode == 2 and "not a navdoctor report" in r.stderr
    assert trace.read_bytes() == before
    out = tmp_path / "r.json"
    assert cli("analyze", trace, "--json", out, "-q").returncode == 0
    assert cli("analyze", trace, "--json", out, "-q").returncode == 0  # an old report is replaced


def test_markdown_summary(cli, tmp_path):
    md = tmp_path / "summary.md"
    r = cli("analyze", *IO_PAIR, "--markdown", md, "-q")
    assert r.returncode == 0, r.stderr
    text = md.read_text()
    assert text.startswith("<!-- navdoctor report")
    assert "**I/O-bound**" in text and "io-dataloader-wait" not in text   # titles, not ids
    assert "| waiting for data |" in text and "**Findings**" in text
    again = cli("analyze", *IO_PAIR, "--markdown", md, "-q")              # its own summary: replaced
    assert again.returncode == 0, again.stderr


def test_markdown_never_replaces_a_users_file(cli, tmp_path):
    notes = tmp_path / "NOTES.md"
    notes.write_text("# my notes\n")
    r = cli("analyze", *IO_PAIR, "--markdown", notes, "-q")
    assert r.returncode == 2 and "not a navdoctor summary" in r.stderr
    assert notes.read_text() == "# my notes\n"


def test_markdown_into_an_empty_file(cli, tmp_path):
    summary = tmp_path / "step_summary"          # as $GITHUB_STEP_SUMMARY starts
    summary.write_text("")
    r = cli("analyze", *IO_PAIR, "--markdown", summary, "-q")
    assert r.returncode == 0, r.stderr
    assert summary.read_text().startswith("<!-- navdoctor report")


LAUNCH_POINT = FIX / "gpu/mixed/lraspp_launch_0.5.nsys.sqlite.gz"   # unprofiled 52.29 ms


def test_unprofiled_step_measures_the_tracer_cost(cli, tmp_path):
    """An H100 LR-ASPP step with 2,591 tiny looped ops (CUDA graphs gave 1.46x unprofiled):
    nsys traced it at 64.4 ms, 10,796 CUDA calls per step. At the assumed 5 us per call the
    tracer would own the whole launch share (compute, close to launch); given the step timed
    without a tracer (52.29 ms) the cost is measured, 1.1 us per call, and launch remains."""
    assumed, measured = tmp_path / "a.json", tmp_path / "m.json"
    assert cli("analyze", LAUNCH_POINT, "--json", assumed, "-q").returncode == 0
    r = cli("analyze", LAUNCH_POINT, "--unprofiled-step-ms", "52.29", "--json", measured)
    assert r.returncode == 0, r.stderr
    a, m = (json.loads(p.read_text())["verdict"] for p in (assumed, measured))
    assert a["tracer_cost"]["ns_per_call"] == 5000 and "unprofiled_step_ms" not in a["tracer_cost"]
    assert a["bound"] == "compute" and a["close_to"] == ["launch"]
    t = m["tracer_cost"]
    assert t["unprofiled_step_ms"] == 52.29 and 1000 < t["ns_per_call"] < 1300
    assert t["step_ms"] == pytest.approx(52.29, abs=0.01)    # the step without the tracer's cost
    assert m["bound"] == "launch" and m["class_shares"]["launch"] > 0.3
    assert str(int(t["ns_per_call"])) in m["class_by_tracer_cost"]     # checked around the measured cost
    assert "measured: the traced step 64.4 ms against 52.3 ms unprofiled" in r.stdout


def test_unprofiled_step_slower_than_the_trace_takes_nothing_out(cli, tmp_path):
    out = tmp_path / "r.json"
    assert cli("analyze", LAUNCH_POINT, "--unprofiled-step-ms", "80", "--json", out, "-q").returncode == 0
    t = json.loads(out.read_text())["verdict"]["tracer_cost"]
    assert t["ns_per_call"] == 0 and t["ms_per_step"] == 0 and t["unprofiled_step_ms"] == 80


def test_unprofiled_step_on_kineto_and_cpu_traces_and_bad_values(cli, tmp_path):
    """A torch.profiler trace of a GPU run gets its cost measured too (per CUDA call, as nsys's;
    without the figure it gets none); a CPU-only trace has no GPU to idle: nothing changes."""
    out = tmp_path / "r.json"
    assert cli("analyze", IO_PAIR[0], "--json", out, "-q").returncode == 0
    assert json.loads(out.read_text())["verdict"].get("tracer_cost") is None
    assert cli("analyze", IO_PAIR[0], "--unprofiled-step-ms", "10", "--json", out, "-q").returncode == 0
    cost = json.loads(out.read_text())["verdict"]["tracer_cost"]
    assert cost["unprofiled_step_ms"] == 10 and cost["ns_per_call"] > 0
    cpu = FIX / "cpu/train_steps.json.gz"
    assert cli("analyze", cpu, "--unprofiled-step-ms", "10", "--json", out, "-q").returncode == 0
    assert json.loads(out.read_text())["verdict"].get("tracer_cost") is None
    for bad in ("0", "-3", "fast", "nan", "inf", "1e-9"):
        r = cli("analyze", LAUNCH_POINT, "--unprofiled-step-ms", bad, "-q")
        assert r.returncode == 2 and "--unprofiled-step-ms" in r.stderr and "Traceback" not in r.stderr


LOADER_POINT = FIX / "gpu/mixed/h100_fcn50_data_0.4.nsys.sqlite.gz"   # diagnose: 21.58 ms, 3.20 waiting
# the same model at another amount: its trace's own wait (1.6 ms of 17.9) is far from making it io
HIDDEN_LOADER_POINT = FIX / "gpu/mixed/h100r13_fcn50_data_0.26.nsys.sqlite.gz"   # 18.0 ms, 0.00 waiting


def _loader_run(cli, tmp_path, *args):
    out = tmp_path / "r.json"
    r = cli("analyze", LOADER_POINT, "--unprofiled-step-ms", "21.58", *args, "--json", out, "-q")
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    return report["verdict"], {f["rule"]: f for f in report["findings"]}


def test_unprofiled_loader_wait_takes_the_tracers_part_out_of_the_data_wait(cli, tmp_path):
    """An H100 FCN ResNet-50 whose DataLoader (0 workers) waits 33% of the traced step. Timed
    without a tracer (diagnose's pass 3) the GPU waited 3.2 of 21.6 ms for batches: the other
    6 ms of the traced wait was the tracer's. 15% is under the 20% line but over the 4.76% at
    which a measured wait binds (8 workers gave 1.21x, bf16 + channels_last 1.02x): io, not a
    close call with compute (compute is weighed at 1.00 while the GPU waits on the loader),
    the expected gain the measured wait's, and the io finding judged on the measured wait;
    the compute finding's step is the same step without the tracer's part. Had the loader
    hidden behind the GPU (0 ms), the same trace reads compute and the io finding stays quiet."""
    v, found = _loader_run(cli, tmp_path, "--unprofiled-loader-wait-ms", "3.2")
    wait = v["loader_wait"]
    assert v["bound"] == "io" and v["close_to"] is None and v["class_shares"]["io"] < 0.2
    assert wait["binds"] and wait["share"] == pytest.approx(0.148, abs=0.002) and wait["origin"] == "given"
    assert wait["tracer_ms"] == pytest.approx(5.96, abs=0.05) and wait["traced_ms"] == pytest.approx(9.16, abs=0.05)
    assert v["estimated_gain"]["io"]["speedup_expected"] == pytest.approx(1.17, abs=0.03)
    assert v["estimated_gain"]["compute"]["speedup_expected"] == 1.0
    io = found["io-dataloader-wait"]
    assert io["at_stake_ms_per_step"] == pytest.approx(3.2, abs=0.01)
    assert "Timed without a tracer the GPU waits 3.20 ms a step (14.8% of 21.58 ms)" in io["message"]
    assert "5.96 ms of the traced wait is the tracer's own" in io["message"]
    assert "less 6.1 ms of tracer cost" in found["compute-gpu-bound"]["message"]   # 5.96 + the calls' 0.18
    assert any("6.0 ms of the traced wait is the tracer's own" in n for n in v["notes"])

    hidden, found = _loader_run(cli, tmp_path, "--unprofiled-loader-wait-ms", "0")
    assert hidden["bound"] == "compute" and not hidden["loader_wait"]["binds"]
    assert "io-dataloader-wait" not in found

    traced, found = _loader_run(cli, tmp_path)       # not measured: the traced wait, 33%
    assert traced["bound"] == "io" and traced["loader_wait"] is None
    assert found["io-dataloader-wait"]["at_stake_ms_per_step"] == pytest.approx(9.16, abs=0.05)


def test_a_measured_wait_binds_from_verify_margin(cli, tmp_path):
    """The loader's line is where the step without the wait is verify's 5% margin faster:
    1 - 1/1.05 = 4.76% of the unprofiled step (a rounded 5% was above its own reason: a
    DeepLabV3 point whose timing pass waited 4.86% and whose workers gave 1.16x read compute).
    The io-dataloader-wait rule judges the measured wait from the same line."""
    from navdoctor.rules import load_rules
    from navdoctor.verdict import LOADER_WAIT_BINDS
    assert LOADER_WAIT_BINDS == pytest.approx(1 - 1 / 1.05)
    rule = next(r for r in load_rules() if r.id == "io-dataloader-wait")
    assert rule.params["min_unprofiled_share"] == LOADER_WAIT_BINDS     # one line, exactly
    over, found = _loader_run_at(cli, tmp_path, "21.58", f"{21.58 * 0.0480:.4f}")
    assert over["loader_wait"]["binds"] and over["bound"] == "io"
    assert "io-dataloader-wait" in found
    under, found = _loader_run_at(cli, tmp_path, "21.58", f"{21.58 * 0.0470:.4f}")
    assert not under["loader_wait"]["binds"] and under["bound"] == "compute"
    assert "io-dataloader-wait" not in found


def test_timing_runs_on_both_sides_of_the_loader_line_make_a_close_call(cli, tmp_path):
    """Several timing runs' waits (diagnose times a loader-fed run twice; analyze takes them
    comma-separated): their mean is judged, and where the least- and the most-waiting run would
    each give another class (one under the loader's line, one over it) the verdict is a close
    call naming the other, whose settle command measures the workers; runs that give one class
    make none."""
    # a capture whose trace shows 1.6 ms of DataLoader wait: no cause is near the 20% line and
    # the trace's own wait does not make it io, so only the runs can make a close call
    def run_at(step, wait):
        return _loader_run_at(cli, tmp_path, step, wait, HIDDEN_LOADER_POINT)
    edge, found = run_at("18", "0,1.6")          # 0% and 8.9%; mean 4.4%
    w = edge["loader_wait"]
    assert w["runs_ms"] == [0.0, 1.6] and w["edge"] and not w["binds"]
    assert edge["bound"] == "compute" and edge["close_to"] == ["io"]
    assert "num_workers" in edge["settle_command"]
    assert any("in one timing run and 1.6 ms in another" in n for n in edge["notes"])
    assert "0.00 to 1.60 ms in the timing runs" in found["io-dataloader-wait"]["message"]
    single, found = run_at("18", "0.8")           # the same mean, one run
    assert single["loader_wait"]["runs_ms"] is None and not single["loader_wait"]["edge"]
    assert single["bound"] == "compute" and not single["close_to"]
    assert "io-dataloader-wait" not in found
    assert edge["confidence"] == pytest.approx(single["confidence"] * 0.6, abs=0.002)
    under, found = run_at("18", "0,0.2")          # both runs under the line
    assert not under["loader_wait"]["edge"] and not under["close_to"]
    assert "io-dataloader-wait" not in found
    over, _ = run_at("18", "1.5,2.5")             # both over: io binds
    assert over["bound"] == "io" and not over["loader_wait"]["edge"] and not over["close_to"]
    edge_io, _ = run_at("18", "0.2,2")           # one under, mean over
    assert edge_io["bound"] == "io" and edge_io["close_to"] == ["compute"]
    assert any("none from compute while the GPU waits on the loader" in n for n in edge_io["notes"])
    # where the mean binds io, the 20% line's close call is not checked, and its note not given
    near, _ = _loader_run_at(cli, tmp_path, "21.58", "0,3")
    assert near["bound"] == "io" and near["loader_wait"]["edge"] and near["close_to"] == ["compute"]
    assert not any("points of the 20%" in n for n in near["notes"])


def test_a_traced_wait_that_binds_where_the_measured_one_does_not_makes_a_close_call(cli, tmp_path):
    """Where the trace's own DataLoader wait makes the run io-bound (judged as without the
    measurement) but the wait timed without a tracer does not, the loader hides behind the GPU
    only while the host is not slowed: a close call naming io, whose settle command measures
    the workers (the H200 ResNet-50 data 0.1 point: its plain run waited, its timing runs did
    not). A trace whose own wait is far from io, or a measured wait that binds, makes none."""
    hidden, _ = _loader_run_at(cli, tmp_path, "18", "0.8")          # the trace shows 33% waiting
    assert hidden["bound"] == "compute" and hidden["close_to"] == ["io"]
    assert hidden["loader_wait"]["traced_binds"] and not hidden["loader_wait"]["edge"]
    assert "num_workers" in hidden["settle_command"]     # though no io finding suggests it
    assert any("the trace's own DataLoader wait" in n and "makes the run io-bound" in n
               for n in hidden["notes"])
    assert hidden["confidence"] <= 0.6                  # a close call's factor
    # where compute's remedies are expected to give nothing (LR-ASPP's depthwise convolutions),
    # io named by the trace's own wait still does not take the class: its share is the
    # measured wait's (0.2 of 30 ms)
    depthwise, _ = _loader_run_at(cli, tmp_path, "30", "0.2", FIX / "gpu/mixed/lraspp_data_0.5.nsys.sqlite.gz")
    assert depthwise["bound"] == "compute" and depthwise["close_to"] == ["io"]
    assert depthwise["loader_wait"]["traced_binds"] and depthwise["confidence"] == pytest.approx(0.6)
    far, _ = _loader_run_at(cli, tmp_path, "18", "0.8", HIDDEN_LOADER_POINT)   # the trace: 1.6 ms
    assert far["bound"] == "compute" and not far["close_to"]
    assert not far["loader_wait"]["traced_binds"]
    bound, _ = _loader_run_at(cli, tmp_path, "18", "1.5")           # 8.3%: the measured wait binds
    assert bound["bound"] == "io" and not bound["loader_wait"]["traced_binds"]


def test_unprofiled_loader_wait_that_does_not_fit_the_trace(cli, tmp_path):
    """A measured wait is used only against a trace that shows DataLoader fetches (an FCN
    step with pageable copies and no DataLoader: not used, and a note says so, the class as
    without it), and takes out no more than the traced step's excess over the unprofiled one
    (an unprofiled step longer than the traced one: nothing; the share binding io is the
    shorter of the two waits)."""
    copy = FIX / "gpu/mixed/h100_fcn50_copy_0.15.nsys.sqlite.gz"
    out, plain = tmp_path / "c.json", tmp_path / "p.json"
    assert cli("analyze", copy, "--unprofiled-step-ms", "21.3", "--unprofiled-loader-wait-ms", "3",
               "--json", out, "-q").returncode == 0
    assert cli("analyze", copy, "--unprofiled-step-ms", "21.3", "--json", plain, "-q").returncode == 0
    v, p = (json.loads(x.read_text())["verdict"] for x in (out, plain))
    assert v["loader_wait"] is None and v["bound"] == p["bound"] and v["class_shares"] == p["class_shares"]
    assert any("is not used: this trace shows no DataLoader fetch" in n for n in v["notes"])
    longer, found = _loader_run_at(cli, tmp_path, "30", "3.2")
    assert longer["loader_wait"]["tracer_ms"] == 0 and longer["bound"] == "io"
    assert longer["class_shares"]["io"] > 0.3                     # the traced wait stands
    assert found["io-dataloader-wait"]["at_stake_ms_per_step"] == pytest.approx(9.16, abs=0.05)
    assert "the unprofiled step is not shorter" in found["io-dataloader-wait"]["message"]
    more, _ = _loader_run_at(cli, tmp_path, "21.58", "12")       # measured longer than traced
    assert more["loader_wait"]["tracer_ms"] == 0
    assert more["loader_wait"]["share"] == pytest.approx(9.16 / 21.58, abs=0.01)


def _loader_run_at(cli, tmp_path, step, wait, capture=LOADER_POINT):
    out = tmp_path / "r.json"
    r = cli("analyze", capture, "--unprofiled-step-ms", step, "--unprofiled-loader-wait-ms", wait,
            "--json", out, "-q")
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    return report["verdict"], {f["rule"]: f for f in report["findings"]}


@pytest.mark.parametrize("args", [["--unprofiled-loader-wait-ms", "2"],
                                  ["--unprofiled-step-ms", "10", "--unprofiled-loader-wait-ms", "11"],
                                  ["--unprofiled-step-ms", "10", "--unprofiled-loader-wait-ms", "-1"],
                                  ["--unprofiled-step-ms", "10", "--unprofiled-loader-wait-ms", "nan"],
                                  ["--unprofiled-step-ms", "10", "--unprofiled-loader-wait-ms", "1,x"],
                                  ["--unprofiled-step-ms", "10", "--unprofiled-loader-wait-ms", "1,12"]])
def test_unprofiled_loader_wait_bad_values(cli, args):
    r = cli("analyze", LOADER_POINT, *args, "-q")
    assert r.returncode == 2 and "--unprofiled-loader-wait-ms" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_gpu_idle_gaps_leave_out_the_tracers_part_of_the_loader_wait(cli, tmp_path):
    """An H100 FCN step whose DataLoader gap is 34% of the traced step: gpu-idle-gaps fires on
    the trace alone; with the wait timed without a tracer at 0 ms (the loader hid behind the
    GPU), that gap is the tracer's, as the verdict (compute) takes it, and the rule is quiet."""
    point = FIX / "gpu/mixed/h100_fcn50_data_0.5.nsys.sqlite.gz"
    traced, measured = tmp_path / "t.json", tmp_path / "m.json"
    assert cli("analyze", point, "--json", traced, "-q").returncode == 0
    assert cli("analyze", point, "--unprofiled-step-ms", "18.5", "--unprofiled-loader-wait-ms", "0",
               "--json", measured, "-q").returncode == 0
    t, m = (json.loads(p.read_text()) for p in (traced, measured))
    assert "gpu-idle-gaps" in {f["rule"] for f in t["findings"]}
    assert "gpu-idle-gaps" not in {f["rule"] for f in m["findings"]} and m["verdict"]["bound"] == "compute"
