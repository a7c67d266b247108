"""`navdoctor diagnose`: run a script under torch.profiler, then under Nsight Systems, and
analyse both traces exactly as `navdoctor analyze` would.

Two runs, because CUPTI takes one subscriber at a time; where a GPU run was traced, a
third, short one times the same steps without any tracer (navdoctor.verify.runner's
timing mode: CUDA events at the step boundaries, stopped once they are timed), so that the
tracers' cost (per CUDA call) is measured on this machine instead of assumed (docs/verdict.md,
"Tracer cost"). Everything lands in a new run directory that never replaces an earlier one.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import NavdoctorError

BUNDLED_WORKLOAD = Path(__file__).resolve().parent.parent / "workloads" / "navigation.py"
PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent.parent)

NSYS_OPTIONS = [
    "-t", "cuda,nvtx,osrt",
    # The seed article's CUDA memory options.
    "--cuda-memory-usage=true", "--cuda-um-cpu-page-faults=true", "--cuda-um-gpu-page-faults=true",
    "--sample=none", "--cpuctxsw=none", "--export=sqlite", "--force-overwrite=false",
]
# Only the steps the runner brackets with cudaProfilerStart/Stop (left out for a whole run).
NSYS_CAPTURE_RANGE = ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]


def mark_from(steps_seen: int, wait: int, warmup: int) -> int:
    """The first step a whole-run pass marks: past the schedule's warm-up where the run has
    steps to spare, but never leaving fewer than half of them."""
    return max(1, min(wait + warmup, steps_seen // 2))


def whole_run_mark_from(status: dict, wait: int, warmup: int) -> int:
    """mark_from for a pass that ended short of its schedule: the step events it saw and the
    schedule it planned (its status), else the defaults given."""
    plan = status.get("plan") or {}
    return mark_from(status.get("step_events", status.get("steps", 0)),
                     plan.get("wait", wait), plan.get("warmup", warmup))


@dataclass
class PassResult:
    name: str
    exit_code: int | None
    status: dict
    trace: str | None
    log: str
    interrupted: bool = False


@dataclass
class RunOutcome:
    run_dir: Path
    passes: list[PassResult] = field(default_factory=list)
    traces: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    script_exit: int = 0
    interrupted: bool = False
    unprofiled_step_ms: float | None = None   # the timing pass's step (mean, stalls left out)
    # ... and each of its runs' GPU wait for DataLoader batches (one run, or two where one waited)
    loader_waits_ms: list[float] = field(default_factory=list)

    @property
    def unprofiled_loader_wait_ms(self) -> float | None:
        """The timing runs' mean wait for DataLoader batches; None where none was timed."""
        return sum(self.loader_waits_ms) / len(self.loader_waits_ms) if self.loader_waits_ms else None

    @property
    def unprofiled_loader_waits_ms(self) -> list[float] | None:
        """Each timing run's wait, where two were timed (the verdict's edge check); else None."""
        return list(self.loader_waits_ms) if len(self.loader_waits_ms) > 1 else None


def find_nsys(explicit: str | None) -> str | None:
    for candidate in (explicit, os.environ.get("NAVDOCTOR_NSYS")):
        if candidate:
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
            found = shutil.which(candidate)
            if found:
                return found
            raise NavdoctorError(f"{candidate}: nsys not found or not executable")
    return shutil.which("nsys")


def new_run_dir(base: str, stem: str) -> Path:
    """A fresh directory; an existing one is never reused."""
    root = Path(base)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        root.mkdir(parents=True, exist_ok=True)
        for n in range(1000):
            candidate = root / (f"{stamp}-{stem}" + (f"-{n}" if n else ""))
            try:
                candidate.mkdir()  # atomic: fails if the name exists, whatever made it
                return candidate
            except FileExistsError:
                continue
    except OSError as e:  # --out is a file, read-only, on a full disk...
        raise NavdoctorError(f"{base}: cannot create a run directory here: "
                             f"{e.strerror or e}") from None
    raise NavdoctorError(f"{base}: cannot create a new run directory (1000 taken for {stamp})")


# What the profilers print into the script's stderr while navdoctor traces it: Kineto's own log
# lines ("ERROR:2026-12-07 13:02:26 4814:4814 DeviceProperties.cpp:56] gpuGetDeviceCount failed
# with code 35" on a machine without a GPU, "USDT:... profiler_start") and the CPU allocator's
# warning that the profiler started after some allocations. They are navdoctor's doing, not the
# script's: kept in the pass's log, left out of what the user sees.
PROFILER_NOISE = re.compile(
    rb"^(?:(?:USDT|INFO|WARNING|ERROR|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \w+\.cpp:\d+\]"
    rb"|\[W\d{4} [\d:.]+ \d* ?CPUAllocator\.cpp:\d+\] Memory block of unknown size)")


_NOISE_STARTS = (b"USDT:", b"INFO:", b"WARNING:", b"ERROR:", b"STAGE:", b"[W")


class NoiseFilter:
    """A sink that passes on the script's output, except the profilers' own lines
    (PROFILER_NOISE). A line that cannot be one of them passes at once, unfinished (a progress
    bar redrawn with '\r'); one that may be waits for its end."""

    def __init__(self, sink):
        self.sink = sink
        self.pending = b""
        self.passing = False      # the current line is known not to be noise

    def write(self, chunk: bytes) -> None:
        out = []
        data = self.pending + chunk
        self.pending = b""
        while data:
            line, nl, data = data.partition(b"\n")
            if self.passing or (nl and not PROFILER_NOISE.match(line)):
                out.append(line + nl)
            elif not nl and any(p.startswith(line[:len(p)]) for p in _NOISE_STARTS):
                self.pending = line          # may be noise: wait for the rest of the line
            elif not nl:
                out.append(line)             # cannot be noise: pass it on unfinished
                self.passing = True
            if nl:
                self.passing = False
        kept = b"".join(out)
        if kept:
            self.sink.write(kept)

    def flush(self) -> None:
        self.sink.flush()

    def close(self) -> None:
        """The last line, if the stream ended without a newline."""
        if self.pending and not PROFILER_NOISE.match(self.pending):
            self.sink.write(self.pending)
            self.sink.flush()
        self.pending = b""


def _tee(stream, sinks) -> threading.Thread:
    def pump():
        for chunk in iter(lambda: stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536), b""):
            for sink in sinks:
                try:
                    sink.write(chunk)
                    sink.flush()
                except (ValueError, OSError):
                    pass
    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return t


def run_and_tee(cmd: list[str], log_path: Path, env: dict,
                stdout_to_stderr: bool = False, echo: bool = True) -> tuple[int, bool]:
    """Run cmd with its stdout/stderr going to ours and to a log; (exit code, interrupted).
    stdout_to_stderr keeps our stdout clean when it carries the JSON report; echo=False
    sends everything to the log only."""
    interrupted = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        out = sys.stderr.buffer if stdout_to_stderr else sys.stdout.buffer
        shown = NoiseFilter(sys.stderr.buffer)
        sinks_out, sinks_err = ([out, log], [shown, log]) if echo else ([log], [log])
        threads = [_tee(proc.stdout, sinks_out), _tee(proc.stderr, sinks_err)]
        try:
            proc.wait()
        except KeyboardInterrupt as e:
            from .. import errors
            if isinstance(e, errors.Terminated):
                # SIGTERM came to navdoctor alone: the child is told to stop the same way,
                # and the run ends (exit 143) once it has.
                _stop_child(proc)
                raise
            # The child got the same SIGINT; let it stop its profiler and write what it has.
            interrupted = True
            try:
                proc.wait(timeout=30)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            # handled here (what was captured is analysed): later errors are not this Ctrl-C's
            errors.interrupt_seen = False
        for t in threads:
            t.join(timeout=5)
        try:
            shown.close()
        except (ValueError, OSError):
            pass
    return proc.returncode, interrupted


def _stop_child(proc: subprocess.Popen) -> None:
    """SIGTERM to the child, SIGKILL after 10 s."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except OSError:
        pass


def _read_status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


TIMED_STEPS_AT_LEAST = 10   # the timing pass's steps: the recorded ones, and at least this many


def collect(script: str | None, args: list[str], out_base: str, wait: int, warmup: int,
            active: int, use_nsys: bool, nsys_path: str | None,
            progress: Callable[[str], None], stdout_to_stderr: bool = False,
            timing: bool = True) -> RunOutcome:
    script_path = Path(script) if script else BUNDLED_WORKLOAD
    if not script_path.exists():
        raise NavdoctorError(f"{script_path}: no such script")
    if script_path.is_dir():
        raise NavdoctorError(f"{script_path}: is a directory, not a Python script")
    nsys = find_nsys(nsys_path) if use_nsys else None
    run_dir = new_run_dir(out_base, script_path.stem)
    outcome = RunOutcome(run_dir)
    env = _child_env()
    schedule = ["--wait", str(wait), "--warmup", str(warmup), "--active", str(active)]
    runner = [sys.executable, "-m", "navdoctor.collect.runner"]

    progress(f"run directory {run_dir}")
    progress(f"pass 1/2: torch.profiler (skip {wait}, warm up {warmup}, record {active} steps; "
             "more after a DataLoader's prefetch buffer)")
    torch_pass = _run_pass("torch", runner + ["--mode", "torch", "--out", str(run_dir)] + schedule
                           + ["--", str(script_path), *args], run_dir, env, stdout_to_stderr=stdout_to_stderr)
    outcome.passes.append(torch_pass)
    if torch_pass.status.get("user_profiler"):
        outcome.notes.append("the script runs its own torch.profiler; navdoctor used that trace")
    whole_from = None   # set when the run is too short for the schedule: both passes go whole
    if not torch_pass.trace and not torch_pass.status.get("error") and torch_pass.exit_code == 0 \
            and not torch_pass.interrupted and torch_pass.status:
        steps = torch_pass.status.get("steps", 0)
        plan = torch_pass.status.get("plan") or {}
        needed = plan.get("wait", wait) + plan.get("warmup", warmup) + 1
        whole_from = whole_run_mark_from(torch_pass.status, wait, warmup)
        outcome.notes.append(f"the script made {steps} steps, fewer than the schedule needs "
                             f"({needed}); profiled its whole run instead (both passes)"
                             + (f", steps marked from step {whole_from} on" if steps else ""))
        progress("pass 1/2 again: the schedule never reached its recording steps; profiling the whole run")
        torch_pass = _run_pass("torch", runner + ["--mode", "torch", "--out", str(run_dir), "--whole",
                                                  "--mark-from", str(whole_from)]
                               + schedule + ["--", str(script_path), *args], run_dir, env,
                               log_name="torch-pass-whole.log", stdout_to_stderr=stdout_to_stderr)
        outcome.passes.append(torch_pass)
    if torch_pass.interrupted:
        outcome.interrupted = True
    if torch_pass.trace:
        outcome.traces.append(torch_pass.trace)
        # the steps the script ran; the report counts those the trace recorded (docs/diagnose.md)
        progress(f"pass 1/2 done: the script ran {torch_pass.status.get('steps', 0)} steps "
                 f"({_source_words(torch_pass.status)}), trace {torch_pass.trace}")
    outcome.script_exit = torch_pass.exit_code or 0

    cuda = torch_pass.status.get("cuda")
    if outcome.interrupted:
        outcome.notes.append("interrupted: the Nsight Systems pass was not run")
    elif not use_nsys:
        outcome.notes.append("--no-nsys: diagnosed from the torch.profiler pass alone")
    elif nsys is None:
        # (said once: diagnose prints the run's notes after the passes)
        outcome.notes.append("nsys not found (PATH, --nsys or NAVDOCTOR_NSYS): diagnosed from the "
                             "torch.profiler pass alone")
    elif not cuda:
        outcome.notes.append("no CUDA device: the Nsight Systems pass was skipped")
    else:
        _nsys_pass(outcome, nsys, runner, schedule, script_path, args, run_dir, env, whole_from,
                   progress)
    # Pass 3 wherever a GPU run was traced (by either tracer): the step without any tracer.
    if timing and cuda and outcome.traces and not outcome.interrupted and not outcome.script_exit:
        if torch_pass.status.get("user_profiler"):
            # the script profiles itself in every run: no run of it is without a tracer
            outcome.notes.append("no timing pass: the script runs its own torch.profiler, so no "
                                 "run of it is unprofiled; the tracer's cost is not measured")
        else:
            _timing_pass(outcome, script_path, args, run_dir, env, progress)
    return outcome


def timing_window(traced_status: dict) -> tuple[int, int]:
    """(steps to skip, steps to time; 0: to the run's end) of the timing pass, from the status
    of the last traced pass: the steps it skipped, then what it recorded and at least
    TIMED_STEPS_AT_LEAST (a run profiled whole: from the first step it marked, to its end).
    The timing runs' statuses keep every step's time; their first `skip` are not the recorded
    steps (navdoctor/collect/rundir.py reads them the same way)."""
    if traced_status.get("whole"):
        return max(0, int(traced_status.get("mark_from") or 1) - 1), 0
    plan = traced_status.get("plan") or {}
    return (int(plan.get("wait", 0)) + int(plan.get("warmup", 0)),
            max(int(plan.get("active", 0)), TIMED_STEPS_AT_LEAST))


def _timing_pass(outcome: RunOutcome, script_path: Path, args: list[str], run_dir: Path,
                 env: dict, progress: Callable[[str], None]) -> None:
    """Pass 3: the steps the traced passes recorded, timed without a tracer: after the steps
    the last traced pass skipped (its plan's skipped and warm-up steps; for a run profiled
    whole, the steps before the first one it marked), then at least TIMED_STEPS_AT_LEAST (a whole run: to
    its end). outcome.unprofiled_step_ms is their mean without isolated stalls, as the traced
    step is (steady.steady_step_ms). A pass that fails or times fewer than 3 steps leaves it None
    (the tracers' cost is not measured) with a note.
    Where the run fed the GPU from a DataLoader (the runner timed the GPU's wait for its
    batches), the steps are timed once more in a fresh process: whether a loader that works on
    the loop's thread hides behind the GPU changes from one process to the next (four timing
    runs of one corpus configuration waited 0.0 to 7.3% of the step: docs/accuracy.md,
    "Loader wait"). The step and the wait are then the two runs' means, and
    outcome.unprofiled_loader_waits_ms keeps both waits (the verdict's close call when they
    fall on both sides of the loader's line: docs/verdict.md, "Loader wait")."""
    traced = next(p for p in reversed(outcome.passes) if p.trace)
    skip, steps = timing_window(traced.status)
    progress(f"pass 3/3: the same steps timed without a tracer (skip {skip}, time "
             f"{steps or 'the rest'})")
    first = _timed_run(outcome, "timing", script_path, args, run_dir, env, skip, steps)
    if first is None:
        return
    outcome.unprofiled_step_ms, wait = first
    if wait is not None:
        outcome.loader_waits_ms = [wait]
        progress(f"pass 3/3, second run: the GPU waited {wait:.2f} ms a step for DataLoader "
                 "batches; timing it again in a fresh process")
        second = _timed_run(outcome, "timing2", script_path, args, run_dir, env, skip, steps)
        if second is not None and second[1] is not None:
            outcome.unprofiled_step_ms = (first[0] + second[0]) / 2
            outcome.loader_waits_ms.append(second[1])
        elif second is not None:
            outcome.notes.append("the timing pass's second run timed no DataLoader wait: the "
                                 "first run's figures are used")
    progress(f"pass 3/3 done: {outcome.unprofiled_step_ms:.2f} ms a step without a tracer"
             + (f", the GPU waiting {outcome.unprofiled_loader_wait_ms:.2f} ms of it for DataLoader batches"
                if outcome.unprofiled_loader_wait_ms is not None else "")
             + (" (two runs: {:.2f} and {:.2f} ms)".format(*outcome.unprofiled_loader_waits_ms)
                if outcome.unprofiled_loader_waits_ms else ""))


def _timed_run(outcome: RunOutcome, mode: str, script_path: Path, args: list[str], run_dir: Path,
               env: dict, skip: int, steps: int) -> tuple[float, float | None] | None:
    """One run of the timing runner: (steady step ms, the GPU's wait for DataLoader batches in
    it, None where no DataLoader fed it or no CUDA events timed it), or None with a note where
    it was interrupted or timed too little (a second run's failure keeps the first's figures)."""
    from ..steady import steady_run_ms
    which = "the timing pass" if mode == "timing" else "the timing pass's second run"
    cmd = [sys.executable, "-m", "navdoctor.verify.runner", "--remedy", "none",
           "--status", str(run_dir / f"status-{mode}.json"), "--warmup", str(skip), "--steps", str(steps),
           "--", str(script_path), *args]
    result = _run_pass(mode, cmd, run_dir, env, echo=False)
    outcome.passes.append(result)
    if result.interrupted:
        outcome.interrupted = True
        outcome.notes.append(f"interrupted during {which}: both traces are complete; "
                             + ("the tracers' cost is not measured" if mode == "timing" else
                                "the first timing run's figures are used"))
        return None
    all_steps = result.status.get("step_ms") or []
    timed = all_steps[skip:]
    if result.exit_code or len(timed) < 3:
        why = (f"exit code {result.exit_code}" if result.exit_code else
               f"{len(all_steps)} steps timed, {len(timed)} after the {skip} skipped: fewer than 3")
        outcome.notes.append(f"{which} (the steps without a tracer) gave too few step times ({why}; "
                             f"see {run_dir / f'{mode}-pass.log'}): "
                             + ("the tracers' cost is not measured" if mode == "timing" else
                                "the first run's figures are used"))
        return None
    waits = result.status.get("loader_wait_ms")
    return steady_run_ms(timed, waits[skip:] if waits else None)


def _source_words(status: dict) -> str:
    source = status.get("step_source") or "none"
    if source == "module" and status.get("step_module"):
        return f"module: calls of {status['step_module']}"
    return source


def _nsys_pass(outcome: RunOutcome, nsys: str, runner: list[str], schedule: list[str],
               script_path: Path, args: list[str], run_dir: Path, env: dict,
               whole_from: int | None, progress: Callable[[str], None]) -> None:
    """Pass 2; when its capture range never opened (the run made fewer steps than the plan
    needs), it is run again with the whole run captured, as pass 1 is: no trace goes missing."""
    for attempt in (1, 2):
        whole = whole_from is not None
        name = "nsys" if attempt == 1 else "nsys-whole"
        log = f"{name}-pass.log"
        cmd = [nsys, "profile", *NSYS_OPTIONS, *([] if whole else NSYS_CAPTURE_RANGE),
               "-o", str(run_dir / name), *runner, "--mode", "nvtx", "--out", str(run_dir),
               *schedule, *(["--whole", "--mark-from", str(whole_from)] if whole else []),
               "--", str(script_path), *args]
        progress("pass 2/2: Nsight Systems (cuda, nvtx, osrt" + (", whole run)" if whole else ")"))
        # The script already spoke in pass 1; this pass's output (and nsys's progress bars)
        # goes to the log, and only its tail is shown if the pass fails.
        nsys_pass = _run_pass("nvtx", cmd, run_dir, env, log_name=log, echo=False)
        sqlite = run_dir / f"{name}.sqlite"
        nsys_pass.trace = str(sqlite) if sqlite.exists() else None
        outcome.passes.append(nsys_pass)
        if nsys_pass.interrupted:
            outcome.interrupted = True
        if nsys_pass.trace:
            outcome.traces.append(nsys_pass.trace)
            progress(f"pass 2/2 done: the script ran {nsys_pass.status.get('steps', 0)} steps, "
                     f"trace {sqlite}")
            return
        opened = nsys_pass.status.get("capture_opened")
        clean = nsys_pass.status and nsys_pass.exit_code == 0 and not nsys_pass.status.get("error")
        if not whole and opened is False and clean and not outcome.interrupted:
            steps = nsys_pass.status.get("steps", 0)
            whole_from = whole_run_mark_from(nsys_pass.status, 0, 0)
            outcome.notes.append(f"the Nsight Systems pass saw {steps} steps, too few to open its "
                                 "capture range; captured its whole run instead")
            progress("pass 2/2 again: the capture range never opened; capturing the whole run")
            continue
        outcome.notes.append("the Nsight Systems pass produced no SQLite export "
                             f"(see {run_dir / log})")
        _show_tail(run_dir / log, progress)
        return


def _show_tail(log: Path, progress: Callable[[str], None], lines: int = 8) -> None:
    try:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return
    for line in tail:
        progress(f"  | {line}")


def _run_pass(mode: str, cmd: list[str], run_dir: Path, env: dict, log_name: str | None = None,
              stdout_to_stderr: bool = False, echo: bool = True) -> PassResult:
    log = run_dir / (log_name or f"{mode}-pass.log")
    status_file = run_dir / f"status-{mode}.json"
    if status_file.exists():
        status_file.unlink()
    code, interrupted = run_and_tee(cmd, log, env, stdout_to_stderr, echo)
    status = _read_status(status_file)
    trace = status.get("trace") if mode == "torch" else None
    result = PassResult(mode, status.get("exit_code", code), status, trace, str(log))
    result.interrupted = interrupted or status.get("exit_code") == 130
    return result
