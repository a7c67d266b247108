"""The collector's step machinery (navdoctor/collect/runner.py), in-process and CPU only.

StepSource (which events are step boundaries), ModuleSteps (per-frame loops without a loader
or optimizer), RecordingPlan (which steps are skipped, warmed up and recorded), the two
collector passes' step handling (TorchPass on a real CPU torch.profiler, NvtxPass against a
stand-in for torch.cuda), diagnose's whole-run reruns (with the pass runner replaced, so
neither a child process nor nsys is needed) and the Kineto loader reading navdoctor.step#N.
"""
from __future__ import annotations

import json
import os
import select
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module
from torch.profiler import ProfilerAction
from torch.utils.data import DataLoader, Dataset
from torch.utils.data import dataloader as dl

import navdoctor
from navdoctor import store
from navdoctor.collect import diagnose, runner
from navdoctor.collect.diagnose import PassResult
from navdoctor.loaders.kineto import load_kineto

RECORDED = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


# --------------------------------------------------------------------------------------------
# Process-wide hooks: _patch_step_sources patches DataLoader.__next__, adds a global optimizer
# hook (its handle is not kept), global module hooks and navdoctor._step_hook. Undo all of it.

def _hook_counts():
    return (len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks))


@pytest.fixture
def hooks(monkeypatch):
    monkeypatch.setattr(dl._BaseDataLoaderIter, "__next__", dl._BaseDataLoaderIter.__next__)
    monkeypatch.setattr(navdoctor, "_step_hook", None)
    optimizer_hooks = dict(optim_module._global_optimizer_post_hooks)
    baseline = _hook_counts()
    installed = []

    def install(on_step=None, plan=None):
        """A StepSource wired to the real hooks; returns (source, module_steps, boundaries),
        boundaries being (step number, source mode) per accepted event."""
        boundaries = []

        def record(n):
            boundaries.append((n, source.mode))
            if on_step is not None:
                on_step(n)
        source = runner.StepSource(record)
        module_steps = runner._patch_step_sources(source, plan)
        installed.append(module_steps)
        return source, module_steps, boundaries

    yield SimpleNamespace(install=install, baseline=baseline)
    for m in installed:
        m.remove()
    optim_module._global_optimizer_post_hooks.clear()
    optim_module._global_optimizer_post_hooks.update(optimizer_hooks)
    assert _hook_counts() == baseline


def _modes(boundaries):
    return [mode for _, mode in boundaries]


class Seg(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                        torch.nn.Sequential(torch.nn.Linear(8, 4)))

    def forward(self, x):
        return self.body(x)


class Det(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(x)


# --------------------------------------------------------------------------------------------
# 1. StepSource priority: explicit > optimizer > dataloader > module

@pytest.mark.parametrize("events, accepted, iterations, final_mode, takeovers", [
    # the loader opens steps until the optimizer appears; then the loader is ignored
    (["dataloader"] * 3 + ["optimizer"] + ["dataloader", "optimizer"] * 2,
     3 + 1 + 2, 3, "optimizer", ["dataloader", "optimizer"]),
    # module steps give way to a DataLoader, and never come back
    (["module", "module", "dataloader", "module", "module", "dataloader"],
     2 + 1 + 1, 2, "dataloader", ["module", "dataloader"]),
    # navdoctor.step() wins over everything once called
    (["optimizer", "explicit", "optimizer", "dataloader", "module", "explicit"],
     1 + 1 + 1, 2, "explicit", ["optimizer", "explicit"]),
    # the top source first: nothing lower is ever counted
    (["explicit", "module", "dataloader", "optimizer", "explicit"], 2, 2, "explicit", ["explicit"]),
])
def test_step_source_priority(events, accepted, iterations, final_mode, takeovers):
    seen, changes = [], []
    source = runner.StepSource(seen.append)
    source.on_mode_change = changes.append
    for e in events:
        source.event(e)
    assert source.steps == accepted
    assert source.iterations == iterations          # the current source's events only
    assert seen == list(range(1, accepted + 1))     # on_step gets consecutive step numbers
    assert source.mode == final_mode
    assert changes == takeovers                      # told once per takeover, not per event


@pytest.mark.parametrize("events, iterations", [
    # (as the hooks call them: the fetch that finds the loader exhausted is an event, then
    # loop_end follows it)
    # three epochs of 4 batches in DataLoader mode: each epoch's exhausted fetch is no iteration
    ((["dataloader"] * 5 + ["end"]) * 3, 12),
    # an evaluation loop runs out before training starts: only optimizer steps count
    (["dataloader"] * 4 + ["end"] + ["dataloader", "optimizer"] * 5 + ["dataloader", "end"], 5),
    # model calls, then an empty DataLoader whose exhausted fetch is the takeover
    (["module"] * 3 + ["dataloader", "end"], 0),
    # the loop ends before any step source was seen
    (["end"], 0),
])
def test_iterations_leave_out_exhausted_fetches_and_lower_sources(events, iterations):
    source = runner.StepSource(lambda n: None)
    for e in events:
        source.loop_end() if e == "end" else source.event(e)
    assert source.iterations == iterations


def test_training_loop_counts_one_step_per_optimizer_step(hooks):
    # A script-like loop: a DataLoader, two forwards per iteration (a no-grad look at the
    # batch, then the training forward), optimizer.step(). The first fetch opens step 1,
    # then each optimizer step closes one: forwards and later fetches are not boundaries.
    source, module_steps, boundaries = hooks.install()
    model = Seg()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.rand(12, 4))
    iterations = 0
    for (x,) in DataLoader(data, batch_size=2):
        with torch.no_grad():
            model(x)
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        iterations += 1
    assert iterations == 6
    assert _modes(boundaries) == ["dataloader"] + ["optimizer"] * iterations
    assert source.steps == iterations + 1 and source.mode == "optimizer"
    # the fetch that opened the first step is a boundary, not an iteration (the pass's count)
    assert source.iterations == iterations
    # The module hooks went away when a higher source took over (they slow every call).
    assert module_steps.anchor is None and _hook_counts() == hooks.baseline


def test_optimizer_steps_without_loader_are_not_counted_per_forward(hooks):
    # No DataLoader: the model is called three times per iteration, and before the first
    # optimizer step twice (so it becomes the module anchor first); the optimizer then takes
    # over and each of its steps is one boundary.
    source, module_steps, boundaries = hooks.install()
    model = Seg()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.rand(3, 4)
    for _ in range(5):
        a, b, c = model(x), model(x), model(x)
        (a + b + c).sum().backward()
        opt.step()
        opt.zero_grad()
    module_boundaries = [m for m in _modes(boundaries) if m == "module"]
    assert _modes(boundaries)[len(module_boundaries):] == ["optimizer"] * 5
    assert len(module_boundaries) == 2          # calls 2 and 3 of the first iteration
    assert source.mode == "optimizer" and _hook_counts() == hooks.baseline
    assert len(model._forward_pre_hooks) == 0   # the anchor's own hook is gone too


def test_navdoctor_step_takes_over_from_loader_and_optimizer(hooks):
    source, _, boundaries = hooks.install()
    model = Det()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.rand(16, 4))
    explicit_calls = 0
    for i, (x,) in enumerate(DataLoader(data, batch_size=2)):
        model(x).sum().backward()
        opt.step()
        if i >= 2 and i % 2 == 0:     # the script marks every other iteration, from the third
            navdoctor.step()
            explicit_calls += 1
    modes = _modes(boundaries)
    first = modes.index("explicit")
    assert modes[first:] == ["explicit"] * explicit_calls
    assert set(modes[:first]) == {"dataloader", "optimizer"}
    assert source.mode == "explicit"


def test_navdoctor_step_is_a_no_op_outside_the_collector(monkeypatch):
    monkeypatch.setattr(navdoctor, "_step_hook", None)
    navdoctor.step()          # must not raise
    calls = []
    monkeypatch.setattr(navdoctor, "_step_hook", lambda: calls.append(1))
    navdoctor.step()
    assert calls == [1]


# --------------------------------------------------------------------------------------------
# 2. A forked child (a DataLoader worker) inherits the hooks; its events are not the run's

def _wait_child(pid, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("forked child hung")


def _read_all(fd, timeout=30.0):
    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_events_in_a_forked_child_are_ignored(hooks, tmp_path):
    log = tmp_path / "boundaries.txt"

    def on_step(n):       # the real collector would touch CUDA here: a crash in a fork
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {n}\n")

    source, module_steps, _ = hooks.install(on_step)
    model = Seg()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.rand(2, 4)
    with torch.no_grad():
        model(x)      # first outermost call: one more would make it the anchor
    assert source.steps == 0 and module_steps.anchor is None

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:      # the child: forwards, an optimizer step, navdoctor.step(), a fetch
        code = 0
        try:
            os.close(r)
            for _ in range(3):
                model(x).sum().backward()
                opt.step()
                navdoctor.step()
            next(iter(DataLoader(range(4), batch_size=2)))
            report = {"steps": source.steps, "mode": source.mode,
                      "anchor": module_steps.anchor_name}
            os.write(w, json.dumps(report).encode())
        except BaseException:
            os.write(w, json.dumps({"error": traceback.format_exc()}).encode())
            code = 3
        finally:
            os._exit(code)
    os.close(w)
    child = json.loads(_read_all(r) or "{}")
    assert _wait_child(pid) == 0, child
    assert child == {"steps": 0, "mode": None, "anchor": None}
    assert not log.exists()           # on_step never ran, in the child or here
    assert source.steps == 0 and source.mode is None and module_steps.anchor is None

    # The parent's own events still count: its second model call opens the first frame step.
    with torch.no_grad():
        model(x)
    assert source.steps == 1 and source.mode == "module"
    assert log.read_text().split() == [str(os.getpid()), "1"]


class ModuleTransformDataset(Dataset):
    """A dataset whose transform is an nn.Module, called in the workers (torchvision style)."""

    def __init__(self, n):
        self.n = n
        self.transform = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Identity())

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.full((4,), float(i))
        for _ in range(3):          # outermost in the worker, several times: an anchor there
            x = self.transform(x)
        return x


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_dataloader_workers_make_no_steps_and_plan_follows_the_loader(hooks, tmp_path):
    # Workers are forked at iter(loader), before the first fetch has removed the module hooks:
    # their transform calls reach ModuleSteps and StepSource in the child and must do nothing.
    log = tmp_path / "boundaries.txt"
    plan = runner.RecordingPlan(wait=1, warmup=1, active=2)
    waits_at_boundary = []

    def on_step(n):
        waits_at_boundary.append((plan.wait, plan.active))
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")

    source, module_steps, boundaries = hooks.install(on_step, plan)
    loader = DataLoader(ModuleTransformDataset(12), batch_size=2, num_workers=2, prefetch_factor=3,
                        multiprocessing_context="fork")
    batches = sum(1 for _ in loader)
    assert batches == 6
    pids = log.read_text().split()
    assert set(pids) == {str(os.getpid())}, "a worker process acted on a step event"
    # One boundary per fetch, the fetch that ends the loop included (it closes the last step).
    assert _modes(boundaries) == ["dataloader"] * (batches + 1) and len(pids) == batches + 1
    assert module_steps.anchor is None
    # The plan saw the loader before the first boundary: 2 workers x 3 prefetched batches are
    # skipped, and 3 periods of 2 workers recorded.
    assert plan.loader == {"num_workers": 2, "prefetch_factor": 3, "buffered_batches": 6}
    assert waits_at_boundary[0] == (6, 6)


# --------------------------------------------------------------------------------------------
# 3. ModuleSteps: per-frame loops without a DataLoader, an optimizer or navdoctor.step()

def test_module_steps_one_per_outermost_call(hooks):
    source, module_steps, boundaries = hooks.install()
    model = Seg().eval()
    frames = 8
    with torch.inference_mode():
        for _ in range(frames):
            model(torch.rand(1, 4))
    # The anchor is known at its second call, which opens the first step: from the start of
    # one call to the start of the next, so 8 calls open 7 steps. Seg's five submodule
    # forwards per call are not boundaries.
    assert boundaries == [(n, "module") for n in range(1, frames)]
    assert module_steps.anchor is model and module_steps.anchor_name == "Seg"
    assert _hook_counts() == hooks.baseline   # global hooks gone once the anchor is chosen


def test_module_steps_one_per_frame_with_two_models_and_a_model_called_once(hooks):
    source, module_steps, boundaries = hooks.install()
    seg, det = Seg().eval(), Det().eval()
    builder = torch.nn.Linear(4, 4)
    warm = torch.rand(1, 4)
    builder(warm)          # called once before the loop: never the anchor
    seg(warm)              # a warm-up call of the first model: its first loop call is call 2
    frames = 6
    for _ in range(frames):
        x = torch.rand(1, 4)
        mask = seg(x)
        boxes = det(x)
        with torch.no_grad():
            float(mask.sum() + boxes.sum())
    assert module_steps.anchor is seg and module_steps.anchor_name == "Seg"
    assert source.steps == frames and _modes(boundaries) == ["module"] * frames


def test_module_steps_survive_exceptions_in_forward(hooks):
    # A frame whose model raises (caught by the loop) must not leave a call level open: the
    # next frames are still outermost calls (before the anchor is chosen) and still steps.
    class Flaky(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(4, 4)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            y = self.inner(x)
            if self.calls in (1, 4, 5):
                raise RuntimeError("bad frame")
            return y

    source, module_steps, _ = hooks.install()
    model = Flaky()
    frames = 8
    for _ in range(frames):
        try:
            model(torch.rand(1, 4))
        except RuntimeError:
            pass
    assert module_steps.anchor is model
    assert source.steps == frames - 1


def test_module_steps_removed_when_a_higher_source_appears(hooks):
    source, module_steps, boundaries = hooks.install()
    model = Det()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.rand(1, 4)
    for _ in range(3):
        model(x)
    assert source.mode == "module" and source.steps == 2
    assert len(model._forward_pre_hooks) == 1
    model(x).sum().backward()
    opt.step()
    assert source.mode == "optimizer" and source.steps == 4   # the 4th call, then the optimizer
    assert len(model._forward_pre_hooks) == 0 and len(model._forward_hooks) == 0
    for _ in range(3):
        model(x)
    assert source.steps == 4


def test_module_steps_count_nested_anchor_calls_once(hooks):
    # The anchor called inside itself (a recursive or re-entrant model): one step per
    # outermost call.
    class Recursive(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, depth=2):
            x = self.lin(x)
            return self(x, depth - 1) if depth else x

    source, module_steps, _ = hooks.install()
    model = Recursive()
    frames = 5
    for _ in range(frames):
        model(torch.rand(1, 4))
    assert module_steps.anchor is model and source.steps == frames - 1


def test_module_steps_shared_backbone_called_inside_another_model(hooks):
    class Detector(torch.nn.Module):
        def __init__(self, backbone):
            super().__init__()
            self.backbone, self.head = backbone, torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.backbone(x))

    source, module_steps, _ = hooks.install()
    backbone = torch.nn.Linear(4, 4)
    detector = Detector(backbone)
    frames = 5
    for _ in range(frames):
        x = torch.rand(1, 4)
        backbone(x)           # features for the segmentation cue
        detector(x)           # calls the same backbone inside
    assert source.steps == frames - 1


def test_module_steps_transform_built_per_frame_is_not_the_anchor(hooks):
    class Normalize(torch.nn.Module):       # torchvision's transforms are nn.Modules
        def forward(self, x):
            return (x - 0.5) / 0.2

    frames = 10
    # The case needs the second frame's transform to get the first one's freed id (the
    # allocator usually obliges): try a few fresh runs until it does.
    for _ in range(30):
        source, module_steps, _ = hooks.install()
        model, ids = Det(), []
        for _ in range(frames):
            t = Normalize()
            ids.append(id(t))
            x = t(torch.rand(1, 4))
            del t
            model(x)
        if ids[0] == ids[1]:
            break
        module_steps.remove()
    else:
        pytest.skip("the interpreter never reused the id: the case is not exercised")
    assert module_steps.anchor is model
    assert source.steps == frames - 1


def test_module_steps_remove_without_anchor_restores_global_hooks(hooks):
    source, module_steps, _ = hooks.install()
    assert _hook_counts() == (hooks.baseline[0] + 1, hooks.baseline[1] + 1)
    module_steps.remove()
    assert _hook_counts() == hooks.baseline
    torch.nn.Linear(2, 2)(torch.rand(1, 2))
    torch.nn.Linear(2, 2)(torch.rand(1, 2))
    assert source.steps == 0


# --------------------------------------------------------------------------------------------
# 4. RecordingPlan

def test_plan_without_loader_keeps_the_schedule():
    plan = runner.RecordingPlan(2, 3, 5)
    assert (plan.first_recorded, plan.end) == (5, 10)
    assert plan.summary() == {"wait": 2, "warmup": 3, "active": 5, "loader": None}


@pytest.mark.parametrize("workers, prefetch, wait, active", [
    (4, 2, 2, 5), (4, None, 2, 5), (2, 5, 2, 5), (1, 2, 6, 5), (3, 2, 2, 20),
    (0, None, 2, 5), (32, 2, 2, 5), (20, 4, 2, 60),
])
def test_plan_grows_with_the_loader(workers, prefetch, wait, active):
    plan = runner.RecordingPlan(wait, 2, active)
    plan.see_loader(workers, prefetch)
    buffered = workers * (prefetch or 2)       # torch's default prefetch_factor is 2
    assert plan.wait == max(wait, buffered)    # the prefetched batches are skipped...
    assert plan.wait >= buffered
    # ...and at least 3 worker periods recorded, at most 48 steps unless asked for more
    assert plan.active == max(active, min(runner.RecordingPlan.MAX_ACTIVE,
                                          runner.RecordingPlan.LOADER_PERIODS * workers))
    assert plan.active >= min(48, 3 * workers) and plan.active >= active
    assert plan.warmup == 2
    assert plan.loader == {"num_workers": workers, "prefetch_factor": prefetch,
                           "buffered_batches": buffered}
    assert plan.summary()["loader"] == plan.loader


def test_plan_active_is_capped_at_48():
    plan = runner.RecordingPlan(2, 2, 5)
    plan.see_loader(100, 2)
    assert plan.active == 48 and plan.wait == 200


def test_plan_takes_the_first_loader_and_freezes_when_scheduling_starts():
    plan = runner.RecordingPlan(2, 1, 3)
    plan.see_loader(2, 2)
    plan.see_loader(8, 4)                       # a second loader (validation) changes nothing
    assert (plan.wait, plan.active, plan.loader["num_workers"]) == (4, 6, 2)

    late = runner.RecordingPlan(2, 1, 3)
    assert late.torch_action(0) == ProfilerAction.NONE and not late.frozen
    late.torch_action(1)
    assert not late.frozen
    late.torch_action(2)                        # the first step past wait: the plan is fixed
    assert late.frozen
    late.see_loader(8, 4)
    assert (late.wait, late.active, late.loader) == (2, 3, None)


@pytest.mark.parametrize("wait, warmup, active, loader", [
    (2, 2, 5, None), (0, 0, 1, None), (1, 0, 3, None), (0, 3, 2, None), (2, 2, 5, (3, 2)),
])
def test_plan_torch_actions(wait, warmup, active, loader):
    plan = runner.RecordingPlan(wait, warmup, active)
    if loader:
        plan.see_loader(*loader)
    w, u, a = plan.wait, plan.warmup, plan.active
    actions = [plan.torch_action(k) for k in range(w + u + a + 3)]
    assert actions[:w] == [ProfilerAction.NONE] * w
    assert actions[w:w + u] == [ProfilerAction.WARMUP] * u
    assert actions[w + u:w + u + a - 1] == [ProfilerAction.RECORD] * (a - 1)
    assert actions[w + u + a - 1] == ProfilerAction.RECORD_AND_SAVE   # saved exactly once
    assert actions[w + u + a:] == [ProfilerAction.NONE] * 3
    assert [k for k, x in enumerate(actions) if x in RECORDED] == list(range(plan.first_recorded,
                                                                            plan.end))


# --------------------------------------------------------------------------------------------
# The passes: TorchPass on a real CPU profiler, NvtxPass against a stand-in for torch.cuda

@pytest.fixture
def restore_profiler(monkeypatch):
    # TorchPass patches torch.profiler.profile.start (to notice a script's own profiler).
    from torch.profiler import profile
    monkeypatch.setattr(profile, "start", profile.start)


def _steps_of(path):
    con = store.open_store()
    load_kineto(con, str(path), 1)
    return con.execute("SELECT step_num, origin FROM steps ORDER BY step_num").fetchall()


def test_torch_pass_records_the_planned_steps(tmp_path, restore_profiler, monkeypatch):
    monkeypatch.setattr(navdoctor, "_step_hook", None)
    plan = runner.RecordingPlan(wait=1, warmup=1, active=3)
    tp = runner.TorchPass(str(tmp_path), plan, whole=False)
    source = runner.StepSource(tp.step)
    navdoctor._step_hook = lambda: source.event("explicit")
    model = torch.nn.Linear(8, 8)
    tp.start()
    for _ in range(plan.end + 3):
        model(torch.rand(2, 8)).sum()
        navdoctor.step()
    tp.stop()
    assert tp.trace_written and Path(tp.trace_path).exists()
    assert _steps_of(tp.trace_path) == [(k, "ProfilerStep")
                                        for k in range(plan.first_recorded, plan.end)]


def test_torch_pass_whole_marks_steps_from_mark_from(tmp_path, restore_profiler):
    plan = runner.RecordingPlan(wait=2, warmup=2, active=5)
    events, mark = 5, 3                 # fewer than the schedule needs: the whole-run pass
    tp = runner.TorchPass(str(tmp_path), plan, whole=True, mark_from=mark)
    source = runner.StepSource(tp.step)
    model = torch.nn.Linear(8, 8)
    tp.start()
    for _ in range(events):
        model(torch.rand(2, 8)).sum()
        source.event("optimizer")
    model(torch.rand(2, 8)).sum()       # after the last boundary, until the end of the run
    tp.stop()
    assert tp.trace_written
    # No ProfilerStep without a schedule: navdoctor.step#N ranges, the warm-up ones left out.
    assert _steps_of(tp.trace_path) == [(n, "navdoctor.step") for n in range(mark, events + 1)]


class FakeCuda:
    """What NvtxPass calls of torch.cuda, logged in order."""

    def __init__(self):
        self.log = []
        self.nvtx = SimpleNamespace(range_push=lambda name: self.log.append(("push", name)),
                                    range_pop=lambda: self.log.append(("pop",)))
        self.profiler = SimpleNamespace(start=lambda: self.log.append(("start",)),
                                        stop=lambda: self.log.append(("stop",)))

    def synchronize(self):
        self.log.append(("sync",))

    def is_available(self):
        return True


def _nvtx_run(plan, events, whole=False, mark_from=0, cuda=True):
    p = runner.NvtxPass(plan, whole=whole, mark_from=mark_from)
    fake = FakeCuda()
    p.torch = SimpleNamespace(cuda=fake)
    p.cuda = cuda
    p.start()
    for n in range(1, events + 1):
        p.step(n)
    p.stop()
    return p, fake.log


def _captured_steps(log):
    """The step numbers whose ranges were pushed while the capture range was open."""
    capturing, out = False, []
    for entry in log:
        if entry[0] == "start":
            capturing = True
        elif entry[0] == "stop":
            capturing = False
        elif entry[0] == "push" and capturing:
            out.append(int(entry[1].split("#")[1]))
    return out


@pytest.mark.parametrize("wait, warmup, active, loader", [
    (2, 2, 5, None), (1, 0, 3, None), (0, 2, 2, None), (4, 1, 1, None), (1, 1, 2, (4, 2)),
])
def test_nvtx_pass_captures_the_steps_the_torch_pass_records(wait, warmup, active, loader):
    plan = runner.RecordingPlan(wait, warmup, active)
    if loader:
        plan.see_loader(*loader)       # before the first step, as the first fetch does
    events = plan.end + 4
    p, log = _nvtx_run(plan, events)
    torch_plan = runner.RecordingPlan(plan.wait, plan.warmup, plan.active)
    recorded = [k for k in range(events + 1) if torch_plan.torch_action(k) in RECORDED and k >= 1]
    assert _captured_steps(log) == recorded
    assert [e for e in log if e[0] in ("start", "stop")] == [("start",), ("stop",)]
    # every capture edge is synchronised first, so no kernel straddles it
    for i, e in enumerate(log):
        if e[0] in ("start", "stop"):
            assert log[i - 1] == ("sync",)
    assert p.capture_opened and not p.capturing and plan.frozen
    pushes = [e[1] for e in log if e[0] == "push"]
    assert pushes == [f"navdoctor.step#{n}" for n in range(1, events + 1)]
    assert len([e for e in log if e[0] == "pop"]) == len(pushes)     # every range closed


def test_nvtx_pass_short_run_never_opens_the_capture():
    plan = runner.RecordingPlan(2, 2, 5)
    p, log = _nvtx_run(plan, plan.first_recorded - 1)
    assert not p.capture_opened and ("start",) not in log
    # opened at first_recorded but the run ends before the plan does: closed at stop()
    p, log = _nvtx_run(runner.RecordingPlan(2, 2, 5), 6)
    assert p.capture_opened and not p.capturing and log[-2:] == [("sync",), ("stop",)]


def test_nvtx_pass_whole_marks_from_mark_from_without_capture_range():
    plan = runner.RecordingPlan(2, 2, 5)
    p, log = _nvtx_run(plan, 6, whole=True, mark_from=3)
    assert [e[1] for e in log if e[0] == "push"] == [f"navdoctor.step#{n}" for n in range(3, 7)]
    assert not any(e[0] in ("start", "stop", "sync") for e in log)
    assert len([e for e in log if e[0] == "pop"]) == 4


def test_nvtx_pass_without_cuda_marks_but_never_captures():
    plan = runner.RecordingPlan(1, 1, 2)
    p, log = _nvtx_run(plan, 6, cuda=False)
    assert not p.capture_opened and not any(e[0] in ("start", "stop", "sync") for e in log)
    assert len([e for e in log if e[0] == "push"]) == 6


# --------------------------------------------------------------------------------------------
# 5. diagnose's whole-run reruns, with the pass runner replaced

class FakePasses:
    """Stands in for diagnose._run_pass: answers each pass from a list of handlers."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = []

    def __call__(self, mode, cmd, run_dir, env, log_name=None, stdout_to_stderr=False, echo=True):
        self.calls.append(SimpleNamespace(mode=mode, cmd=list(cmd), run_dir=Path(run_dir),
                                          log_name=log_name))
        assert self.answers, f"unexpected pass: {cmd}"
        return self.answers.pop(0)(Path(run_dir), list(cmd))


def torch_ok(steps=20, trace=True, **status):
    def answer(run_dir, cmd):
        st = {"steps": steps, "exit_code": 0, "error": None, "cuda": True,
              "plan": {"wait": 2, "warmup": 2, "active": 5, "loader": None}, **status}
        return PassResult("torch", st["exit_code"], st,
                          str(run_dir / "kineto.json.gz") if trace else None, "log")
    return answer


def nsys_answer(steps=20, opened=True, export=True, exit_code=0, error=None, interrupted=False,
                plan=None, **extra):
    def answer(run_dir, cmd):
        name = Path(cmd[cmd.index("-o") + 1]).name
        if export:
            (run_dir / f"{name}.sqlite").write_text("")
        st = {"steps": steps, "exit_code": exit_code, "error": error, "capture_opened": opened,
              "plan": plan or {"wait": 2, "warmup": 2, "active": 5}, **extra}
        return PassResult("nvtx", exit_code, st, None, "log", interrupted=interrupted)
    return answer


def _opt(cmd, name):
    return cmd[cmd.index(name) + 1] if name in cmd else None


@pytest.fixture
def run_collect(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    monkeypatch.setattr(diagnose, "find_nsys", lambda explicit: "/opt/fake/nsys")

    def run(fake, wait=2, warmup=2, active=5, use_nsys=True, timing=False):
        monkeypatch.setattr(diagnose, "_run_pass", fake)
        messages = []
        outcome = diagnose.collect(str(script), ["--lr", "3"], str(tmp_path / "runs"), wait, warmup,
                                   active, use_nsys, None, messages.append, timing=timing)
        return outcome, messages
    return run


def test_mark_from_leaves_warm_up_out_but_keeps_half_the_steps():
    for wait, warmup in ((2, 2), (8, 1), (0, 0), (1, 3)):
        for steps in range(0, 40):
            m = diagnose.mark_from(steps, wait, warmup)
            assert 1 <= m <= max(1, wait + warmup)
            if steps:
                assert steps - m + 1 >= steps / 2          # never fewer than half marked
            if steps >= 2 * (wait + warmup) and wait + warmup:
                assert m == wait + warmup                  # warm-up left out when there are spare


def test_short_run_reruns_both_passes_whole(run_collect):
    # The torch pass saw 11 steps but its plan (grown by a loader: wait 8) needed more, so it
    # wrote no trace: it runs again whole, and the nsys pass goes whole from the start.
    fake = FakePasses(
        torch_ok(steps=11, trace=False, plan={"wait": 8, "warmup": 1, "active": 6, "loader": {}}),
        torch_ok(steps=11),
        nsys_answer(opened=True))
    outcome, messages = run_collect(fake, wait=2, warmup=1)
    first, whole, nsys = fake.calls
    assert "--whole" not in first.cmd and _opt(first.cmd, "--wait") == "2"
    expected = diagnose.mark_from(11, 8, 1)
    assert expected == 5          # half of 11 steps, not the plan's 9 nor the options' 3
    assert "--whole" in whole.cmd and _opt(whole.cmd, "--mark-from") == str(expected)
    assert whole.log_name == "torch-pass-whole.log"
    assert whole.cmd[whole.cmd.index("--"):] == first.cmd[first.cmd.index("--"):]   # same script, args
    assert "--whole" in nsys.cmd and _opt(nsys.cmd, "--mark-from") == str(expected)
    assert "--capture-range=cudaProfilerApi" not in nsys.cmd
    assert [p.name for p in outcome.passes] == ["torch", "torch", "nvtx"]
    assert outcome.traces == [str(outcome.run_dir / "kineto.json.gz"),
                              str(outcome.run_dir / "nsys.sqlite")]
    assert any("profiled its whole run" in n and "from step 5" in n for n in outcome.notes)


def test_short_run_marks_from_the_step_numbers_the_collector_saw(run_collect):
    # An optimizer loop of 11 iterations made 12 step events (the fetch that opened the first
    # step is one): --mark-from counts in the collector's step numbers, the note in iterations.
    fake = FakePasses(
        torch_ok(steps=11, step_events=12, trace=False, plan={"wait": 8, "warmup": 1, "active": 6}),
        torch_ok(steps=11, step_events=12),
        nsys_answer(opened=True))
    outcome, _ = run_collect(fake, wait=2, warmup=1)
    _, whole, nsys = fake.calls
    assert _opt(whole.cmd, "--mark-from") == str(diagnose.mark_from(12, 8, 1)) == "6"
    assert _opt(nsys.cmd, "--mark-from") == "6"
    assert any("the script made 11 steps" in n for n in outcome.notes)


@pytest.mark.parametrize("status", [
    {"error": "RuntimeError: boom"},
    {"exit_code": 1},
])
def test_failed_short_run_is_not_rerun(run_collect, status):
    fake = FakePasses(torch_ok(steps=1, trace=False, **status), nsys_answer())
    outcome, _ = run_collect(fake)
    assert [c.mode for c in fake.calls] == ["torch", "nvtx"]
    assert not any("--whole" in c.cmd for c in fake.calls)


def test_missing_status_is_not_rerun(run_collect):
    def no_status(run_dir, cmd):      # the script ended with os._exit(0): no status-torch.json
        return PassResult("torch", 0, {}, None, "log")
    fake = FakePasses(no_status)
    outcome, _ = run_collect(fake, use_nsys=False)
    assert len(fake.calls) == 1 and outcome.traces == []


def test_interrupted_short_run_is_not_rerun(run_collect):
    def interrupted(run_dir, cmd):    # the script caught KeyboardInterrupt and exited 0
        st = {"steps": 1, "exit_code": 0, "error": None, "cuda": True,
              "plan": {"wait": 2, "warmup": 2, "active": 5}}
        return PassResult("torch", 0, st, None, "log", interrupted=True)
    fake = FakePasses(interrupted, torch_ok(), nsys_answer())    # what a buggy run would ask
    outcome, _ = run_collect(fake)
    assert [c.mode for c in fake.calls] == ["torch"] and outcome.interrupted


def test_nsys_capture_never_opened_reruns_nsys_whole(run_collect):
    fake = FakePasses(torch_ok(steps=20),
                      nsys_answer(steps=20, opened=False, export=False,
                                  plan={"wait": 5, "warmup": 2, "active": 5}),
                      nsys_answer(steps=20, opened=True))
    outcome, messages = run_collect(fake)
    _, scheduled, whole = fake.calls
    assert "--capture-range=cudaProfilerApi" in scheduled.cmd and "--whole" not in scheduled.cmd
    assert _opt(scheduled.cmd, "-o") == str(outcome.run_dir / "nsys")
    assert "--capture-range=cudaProfilerApi" not in whole.cmd
    # from the nsys pass's own plan (wait 5 + warm-up 2), not the options' 2 + 2
    assert _opt(whole.cmd, "--mark-from") == str(diagnose.mark_from(20, 5, 2)) == "7"
    assert _opt(whole.cmd, "-o") == str(outcome.run_dir / "nsys-whole")
    assert whole.log_name == "nsys-whole-pass.log"
    assert outcome.traces == [str(outcome.run_dir / "kineto.json.gz"),
                              str(outcome.run_dir / "nsys-whole.sqlite")]
    assert any("too few to open its capture range" in n for n in outcome.notes)


@pytest.mark.parametrize("answer", [
    nsys_answer(opened=True, export=False),                       # nsys failed to export
    nsys_answer(opened=False, export=False, exit_code=1),         # the script crashed
    nsys_answer(opened=False, export=False, error="ValueError: x"),
    nsys_answer(opened=False, export=False, interrupted=True),    # Ctrl-C
    nsys_answer(opened=None, export=False),                       # no status written
])
def test_nsys_pass_not_rerun_unless_cleanly_short(run_collect, answer):
    fake = FakePasses(torch_ok(), answer)
    outcome, messages = run_collect(fake)
    assert [c.mode for c in fake.calls] == ["torch", "nvtx"]
    assert outcome.traces == [str(outcome.run_dir / "kineto.json.gz")]
    assert not any("captured its whole run" in n for n in outcome.notes)


def test_whole_nsys_pass_is_not_rerun_again(run_collect):
    fake = FakePasses(torch_ok(steps=1, trace=False), torch_ok(steps=1),
                      nsys_answer(opened=False, export=False))
    outcome, _ = run_collect(fake)
    assert [c.mode for c in fake.calls] == ["torch", "torch", "nvtx"]
    assert any("produced no SQLite export" in n for n in outcome.notes)


def test_no_cuda_skips_nsys(run_collect):
    fake = FakePasses(torch_ok(cuda=False))
    outcome, _ = run_collect(fake)
    assert len(fake.calls) == 1
    assert any("no CUDA device" in n for n in outcome.notes)


# --------------------------------------------------------------------------------------------
# 6. Kineto traces with navdoctor.step#N annotations (the whole-run torch pass) are steps

BASE_US = 1_700_000_000_000.0


def _kineto(tmp_path, events, name="t.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def _x(cat, name, ts, dur, pid=1, tid=1, **args):
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": BASE_US + ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def _step_events(nums, length=1000.0, gpu_copy=True):
    events = []
    for i, n in enumerate(nums):
        t = i * length
        events.append(_x("user_annotation", f"navdoctor.step#{n}", t, length - 10))
        events.append(_x("cpu_op", "aten::mm", t + 100, 300))
        if gpu_copy:     # Kineto's GPU-side copy of a host annotation (later, on the GPU's
            # clock): neither a second step nor part of the host step's span
            events.append(_x("gpu_user_annotation", f"navdoctor.step#{n}", t + 200, length,
                             pid=0, tid=7))
    return events


def test_kineto_navdoctor_step_ranges_are_steps(tmp_path):
    nums = [3, 4, 5, 6]
    events = _step_events(nums) + [
        _x("user_annotation", "navdoctor.step#7b", 5000, 10),     # not a step name
        _x("user_annotation", "my navdoctor.step#8", 5100, 10),
    ]
    con = store.open_store()
    load_kineto(con, str(_kineto(tmp_path, events)), 1)
    rows = con.execute("SELECT step_num, start_ns, dur_ns, origin FROM steps "
                       "ORDER BY step_num").fetchall()
    base_ns = int(BASE_US * 1000)
    assert rows == [(n, base_ns + i * 1_000_000, 990_000, "navdoctor.step")
                    for i, n in enumerate(nums)]


def test_kineto_profiler_steps_win_over_navdoctor_steps(tmp_path):
    events = _step_events([1, 2, 3]) + [
        _x("user_annotation", f"ProfilerStep#{n}", 10_000 + n * 500, 400) for n in (7, 8)]
    con = store.open_store()
    load_kineto(con, str(_kineto(tmp_path, events)), 1)
    assert con.execute("SELECT step_num, origin FROM steps ORDER BY 1").fetchall() == [
        (7, "ProfilerStep"), (8, "ProfilerStep")]


def test_analysis_uses_navdoctor_steps_without_inferring(tmp_path):
    from navdoctor.analysis import analyze
    path = _kineto(tmp_path, _step_events(range(2, 8)))
    a = analyze([str(path)], [])
    assert a.verdict.steps == 6
    assert a.verdict.per_trace[0].step_origin == "navdoctor.step"
    assert not any("infer" in w for w in a.warnings)


def timing_answer(step_ms, exit_code=0, loader_wait_ms=None):
    def answer(run_dir, cmd):
        st = {"exit_code": exit_code, "error": None, "step_ms": step_ms, "clock": "cuda_events",
              "loader_wait_ms": loader_wait_ms}
        return PassResult("timing", exit_code, st, None, "log")
    return answer


def test_timing_pass_also_gives_the_loader_wait_of_the_same_steps(run_collect):
    """The GPU's wait for DataLoader batches (the runner's LoaderWait, per step) is summarised
    over the steps the unprofiled step keeps: the skipped steps and the stall are left out."""
    steps = [90.0] * 12 + [10.0, 11.0, 40.0, 12.0, 10.5] * 2
    waits = [50.0] * 12 + [1.0, 2.0, 30.0, 3.0, 2.0] * 2
    fake = FakePasses(torch_ok(), nsys_answer(plan={"wait": 9, "warmup": 3, "active": 6}),
                      timing_answer(steps, loader_wait_ms=waits),
                      timing_answer(steps, loader_wait_ms=waits))
    outcome, messages = run_collect(fake, timing=True)
    assert outcome.unprofiled_loader_wait_ms == pytest.approx(2.0)     # (1 + 2 + 3 + 2) / 4
    assert any("waiting 2.00 ms of it for DataLoader batches" in m for m in messages)
    fake = FakePasses(torch_ok(), nsys_answer(), timing_answer([9.0] * 20))    # no loader seen
    outcome, _ = run_collect(fake, timing=True)
    assert outcome.unprofiled_step_ms == 9.0 and outcome.unprofiled_loader_wait_ms is None
    assert [c.mode for c in fake.calls] == ["torch", "nvtx", "timing"]     # one run: no loader


def test_a_loader_fed_run_is_timed_twice_in_two_processes(run_collect):
    """Whether a loader on the loop's thread hides behind the GPU changes from one process to
    the next, so a run whose GPU waited on DataLoader batches is timed again in a fresh process:
    the step and the wait are the two runs' means, and both waits are kept for the verdict."""
    fake = FakePasses(torch_ok(), nsys_answer(),
                      timing_answer([20.0] * 20, loader_wait_ms=[0.0] * 20),
                      timing_answer([22.0] * 20, loader_wait_ms=[1.4] * 20))
    outcome, messages = run_collect(fake, timing=True)
    first, second = fake.calls[2:]
    assert (first.mode, second.mode) == ("timing", "timing2")
    assert _opt(second.cmd, "--status") == str(outcome.run_dir / "status-timing2.json")
    assert _opt(second.cmd, "--warmup") == _opt(first.cmd, "--warmup")
    assert _opt(second.cmd, "--steps") == _opt(first.cmd, "--steps")
    assert outcome.unprofiled_step_ms == pytest.approx(21.0)
    assert outcome.unprofiled_loader_wait_ms == pytest.approx(0.7)
    assert outcome.unprofiled_loader_waits_ms == pytest.approx([0.0, 1.4])
    assert any("two runs: 0.00 and 1.40 ms" in m for m in messages)
    # a second run that fails keeps the first run's figures, and says so
    fake = FakePasses(torch_ok(), nsys_answer(),
                      timing_answer([20.0] * 20, loader_wait_ms=[0.5] * 20),
                      timing_answer([22.0] * 2, exit_code=1))
    outcome, _ = run_collect(fake, timing=True)
    assert outcome.unprofiled_step_ms == 20.0 and outcome.unprofiled_loader_wait_ms == 0.5
    assert outcome.unprofiled_loader_waits_ms is None
    assert any("second run" in n and "the first run's figures are used" in n for n in outcome.notes)


class _HostClockEvent:
    """A stand-in CUDA event on a GPU that is always idle: it "runs" when recorded, so the
    time between two is the host time between their records."""
    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = time.perf_counter() * 1000

    def elapsed_time(self, other):
        return other.t - self.t


def test_loader_wait_times_each_fetch_in_a_training_loop(hooks, monkeypatch):
    """The real hooks on a real DataLoader (workers 0, ~6 ms a batch) and optimizer, with
    CUDA events standing in for a GPU that waits for every batch: LoaderWait.install() brackets
    each fetch, the first (before the optimizer became the step source) is left out, and each
    timed step gets the one fetch it made (~6 ms); a fetch before CUDA is in use records
    nothing."""
    from navdoctor.verify.runner import LoaderWait, StepClock

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            time.sleep(0.003)
            return torch.rand(4)

    cuda = SimpleNamespace(available=True, initialized=False)
    fake = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: cuda.available,
                                                is_initialized=lambda: cuda.initialized,
                                                Event=_HostClockEvent, synchronize=lambda: None))
    clock = StepClock(fake, warmup=0, steps=0)
    source, _module_steps, _ = hooks.install(on_step=clock.boundary)
    clock.source = source
    wait = LoaderWait(fake, clock)
    wait.install()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = iter(DataLoader(Slow(), batch_size=2))
    next(loader)                       # before CUDA is in use: nothing recorded
    assert wait.fetches == []
    cuda.initialized = True
    for x in loader:
        model(x).sum().backward()
        opt.step()
    step_ms, kind = clock.step_ms()
    waits = wait.per_step_ms(len(step_ms))
    assert kind == "cuda_events" and clock.mode == "optimizer" and len(step_ms) == 6
    assert len(waits) == 6 and all(5.0 <= w <= 40.0 for w in waits), waits
    assert all(w <= s for w, s in zip(waits, step_ms))


class _FakeEvent:
    def __init__(self, t):
        self.t = t

    def elapsed_time(self, other):
        return other.t - self.t


def test_loader_wait_sums_each_steps_fetches_of_the_final_step_source():
    """LoaderWait.per_step_ms: a fetch belongs to the step whose boundary came last before it
    returned; fetches before the first boundary, past the timed steps or of a step source that
    was later outranked are not counted; a step without a fetch waited 0."""
    from navdoctor.verify.runner import LoaderWait, StepClock
    clock = StepClock(None, warmup=0, steps=0)
    clock.mode, clock.wall = "explicit", [0.0, 1.0, 2.0, 3.0]
    wait = LoaderWait(None, clock)
    e = _FakeEvent
    wait.fetches = [("explicit", -1, e(0), e(5)),         # before the first boundary
                    ("dataloader", 0, e(0), e(7)),        # of the outranked source
                    ("explicit", 0, e(10), e(12.5)), ("explicit", 0, e(20), e(21)),
                    ("explicit", 2, e(30), e(30)),        # the GPU never waited
                    ("explicit", 3, e(40), e(49))]        # past the 3 timed steps
    assert wait.per_step_ms(3) == [3.5, 0.0, 0.0]
    wait.fetches = []
    assert wait.per_step_ms(3) is None


def test_timing_pass_times_the_recorded_steps_without_a_tracer(run_collect):
    """After the traced passes, pass 3 runs the script under verify's timing runner (no
    tracer), skipping the steps the last traced pass skipped (its plan: a loader's buffer
    grows them), and the mean of the steps after them, an isolated stall left out as the
    traced step leaves it out (3x the median), is the unprofiled step."""
    skipped = [90.0] * 12                        # start-up: left out
    fake = FakePasses(torch_ok(), nsys_answer(plan={"wait": 9, "warmup": 3, "active": 6}),
                      timing_answer(skipped + [10.0, 11.0, 40.0, 12.0, 10.5] * 2))
    outcome, messages = run_collect(fake, timing=True)
    timing = fake.calls[2]
    assert timing.mode == "timing" and timing.cmd[1:3] == ["-m", "navdoctor.verify.runner"]
    assert _opt(timing.cmd, "--remedy") == "none"
    assert _opt(timing.cmd, "--warmup") == "12" and _opt(timing.cmd, "--steps") == str(
        diagnose.TIMED_STEPS_AT_LEAST)
    assert _opt(timing.cmd, "--status") == str(outcome.run_dir / "status-timing.json")
    assert timing.cmd[timing.cmd.index("--") + 1:][1:] == ["--lr", "3"]   # the script's args
    assert [p.name for p in outcome.passes] == ["torch", "nvtx", "timing"]
    assert outcome.unprofiled_step_ms == pytest.approx(10.875)     # (10 + 11 + 12 + 10.5) / 4
    assert any("pass 3/3 done" in m for m in messages)


def test_timing_pass_after_a_whole_run_skips_what_it_did_not_mark(run_collect):
    """A short script profiled whole (its steps marked from mark_from on): pass 3 skips the
    steps before that and times the rest of the run, however few."""
    fake = FakePasses(torch_ok(steps=11, trace=False, plan={"wait": 8, "warmup": 1, "active": 6, "loader": {}}),
                      torch_ok(steps=11, whole=True, mark_from=5),
                      nsys_answer(opened=True, whole=True, mark_from=5),
                      timing_answer([80.0] * 4 + [20.0, 21.0, 19.0, 20.0, 20.0, 20.0, 20.0]))
    outcome, _ = run_collect(fake, wait=2, warmup=1, timing=True)
    timing = fake.calls[-1]
    assert _opt(timing.cmd, "--warmup") == "4" and _opt(timing.cmd, "--steps") == "0"
    assert outcome.unprofiled_step_ms == pytest.approx(20.0)


def test_timing_pass_uses_the_traced_pass_plan_when_nsys_left_none(run_collect):
    """nsys died before its status was written: pass 3 follows the torch pass's plan, not an
    empty one (which would time the cold first steps)."""
    def nsys_died(run_dir, cmd):
        return PassResult("nvtx", 1, {}, None, "log")
    fake = FakePasses(torch_ok(plan={"wait": 6, "warmup": 2, "active": 5, "loader": None}), nsys_died,
                      timing_answer([9.0] * 20))
    outcome, _ = run_collect(fake, timing=True)
    assert _opt(fake.calls[-1].cmd, "--warmup") == "8" and outcome.unprofiled_step_ms == 9.0


def test_interrupted_timing_pass_keeps_the_traces_and_says_so(run_collect):
    def interrupted(run_dir, cmd):
        return PassResult("timing", 130, {"exit_code": 130}, None, "log", interrupted=True)
    fake = FakePasses(torch_ok(), nsys_answer(), interrupted)
    outcome, _ = run_collect(fake, timing=True)
    assert outcome.interrupted and len(outcome.traces) == 2 and outcome.unprofiled_step_ms is None
    assert any("interrupted during the timing pass" in n for n in outcome.notes)


@pytest.mark.parametrize("answer", [timing_answer([], exit_code=1), timing_answer([5.0, 5.0, 5.0, 5.0, 5.0, 6.0])])
def test_timing_pass_that_times_too_little_leaves_the_cost_assumed(run_collect, answer):
    fake = FakePasses(torch_ok(), nsys_answer(), answer)
    outcome, _ = run_collect(fake, timing=True)
    assert outcome.unprofiled_step_ms is None
    assert any("timing pass" in n and "not measured" in n for n in outcome.notes)


def test_timing_pass_after_a_torch_profiler_trace_alone(run_collect):
    """Without an nsys trace (no nsys, or no export) the torch.profiler trace of a GPU run is
    the one corrected: pass 3 still times the steps (the torch pass's plan)."""
    fake = FakePasses(torch_ok(plan={"wait": 3, "warmup": 2, "active": 5, "loader": None}),
                      timing_answer([50.0] * 5 + [20.0] * 10))
    outcome, _ = run_collect(fake, use_nsys=False, timing=True)
    assert [c.mode for c in fake.calls] == ["torch", "timing"]
    assert _opt(fake.calls[1].cmd, "--warmup") == "5" and outcome.unprofiled_step_ms == 20.0
    fake = FakePasses(torch_ok(), nsys_answer(export=False, opened=True), timing_answer([9.0] * 14))
    outcome, _ = run_collect(fake, timing=True)
    assert [c.mode for c in fake.calls] == ["torch", "nvtx", "timing"] and outcome.unprofiled_step_ms == 9.0


def test_no_timing_pass_on_a_cpu_run_or_without_a_trace(run_collect):
    fake = FakePasses(torch_ok(cuda=False))
    outcome, _ = run_collect(fake, timing=True)
    assert [c.mode for c in fake.calls] == ["torch"] and outcome.unprofiled_step_ms is None
    fake = FakePasses(torch_ok(trace=False, steps=0, exit_code=1, error="boom"))
    outcome, _ = run_collect(fake, use_nsys=False, timing=True)
    assert [c.mode for c in fake.calls] == ["torch"]


def test_no_timing_pass_for_a_script_that_profiles_itself(run_collect):
    fake = FakePasses(torch_ok(user_profiler=True), nsys_answer())
    outcome, _ = run_collect(fake, timing=True)
    assert [c.mode for c in fake.calls] == ["torch", "nvtx"] and outcome.unprofiled_step_ms is None
    assert any("no timing pass" in n for n in outcome.notes)


def test_timing_pass_on_a_real_script(tmp_path):
    """The real command (no stand-in): a CPU script of up to 40 steps of ~20 ms marked by
    navdoctor.step(); pass 3 stops it once 2 + 2 skipped and 10 timed steps are seen."""
    script = tmp_path / "loop.py"
    script.write_text("import time, navdoctor\n"
                      "for i in range(40):\n"
                      "    time.sleep(0.02)\n"
                      "    navdoctor.step()\n"
                      "    print('step', i, flush=True)\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    outcome = diagnose.RunOutcome(run_dir)
    outcome.passes.append(PassResult("nvtx", 0, {"plan": {"wait": 2, "warmup": 2, "active": 5}},
                                     str(run_dir / "nsys.sqlite"), "log"))
    messages = []
    diagnose._timing_pass(outcome, script, [], run_dir, diagnose._child_env(), messages.append)
    status = json.loads((run_dir / "status-timing.json").read_text())
    assert status["stopped_early"] and status["exit_code"] == 0
    assert "step 39" not in (run_dir / "timing-pass.log").read_text()     # stopped, not run out
    assert 19.0 <= outcome.unprofiled_step_ms <= 40.0, outcome.unprofiled_step_ms
