"""The child process of `navdoctor verify`: apply remedies, run the script, time its steps.

    python -m navdoctor.verify.runner --remedy ID[+ID...]|none --status PATH
        [--warmup 3 --steps 20] -- SCRIPT ARGS
    python -m navdoctor.verify.runner --remedy ... --profile DIR [--wait 2 --warmup 2 --active 5]
        -- SCRIPT ARGS

Timing mode: the remedies are patched in (navdoctor.verify.remedies.Patches), then the script
runs as `python SCRIPT ARGS` would (runpy, as navdoctor.collect.runner does). Step boundaries
come from navdoctor.collect.runner.StepSource (DataLoader batches, optimizer steps, or
navdoctor.step(), whichever ranks highest once seen). At each boundary the wall clock is
read and, once CUDA is in use, a CUDA event is recorded: no synchronize inside the loop, the
events are read once at the end. Only boundaries of the final step source count. Each
DataLoader fetch is bracketed by two more events (LoaderWait): the GPU time between them is how
long the GPU sat idle waiting for that batch, with no tracer slowing the loader. After
warmup + steps steps the run is stopped (SystemExit at the boundary), so long training scripts
cost only what is timed.

Profile mode: the same patches, then navdoctor.collect.runner's torch pass, so the
diagnosis of the patched script can be compared with the baseline's.
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
from navdoctor.collect.runner import exit_code_of, set_up_as_main


class StopRun(SystemExit):
    """Raised at a step boundary once enough steps are timed; ends the script like exit(0)."""

    def __init__(self):
        super().__init__(0)


class StepClock:
    def __init__(self, torch, warmup: int, steps: int, on_step=None):
        self.torch = torch
        self.limit = warmup + steps + 1 if steps > 0 else None     # boundaries of one source
        self.on_step = on_step
        self.mode: str | None = None
        self.wall: list[float] = []
        self.events: list = []
        self.switches = 0
        self.stopped = False
        self.source = None

    def boundary(self, n: int) -> None:
        mode = self.source.mode
        if mode != self.mode:           # a higher-ranking source took over: start again
            self.mode = mode
            self.wall, self.events = [], []
            self.switches += 1
        if self.on_step is not None:
            self.on_step()
        torch = self.torch
        event = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self.events.append(event)
        self.wall.append(time.perf_counter())
        if self.limit is not None and len(self.wall) >= self.limit:
            self.stopped = True
            raise StopRun()

    def step_ms(self) -> tuple[list[float], str]:
        """Per-step times of the final source; CUDA event times where both ends have one."""
        torch = self.torch
        if any(e is not None for e in self.events):
            torch.cuda.synchronize()
        out, clock = [], "wall"
        for i in range(1, len(self.wall)):
            a, b = self.events[i - 1], self.events[i]
            if a is not None and b is not None:
                out.append(a.elapsed_time(b))
                clock = "cuda_events"
            else:
                out.append((self.wall[i] - self.wall[i - 1]) * 1000)
        return [round(x, 4) for x in out], clock


class LoaderWait:
    """How long the GPU waits for each DataLoader batch, timed without a tracer.

    An event recorded as the fetch starts runs on the GPU once the work queued before it is
    done; one recorded as the fetch returns runs when the GPU reaches it. The GPU time between
    the two is therefore the part of the fetch the GPU spent idle: none when the queued work
    outlasted the fetch (the loading hid behind the GPU), all of it when the queue was empty.
    That is the data-wait the traces show, measured on a run whose loader no tracer slows."""

    def __init__(self, torch, clock: StepClock):
        self.torch = torch
        self.clock = clock
        self.pid = os.getpid()
        self.fetches: list[tuple[str | None, int, object, object]] = []  # (source, step, start, end)

    def install(self) -> None:
        from torch.utils.data import dataloader as dl
        inner = dl._BaseDataLoaderIter.__next__
        torch, clock = self.torch, self.clock

        def next_timed(it):
            # a forked worker inherits the patch and must not touch CUDA
            if os.getpid() != self.pid or not (torch.cuda.is_available() and torch.cuda.is_initialized()):
                return inner(it)
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            batch = inner(it)       # the step boundary (and StopRun) happen in here
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.fetches.append((clock.mode, len(clock.wall) - 1, start, end))
            return batch

        dl._BaseDataLoaderIter.__next__ = next_timed

    def per_step_ms(self, steps: int) -> list[float] | None:
        """The GPU's wait for batches in each of the first `steps` timed steps (0 in a step
        without a fetch); None when no fetch was timed in them. Call after step_ms()
        (which synchronizes)."""
        waits = [0.0] * steps
        seen = False
        for mode, step, start, end in self.fetches:
            if mode == self.clock.mode and 0 <= step < steps:
                waits[step] += start.elapsed_time(end)
                seen = True
        return [round(w, 4) for w in waits] if seen else None


def _run_script(script: str, script_args: list[str]) -> tuple[int, str | None]:
    set_up_as_main(script, script_args)
    try:
        runpy.run_path(script, run_name="__main__")
    except StopRun:
        return 0, None
    except SystemExit as e:
        return exit_code_of(e), None
    except KeyboardInterrupt:
        return 130, "interrupted"
    except BaseException as e:  # the script's crash, or a remedy that broke it
        traceback.print_exc()
        return 1, f"{type(e).__name__}: {e}".strip().splitlines()[0][:500]
    return 0, None


def _write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("navdoctor verify runner: usage: ... -- SCRIPT [ARGS]", file=sys.stderr)
        return 2
    split = argv.index("--")
    p = argparse.ArgumentParser(prog="navdoctor.verify.runner")
    p.add_argument("--remedy", default="none", help="ID[+ID...] or none")
    p.add_argument("--status", help="timing mode: write the status JSON here")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20, help="timed steps, then stop (0: run to the end)")
    p.add_argument("--profile", metavar="DIR", help="profile mode: torch.profiler pass into DIR")
    p.add_argument("--wait", type=int, default=2)
    p.add_argument("--active", type=int, default=5)
    p.add_argument("--whole", action="store_true")
    opts = p.parse_args(argv[:split])
    script, script_args = argv[split + 1], argv[split + 2:]
    ids = tuple(r for r in opts.remedy.split("+") if r and r != "none")

    from .remedies import Patches
    import torch
    patches = Patches(ids)
    patches.install()

    if opts.profile:
        return _profile(opts, patches, script, script_args)

    from ..collect.runner import StepSource, _patch_step_sources
    clock = StepClock(torch, opts.warmup, opts.steps, on_step=patches.on_step)
    source = StepSource(clock.boundary)
    clock.source = source
    _patch_step_sources(source)
    loader = LoaderWait(torch, clock)
    loader.install()

    t0 = time.perf_counter()
    exit_code, error = _run_script(script, script_args)
    seconds = time.perf_counter() - t0
    navdoctor._step_hook = None
    patches.after_run()
    loader_wait_ms = None
    try:
        step_ms, clock_kind = clock.step_ms()
    except Exception as e:  # a CUDA error after the script: keep its outcome
        step_ms, clock_kind = [], "wall"
        error = error or f"reading step times failed: {e}"
    if clock_kind == "cuda_events":
        try:    # (a failure here costs the loader wait only, not the step times)
            loader_wait_ms = loader.per_step_ms(len(step_ms))
        except Exception:
            loader_wait_ms = None
    status = {"remedies": list(ids), "script": script, "exit_code": exit_code, "error": error,
              "stopped_early": clock.stopped, "step_source": clock.mode, "source_switches": clock.switches,
              "steps_seen": source.steps, "step_ms": step_ms, "clock": clock_kind,
              "loader_wait_ms": loader_wait_ms,
              "seconds": round(seconds, 4), "cuda": bool(torch.cuda.is_available()),
              "torch": torch.__version__, "pid": os.getpid(),
              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              **patches.summary()}
    if opts.status:
        _write_json(opts.status, status)
    sys.stdout.flush()
    sys.stderr.flush()
    return exit_code


def _profile(opts, patches, script: str, script_args: list[str]) -> int:
    """navdoctor.collect.runner's torch pass over the patched script, stopped once its trace
    is written (a few steps after the recorded ones)."""
    from ..collect import runner as collect_runner
    original_event = collect_runner.StepSource.event

    def limit() -> int:
        # The recording plan grows with a DataLoader's workers (their buffered batches are
        # skipped), so the stop follows the plan the run made, not the options alone.
        plan = collect_runner.current_plan
        return (plan.end if plan else opts.wait + opts.warmup + opts.active) + 2

    def event(source, kind):
        before = source.steps
        original_event(source, kind)
        if source.steps != before:
            patches.on_step()
            if not opts.whole and source.steps >= limit():
                raise StopRun()

    collect_runner.StepSource.event = event
    args = ["--mode", "torch", "--out", opts.profile, "--wait", str(opts.wait),
            "--warmup", str(opts.warmup), "--active", str(opts.active)]
    if opts.whole:
        args.append("--whole")
    code = collect_runner.main(args + ["--", script, *script_args])
    patches.after_run()
    _write_json(os.path.join(opts.profile, "verify-patches.json"), patches.summary())
    return code


if __name__ == "__main__":
    sys.exit(main())
