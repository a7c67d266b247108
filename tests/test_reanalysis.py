"""`navdoctor analyze RUN_DIR`: a diagnose run folder read back with all it recorded (its
traces, its timing pass, the run's facts), so that the verdict is the one diagnose gave."""
import gzip
import json
import shutil
from pathlib import Path

from conftest import CPU_TRAINING_LOOP

ROOT = Path(__file__).resolve().parent.parent
# An H100 capture of the mixed corpus (fixtures/gpu/mixed/labels.yaml): diagnose's timing pass
# measured 20.5607 ms a step without a tracer. By its trace alone the step is compute-bound
# with a close call to launch; with the timing pass, launch-bound with a close call to compute.
CAPTURE = ROOT / "fixtures" / "gpu" / "mixed" / "h100_dlv3mnv3_launch_0.4.nsys.sqlite.gz"
UNPROFILED_MS = 20.5607


def verdict_of(j: dict) -> tuple:
    v = j["verdict"]
    return v["bound"], v["close_to"], v["confidence"], v["steps"], v["step_ms"], v["class_shares"]


def test_a_run_folder_gives_the_verdict_diagnose_gave(cli, tmp_path):
    run = tmp_path / "navdoctor-runs" / "20261205-101500-mix"
    run.mkdir(parents=True)
    with gzip.open(CAPTURE, "rb") as src, open(run / "nsys.sqlite", "wb") as dst:
        shutil.copyfileobj(src, dst)
    # what diagnose gave: the analysis of its trace with its timing pass (commands/diagnose.py)
    recorded = cli("analyze", run / "nsys.sqlite", "--unprofiled-step-ms", UNPROFILED_MS,
                   "--json", "-", "-q")
    assert recorded.returncode == 0, recorded.stderr
    report = json.loads(recorded.stdout)
    report["run"] = {"dir": "/home/someone/navdoctor-runs/20261205-101500-mix", "script": "mix.py",
                     "args": ["--cause", "launch"], "script_exit_code": 0, "interrupted": False,
                     "notes": [], "passes": [], "unprofiled_step_ms": UNPROFILED_MS,
                     "unprofiled_loader_wait_ms": None, "unprofiled_loader_waits_ms": None}
    (run / "report.json").write_text(json.dumps(report))
    again = cli("analyze", run, "--json", "-", "-q")
    assert again.returncode == 0, again.stderr
    j = json.loads(again.stdout)
    assert verdict_of(j) == verdict_of(report)
    assert j["verdict"]["bound"] == "launch" and j["verdict"]["tracer_cost"]["unprofiled_step_ms"] == round(UNPROFILED_MS, 3)
    assert j["run"]["dir"] == str(run) and j["run"]["script"] == "mix.py"
    assert j["run"]["recorded_dir"] == "/home/someone/navdoctor-runs/20261205-101500-mix"
    # the trace by name alone leaves the timing pass out: another class
    alone = json.loads(cli("analyze", run / "nsys.sqlite", "--json", "-", "-q").stdout)
    assert alone["verdict"]["bound"] == "compute"


def test_without_report_json_the_timing_runs_statuses_count(cli, tmp_path):
    """A run whose analysis never wrote report.json: the timing pass's own status files give
    the step time, worked out as diagnose works it out (skip the traced pass's wait and warm-up
    steps, the mean without isolated stalls)."""
    run = tmp_path / "run"
    run.mkdir()
    with gzip.open(CAPTURE, "rb") as src, open(run / "nsys.sqlite", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (run / "status-nvtx.json").write_text(json.dumps(
        {"mode": "nvtx", "plan": {"wait": 2, "warmup": 2, "active": 5}, "exit_code": 0}))
    steps = [90.0, 80.0, 30.0, 25.0] + [UNPROFILED_MS] * 10     # four skipped, then ten timed
    (run / "status-timing.json").write_text(json.dumps({"exit_code": 0, "step_ms": steps}))
    from navdoctor.collect.rundir import read_run_dir
    record = read_run_dir(run)
    assert record.unprofiled_step_ms == UNPROFILED_MS and record.source == "status files"
    j = json.loads(cli("analyze", run, "--json", "-", "-q").stdout)
    assert j["verdict"]["bound"] == "launch" and j["run"]["reanalysed"] is True


def test_a_folder_that_is_no_run_is_one_line(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    r = cli("analyze", tmp_path / "empty")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "not a trace file nor a `navdoctor diagnose` run directory" in r.stderr
    r = cli("analyze", tmp_path / "empty", CAPTURE)
    assert r.returncode == 2 and "analysed alone" in r.stderr


def test_a_real_cpu_diagnose_run_is_analysed_again_the_same(cli, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(CPU_TRAINING_LOOP.replace("{before}", ""))
    r = cli("diagnose", "--out", tmp_path / "runs", "--no-nsys", "--wait", "1", "--warmup", "1",
            "--steps", "4", "--json", tmp_path / "diag.json", script, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    diag = json.loads((tmp_path / "diag.json").read_text())
    again = cli("analyze", diag["run"]["dir"], "--json", "-", "-q")
    assert again.returncode == 0, again.stderr
    j = json.loads(again.stdout)
    assert verdict_of(j) == verdict_of(diag)
    assert [f["rule"] for f in j["findings"]] == [f["rule"] for f in diag["findings"]]
    assert j["run"]["script"] == diag["run"]["script"]
