"""Runs a user's script as `python SCRIPT ARGS` would, inside one collector pass.

    python -m navdoctor.collect.runner --mode torch --out DIR [--wait 2 --warmup 2 --active 5] -- SCRIPT ARGS
    python -m navdoctor.collect.runner --mode nvtx  --out DIR [...] -- SCRIPT ARGS

mode torch: torch.profiler with a wait/warmup/active schedule, CPU (+CUDA) activities,
    shapes, memory and stacks; the trace goes to DIR/kineto.json.gz.
mode nvtx:  for the Nsight Systems pass: an NVTX range per step (navdoctor.step#N) and per
    DataLoader fetch, and cudaProfilerStart/Stop around the same steps the torch pass records.
Steps advance without changes to the script: on each DataLoader batch, or on each optimizer
step once the script has one; a script may call navdoctor.step() instead, which then wins.
DIR/status-<mode>.json says what happened (steps seen, how, whether a trace was written).
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
import traceback

import navdoctor
from navdoctor import LOOP_END_MARK


class StepSource:
    """Decides which events advance the step: explicit > optimizer > dataloader > module.

    `module` is the fallback for loops that have none of the others (a per-frame inference
    loop with its own frame reader): a step is one call of the outermost model, from the start
    of one call to the start of the next, so the frame's pre- and post-processing and waiting
    belong to it (see ModuleSteps)."""
    PRIORITY = {"module": -1, "dataloader": 0, "optimizer": 1, "explicit": 2}

    def __init__(self, on_step):
        self.on_step = on_step
        self.pid = os.getpid()
        self.mode: str | None = None
        self.steps = 0
        self.on_mode_change = None  # called with the new mode when a higher source takes over
        # A DataLoader that runs out (its __next__ raises StopIteration) ends a loop: the step
        # its last fetch opened (or the one after the last optimizer step) is the code after
        # the loop, not an iteration. on_loop_end marks it in the trace (the analysis leaves
        # such a step out: breakdown.drop_loop_tails); fetches_past_end counts the step events
        # such fetches made (DataLoader steps only: they are no iterations).
        self.on_loop_end = None
        self.fetches_past_end = 0
        # boundaries since the current source took over: a lower source's earlier events
        # (the fetch that opened the first optimizer step, a model call before a DataLoader)
        # are no iterations of the loop the current one counts
        self.mode_events = 0

    @property
    def iterations(self) -> int:
        """The loop's iterations by the current source: its events, less the fetches that
        found the DataLoader exhausted (they opened no iteration)."""
        return self.mode_events - self.fetches_past_end

    def loop_end(self) -> None:
        if os.getpid() != self.pid or self.mode not in ("dataloader", "optimizer"):
            return
        if self.mode == "dataloader":
            self.fetches_past_end += 1
        if self.on_loop_end is not None:
            self.on_loop_end()

    def event(self, source: str) -> None:
        # A DataLoader fetch opens a step, an optimizer step or navdoctor.step() closes one;
        # either way each accepted event is one boundary. Lower-priority sources are ignored
        # once a higher one has been seen. A forked DataLoader worker inherits the hooks; its
        # events (transforms are nn.Modules) are not the run's steps, and acting on them would
        # touch CUDA in the child ("Cannot re-initialize CUDA in forked subprocess").
        if os.getpid() != self.pid:
            return
        if self.mode is not None and self.PRIORITY[source] < self.PRIORITY[self.mode]:
            return
        if source != self.mode:
            self.mode = source
            self.mode_events = self.fetches_past_end = 0
            if self.on_mode_change is not None:
                self.on_mode_change(source)
        self.steps += 1
        self.mode_events += 1
        self.on_step(self.steps)


class ModuleSteps:
    """Step boundaries at the calls of the outermost model, for loops without a DataLoader,
    an optimizer or navdoctor.step().

    Global forward hooks see every nn.Module call while no anchor is chosen; a call made while
    no other module call is open on that thread is an outermost call. The anchor is the first
    module to be called outermost a second time: with several models per frame (a segmenter
    then a detector) that is the first of them, so there is one step per frame, not per model;
    a model built or called once before the loop never becomes the anchor. Once chosen, the
    global hooks are removed (they would slow every module call of the run) and a pre-hook on
    the anchor alone marks the steps. A higher step source (a DataLoader, an optimizer) makes
    them all go away.
    """

    def __init__(self, source: StepSource):
        import threading
        import torch
        self.source = source
        self.torch = torch
        self.depth = threading.local()
        import weakref
        self.calls: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self.nested: "weakref.WeakSet" = weakref.WeakSet()
        self.anchor = None
        self.anchor_name: str | None = None
        self.handles: list = []
        self._anchor_handle = None
        from torch.nn.modules import module as nn_module
        self.handles.append(nn_module.register_module_forward_pre_hook(self._pre))
        try:
            self.handles.append(nn_module.register_module_forward_hook(self._post, always_call=True))
        except TypeError:  # torch < 2.0: no always_call (an exception in forward leaks a level)
            self.handles.append(nn_module.register_module_forward_hook(self._post))
        source.on_mode_change = self._mode_changed

    def _pre(self, module, args):
        if os.getpid() != self.source.pid:   # a forked DataLoader worker: not the run's calls
            return
        d = getattr(self.depth, "n", 0)
        self.depth.n = d + 1
        if self.anchor is not None:
            return
        if d == 0:
            self.depth.outermost = module
            # Keyed by the module itself (weakly), not id(): a transform built per frame is
            # freed and the next one often gets the same id, which looked like a second call.
            n = self.calls.get(module, 0) + 1
            self.calls[module] = n
            if n == 2 and module not in self.nested:
                self._choose(module)
        elif module is not getattr(self.depth, "outermost", None):
            # Called inside another model too (a shared backbone): its own calls are not frames.
            self.nested.add(module)

    def _post(self, module, args, output):
        self.depth.n = max(0, getattr(self.depth, "n", 1) - 1)

    def _choose(self, module) -> None:
        self.anchor = module
        self.anchor_name = type(module).__name__
        self.remove_global()
        depth = self.depth
        source = self.source

        def anchor_call(mod, args):
            # The anchor may also be called inside another module (rare): only its outermost
            # calls are frames. Depth is no longer tracked globally, so count its own nesting.
            if getattr(depth, "anchor_open", 0) == 0:
                source.event("module")
            depth.anchor_open = getattr(depth, "anchor_open", 0) + 1

        def anchor_done(mod, args, output):
            depth.anchor_open = max(0, getattr(depth, "anchor_open", 1) - 1)

        self.depth.anchor_open = 1   # we are inside the anchor's second call right now
        self._anchor_handle = [module.register_forward_pre_hook(anchor_call)]
        try:
            self._anchor_handle.append(module.register_forward_hook(anchor_done, always_call=True))
        except TypeError:
            self._anchor_handle.append(module.register_forward_hook(anchor_done))
        source.event("module")      # this (second) call opens the first frame step

    def remove_global(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def _mode_changed(self, mode: str) -> None:
        if mode != "module":
            self.remove()

    def remove(self) -> None:
        self.remove_global()
        for h in self._anchor_handle or []:
            h.remove()
        self._anchor_handle = None


class RecordingPlan:
    """Which steps are skipped, warmed up and recorded, decided as the run goes and then
    frozen when the first step past `wait` begins (torch's schedule asks step by step).

    A DataLoader with workers hands out `num_workers x prefetch_factor` batches from its
    buffer before its steady state shows: recording starts after them (plus warm-up). Its
    workers deliver in turn, so a data stall recurs with a period of up to num_workers steps:
    at least LOADER_PERIODS such periods are recorded (up to MAX_ACTIVE steps), so that a
    recurring stall shows more than once and is not taken for an isolated one.
    """
    LOADER_PERIODS = 3
    MAX_ACTIVE = 48

    def __init__(self, wait: int, warmup: int, active: int):
        self.wait, self.warmup, self.active = wait, warmup, active
        self.frozen = False
        self.loader: dict | None = None

    def see_loader(self, num_workers: int, prefetch_factor: int | None) -> None:
        if self.frozen or self.loader is not None:
            return
        workers = max(0, int(num_workers or 0))
        buffered = workers * int(prefetch_factor or 2) if workers else 0
        self.loader = {"num_workers": workers, "prefetch_factor": prefetch_factor,
                       "buffered_batches": buffered}
        self.wait = max(self.wait, buffered)
        self.active = max(self.active, min(self.MAX_ACTIVE, self.LOADER_PERIODS * workers))

    @property
    def first_recorded(self) -> int:
        return self.wait + self.warmup

    @property
    def end(self) -> int:
        """The step number after the last recorded one."""
        return self.wait + self.warmup + self.active

    def torch_action(self, step: int):
        from torch.profiler import ProfilerAction
        if step < self.wait:
            return ProfilerAction.NONE
        self.frozen = True
        if step < self.first_recorded:
            return ProfilerAction.WARMUP
        if step < self.end - 1:
            return ProfilerAction.RECORD
        if step == self.end - 1:
            return ProfilerAction.RECORD_AND_SAVE
        return ProfilerAction.NONE

    def summary(self) -> dict:
        return {"wait": self.wait, "warmup": self.warmup, "active": self.active,
                "loader": self.loader}


# The plan of the pass running in this process (read by verify's profile mode).
current_plan: RecordingPlan | None = None


def _patch_step_sources(source: StepSource, plan: RecordingPlan | None = None) -> ModuleSteps:
    import torch
    from torch.utils.data import dataloader as dl

    original_next = dl._BaseDataLoaderIter.__next__

    def next_with_step(self):
        if plan is not None:
            plan.see_loader(getattr(self, "_num_workers", 0), getattr(self, "_prefetch_factor", None))
        source.event("dataloader")
        try:
            return original_next(self)
        except StopIteration:
            source.loop_end()
            raise

    dl._BaseDataLoaderIter.__next__ = next_with_step
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        register_optimizer_step_post_hook(lambda opt, args, kwargs: source.event("optimizer"))
    except ImportError:  # torch < 2.0 has no global optimizer hook
        pass
    navdoctor._step_hook = lambda: source.event("explicit")
    del torch
    return ModuleSteps(source)


class TorchPass:
    def __init__(self, out: str, plan: RecordingPlan, whole: bool, mark_from: int = 0):
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule
        self.torch = torch
        self.out = out
        self.trace_path = os.path.join(out, "kineto.json.gz")
        self.trace_written = False
        self.user_profiler = False
        activities = [ProfilerActivity.CPU]
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            activities.append(ProfilerActivity.CUDA)
        kwargs = dict(activities=activities, record_shapes=True, profile_memory=True,
                      with_stack=True, on_trace_ready=self._export)
        if not whole:
            kwargs["schedule"] = plan.torch_action
        self.whole = whole
        self.plan = plan
        # Without a schedule torch writes no ProfilerStep#N: the steps are marked as
        # navdoctor.step#N ranges instead, from step mark_from on (the ones before are warm-up).
        self.mark_from = mark_from
        self._range = None
        self.prof = profile(**kwargs)
        self._own = self.prof
        self._watch_user_profilers(profile)

    def _export(self, prof) -> None:
        prof.export_chrome_trace(self.trace_path)
        self.trace_written = True

    def _watch_user_profilers(self, profile_cls) -> None:
        """CUPTI takes one subscriber: if the script starts its own torch.profiler, ours
        steps aside and the script's trace is also saved as ours."""
        original_start = profile_cls.start
        runner = self

        def start(prof_self):
            if prof_self is not runner._own and not runner.user_profiler:
                runner.user_profiler = True
                runner._stop_own(export=False)
                user_ready = prof_self.on_trace_ready

                def ready(p):
                    runner._export(p)
                    if user_ready is not None:
                        user_ready(p)
                prof_self.on_trace_ready = ready
            return original_start(prof_self)

        profile_cls.start = start

    def start(self) -> None:
        self.prof.start()

    def step(self, n: int) -> None:
        if self.user_profiler:
            return
        if not self.whole:
            self.prof.step()
            return
        self._close_range()
        if n >= max(1, self.mark_from):
            self._range = self.torch.autograd.profiler.record_function(f"navdoctor.step#{n}")
            self._range.__enter__()

    def loop_end(self) -> None:
        """Mark where a DataLoader ran out (LOOP_END_MARK), inside the step it opened."""
        if self.user_profiler:
            return
        with self.torch.autograd.profiler.record_function(LOOP_END_MARK):
            pass

    def _close_range(self) -> None:
        if self._range is not None:
            rng, self._range = self._range, None
            try:
                rng.__exit__(None, None, None)
            except Exception:
                pass

    def _stop_own(self, export: bool) -> None:
        if self._own is None:
            return
        own, self._own = self._own, None
        if not export:
            own.on_trace_ready = None
        try:
            own.stop()
        except Exception:
            pass

    def stop(self) -> None:
        self._close_range()
        self._stop_own(export=True)


class NvtxPass:
    """Marks steps with NVTX and limits the nsys capture (cudaProfilerApi) to the steps the
    torch pass records (the same RecordingPlan, fed by the same DataLoader): its wait and
    warm-up steps are skipped, its active steps captured. whole: nsys captures the whole run
    (no capture range), and steps from mark_from on are marked."""

    def __init__(self, plan: RecordingPlan, whole: bool = False, mark_from: int = 0):
        import torch
        self.torch = torch
        self.plan = plan
        self.whole = whole
        self.mark_from = mark_from
        self.capturing = False
        self.capture_opened = False
        self.open_range = False
        self.cuda = torch.cuda.is_available()

    def start(self) -> None:
        pass

    def step(self, n: int) -> None:
        # Step events are numbered from 1; torch's schedule records its steps first_recorded ..
        # end-1 counted from 0 (start-up), i.e. from event first_recorded to event end.
        nvtx = self.torch.cuda.nvtx
        if self.open_range:
            nvtx.range_pop()
            self.open_range = False
        if not self.whole:
            if n >= self.plan.wait:
                self.plan.frozen = True
            if n == max(1, self.plan.first_recorded) and self.cuda and not self.capture_opened:
                self.torch.cuda.synchronize()
                self.torch.cuda.profiler.start()
                self.capturing = self.capture_opened = True
            if n == self.plan.end and self.capturing:
                self.torch.cuda.synchronize()
                self.torch.cuda.profiler.stop()
                self.capturing = False
        elif n < max(1, self.mark_from):
            return
        nvtx.range_push(f"navdoctor.step#{n}")
        self.open_range = True

    def loop_end(self) -> None:
        """Mark where a DataLoader ran out (LOOP_END_MARK), inside the step it opened."""
        self.torch.cuda.nvtx.range_push(LOOP_END_MARK)
        self.torch.cuda.nvtx.range_pop()

    def stop(self) -> None:
        nvtx = self.torch.cuda.nvtx
        if self.open_range:
            nvtx.range_pop()
            self.open_range = False
        if self.capturing:
            self.torch.cuda.synchronize()
            self.torch.cuda.profiler.stop()
            self.capturing = False


def _patch_dataloader_nvtx() -> None:
    import torch
    from torch.utils.data import dataloader as dl
    patched_next = dl._BaseDataLoaderIter.__next__

    def next_in_range(self):
        torch.cuda.nvtx.range_push("navdoctor.dataloader_next")
        try:
            return patched_next(self)
        finally:
            torch.cuda.nvtx.range_pop()

    dl._BaseDataLoaderIter.__next__ = next_in_range


def set_up_as_main(script: str, script_args: list[str]) -> None:
    """Exactly what `python SCRIPT ARGS` sets up before runpy runs the script."""
    sys.argv = [script, *script_args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))


def exit_code_of(e: SystemExit) -> int:
    """The exit status Python gives sys.exit(code); a non-int code is printed, as Python does."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("navdoctor runner: usage: ... -- SCRIPT [ARGS]", file=sys.stderr)
        return 2
    split = argv.index("--")
    p = argparse.ArgumentParser(prog="navdoctor.collect.runner")
    p.add_argument("--mode", choices=["torch", "nvtx"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--wait", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--active", type=int, default=5)
    p.add_argument("--whole", action="store_true", help="no schedule: profile the whole run")
    p.add_argument("--mark-from", type=int, default=0,
                   help="with --whole: mark steps from this step event on (earlier ones are warm-up)")
    opts = p.parse_args(argv[:split])
    script, script_args = argv[split + 1], argv[split + 2:]

    status = {"mode": opts.mode, "script": script, "steps": 0, "step_source": None,
              "exit_code": None, "error": None, "trace": None, "user_profiler": False,
              "cuda": None, "whole": opts.whole, "mark_from": opts.mark_from}
    t0 = time.time()
    global current_plan
    plan = current_plan = RecordingPlan(opts.wait, opts.warmup, opts.active)
    if opts.mode == "torch":
        collector = TorchPass(opts.out, plan, opts.whole, opts.mark_from)
    else:
        collector = NvtxPass(plan, opts.whole, opts.mark_from)
        _patch_dataloader_nvtx()
    source = StepSource(lambda n: _step(collector, n))
    source.on_loop_end = collector.loop_end
    module_steps = _patch_step_sources(source, plan)
    status["cuda"] = collector.cuda

    set_up_as_main(script, script_args)
    exit_code = 0
    collector.start()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        exit_code = exit_code_of(e)
    except KeyboardInterrupt:
        exit_code = 130
        status["error"] = "interrupted"
    except BaseException as e:  # the script's own crash: report it as Python would
        traceback.print_exc()
        exit_code = 1
        status["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:500]
    finally:
        try:
            collector.stop()
        except Exception as e:  # never hide the script's own outcome behind ours
            status["error"] = status["error"] or f"profiler stop failed: {e}"
        navdoctor._step_hook = None
        module_steps.remove()
    # steps: the loop's iterations (what the user is told); step_events: the step numbers the
    # collector saw, in which the schedule and --mark-from count
    status.update(steps=source.iterations, step_events=source.steps, step_source=source.mode, exit_code=exit_code,
                  seconds=round(time.time() - t0, 3), plan=plan.summary(),
                  step_module=module_steps.anchor_name if source.mode == "module" else None)
    if opts.mode == "nvtx":
        status["capture_opened"] = collector.capture_opened or opts.whole
    if opts.mode == "torch":
        status["trace"] = collector.trace_path if collector.trace_written else None
        status["user_profiler"] = collector.user_profiler
    tmp = os.path.join(opts.out, f".status-{opts.mode}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(status, f, indent=2)
    os.replace(tmp, os.path.join(opts.out, f"status-{opts.mode}.json"))
    sys.stdout.flush()
    sys.stderr.flush()
    return exit_code


def _step(collector, n: int) -> None:
    collector.step(n)


if __name__ == "__main__":
    sys.exit(main())
