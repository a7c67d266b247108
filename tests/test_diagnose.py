"""`navdoctor diagnose` on the CPU: a real torch.profiler pass of small scripts."""
import json
import textwrap
from pathlib import Path

import pytest
from conftest import sigint_as_in_a_terminal

LOOP = textwrap.dedent("""
    import sys, os, torch
    print("argv", sys.argv[1:], "main", __name__, "cwd", os.getcwd())
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 2, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        {extra}
    print("finished")
""")


def script(tmp_path, extra="", name="loop.py", body=None):
    p = tmp_path / name
    p.write_text(body if body is not None else LOOP.replace("{extra}", extra))
    return p


def diagnose(cli, tmp_path, *args, env=None):
    out = tmp_path / "runs"
    r = cli("diagnose", "--out", out, "--no-nsys", "--wait", "1", "--warmup", "1", "--steps", "3",
            "--json", tmp_path / "report.json", *args, cwd=tmp_path, env=env)
    report = json.loads((tmp_path / "report.json").read_text()) if (tmp_path / "report.json").exists() else None
    return r, report


def test_profiles_a_training_script_on_cpu(cli, tmp_path):
    s = script(tmp_path)
    r, report = diagnose(cli, tmp_path, s, "--lr", "3")
    assert r.returncode == 0, r.stderr
    assert "argv ['--lr', '3'] main __main__ cwd " + str(tmp_path) in r.stdout  # as `python SCRIPT ARGS`
    assert "finished" in r.stdout and r.stdout.index("finished") < r.stdout.index("VERDICT")
    run = report["run"]
    torch_pass = run["passes"][0]
    # 16 optimizer steps (64 rows, batch 4): the fetch that opened the first is no iteration
    assert torch_pass["step_source"] == "optimizer" and torch_pass["steps"] == 16
    assert report["verdict"]["steps"] == 3 and report["verdict"]["per_trace"][0]["step_origin"] == "ProfilerStep"
    run_dir = Path(run["dir"])
    for f in ("kineto.json.gz", "trace.duckdb", "report.json", "report.md", "torch-pass.log"):
        assert (run_dir / f).exists(), f
    assert any("--no-nsys" in n for n in run["notes"])
    assert "pass 1/2: torch.profiler" in r.stderr


def test_explicit_steps_win(cli, tmp_path):
    s = script(tmp_path, extra="import navdoctor; navdoctor.step()")
    r, report = diagnose(cli, tmp_path, s)
    assert report["run"]["passes"][0]["step_source"] == "explicit"


def test_dataloader_steps_without_optimizer(cli, tmp_path):
    body = textwrap.dedent("""
        import torch
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(40, 8)), batch_size=4)
        model = torch.nn.Linear(8, 2)
        with torch.no_grad():
            for (x,) in loader:
                model(x)
    """)
    r, report = diagnose(cli, tmp_path, script(tmp_path, body=body))
    assert r.returncode == 0, r.stderr
    assert report["run"]["passes"][0]["step_source"] == "dataloader"
    assert report["verdict"]["steps"] == 3


def test_the_code_after_a_loop_is_no_step(cli, tmp_path):
    """The fetch that finds the DataLoader exhausted opens no iteration: the steps are the 7
    batches, and the code after the loop (here 0.4 s) is no step of the verdict. With loader
    workers the recording runs on past the prefetched batches, so the window reaches the loop's
    end: that step was the recorded window's last ProfilerStep, 40x the others."""
    body = textwrap.dedent("""
        import time, torch
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(28, 8)),
                                             batch_size=4, num_workers=2)
        model = torch.nn.Linear(8, 2)
        with torch.no_grad():
            for (x,) in loader:
                model(x)
                time.sleep(0.01)
        time.sleep(0.4)
    """)
    r, report = diagnose(cli, tmp_path, script(tmp_path, body=body))
    assert r.returncode == 0, r.stderr
    assert report["run"]["passes"][0]["step_source"] == "dataloader"
    assert "the script ran 7 steps (dataloader)" in r.stderr
    v = report["verdict"]
    assert v["steps"] >= 1 and v["step_ms"] < 100, (v["steps"], v["step_ms"])


def test_crashing_script_keeps_capture_and_exit_code(cli, tmp_path):
    s = script(tmp_path, extra="if step == 7: raise RuntimeError('boom at step 7')")
    r, report = diagnose(cli, tmp_path, s)
    assert r.returncode == 1
    assert "RuntimeError: boom at step 7" in r.stderr      # the script's own traceback
    assert "the script failed" in r.stderr
    assert report["verdict"]["steps"] == 3                  # steps recorded before the crash
    assert report["run"]["script_exit_code"] == 1


def test_script_exit_status_is_kept(cli, tmp_path):
    s = script(tmp_path, extra="if step == 8: sys.exit(3)")
    r, report = diagnose(cli, tmp_path, s)
    assert r.returncode == 3 and report["run"]["script_exit_code"] == 3


def test_script_that_never_steps_is_profiled_whole(cli, tmp_path):
    body = "import torch\nx = torch.randn(64, 64)\nfor _ in range(20):\n    x = (x @ x).tanh()\nprint('ok')\n"
    r, report = diagnose(cli, tmp_path, script(tmp_path, body=body))
    assert r.returncode == 0, r.stderr
    assert any("profiled its whole run" in n for n in report["run"]["notes"])
    assert report["verdict"]["per_trace"][0]["step_origin"] == "whole-trace"
    assert "trace-no-steps" in [f["rule"] for f in report["findings"]]


def test_script_with_its_own_profiler(cli, tmp_path):
    body = textwrap.dedent("""
        import torch
        from torch.profiler import profile, schedule, ProfilerActivity
        model = torch.nn.Linear(32, 32)
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2)) as p:
            for _ in range(6):
                model(torch.randn(8, 32)).sum().backward()
                p.step()
        print("own profiler done")
    """)
    r, report = diagnose(cli, tmp_path, script(tmp_path, body=body))
    assert r.returncode == 0, r.stderr
    assert "own profiler done" in r.stdout
    assert any("its own torch.profiler" in n for n in report["run"]["notes"])
    assert report["verdict"]["steps"] >= 1


def test_nsys_missing_is_one_line_and_cpu_still_diagnosed(cli, tmp_path):
    s = script(tmp_path)
    out = tmp_path / "runs"
    r = cli("diagnose", "--out", out, "--wait", "1", "--warmup", "1", "--steps", "2", "--json", "-", s,
            env={"PATH": "/usr/bin:/bin", "NAVDOCTOR_NSYS": ""})
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)  # the script's own output went to stderr
    assert "finished" in r.stderr
    assert any("nsys not found" in n or "no CUDA device" in n for n in report["run"]["notes"])
    r = cli("diagnose", "--nsys", "/nonexistent/nsys", s)
    assert r.returncode == 2 and "nsys not found" in r.stderr


def test_runs_never_overwrite(cli, tmp_path):
    s = script(tmp_path)
    dirs = set()
    for _ in range(2):
        r, report = diagnose(cli, tmp_path, s)
        dirs.add(report["run"]["dir"])
    assert len(dirs) == 2


def test_missing_script(cli, tmp_path):
    r = cli("diagnose", "--no-nsys", tmp_path / "nope.py")
    assert r.returncode == 2 and "no such script" in r.stderr and "Traceback" not in r.stderr


def test_ctrl_c_stops_cleanly_and_keeps_the_run(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    root = Path(__file__).resolve().parent.parent
    s = script(tmp_path, extra="import time; time.sleep(0.5)")
    env = dict(os.environ, PYTHONPATH=str(root))
    out = tmp_path / "runs"
    # A new session, like a terminal's foreground job: Ctrl-C goes to the whole group.
    proc = subprocess.Popen([sys.executable, "-m", "navdoctor.cli", "diagnose", "--no-nsys", "--out", str(out),
                             "--wait", "1", "--warmup", "1", "--steps", "100", str(s)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=sigint_as_in_a_terminal)
    # Interrupt once the script is running its loop (it prints its argv first), however
    # slow the machine is.
    deadline = time.time() + 240
    while time.time() < deadline:
        logs = list(out.glob("*/torch-pass.log"))
        if logs and "argv" in logs[0].read_text(errors="replace"):
            break
        time.sleep(0.5)
    time.sleep(3)  # a few steps of 0.5 s
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr.decode()[-2000:]
    assert b"Traceback (most recent call last)" not in stderr.split(b"KeyboardInterrupt")[-1]
    run_dirs = list(out.iterdir())
    assert len(run_dirs) == 1 and (run_dirs[0] / "torch-pass.log").exists()


def test_per_frame_loop_without_loader_gets_module_steps(cli, tmp_path):
    # A camera-style loop (issue #18): frames made one at a time, two models per frame, a
    # read-back; no DataLoader, no optimizer, no markers. Each frame must be a step, cut at the
    # model called once per frame (not at every submodule's forward, not one step per model).
    body = textwrap.dedent("""
        import torch
        seg = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1)).eval()
        det = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(6)).eval()
        def frames(n):
            for i in range(n):
                yield torch.rand(1, 3, 48, 64)
        with torch.inference_mode():
            for n, x in enumerate(frames(16)):
                mask = seg(x).argmax(1)
                boxes = det(x)
                blocked = float((mask != 0).float().mean()) + float(boxes.sum())
        print("frames done")
    """)
    r, report = diagnose(cli, tmp_path, script(tmp_path, body=body))
    assert r.returncode == 0, r.stderr
    torch_pass = report["run"]["passes"][0]
    assert torch_pass["step_source"] == "module", torch_pass
    assert torch_pass["steps"] in (15, 16), torch_pass          # one per frame
    assert torch_pass["step_module"] == "Sequential"
    assert report["verdict"]["steps"] == 3
    assert report["verdict"]["per_trace"][0]["step_origin"] == "ProfilerStep"
    assert "trace-no-steps" not in [f["rule"] for f in report["findings"]]
