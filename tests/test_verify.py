"""`navdoctor verify`: in-child patches, interleaving, the noise-aware verdict, code-change
remedies, and the command line. CPU only; the child runs use tiny scripts."""
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from navdoctor.errors import NavdoctorError
from navdoctor.verify import VERIFY_SCHEMA_VERSION
from navdoctor.verify.command import (BASELINE, Plan, Settings, _arm_result, _estimate_check,
                                      plan_from_report, render_table, schedule, Run)
from navdoctor.verify.remedies import parse_arms, target_workers
from navdoctor.verify.stats import HELPS, HURTS, INCONCLUSIVE, NO_EFFECT, compare, decide

ROOT = Path(__file__).resolve().parent.parent

LOADER_SCRIPT = textwrap.dedent("""
    import sys, torch
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    print("loader", loader.num_workers, loader.pin_memory, loader.persistent_workers, flush=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    print("finished", sys.argv[1:])
""")

CONV_SCRIPT = textwrap.dedent("""
    import torch
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.head = torch.nn.Linear(8, 2)
        def forward(self, x):
            print("forward autocast", torch.is_autocast_enabled("cpu"),
                  "input channels_last", x.is_contiguous(memory_format=torch.channels_last),
                  "weight channels_last", self.conv.weight.is_contiguous(memory_format=torch.channels_last),
                  flush=True)
            return self.head(self.conv(x).mean(dim=(2, 3)))
    net = Net()
    loss_fn = torch.nn.MSELoss()          # parameter-free: not "the model"
    import navdoctor
    with torch.no_grad():
        for _ in range(3):
            loss_fn(net(torch.randn(2, 3, 8, 8)), torch.zeros(2, 2))
            navdoctor.step()
""")


def child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_child(tmp_path, script_text, remedy, steps=20, warmup=1):
    script = tmp_path / "s.py"
    script.write_text(script_text)
    status = tmp_path / f"status-{remedy}.json"
    r = subprocess.run([sys.executable, "-m", "navdoctor.verify.runner", "--remedy", remedy,
                        "--status", str(status), "--warmup", str(warmup), "--steps", str(steps),
                        "--", str(script), "--flag"],
                       capture_output=True, text=True, env=child_env(), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    return r, json.loads(status.read_text())


# ---- in-child patches ------------------------------------------------------------------------

def test_loader_patch_on_and_off(tmp_path):
    r, st = run_child(tmp_path, LOADER_SCRIPT, "none")
    assert "loader 0 False False" in r.stdout
    assert st["changes"] == {} and st["loaders"][0]["after"]["num_workers"] == 0
    assert st["step_source"] == "optimizer" and len(st["step_ms"]) == 15   # 16 batches
    assert "finished ['--flag']" in r.stdout                                  # ran to its end

    r, st = run_child(tmp_path, LOADER_SCRIPT,
                      "num_workers+pin_memory+persistent_workers+prefetch_factor+channels_last",
                      steps=5, warmup=1)
    workers = target_workers()
    assert f"loader {workers} True True" in r.stdout
    loader = st["loaders"][0]
    assert loader["before"]["num_workers"] == 0 and loader["after"]["num_workers"] == workers > 0
    assert loader["after"]["prefetch_factor"] == 4
    assert st["changes"]["num_workers"] == [f"num_workers 0 -> {workers}"]
    # channels_last on an MLP: nothing to convert, said so
    assert st["changes"]["channels_last"] == []
    assert any("no 4-D weights" in n for n in st["notes"]["channels_last"])
    # stopped after warmup + steps: 7 boundaries, 6 intervals, and the script never finished
    assert st["stopped_early"] and len(st["step_ms"]) == 6 and "finished" not in r.stdout


def test_model_patches_autocast_channels_last(tmp_path):
    r, st = run_child(tmp_path, CONV_SCRIPT, "none")
    assert "forward autocast False input channels_last False weight channels_last False" in r.stdout
    assert [m["class"] for m in st["models"]] == ["Net"]          # the loss has no parameters
    r, st = run_child(tmp_path, CONV_SCRIPT, "amp_bf16+channels_last")
    assert "forward autocast True input channels_last True weight channels_last True" in r.stdout
    assert st["step_source"] == "explicit"
    assert any("autocast" in c for c in st["changes"]["amp_bf16"])
    assert any("4-D weights" in c for c in st["changes"]["channels_last"])


def test_wrapped_module_call_survives_the_scripts_own_profiler(tmp_path):
    # torch.profiler's Python tracer (with_stack) reads `self` from Module.__call__'s frame
    script = textwrap.dedent("""
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        with torch.profiler.profile(with_stack=True) as prof:
            model(torch.randn(2, 4))
        print("profiled", len(prof.events()) > 0)
    """)
    r, st = run_child(tmp_path, script, "amp_bf16")
    assert "profiled True" in r.stdout and st["models"][0]["class"] == "Sequential"


OPTIMIZER_SCRIPT = textwrap.dedent("""
    import torch
    model = torch.nn.Linear(4, 2)
    class MySGD(torch.optim.SGD):          # the script's own subclass
        pass
    opts = [torch.optim.SGD(model.parameters(), lr=0.1, foreach=False),
            torch.optim.Adam(model.parameters()), MySGD(model.parameters(), lr=0.1)]
    left = torch.optim.SGD(model.parameters(), lr=0.1, differentiable=True)
    print("defaults", [o.defaults["foreach"] for o in opts], "groups",
          [o.param_groups[0]["foreach"] for o in opts], "differentiable", left.defaults["foreach"], flush=True)
    for _ in range(3):
        model(torch.randn(3, 4)).sum().backward()
        for o in opts:
            o.step()
        opts[0].zero_grad(set_to_none=False)
        print("optimizer zero_grad leaves None", model.weight.grad is None, flush=True)
        model(torch.randn(3, 4)).sum().backward()
        model.zero_grad(set_to_none=False)
        print("module zero_grad leaves None", model.weight.grad is None, flush=True)
    print("finished")
""")


def test_optimizer_patches_foreach_and_set_to_none(tmp_path):
    """CPU only: that the patches take effect, not what they gain (no GPU measurement)."""
    r, st = run_child(tmp_path, OPTIMIZER_SCRIPT, "none")
    assert "defaults [False, None, None] groups [False, None, None] differentiable None" in r.stdout
    assert "optimizer zero_grad leaves None False" in r.stdout and "module zero_grad leaves None False" in r.stdout
    assert st["changes"] == {} and st["optimizer_count"] == 4
    r, st = run_child(tmp_path, OPTIMIZER_SCRIPT, "zero_grad_set_to_none+foreach_optimizer")
    assert "finished" in r.stdout
    # every optimizer and its parameter groups run foreach, the differentiable one excepted
    assert "defaults [True, True, True] groups [True, True, True] differentiable None" in r.stdout
    assert "optimizer zero_grad leaves None False" not in r.stdout
    assert r.stdout.count("optimizer zero_grad leaves None True") == 3
    assert r.stdout.count("module zero_grad leaves None True") == 3
    assert st["changes"]["foreach_optimizer"] == ["SGD: foreach False -> True", "Adam: foreach None -> True",
                                                  "MySGD: foreach None -> True"]
    assert st["changes"]["zero_grad_set_to_none"] == ["SGD.zero_grad(set_to_none=False) -> True",
                                                      "Linear.zero_grad(set_to_none=False) -> True"]
    assert any("differentiable" in n for n in st["notes"]["foreach_optimizer"])
    assert [o["class"] for o in st["optimizers"]] == ["SGD", "Adam", "MySGD", "SGD"]
    assert st["optimizers"][0]["before"]["foreach"] is False and st["optimizers"][0]["after"]["foreach"] is True


def test_optimizer_remedies_are_named_by_their_rules():
    import yaml
    launch = yaml.safe_load((ROOT / "rules" / "launch.yaml").read_text())["rules"]
    verify = {r["id"]: {m.get("verify") for m in r.get("remedies", [])} for r in launch}
    assert "foreach_optimizer" in verify["launch-per-tensor-optimizer"]
    assert "zero_grad_set_to_none" in verify["launch-zero-grad-fills"]
    assert parse_arms(["zero_grad_set_to_none,foreach_optimizer"]) == [("zero_grad_set_to_none",),
                                                                      ("foreach_optimizer",)]


# ---- order, stats ----------------------------------------------------------------------------

def test_interleaved_order_reverses_every_other_round():
    nw, amp = ("num_workers",), ("amp_bf16",)
    order = schedule([nw, amp], 3)
    assert [a for _, a in order] == [BASELINE, nw, amp, amp, nw, BASELINE, BASELINE, nw, amp]
    assert [r for r, _ in order] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [a for _, a in schedule([nw], 4)] == [BASELINE, nw, nw, BASELINE] * 2   # A B B A A B B A


def _runs(rng, centre, noise, runs=4, steps=20, run_noise=0.0):
    out = []
    for _ in range(runs):
        shift = centre * (1 + rng.uniform(-run_noise, run_noise))
        out.append([shift * (1 + rng.gauss(0, noise)) for _ in range(steps)])
    return out


def test_priming_runs_come_first_and_untimed():
    nw = ("num_workers",)
    order = schedule([nw], 2, priming=1)
    assert order[:2] == [(0, BASELINE), (0, nw)]
    assert order[2:] == schedule([nw], 2)
    assert schedule([nw], 2, priming=0) == schedule([nw], 2)


def test_compiler_counters_become_notes():
    from torch._dynamo.utils import counters
    from navdoctor.verify.remedies import Patches
    saved = {k: dict(v) for k, v in counters.items()}
    try:
        counters.clear()
        counters["graph_break"]["call to an unsupported function"] += 2
        counters["stats"]["unique_graphs"] += 3
        counters["inductor"]["cudagraph_skips"] += 1
        p = Patches(("cuda_graphs",))
        p.cuda = True
        p.after_run()
        notes = " ".join(p.notes["cuda_graphs"])
        assert "2 graph break(s), 3 compiled graph(s)" in notes and "skipped CUDA graphs 1 time" in notes
        assert p.observed["compiler"] == {"unique_graphs": 3, "graph_breaks": 2, "cudagraph_skips": 1,
                                             "cudagraph_skip_reasons": []}
        counters.clear()
        quiet = Patches(("cuda_graphs",))
        quiet.cuda = True
        quiet.after_run()                       # compiled cleanly: nothing to say
        assert quiet.notes["cuda_graphs"] == []
        other = Patches(("amp_bf16",))
        other.after_run()                       # no compiling remedy: counters not read
        assert "compiler" not in other.observed
        # inductor's own skip path: the reason it logs (silently, without TORCH_LOGS) is kept
        from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter
        told = Patches(("cuda_graphs",))
        told.cuda = True
        told._listen_for_cudagraph_skips()
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs (1 instances)")
        told.after_run()
        assert "why: skipping cudagraphs due to mutated inputs" in " ".join(told.notes["cuda_graphs"])
        assert told.observed["compiler"]["cudagraph_skip_reasons"] == [
            "skipping cudagraphs due to mutated inputs (1 instances)"]
    finally:
        counters.clear()
        for k, v in saved.items():
            counters[k].update(v)


def test_verdicts_on_synthetic_samples():
    rng = random.Random(1)
    base = _runs(rng, 100.0, 0.02, run_noise=0.01)
    assert compare(base, _runs(rng, 50.0, 0.02, run_noise=0.01)).verdict == HELPS
    assert compare(base, _runs(rng, 150.0, 0.02, run_noise=0.01)).verdict == HURTS
    same = compare(base, _runs(rng, 100.0, 0.02, run_noise=0.01))
    assert same.verdict == NO_EFFECT and same.ci_low < 1 < same.ci_high
    # a real 8% gain, but runs that disagree by +-30%: the interval cannot tell
    wild = compare(_runs(rng, 100.0, 0.05, runs=3, run_noise=0.3), _runs(rng, 92.0, 0.05, runs=3, run_noise=0.3))
    assert wild.verdict == INCONCLUSIVE


def test_paired_interval_sees_run_to_run_noise():
    # Two rounds that disagree (1.3x and 3x): a bootstrap over two rounds looks sure of a gain,
    # the paired t-interval over rounds does not.
    before = [[10.0] * 20, [10.5] * 20]
    after = [[7.7] * 20, [3.5] * 20]
    c = compare(before, after)
    assert c.ci_bootstrap[0] > 1.05 and c.ci_paired_t[0] < 1 and c.verdict == INCONCLUSIVE


def test_drift_shared_within_a_round_cancels():
    # The machine is 3x slower in round 2 and 2x in round 3 for both arms; the remedy is a
    # steady ~11% gain within every round.
    rng = random.Random(2)
    jitter = lambda v: [v * (1 + rng.gauss(0, 0.01)) for _ in range(20)]  # noqa: E731
    before = [jitter(10.0), jitter(30.0), jitter(20.0)]
    after = [jitter(9.0), jitter(27.0), jitter(18.0)]
    assert compare(before, after).verdict == HELPS
    assert compare(before, after, paired=False).verdict == INCONCLUSIVE


def test_decide_bounds():
    assert decide(1.06, 1.2, 0.05) == HELPS
    assert decide(1.02, 1.2, 0.05) == INCONCLUSIVE
    assert decide(0.97, 1.03, 0.05) == NO_EFFECT
    assert decide(0.5, 0.9, 0.05) == HURTS


def _timed_run(arm, rnd, ms, changes=("patched",)):
    """A finished run of an arm: its steps' times and what its patches changed."""
    return Run(arm, rnd, 0, {"step_ms": ms, "changes": {a: list(changes) for a in arm}, "notes": {}}, "log", 1.0)


def test_unapplied_patch_is_no_effect_whatever_the_noise():
    base = [_timed_run(BASELINE, i, [10.0] * 8, []) for i in (1, 2, 3)]
    arm = ("channels_last",)
    arm_runs = [_timed_run(arm, i, [5.0] * 8, []) for i in (1, 2, 3)]        # faster, but nothing changed
    res = _arm_result(Plan("s.py", [], [arm]), arm, base, arm_runs, Settings(warmup=1, steps=5), None)
    assert res["comparison"]["verdict"] == HELPS and res["verdict"] == NO_EFFECT
    assert res["applied"] == {"channels_last": False}
    assert res["class"]["changed"] is None and res["class"]["note"].startswith("not measured")


# ---- parsing, code changes, diagnose's plan --------------------------------------------------

def test_parse_arms():
    assert parse_arms(["num_workers,pin_memory", "num_workers+persistent_workers"]) == [
        ("num_workers",), ("pin_memory",), ("num_workers", "persistent_workers")]
    for bad in ("warp_speed", "compile+cuda_graphs", "amp_bf16+amp_fp16", "batch_size+amp_bf16"):
        with pytest.raises(NavdoctorError):
            parse_arms([bad])


def test_plan_from_report_splits_measured_and_code_changes():
    rem = lambda title, verify=None, code=None: SimpleNamespace(title=title, verify=verify, code=code, text="")  # noqa: E731
    report = SimpleNamespace(findings=[
        SimpleNamespace(rule="io-dataloader-wait", remedies=[rem("workers", "num_workers"), rem("pin", "pin_memory")]),
        SimpleNamespace(rule="launch-overhead", remedies=[rem("graphs", "cuda_graphs"),
                                                         rem("Larger batches", "batch_size")]),
        SimpleNamespace(rule="memory-sync-stalls", remedies=[rem("Drop .cpu() from the loop", None, "x.sum()  # no .cpu()")]),
        SimpleNamespace(rule="io-blocking-file-reads", remedies=[rem("read in parallel", "num_workers")]),
        SimpleNamespace(rule="trace-cpu-only", severity="info", remedies=[rem("Record CUDA activity")]),
    ])
    for f in report.findings:
        f.severity = getattr(f, "severity", "high")
    plan = plan_from_report(report, "s.py", [])
    assert plan.arms == [("num_workers",), ("pin_memory",), ("cuda_graphs",)]
    assert plan.sources["num_workers"] == ["io-dataloader-wait", "io-blocking-file-reads"]
    assert [(c.id, c.rule) for c in plan.code_changes] == [("batch_size", "launch-overhead"),
                                                         (None, "memory-sync-stalls")]
    assert plan.code_changes[1].code == "x.sum()  # no .cpu()"


def test_code_change_remedy_reported_not_measured(cli, tmp_path):
    s = tmp_path / "s.py"
    s.write_text(LOADER_SCRIPT)
    r = cli("verify", "--out", tmp_path / "runs", "--remedy", "batch_size", "--json", "-", s, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["schema_version"] == VERIFY_SCHEMA_VERSION
    (res,) = out["results"]
    assert res["kind"] == "code_change" and res["verdict"] == "needs code change"
    assert res["measured"] is False and res["comparison"] is None and res["runs"] == []
    assert res["rule"] and "batch" in (res["code"] + res["text"]).lower()
    assert "needs code change" in render_table(out)


# ---- the command line ------------------------------------------------------------------------

def test_cli_bad_input_exits_2_with_one_line(cli, tmp_path):
    s = tmp_path / "s.py"
    s.write_text(LOADER_SCRIPT)
    r = cli("verify", "--out", tmp_path / "runs", "--remedy", "warp_speed", s, cwd=tmp_path)
    assert r.returncode == 2 and "unknown remedy 'warp_speed'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = cli("verify", "--out", tmp_path / "runs", "--remedy", "num_workers", tmp_path / "nope.py", cwd=tmp_path)
    assert r.returncode == 2 and "no such script" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("verify", "--repeats", "0", s, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_cli_failing_script_exits_1(cli, tmp_path):
    s = tmp_path / "s.py"
    s.write_text("raise RuntimeError('broken before any step')\n")
    r = cli("verify", "--out", tmp_path / "runs", "--repeats", "2", "--remedy", "num_workers", s, cwd=tmp_path)
    assert r.returncode == 1 and "failed without any remedy" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_end_to_end_interleaved(cli, tmp_path):
    s = tmp_path / "s.py"
    s.write_text(LOADER_SCRIPT)
    out = tmp_path / "v.json"
    r = cli("verify", "--out", tmp_path / "runs", "--repeats", "2", "--warmup", "1", "--steps", "6",
            "--remedy", "num_workers", "--json", out, s, "--flag", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    order = [line.split(": ")[-1] for line in r.stderr.splitlines() if "verify run" in line]
    # one untimed priming run of each arm, then the rounds A B | B A
    assert order == ["baseline", "num_workers"] + ["baseline", "num_workers", "num_workers", "baseline"]
    res = json.loads(out.read_text())
    assert [p["arm"] for p in res["priming_runs"]] == ["baseline", "num_workers"]
    assert res["settings"]["priming_runs"] == 1 and len(res["baseline"]["runs"]) == 2
    assert all(run["round"] in (1, 2) for run in res["baseline"]["runs"])
    assert res["settings"]["repeats"] == 2 and res["baseline"]["step_source"] == "optimizer"
    by = {x["remedy"]: x for x in res["results"]}
    nw = by["num_workers"]
    assert nw["applied"] == {"num_workers": True} and len(nw["runs"]) == 2
    assert all(run["steps_timed"] == 6 for run in nw["runs"])
    assert nw["verdict"] in (HELPS, NO_EFFECT, HURTS, INCONCLUSIVE)
    c = nw["comparison"]
    assert c["ci"][0] <= c["speedup"] <= c["ci"][1] and c["runs_before"] == 2
    logs = sorted(Path(res["run_dir"]).glob("r0*-num_workers.log"))
    assert len(logs) == 2 and f"loader {target_workers()} False False" in logs[0].read_text()
    assert "loader 0 False False" in (Path(res["run_dir"]) / "r01-baseline.log").read_text()
    assert "verdict" in r.stdout and "num_workers" in r.stdout    # the table
    assert (Path(res["run_dir"]) / "verify.json").exists()


def test_the_diagnosis_estimate_is_checked_against_the_measurement():
    """diagnose --verify: each measured remedy carries the diagnosis's prediction for it (the
    remedy's expected speed-up and range from the what-if model, the largest among the
    findings that suggest it) and the bound; the result says whether the measurement fell in
    the predicted range, how far from the expectation, and whether it broke the bound (only
    where the whole interval is above it)."""
    def rem(verify, expected=None, rng=None):
        return SimpleNamespace(title=verify, verify=verify, code=None, text="",
                               speedup_expected=expected, speedup_range=rng)
    report = SimpleNamespace(findings=[
        SimpleNamespace(rule="io-dataloader-wait", severity="high", speedup_expected=1.3,
                        speedup_up_to=1.8, remedies=[rem("num_workers", 1.4, [1.2, 1.6])]),
        SimpleNamespace(rule="io-blocking-file-reads", severity="medium", speedup_expected=1.1,
                        speedup_up_to=1.2, remedies=[rem("num_workers", 1.1, [1.0, 1.2])]),
        SimpleNamespace(rule="compute-gpu-bound", severity="medium", speedup_expected=1.2,
                        speedup_up_to=1.2, remedies=[rem("channels_last", 1.05, [0.9, 1.2])])])
    plan = plan_from_report(report, "s.py", [])
    assert plan.estimates["num_workers"] == {"rule": "io-dataloader-wait", "expected": 1.4, "range": [1.2, 1.6],
                                             "up_to": 1.8, "from": "the diagnosis"}

    base = [_timed_run(BASELINE, i, [10.0, 10.1, 9.9, 10.0, 10.05, 9.95, 10.0, 10.0]) for i in (1, 2, 3)]
    settings = Settings(warmup=1, steps=5)
    within = _arm_result(plan, ("num_workers",), base,
                         [_timed_run(("num_workers",), i, [7.0, 7.05, 6.95, 7.0, 7.0, 7.0, 7.02, 6.98]) for i in (1, 2, 3)],
                         settings, None)
    assert within["estimate"]["measured"] == pytest.approx(10 / 7, rel=0.02)
    assert within["estimate"]["above_bound"] is False
    assert within["estimate"]["inside_range"] is True
    assert within["estimate"]["error"] == pytest.approx(10 / 7 / 1.4 - 1, abs=0.02)
    above = _arm_result(plan, ("channels_last",), base,
                        [_timed_run(("channels_last",), i, [5.0, 5.02, 4.98, 5.0, 5.0, 5.0, 5.01, 4.99]) for i in (1, 2, 3)],
                        settings, None)
    assert above["estimate"]["rule"] == "compute-gpu-bound" and above["estimate"]["above_bound"] is True
    assert above["estimate"]["inside_range"] is False
    # a plan without a diagnosis has no estimate to check
    assert _arm_result(Plan("s.py", [], [("num_workers",)]), ("num_workers",), base,
                       [_timed_run(("num_workers",), i, [7.0] * 8) for i in (1, 2, 3)], settings, None)["estimate"] is None


def test_a_baseline_the_host_ran_at_another_speed_is_named_beside_the_prediction():
    """The what-if figures are relative to the step diagnose's timing pass measured (the
    report's run.unprofiled_step_ms): where verify's baseline runs the same step more than 10%
    faster or slower, the estimate says by how much and the text says the expectation was made
    from the diagnosed step; within 10% it says nothing of it, nor where the diagnosis timed no
    step or verify timed whole runs."""
    def report(step_ms):
        return SimpleNamespace(
            run=None if step_ms is None else {"unprofiled_step_ms": step_ms},
            findings=[SimpleNamespace(rule="io-dataloader-wait", severity="high", speedup_expected=1.3,
                                      speedup_up_to=1.8, remedies=[SimpleNamespace(
                                          title="w", verify="num_workers", code=None, text="",
                                          speedup_expected=1.4, speedup_range=[1.2, 1.6])])])

    base = [_timed_run(BASELINE, i, [10.0] * 8) for i in (1, 2, 3)]
    after = [_timed_run(("num_workers",), i, [7.0] * 8) for i in (1, 2, 3)]
    settings = Settings(warmup=1, steps=5)
    moved = _arm_result(plan_from_report(report(7.0), "s.py", []), ("num_workers",), base, after,
                        settings, None)["estimate"]
    assert moved["step_ms"] == 7.0 and moved["step_ms_measured"] == pytest.approx(10.0)
    assert moved["baseline_moved"] == pytest.approx(10 / 7, abs=0.01)
    steady = _arm_result(plan_from_report(report(9.6), "s.py", []), ("num_workers",), base, after,
                         settings, None)["estimate"]
    assert steady["baseline_moved"] is None
    result = {"script": "s.py", "args": [], "run_dir": "d", "baseline": {},
              "settings": {"repeats": 3, "timed_steps": 5, "warmup_steps": 1, "confidence": 0.95, "margin": 0.05},
              "machine": {"cpus": 2, "cpu": "x"}, "results": [{"remedy": "num_workers", "kind": "measured", "verdict": HELPS,
                                          "applied": {"num_workers": True}, "comparison": {}, "estimate": e}
                                         for e in (moved,)]}
    text = render_table(result)
    assert "10.00 ms here and 7.00 ms when diagnosed (1.43x)" in text
    result["results"][0]["estimate"] = steady
    assert "when diagnosed" not in render_table(result)
    untimed = _arm_result(plan_from_report(report(None), "s.py", []), ("num_workers",), base, after,
                          settings, None)["estimate"]
    assert untimed["expected"] == 1.4 and "step_ms" not in untimed and "baseline_moved" not in untimed
    whole_runs = _estimate_check(dict(plan_from_report(report(7.0), "s.py", []).estimates["num_workers"]),
                                 SimpleNamespace(speedup=1.4, ci_low=1.3, before_ms=10_000.0), per_step=False)
    assert "baseline_moved" not in whole_runs and whole_runs["step_ms"] == 7.0


def test_bf16_note_on_gpus_without_bf16_tensor_cores():
    """V100 (7.0) and T4 (7.5) have fp16 tensor cores only: verify's amp_bf16 says so and
    points to amp_fp16; A100/H100 (8.0, 9.0) and an unknown device get no note."""
    from navdoctor.verify.remedies import bf16_without_tensor_cores
    for cap in ((7, 0), (7, 5), (6, 1)):
        note = bf16_without_tensor_cores(cap)
        assert note and f"{cap[0]}.{cap[1]}" in note and "amp_fp16" in note
    for cap in ((8, 0), (8, 6), (9, 0), (10, 0), None):
        assert bf16_without_tensor_cores(cap) is None


def test_cli_classify_diagnoses_each_arm(cli, tmp_path):
    """--classify: one torch.profiler run per arm, diagnosed (on a GPU with that arm's
    profiler cost measured from its own timed runs); each arm gets a class and its trace."""
    s = tmp_path / "s.py"
    s.write_text(LOADER_SCRIPT)
    out = tmp_path / "v.json"
    r = cli("verify", "--out", tmp_path / "runs", "--repeats", "1", "--warmup", "1", "--steps", "4",
            "--classify", "--remedy", "num_workers", "--json", out, s, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    nw = next(x for x in res["results"] if x["remedy"] == "num_workers")
    assert nw["class"]["before"] and nw["class"]["after"], nw["class"]
    assert nw["class"]["changed"] in (True, False)


def test_classify_summarises_each_timed_run_as_diagnose_does():
    """--classify judges each arm with its timed runs as diagnose judges its timing runs: each
    run over its own timed steps (warm-up skipped, the run's stalls left out of its step and of
    its DataLoader wait alike), the step their mean, one wait per run, so that runs on either
    side of the loader's line are seen; no wait where a run timed none, and nothing where the
    runs are compared whole (their times hold the script's start-up)."""
    from navdoctor.verify.command import Run, Settings, _arm_unprofiled

    def run(rnd, ms, waits):
        return Run(("num_workers",), rnd, 0, {"step_ms": ms, "loader_wait_ms": waits, "seconds": 9.0},
                   "log", 1.0)
    settings = Settings(warmup=2, steps=5)
    runs = [run(1, [50, 50, 10, 10, 40, 10, 10, 99], [30, 30, 2, 2, 30, 2, 2, 50]),
            run(2, [50, 50, 10, 11, 10, 10, 10], [30, 30, 3, 3, 3, 3, 3])]
    step, waits = _arm_unprofiled(runs, settings)
    assert waits == pytest.approx([2.0, 3.0], abs=1e-4)        # the 40 ms stall out of run 1's wait
    assert step == pytest.approx((10.0 + 10.2) / 2, abs=1e-4)  # ... and out of its step
    # a whole slow run counts in both figures, as a slow timing run of diagnose does
    slow = run(3, [35.0] * 8, [25.0] * 8)
    step, waits = _arm_unprofiled([run(4, [10.0] * 8, [0.0] * 8), slow], settings)
    assert step == pytest.approx(22.5) and waits == pytest.approx([0.0, 25.0])
    assert _arm_unprofiled([runs[0], run(5, [10.0] * 8, None)], settings) == (pytest.approx(10.0), None)
    assert _arm_unprofiled([run(6, [10.0], [1.0])], settings) == (None, None)   # too few steps: whole runs


def test_classify_makes_a_close_call_where_its_runs_waits_straddle_the_loader_line(tmp_path, monkeypatch):
    """An arm whose timed runs waited on both sides of the loader's line is judged as diagnose
    judges two such timing runs: a close call naming the other class, which the table's detail
    line and the HTML page show."""
    from navdoctor.reporters.html import render_verify_html
    from navdoctor.verify import command as vc
    capture = Path(__file__).parent.parent / "fixtures/gpu/mixed/h100r13_fcn50_data_0.26.nsys.sqlite.gz"

    def fake_profiled_run(script, args, arm, status_path, log_path, settings, extra):
        (Path(extra[1]) / "status-torch.json").write_text(json.dumps({"trace": str(capture)}))
        return 0, False, None
    monkeypatch.setattr(vc, "run_child", fake_profiled_run)
    arm = ("num_workers",)
    plan = vc.Plan("script.py", [], [arm])
    # the baseline's two runs waited 0% and 8.9% of the 18 ms step, the arm's both under the line
    # (a capture whose trace shows 1.6 ms of wait: the trace alone does not make it io)
    classes = vc._classify(plan, vc.Settings(), tmp_path, lambda m: None, set(),
                           {vc.BASELINE: (18.0, [0.0, 1.6]), arm: (18.0, [0.0, 0.1])})
    straddling, both_under = classes[vc.BASELINE], classes[arm]
    assert straddling["bound"] == "compute" and straddling["close_to"] == ["io"]
    assert straddling["loader_waits_ms"] == [0.0, 1.6]
    assert both_under["bound"] == "compute" and both_under["close_to"] is None

    settings = vc.Settings(repeats=2, warmup=1, steps=4)

    def run(a, rnd):
        return Run(a, rnd, 0, {"step_ms": [18.0] * 5, "changes": {"num_workers": ["0 -> 8"]},
                               "seconds": 1.0}, "log", 1.0)
    result = {"settings": {"repeats": 2, "warmup_steps": 1, "timed_steps": 4, "margin": 0.05,
                           "confidence": 0.95, "priming_runs": 0},
              "machine": {"device": "H100", "cpus": 16, "cpu": "x", "torch": "2", "cuda": True},
              "script": "script.py", "args": [], "run_dir": str(tmp_path), "created": "2026-01-01",
              "baseline": {"median_ms": 18.0},
              "results": [vc._arm_result(plan, arm, [run(vc.BASELINE, r) for r in (1, 2)],
                                         [run(arm, r) for r in (1, 2)], settings, classes)]}
    assert "class: compute (close call with io) -> compute (profiled:" in vc.render_table(result)
    assert "compute (close call with io) → compute" in render_verify_html(result)
