"""Multi-rank jobs (issue #15): ranks recognised, stragglers named with their cause, balanced
jobs said to be balanced, exposed and overlapped communication told apart."""
import json
from pathlib import Path

import pytest

from navdoctor.ranks.detect import job_ranks
from navdoctor.ranks.executor import run_ranks
from navdoctor.ranks.job import build_job
from navdoctor.rules import load_rules
from ranks_factory import make_job
from kineto_factory import KinetoTrace

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = ROOT.parent / "shared" / "public-traces"
GLOO = ROOT / "fixtures" / "ranks" / "gloo_ddp_slow_rank1"


def job_of(paths, workers=1):
    rules = load_rules()
    ranks = job_ranks([str(p) for p in paths])
    assert ranks is not None
    return build_job(run_ranks(ranks, rules, workers=workers), rules, None, lambda m: None)


def fired(ja):
    return {f.rule.id for f in ja.analysis.findings}


def test_straggler_named_with_its_cause(tmp_path):
    # rank 2's data loading is 20 ms slower; the others wait for it in the all-reduce kernel
    ja = job_of(make_job(tmp_path, ranks=4, data_us=[500, 500, 20500, 500]))
    s = ja.job["straggler"]
    assert s and s["rank"] == 2
    assert s["cause"] == "data" and s["cause_class"] == "io"
    assert s["last_share"] == 1.0
    # the others wait about the 20 ms extra data time, per step
    assert 15 <= s["cost_ms_per_step"] <= 21
    assert "io-dataloader-wait" in s["findings"] and s["remedies"]
    assert "job-straggler" in fired(ja)
    msg = next(f.message for f in ja.analysis.findings if f.rule.id == "job-straggler")
    assert "Rank 2" in msg and "data" in msg
    assert ja.analysis.verdict.bound == "io" and not ja.job["balanced"]
    # one slow rank is a straggler, not an imbalance of the job's work
    assert "job-load-imbalance" not in fired(ja)
    waiting = [r for r in ja.job["per_rank"] if r["rank"] != 2]
    assert all(r["wait_ms"] > 15 for r in waiting)
    assert next(r for r in ja.job["per_rank"] if r["rank"] == 2)["wait_ms"] < 1


def test_job_findings_led_by_the_jobs_class(tmp_path):
    """The ranks' findings are ranked as one run's are: the job verdict's class first. Rank 2's
    slow loading makes the others wait in the all-reduce, so exposed communication puts more
    time at stake (0.71 of the step) than the DataLoader wait (0.66), but the job is io-bound
    and the loader's finding is the remedy to try first (before: by time at stake alone)."""
    ja = job_of(make_job(tmp_path, ranks=4, data_us=[500, 500, 20500, 500]))
    v = ja.analysis.verdict
    assert v.bound == "io" and v.findings_lead == "io"
    ranks_findings = [f for f in ja.analysis.findings if not f.rule.id.startswith("job-")]
    assert ranks_findings[0].rule.id == "io-dataloader-wait"
    comm = next(f for f in ranks_findings if f.rule.id == "memory-exposed-communication")
    assert comm.at_stake_share > ranks_findings[0].at_stake_share


def test_a_job_leads_with_its_class_even_where_a_rank_has_compute_headroom(tmp_path):
    """A straggler's loading (51% of its step) is a quarter of four ranks' mean class shares,
    while the compute headroom is one rank's: the two expected figures do not compare, so a
    job's findings are led by its own class, never moved to compute (and no note says so).
    The job's own findings stay first."""
    ja = job_of(make_job(tmp_path, ranks=4, data_us=[500, 500, 12000, 500]))
    v = ja.analysis.verdict
    ids = [f.rule.id for f in ja.analysis.findings]
    assert "compute-no-tensor-cores" in ids          # a compute finding fired on the ranks
    assert v.bound == "io" and v.findings_lead == "io"
    assert not any("ranked first" in n for n in v.notes)
    jobs = [i for i, rid in enumerate(ids) if rid.startswith("job-")]
    assert jobs and jobs == list(range(len(jobs)))  # the job's findings first
    assert ids[len(jobs)] == "io-dataloader-wait"


def test_balanced_job_says_so(tmp_path):
    ja = job_of(make_job(tmp_path, ranks=4))
    assert ja.job["straggler"] is None and ja.job["balanced"]
    assert not {"job-straggler", "job-load-imbalance"} & fired(ja)
    assert any("balanced" in n for n in ja.analysis.verdict.notes)


def test_small_jitter_is_not_a_straggler(tmp_path):
    # rank 1 is 0.3 ms later every step: always last, but the others lose ~3% of the step
    ja = job_of(make_job(tmp_path, ranks=3, data_us=[500, 800, 500]))
    assert ja.job["per_rank"][1]["last_share"] == 1.0
    assert ja.job["straggler"] is None and "job-straggler" not in fired(ja)


def test_exposed_and_overlapped_communication(tmp_path):
    exposed = job_of(make_job(tmp_path / "e", ranks=2))
    overlapped = job_of(make_job(tmp_path / "o", ranks=2, overlap=True))
    ce, co = exposed.job["communication"], overlapped.job["communication"]
    assert ce["total_ms"] == pytest.approx(2.0, abs=0.05) == co["total_ms"]
    assert ce["exposed_ms"] == pytest.approx(2.0, abs=0.05) and ce["overlapped_share"] < 0.05
    assert co["exposed_ms"] < 0.05 and co["overlapped_share"] > 0.95
    assert "job-exposed-communication" in fired(exposed)
    assert "job-exposed-communication" not in fired(overlapped)


def test_load_imbalance_across_several_ranks(tmp_path):
    ja = job_of(make_job(tmp_path, ranks=4, compute_us=[6000, 8000, 10000, 12000]))
    assert "job-load-imbalance" in fired(ja)
    assert ja.job["work_spread"] > 0.3 and not ja.job["balanced"]


def test_pool_gives_the_same_job_as_one_process(tmp_path):
    paths = make_job(tmp_path, ranks=3, data_us=[500, 15500, 500], steps=4)
    one, pool = job_of(paths, workers=1), job_of(paths, workers=2)
    assert one.job == pool.job


def test_job_rules_are_silent_on_one_trace(tmp_path):
    from navdoctor.analysis import analyze
    paths = make_job(tmp_path, ranks=2, data_us=[500, 20500])
    a = analyze([paths[0]], load_rules())
    assert not {f.rule.id for f in a.findings if f.rule.id.startswith("job-")}
    assert not a.rule_failures


def test_cli_ranks_json(tmp_path, cli):
    make_job(tmp_path / "job", ranks=2, data_us=[20500, 500])
    r = cli("analyze", "--ranks", tmp_path / "job", "--workers", "1", "--json", "-")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    major, minor = map(int, rep["schema_version"].split("."))
    assert (major, minor) >= (2, 2)         # the job section came with 2.2
    assert rep["job"]["straggler"]["rank"] == 0 and rep["job"]["ranks"] == 2
    assert [i["path"] for i in rep["inputs"]] == sorted(str(p) for p in (tmp_path / "job").iterdir())
    text = cli("analyze", *sorted((tmp_path / "job").iterdir()), "--workers", "1")
    assert text.returncode == 0 and "STRAGGLER  rank 0" in text.stdout


@pytest.mark.parametrize("case", ["mixed", "duplicate", "worlds", "empty", "not-ranks"])
def test_bad_rank_sets_are_one_line_errors(tmp_path, cli, case):
    paths = make_job(tmp_path / "a", ranks=2)
    plain = KinetoTrace().write(tmp_path / "plain.json")
    other = make_job(tmp_path / "b", ranks=3)
    (tmp_path / "empty").mkdir()
    args = {"mixed": [paths[0], plain], "duplicate": [paths[0], paths[0]],
            "worlds": [paths[0], other[1]], "empty": ["--ranks", tmp_path / "empty"],
            "not-ranks": ["--ranks", str(tmp_path / "plain*.json"), plain]}[case]
    r = cli("analyze", *args)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_broken_rank_in_the_pool_is_one_line(tmp_path, cli):
    # The rank's error comes back from a pool worker: it must survive pickling (it used to
    # kill the pool's result thread, and the job waited for ever).
    paths = make_job(tmp_path, ranks=2, steps=2)
    text = open(paths[1]).read()
    at = text.index('"ts"', len(text) // 2)   # distributedInfo stays readable, the events not
    open(paths[1], "w").write(text[:at] + '"ts": oops, ' + text[at:])
    r = cli("analyze", "--ranks", tmp_path, "--workers", "2", "-q", timeout=120)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "rank1.json" in r.stderr


def test_real_gloo_ddp_capture_names_the_slow_rank():
    # a real 2-process DDP run (gloo, CPU) whose rank 1 loads each batch 30 ms slower
    ja = job_of(sorted(GLOO.glob("gloo_cpu_rank*.json.gz")))
    assert ja.job["backend"] == "gloo" and ja.job["steps"] >= 4
    s = ja.job["straggler"]
    assert s and s["rank"] == 1 and s["cause"] == "data"
    assert s["cost_ms_per_step"] > 10   # rank 0 waits in gloo:all_reduce for the 30 ms
    assert "job-straggler" in fired(ja)


DLRM = PUBLIC / "param_dlrm_v100_8ranks"


@pytest.mark.skipif(not DLRM.is_dir(), reason="../shared/public-traces absent")
def test_dlrm_8_ranks_as_a_job(cli):
    r = cli("analyze", "--ranks", DLRM, "--workers", "2", "--json", "-")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)["job"]
    assert job["ranks"] == 8 and job["backend"] == "nccl"
    assert job["steps"] == 1 and job["collectives_per_step"] > 0
    assert len(job["per_rank"]) == 8
    for p in job["per_rank"]:
        assert 0 <= p["comm_overlapped_ms"] <= p["comm_total_ms"] + 1e-6
        assert 0 <= p["wait_ms"] <= p["comm_exposed_ms"] + 1e-6


HTA = PUBLIC / "hta_trace_filter_sampled_2of128ranks"


@pytest.mark.skipif(not HTA.is_dir(), reason="../shared/public-traces absent")
def test_hta_two_sampled_ranks_of_128(cli):
    r = cli("analyze", *sorted(HTA.glob("*.json.gz")), "--workers", "1", "--json", "-")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["job"]["ranks"] == 2 and rep["job"]["world_size"] == 128
    assert any("2 of 128 ranks" in n for n in rep["verdict"]["notes"])


def _two_process_export(path, slow_ms: float = 20.0):
    """One Nsight Systems export of a 2-process NCCL job (pids 100 and 200, one GPU each):
    rank 1 spends slow_ms on the host before its compute each step; rank 0 waits for it in
    the all-reduce."""
    from nsys_factory import NsysExport
    from ranks_factory import ALLREDUCE
    exp = NsysExport(pid=100)
    ms = 1_000_000
    t0 = 10 * ms
    for n in range(6):
        arrive = {100: t0 + 9 * ms, 200: t0 + 9 * ms + int(slow_ms * ms)}
        end = max(arrive.values()) + 2 * ms
        for pid, device in ((100, 0), (200, 1)):
            exp.pid = exp.tid = pid
            exp.step(n, t0, end + ms)
            start = arrive[pid] - 8 * ms
            for k in range(4):
                exp.kernel(start + k * 2 * ms, start + (k + 1) * 2 * ms, "volta_sgemm_128x64_nn",
                           device=device)
            exp.kernel(arrive[pid], end, ALLREDUCE, short="ncclKernel_AllReduce_RING_LL_Sum_float",
                       device=device, stream=13)
        t0 = end + 2 * ms
    return exp.write(path)


def test_one_nsys_export_of_several_processes_is_a_job(cli, tmp_path):
    export = _two_process_export(tmp_path / "job.sqlite")
    r = cli("analyze", export, "--json", tmp_path / "job.json", "-q")
    assert r.returncode == 0, r.stderr
    job = json.loads((tmp_path / "job.json").read_text())["job"]
    assert job["ranks"] == 2 and [x["rank"] for x in job["per_rank"]] == [0, 1]
    assert [x["path"] for x in job["per_rank"]] == [f"{export} (process {p})" for p in (100, 200)]
    assert job["straggler"]["rank"] == 1, job["straggler"]
    # the straggler's extra time is on its host, not its GPU
    assert job["straggler"]["cause"] in ("host", "launch", "idle"), job["straggler"]


def test_one_process_export_stays_one_trace(cli, tmp_path):
    from nsys_factory import NsysExport
    exp = NsysExport(pid=100)
    for n in range(4):
        exp.step(n, n * 10_000_000, n * 10_000_000 + 9_000_000)
        exp.kernel(n * 10_000_000 + 1_000_000, n * 10_000_000 + 8_000_000, "volta_sgemm_128x64_nn")
    r = cli("analyze", exp.write(tmp_path / "one.sqlite"), "--json", tmp_path / "one.json", "-q")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "one.json").read_text()).get("job") is None


FASTVIDEO = PUBLIC / "nsysai_h100x2_fastvideo_train_before" / "mfu_2gpu_before.sqlite"


@pytest.mark.skipif(not FASTVIDEO.is_file(), reason="../shared/public-traces absent")
def test_public_two_gpu_nsys_export_is_a_job(cli, tmp_path):
    """nsys-ai's 2-GPU FastVideo capture: one export, two processes with NCCL kernels."""
    r = cli("analyze", FASTVIDEO, "--json", tmp_path / "fv.json")
    assert r.returncode == 0, r.stderr
    # the ranks were split into temporary files; the user sees their export's name only
    # (the inferred steps' warnings named the temporary files)
    text = r.stdout + (tmp_path / "fv.json").read_text()
    assert "navdoctor-ranks-" not in text and f"{FASTVIDEO} (process" in text
    job = json.loads((tmp_path / "fv.json").read_text())["job"]
    assert job["ranks"] == 2 and job["backend"] == "nccl" and job["steps"] >= 3
    assert all(x["bound"] == "compute" for x in job["per_rank"]), job["per_rank"]
    assert job["communication"]["exposed_ms"] > 0


def test_job_html_page(cli, tmp_path):
    export = _two_process_export(tmp_path / "job.sqlite")
    page = tmp_path / "job.html"
    r = cli("analyze", export, "--html", page, "-q")
    assert r.returncode == 0, r.stderr
    from navdoctor.reporters.html import is_navdoctor_html
    text = page.read_text(encoding="utf-8")
    assert is_navdoctor_html(page) and 'data-rule="job-straggler"' in text
    assert f"{export} (process 200)" in text
