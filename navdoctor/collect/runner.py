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


class StepSource:
    """Decides which events advance the step: explicit > optimizer > dataloader."""
    PRIORITY = {"dataloader": 0, "optimizer": 1, "explicit": 2}

    def __init__(self, on_step):
        self.on_step = on_step
        self.mode: str | None = None
        self.steps = 0

    def event(self, source: str) -> None:
        # A DataLoader fetch opens a step, an optimizer step or navdoctor.step() closes one;
        # either way each accepted event is one boundary. Lower-priority sources are ignored
        # once a higher one has been seen.
        if self.mode is not None and self.PRIORITY[source] < self.PRIORITY[self.mode]:
            return
        self.mode = source
        self.steps += 1
        self.on_step(self.steps)


def _patch_step_sources(source: StepSource) -> None:
    import torch
    from torch.utils.data import dataloader as dl

    original_next = dl._BaseDataLoaderIter.__next__

    def next_with_step(self):
        source.event("dataloader")
        return original_next(self)

    dl._BaseDataLoaderIter.__next__ = next_with_step
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        register_optimizer_step_post_hook(lambda opt, args, kwargs: source.event("optimizer"))
    except ImportError:  # torch < 2.0 has no global optimizer hook
        pass
    navdoctor._step_hook = lambda: source.event("explicit")
    del torch


class TorchPass:
    def __init__(self, out: str, wait: int, warmup: int, active: int, whole: bool):
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
            kwargs["schedule"] = schedule(wait=wait, warmup=warmup, active=active, repeat=1)
        self.whole = whole
        self.prof = profile(**kwargs)
        self.active_steps = active
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
        if not self.user_profiler and not self.whole:
            self.prof.step()

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
        self._stop_own(export=True)


class NvtxPass:
    """Marks steps with NVTX and limits the nsys capture (cudaProfilerApi) to the steps the
    torch pass records: wait + warmup steps are skipped, `active` steps are captured."""

    def __init__(self, wait: int, warmup: int, active: int):
        import torch
        self.torch = torch
        # Step events are numbered from 1; torch's schedule records steps wait+warmup ..
        # wait+warmup+active-1 counted from 0 (start-up), i.e. after events wait+warmup...
        self.first = max(1, wait + warmup)
        self.last = self.first + active - 1
        self.capturing = False
        self.open_range = False
        self.cuda = torch.cuda.is_available()

    def start(self) -> None:
        pass

    def step(self, n: int) -> None:
        nvtx = self.torch.cuda.nvtx
        if self.open_range:
            nvtx.range_pop()
            self.open_range = False
        if n == self.first and self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.profiler.start()
            self.capturing = True
        if n == self.last + 1 and self.capturing:
            self.torch.cuda.synchronize()
            self.torch.cuda.profiler.stop()
            self.capturing = False
        nvtx.range_push(f"navdoctor.step#{n}")
        self.open_range = True

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
    opts = p.parse_args(argv[:split])
    script, script_args = argv[split + 1], argv[split + 2:]

    status = {"mode": opts.mode, "script": script, "steps": 0, "step_source": None,
              "exit_code": None, "error": None, "trace": None, "user_profiler": False,
              "cuda": None, "whole": opts.whole}
    t0 = time.time()
    if opts.mode == "torch":
        collector = TorchPass(opts.out, opts.wait, opts.warmup, opts.active, opts.whole)
    else:
        collector = NvtxPass(opts.wait, opts.warmup, opts.active)
        _patch_dataloader_nvtx()
    source = StepSource(lambda n: _step(collector, n))
    _patch_step_sources(source)
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
    status.update(steps=source.steps, step_source=source.mode, exit_code=exit_code,
                  seconds=round(time.time() - t0, 3))
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
