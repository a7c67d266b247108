"""`navdoctor verify`: run the script with and without each remedy, interleaved, and judge.

One baseline arm and one arm per remedy (or '+'-joined remedy set). Runs go in rounds, each
round one run of every arm, the order reversed every other round (B R1 R2 | R2 R1 B | ...),
so a drift of the machine (another job, thermal state, caches) lands on every arm alike.
Each run is a fresh child process (navdoctor.verify.runner) that times `warmup + steps`
steps and stops.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import __version__
from ..errors import NavdoctorError
from . import VERIFY_SCHEMA_VERSION
from .remedies import CODE_CHANGES, LOADER_IDS, MODEL_IDS, REMEDIES, arm_name, parse_arms, usable_cpus
from .stats import NO_EFFECT, compare

BASELINE: tuple[str, ...] = ()
DEFAULT_CPU = ["num_workers", "amp_bf16", "channels_last"]
DEFAULT_CUDA = ["num_workers", "pin_memory", "amp_bf16", "channels_last", "cudnn_benchmark"]


@dataclass
class Settings:
    repeats: int = 3
    warmup: int = 3
    steps: int = 20
    margin: float = 0.05
    confidence: float = 0.95
    resamples: int = 2000
    timeout: float = 900.0
    classify: bool = False
    priming: int = 1        # untimed runs of every arm before round 1


@dataclass
class Run:
    arm: tuple[str, ...]
    round: int
    exit_code: int | None
    status: dict
    log: str
    wall_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and bool(self.status) and not self.timed_out

    def error_line(self) -> str:
        if self.timed_out:
            return "timed out"
        if not self.status:
            return f"exit code {self.exit_code}, no status written"
        err = self.status.get("error")
        return f"exit code {self.exit_code}" + (f": {err}" if err else "")


@dataclass
class CodeChange:
    """A remedy verify cannot apply from outside the script; reported, never measured."""
    id: str | None
    title: str
    code: str | None
    text: str = ""
    rule: str | None = None


@dataclass
class Plan:
    script: str
    args: list[str]
    arms: list[tuple[str, ...]]
    code_changes: list[CodeChange] = field(default_factory=list)
    sources: dict[str, list[str]] = field(default_factory=dict)   # arm name -> rules suggesting it
    # arm name -> what the diagnosis estimated for it (the suggesting finding with the highest
    # bound): rule, expected, up_to; measured against it after the runs
    estimates: dict[str, dict] = field(default_factory=dict)


def schedule(arms: list[tuple[str, ...]], repeats: int,
             priming: int = 0) -> list[tuple[int, tuple[str, ...]]]:
    """(round, arm) in run order. Odd rounds run the baseline, then each remedy; even rounds
    the same in reverse (B R1 R2 | R2 R1 B | B R1 R2 ...). A drift of the machine during a
    round (a job starting or ending elsewhere) then favours each remedy in one round and the
    baseline in the next, instead of always the same side: the bias becomes round-to-round
    spread, which the paired interval sees.

    First, `priming` untimed runs of every arm (round 0): the first run of a script, or of a
    remedy, on a machine pays for cold caches (files, compiled kernels, inductor/Triton caches,
    GPU clocks ramping up); on an H200 that made one run of 3 up to 7x slower than the others
    and the interval useless."""
    order = [BASELINE] + [a for a in arms if a != BASELINE]
    return ([(0, arm) for _ in range(priming) for arm in order]
            + [(r, arm) for r in range(1, repeats + 1)
               for arm in (order if r % 2 else order[::-1])])


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_child(script: str, args: list[str], arm: tuple[str, ...], status_path: Path, log_path: Path,
              settings: Settings, extra: list[str] | None = None) -> tuple[int | None, bool, float]:
    """One child run; (exit code, timed out, seconds). Its output goes to log_path only."""
    from ..collect.diagnose import _child_env
    cmd = [sys.executable, "-m", "navdoctor.verify.runner", "--remedy", arm_name(arm) if arm else "none"]
    cmd += extra if extra is not None else ["--status", str(status_path), "--warmup",
                                            str(settings.warmup), "--steps", str(settings.steps)]
    cmd += ["--", script, *args]
    t0 = time.perf_counter()
    with open(log_path, "wb") as log, _term_as_interrupt():
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        # Its own process group: a timeout or Ctrl-C ends the child and its loader workers.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_child_env(),
                                start_new_session=True)
        try:
            proc.wait(timeout=settings.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return None, True, time.perf_counter() - t0
        except KeyboardInterrupt:
            _kill_group(proc)
            raise
    return proc.returncode, False, time.perf_counter() - t0


@contextlib.contextmanager
def _term_as_interrupt():
    """SIGTERM to verify ends the running child (and its workers) as Ctrl-C does (then exit
    143: errors.note_terminate)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from ..errors import note_terminate as on_term

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def new_verify_dir(base: str, stem: str) -> Path:
    from ..collect.diagnose import new_run_dir
    return new_run_dir(base, f"verify-{stem}")


def check_script(script: str) -> None:
    p = Path(script)
    if not p.exists():
        raise NavdoctorError(f"{script}: no such script")
    if p.is_dir():
        raise NavdoctorError(f"{script}: is a directory, not a Python script")


def default_arms(cuda: bool) -> list[tuple[str, ...]]:
    return [(r,) for r in (DEFAULT_CUDA if cuda else DEFAULT_CPU)]


def code_change_for(rid: str, rules=None) -> CodeChange:
    """The rule's own snippet for a code-change verify id, else the registry's."""
    info = CODE_CHANGES[rid]
    for rule in rules or []:
        for r in rule.remedies:
            if r.verify == rid:
                return CodeChange(rid, r.title, r.code or info.code, r.text, rule.id)
    return CodeChange(rid, info.title, info.code, info.patch)


def plan_from_ids(script: str, args: list[str], values: list[str], cuda: bool) -> Plan:
    arms = parse_arms(values) if values else default_arms(cuda)
    measured = [a for a in arms if not (len(a) == 1 and a[0] in CODE_CHANGES)]
    code = [a[0] for a in arms if len(a) == 1 and a[0] in CODE_CHANGES]
    rules = None
    if code:
        from ..rules import load_rules
        try:
            rules = load_rules()
        except NavdoctorError:
            rules = None
    return Plan(script, args, measured, [code_change_for(r, rules) for r in code])


def plan_from_report(report, script: str, args: list[str]) -> Plan:
    """The remedies of a diagnosis's findings (info-level findings aside): `verify:` ids
    navdoctor can apply are measured; the rest (code-change ids such as batch_size, and
    remedies with no id) are listed."""
    arms: list[tuple[str, ...]] = []
    sources: dict[str, list[str]] = {}
    code: list[CodeChange] = []
    seen_code: set[tuple] = set()
    estimates: dict[str, dict] = {}
    # the step diagnose's timing pass measured without a tracer, which the what-if figures were
    # made from: verify's own baseline is the same step timed again (none without a timing pass)
    predicted_from_ms = (getattr(report, "run", None) or {}).get("unprofiled_step_ms")
    for f in report.findings:
        if f.severity == "info":     # notes about the trace itself, not remedies for the run
            continue
        for r in f.remedies:
            if r.verify in REMEDIES:
                arm = (r.verify,)
                if arm not in arms:
                    arms.append(arm)
                sources.setdefault(r.verify, [])
                if f.rule not in sources[r.verify]:
                    sources[r.verify].append(f.rule)
                up_to = getattr(f, "speedup_up_to", None)
                expected = getattr(r, "speedup_expected", None)
                old = estimates.get(r.verify, {})
                if (expected or 0) > (old.get("expected") or 0) or (
                        not old.get("expected") and (up_to or 0) > (old.get("up_to") or 0)):
                    estimates[r.verify] = {"rule": f.rule, "expected": expected,
                                           "range": getattr(r, "speedup_range", None),
                                           "up_to": up_to, "from": "the diagnosis"}
                    if expected and predicted_from_ms:
                        estimates[r.verify]["step_ms"] = predicted_from_ms
            else:
                key = (r.verify, r.title)
                if key in seen_code:
                    continue
                seen_code.add(key)
                if r.verify in CODE_CHANGES:
                    info = CODE_CHANGES[r.verify]
                    code.append(CodeChange(r.verify, r.title, r.code or info.code, r.text, f.rule))
                else:
                    code.append(CodeChange(r.verify, r.title, r.code, r.text, f.rule))
    return Plan(script, args, arms, code, sources, estimates)


def _machine(statuses: list[dict]) -> dict:
    cpu_model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    st = next((s for s in statuses if s), {})
    load = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        pass
    return {"cpu": cpu_model, "cpus": usable_cpus(), "cuda": st.get("cuda"),
            "device": st.get("device"), "torch": st.get("torch"), "python": platform.python_version(),
            "platform": platform.platform(terse=True), "load_average_at_end": load}


# ---- one verification ------------------------------------------------------------------------

def verify(plan: Plan, settings: Settings, out_dir: Path,
           progress: Callable[[str], None] = lambda m: None) -> dict:
    """Run every arm, interleaved; returns the JSON-ready result."""
    check_script(plan.script)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    failed_arms: set[tuple[str, ...]] = set()
    order = schedule(plan.arms, settings.repeats, settings.priming) if plan.arms else []
    t_start = time.time()
    primed: dict[tuple[str, ...], int] = {}
    for i, (rnd, arm) in enumerate(order, start=1):
        name = arm_name(arm)
        if arm in failed_arms:
            continue
        if rnd == 0:
            primed[arm] = primed.get(arm, 0) + 1
            progress(f"verify run {i}/{len(order)} (priming, not timed): {name}")
            stem = f"p{primed[arm]:02d}-{name.replace('+', '_')}"
        else:
            progress(f"verify run {i}/{len(order)} (round {rnd}/{settings.repeats}): {name}")
            stem = f"r{rnd:02d}-{name.replace('+', '_')}"
        status_path, log_path = out_dir / f"{stem}.json", out_dir / f"{stem}.log"
        if status_path.exists():
            status_path.unlink()
        code, timed_out, wall = run_child(plan.script, plan.args, arm, status_path, log_path, settings)
        run = Run(arm, rnd, code, _read_json(status_path), str(log_path), wall, timed_out)
        runs.append(run)
        if not run.ok:
            progress(f"verify: {name} failed in round {rnd} ({run.error_line()}); log {log_path}")
            if arm != BASELINE:
                failed_arms.add(arm)        # a remedy that breaks the script: no more runs of it
            elif not any(r.ok for r in runs if r.arm == BASELINE):
                raise ScriptFailed(f"the script failed without any remedy ({run.error_line()}); "
                                   f"log: {log_path}")
            # a later baseline failure only drops its round from the comparisons

    priming_runs = [r for r in runs if r.round == 0]
    # A remedy that broke the script in its priming run is reported as failed by that run.
    runs = [r for r in runs if r.round != 0 or not r.ok]
    base_runs = [r for r in runs if r.arm == BASELINE and r.ok]
    if plan.arms and not base_runs:
        raise ScriptFailed("no timed baseline run succeeded (only the priming run did); logs in "
                           f"{out_dir}")
    results = []
    classes = None
    if settings.classify:
        # each arm's class is judged with its profiler's cost measured from its own timed
        # runs, summarised as diagnose summarises its timing runs
        unprofiled = {arm: _arm_unprofiled([r for r in runs if r.arm == arm and r.ok], settings)
                      for arm in [BASELINE, *plan.arms]}
        classes = _classify(plan, settings, out_dir, progress, failed_arms, unprofiled)
    for arm in plan.arms:
        results.append(_arm_result(plan, arm, base_runs, [r for r in runs if r.arm == arm],
                                   settings, classes))
    for c in plan.code_changes:
        results.append({"remedy": c.id or c.title, "remedies": [c.id] if c.id else [], "title": c.title,
                        "kind": "code_change", "verdict": "needs code change", "measured": False,
                        "applied": None, "code": c.code, "text": c.text, "rule": c.rule,
                        "comparison": None, "changes": [], "notes": [
                            "changes the script's own code; navdoctor does not apply or time it"],
                        "class": {"before": None, "after": None, "changed": None,
                                  "note": "not measured: a code change"}, "runs": []})
    base_class = (classes or {}).get(BASELINE)
    return {
        "schema_version": VERIFY_SCHEMA_VERSION,
        "tool": f"navdoctor {__version__}",
        "script": plan.script, "args": plan.args,
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "seconds": round(time.time() - t_start, 1),
        "machine": _machine([r.status for r in base_runs]),
        "settings": {"repeats": settings.repeats, "warmup_steps": settings.warmup,
                     "timed_steps": settings.steps, "margin": settings.margin,
                     "confidence": settings.confidence, "bootstrap_resamples": settings.resamples,
                     "order": "rounds of one run per arm; baseline first in odd rounds, "
                              "last in even rounds (reversed order)",
                     "classify": settings.classify, "priming_runs": settings.priming},
        "run_dir": str(out_dir),
        "baseline": {"median_ms": _arm_median(base_runs, settings),
                     "step_source": base_runs[0].status.get("step_source") if base_runs else None,
                     "clock": base_runs[0].status.get("clock") if base_runs else None,
                     "models": base_runs[0].status.get("models", []) if base_runs else [],
                     "loaders": base_runs[0].status.get("loaders", []) if base_runs else [],
                     "class": base_class, "runs": [_run_json(r, settings) for r in runs if r.arm == BASELINE]},
        "results": results,
        "priming_runs": [dict(_run_json(r, settings), arm=arm_name(r.arm)) for r in priming_runs],
    }


class ScriptFailed(NavdoctorError):
    """The script fails on its own: nothing to compare (exit code 1)."""


def _steady(run: Run, skip: int, steps: int, field: str = "step_ms") -> list[float]:
    """The run's timed window of a per-step series (step times, or the loader's waits)."""
    return (run.status.get(field) or [])[skip:skip + steps]


def _arm_samples(runs: list[Run], settings: Settings) -> list[float]:
    """The arm's timed steps, pooled over its runs (by _samples' rule)."""
    samples, _unit, _note = _samples(runs, runs, settings)
    return [x for s in samples[0] for x in s]


def _arm_median(runs: list[Run], settings: Settings) -> float | None:
    pooled = _arm_samples(runs, settings)
    if not pooled:
        return None
    import statistics
    return round(statistics.median(pooled), 4)


def _arm_unprofiled(runs: list[Run], settings: Settings) -> tuple[float | None, list[float] | None]:
    """The arm's step without a tracer and each run's GPU wait for DataLoader batches per step
    (the timing runner's LoaderWait), for --classify, as diagnose summarises its timing runs:
    each run over its own timed steps (steady.steady_step_ms and steady_loader_wait_ms, so that
    a run's stalls are left out of its step and its wait alike), the step their mean, the
    waits one per run (the least and most waiting runs are judged apart:
    verdict.loader_wait_of). (None, None) where the runs are compared whole (their times hold
    the script's start-up, not a step); waits None where a run timed none (no DataLoader, no
    CUDA)."""
    from ..steady import steady_run_ms
    skip, unit, _note = _steady_rule(runs, settings)
    if unit != "step" or not runs:
        return None, None
    steps, waits = zip(*(steady_run_ms(_steady(r, skip, settings.steps),
                                       _steady(r, skip, settings.steps, "loader_wait_ms")) for r in runs))
    if None in steps:
        return None, None
    return sum(steps) / len(steps), (list(waits) if None not in waits else None)


def _steady_rule(runs: list[Run], settings: Settings) -> tuple[int, str, str | None]:
    """(steps to skip, 'step' or 'run', a note): skip --warmup steps, or fewer when a script
    has fewer steps, or whole-run times when it has none."""
    counts = [len(r.status.get("step_ms", [])) for r in runs]
    fewest = min(counts) if counts else 0
    if fewest >= settings.warmup + 1:
        return settings.warmup, "step", None
    if fewest >= 2:
        return 1, "step", (f"a run had only {fewest} steps: skipped 1 warm-up step instead of "
                           f"{settings.warmup}")
    return 0, "run", ("no steady steps found (the script has no DataLoader, optimizer step or "
                      "navdoctor.step(), or too few steps): compared whole-run times, which "
                      "include the script's start-up")


def _samples(base: list[Run], arm: list[Run], settings: Settings):
    """Per-run samples for both arms, by one rule (_steady_rule)."""
    skip, unit, note = _steady_rule(base + arm, settings)
    if unit == "run":
        return ([[r.status["seconds"] * 1000] for r in base],
                [[r.status["seconds"] * 1000] for r in arm]), unit, note
    return ([_steady(r, skip, settings.steps) for r in base],
            [_steady(r, skip, settings.steps) for r in arm]), unit, note


def _run_json(run: Run, settings: Settings) -> dict:
    import statistics
    steps = run.status.get("step_ms", [])
    steady = _steady(run, settings.warmup, settings.steps)
    return {"round": run.round, "exit_code": run.exit_code, "ok": run.ok,
            "error": None if run.ok else run.error_line(), "steps_timed": len(steady),
            "steps_seen": len(steps), "median_ms": round(statistics.median(steady), 4) if steady else None,
            "step_ms": steps, "seconds": run.status.get("seconds"), "wall_s": round(run.wall_s, 2),
            "log": run.log}


def _applied(arm: tuple[str, ...], base: list[Run], arm_runs: list[Run]) -> dict[str, bool]:
    out = {}
    for rid in arm:
        changed = any(r.status.get("changes", {}).get(rid) for r in arm_runs if r.ok)
        if rid == "cudnn_benchmark":
            seen = [r.status.get("observed", {}).get("cudnn_benchmark_at_first_step") for r in base]
            if any(v is True for v in seen):
                changed = False
        out[rid] = bool(changed)
    return out


def _arm_result(plan: Plan, arm: tuple[str, ...], base: list[Run], arm_runs: list[Run],
                settings: Settings, classes: dict | None) -> dict:
    name = arm_name(arm)
    ok_runs = [r for r in arm_runs if r.ok]
    changes: list[str] = []
    notes: list[str] = []
    for rid in arm:
        for r in ok_runs[:1] or arm_runs[:1]:
            changes += [f"{rid}: {c}" if len(arm) > 1 else c for c in r.status.get("changes", {}).get(rid, [])]
            notes += [f"{rid}: {n}" if len(arm) > 1 else n for n in r.status.get("notes", {}).get(rid, [])]
    first = (ok_runs or arm_runs or [None])[0]
    if first is not None and first.status:
        if any(rid in LOADER_IDS for rid in arm) and not first.status.get("loader_count"):
            notes.append("the script creates no DataLoader")
        if any(rid in MODEL_IDS for rid in arm) and not first.status.get("models"):
            notes.append("no model found: no module with parameters was called outside another "
                         "module's call (a script that calls model.forward() directly bypasses it)")
        if "foreach_optimizer" in arm and not first.status.get("optimizer_count"):
            notes.append("the script creates no torch.optim optimizer")
    if "cudnn_benchmark" in arm and any(
            r.status.get("observed", {}).get("cudnn_benchmark_at_first_step") for r in base):
        notes.append("the script already sets torch.backends.cudnn.benchmark = True")
    applied = _applied(arm, base, arm_runs)
    titles = " + ".join(REMEDIES[r].title for r in arm)
    result = {"remedy": name, "remedies": list(arm), "title": titles, "kind": "measured",
              "measured": True, "applied": applied, "changes": changes, "notes": notes,
              "suggested_by": plan.sources.get(name, []), "code": "\n".join(REMEDIES[r].code for r in arm),
              "comparison": None, "runs": [_run_json(r, settings) for r in arm_runs]}
    failed = [r for r in arm_runs if not r.ok]
    if failed:
        result.update(kind="failed", verdict="failed", measured=False)
        where = "its priming run" if failed[0].round == 0 else f"round {failed[0].round}"
        result["notes"] = notes + [f"the script failed with this remedy in {where} "
                                   f"({failed[0].error_line()}); log: {failed[0].log}"]
        result["class"] = {"before": None, "after": None, "changed": None, "note": "not measured: the run failed"}
        return result
    # Pair each remedy run with the baseline run of its round.
    base_by_round = {r.round: r for r in base}
    paired = [(base_by_round[r.round], r) for r in ok_runs if r.round in base_by_round]
    (before, after), unit, note = _samples([b for b, _ in paired], [a for _, a in paired], settings)
    comparison = compare(before, after, settings.margin, settings.confidence, settings.resamples)
    result["comparison"] = dict(comparison.to_json(), unit=unit)
    result["notes"] += comparison.notes + ([note] if note else [])
    verdict = comparison.verdict
    if not any(applied.values()):
        verdict = NO_EFFECT
        result["notes"].append("the patch changed nothing in this script, so the measured "
                               "difference is noise: verdict 'no effect' regardless")
    result["verdict"] = verdict
    result["class"] = _class_entry(classes, arm)
    result["estimate"] = _estimate_check(plan.estimates.get(name) or _baseline_prediction(arm, classes),
                                         comparison, per_step=unit != "run")
    return result


def _baseline_prediction(arm: tuple[str, ...], classes: dict | None) -> dict | None:
    """The what-if model's figure for a one-remedy arm from the baseline's profiled run (with
    --classify), where no diagnosis gave one."""
    from ..whatif import VERIFY_TO_WHATIF
    remedies = ((classes or {}).get(BASELINE) or {}).get("whatif") or {}
    p = remedies.get(VERIFY_TO_WHATIF.get(arm[0])) if len(arm) == 1 else None
    if not p or not p.get("expected"):
        return None
    return {"rule": None, "expected": p["expected"], "range": [p["low"], p["high"]], "up_to": None,
            "from": "the baseline's profiled run"}


# how far the step as is, timed here, may lie from the one the prediction was made from before
# verify says the host moved: two untraced timings of one step on one host agreed within 8% on
# the calibration's steadiest host and were up to 1.64x apart on others (docs/accuracy.md)
BASELINE_MOVED = 0.10


def _estimate_check(estimate: dict | None, comparison, per_step: bool = True) -> dict | None:
    """The predicted speed-up of a remedy (the what-if model's, with its range) against what
    it measurably gave; the bound ("up to") is broken only where the whole confidence interval
    lies above it. Where the prediction says which step it was made from (step_ms: diagnose's
    timing pass), step_ms_measured is the baseline's step here, and where the two lie more than
    BASELINE_MOVED apart, baseline_moved is their ratio (else None): the same step timed faster or
    slower by the host, which a speed-up measured here moves with."""
    if not estimate or comparison.speedup is None:
        return None
    out = dict(estimate, measured=round(comparison.speedup, 4))
    if per_step and estimate.get("step_ms") and comparison.before_ms:
        moved = comparison.before_ms / estimate["step_ms"]
        out["step_ms_measured"] = round(comparison.before_ms, 4)
        out["baseline_moved"] = round(moved, 3) if abs(moved - 1) > BASELINE_MOVED else None
    low = comparison.ci_low
    out["above_bound"] = bool(low is not None and estimate.get("up_to") and low > estimate["up_to"])
    rng = estimate.get("range")
    out["inside_range"] = bool(rng) and rng[0] <= comparison.speedup <= rng[1] if rng else None
    if estimate.get("expected"):
        out["error"] = round(comparison.speedup / estimate["expected"] - 1, 4)
    return out


# ---- the diagnosed class, before and after ---------------------------------------------------

NOT_MEASURED = ("not measured: pass --classify for one extra torch.profiler run per arm and a "
                "diagnosis of each (a profiled run costs more than a timed one)")


def _class_entry(classes: dict | None, arm: tuple[str, ...]) -> dict:
    if classes is None:
        return {"before": None, "after": None, "changed": None, "note": NOT_MEASURED}
    before, after = classes.get(BASELINE), classes.get(arm)
    if not before or not after or before.get("bound") is None or after.get("bound") is None:
        why = (after or before or {}).get("error") or "no trace"
        return {"before": (before or {}).get("bound"), "after": (after or {}).get("bound"),
                "changed": None, "note": f"not measured: {why}"}
    return {"before": before["bound"], "after": after["bound"],
            "changed": before["bound"] != after["bound"],
            "before_detail": before, "after_detail": after, "note": None}


def _classify(plan: Plan, settings: Settings, out_dir: Path, progress, failed_arms,
              unprofiled: dict) -> dict:
    from ..analysis import analyze
    from ..rules import load_rules
    rules = load_rules()
    classes: dict = {}
    arms = [BASELINE] + [a for a in plan.arms if a not in failed_arms]
    for i, arm in enumerate(arms, start=1):
        name = arm_name(arm)
        progress(f"verify classify {i}/{len(arms)}: torch.profiler pass of {name}")
        pdir = out_dir / f"profile-{name.replace('+', '_')}"
        pdir.mkdir(exist_ok=True)
        trace = None
        for whole in (False, True):
            extra = ["--profile", str(pdir), "--wait", "2", "--warmup", "2", "--active", "5"]
            if whole:
                extra.append("--whole")
            code, timed_out, _ = run_child(plan.script, plan.args, arm, pdir / "unused.json",
                                           pdir / ("profile-whole.log" if whole else "profile.log"),
                                           settings, extra)
            status = _read_json(pdir / "status-torch.json")
            trace = status.get("trace")
            if trace or timed_out or code:
                break
        if not trace:
            classes[arm] = {"bound": None, "error": "the profiled run wrote no trace"
                            + (f" (exit code {code})" if code else "")}
            continue
        try:
            step_ms, loader_waits_ms = unprofiled.get(arm, (None, None))
            a = analyze([trace], rules, None, unprofiled_step_ms=step_ms,
                        unprofiled_loader_wait_ms=loader_waits_ms if step_ms is not None else None)
            classes[arm] = {"bound": a.verdict.bound, "confidence": round(a.verdict.confidence, 3),
                            # the what-if model's figures, read for the baseline's remedies
                            "whatif": (a.verdict.whatif or {}).get("remedies") if arm == BASELINE else None,
                            "close_to": a.verdict.close_to or None,
                            # the timed runs' waits it was judged with, where the trace's
                            # loader wait took them (their edge: close_to)
                            "loader_waits_ms": [round(w, 3) for w in loader_waits_ms]
                            if loader_waits_ms and step_ms is not None and a.verdict.loader_wait
                            else None,
                            "step_ms": None if a.verdict.step_ms is None else round(a.verdict.step_ms, 3),
                            "findings": [f.rule.id for f in a.findings], "trace": trace}
        except NavdoctorError as e:
            classes[arm] = {"bound": None, "error": str(e)}
    return classes


# ---- output ----------------------------------------------------------------------------------

def result_to_json(result: dict) -> str:
    return json.dumps(result, indent=2) + "\n"


def _fmt(x, spec: str) -> str:
    width = int("".join(ch for ch in spec.split(".")[0] if ch.isdigit()) or 0)
    return f"{'-':>{width}}" if x is None else format(x, spec)


def render_table(result: dict) -> str:
    from ..report import class_text
    s = result["settings"]
    m = result["machine"]
    lines = [f"navdoctor verify: {' '.join([result['script'], *result['args']])}",
             f"  {s['repeats']} run(s) per arm, interleaved, after {s.get('priming_runs', 0)} untimed "
             f"priming run(s) each",
             f"  up to {s['timed_steps']} timed steps per run after {s['warmup_steps']} warm-up steps; "
             f"{s['confidence']:.0%} CI, margin {s['margin']:.0%}",
             f"  machine: {m.get('device') or 'cpu'}; {m['cpus']} CPUs ({m['cpu']}); torch "
             f"{m.get('torch')}; {'CUDA' if m.get('cuda') else 'no CUDA'}",
             ""]
    base = result["baseline"]
    if base.get("step_source"):
        lines.insert(3, f"  steps from: {base['step_source']} ({base.get('clock')}); models found: "
                        + (", ".join(x["class"] for x in base.get("models", [])) or "none"))
    header = (f"{'remedy':30} {'before ms':>10} {'after ms':>10} {'speedup':>8}  {'95% CI':15} "
              f"{'verdict':21} class")
    lines += [header, "-" * len(header)]
    for r in result["results"]:
        c = r.get("comparison") or {}
        ci = c.get("ci")
        ci_text = f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "-"
        cls = r.get("class") or {}
        if cls.get("before") and cls.get("after"):
            cls_text = f"{cls['before']} -> {cls['after']}"
        elif r["kind"] == "code_change":
            cls_text = "-"
        else:
            cls_text = "not measured"
        speed = f"{c['speedup']:.2f}x" if c.get("speedup") else "-"
        verdict = r["verdict"]
        if r["kind"] == "measured" and not any((r.get("applied") or {}).values()):
            verdict += " (unchanged)"
        lines.append(f"{r['remedy'][:30]:30} {_fmt(c.get('before_ms'), '10.2f')} "
                     f"{_fmt(c.get('after_ms'), '10.2f')} {speed:>8}  {ci_text:15} {verdict:21} {cls_text}")
    lines.append("")
    for r in result["results"]:
        detail = []
        if r["kind"] == "code_change":
            what = r.get("code") or r.get("text") or ""
            src = f" (rule {r['rule']})" if r.get("rule") else ""
            lines.append(f"{r['remedy']}: needs a code change{src}; not measured")
            lines.extend("    " + x for x in what.rstrip().splitlines())
            continue
        detail += r.get("changes", [])
        detail += r.get("notes", [])
        est = r.get("estimate")
        if est and est.get("expected"):
            rng = est.get("range")
            detail.append(f"predicted {est['expected']:.2f}x"
                          + (f" ({rng[0]:.2f}-{rng[1]:.2f}x)" if rng else "")
                          + f" by {est.get('from', 'the diagnosis')}"
                          + (f" ({est['rule']})" if est.get("rule") else "")
                          + f"; measured {est['measured']:.2f}x: "
                          + ("inside the predicted range" if est.get("inside_range") else
                             "OUTSIDE the predicted range")
                          + (f", {est['error']:+.0%} from the expectation" if est.get("error") is not None else ""))
            if est.get("baseline_moved"):
                detail.append(f"the step as is took {est['step_ms_measured']:.2f} ms here and "
                              f"{est['step_ms']:.2f} ms when diagnosed ({est['baseline_moved']:.2f}x): the "
                              "host ran the same step at another speed, and the expectation is "
                              "relative to the diagnosed step (docs/verdict.md, 'The range')")
        elif est and est.get("up_to"):
            detail.append(f"the diagnosis bounded it at {est['up_to']:.2f}x ({est['rule']}); "
                          f"measured {est['measured']:.2f}x: "
                          + ("ABOVE the bound (please report it)" if est["above_bound"] else "within the bound"))
        elif r["kind"] == "measured":
            detail.append("no prediction: run it after `navdoctor diagnose` (diagnose --verify), or "
                          "with --classify, to see the predicted speed-up beside the measured one")
        cls = r.get("class") or {}
        if cls.get("note") and cls["note"] != NOT_MEASURED and r["kind"] == "measured":
            detail.append(f"class: {cls['note']}")
        elif cls.get("changed") is not None:
            before, after = cls.get("before_detail", {}), cls.get("after_detail", {})
            detail.append(f"class: {class_text(cls['before'], before)} -> "
                          f"{class_text(cls['after'], after)} (profiled: "
                          f"{_fmt(before.get('step_ms'), '.1f')} -> {_fmt(after.get('step_ms'), '.1f')} "
                          f"ms/step; findings {', '.join(after.get('findings', [])) or 'none'})")
        if detail:
            lines.append(f"{r['remedy']}:")
            lines.extend(f"    {d}" for d in detail)
    if any((r.get("class") or {}).get("note") == NOT_MEASURED for r in result["results"]):
        lines.append("class: " + NOT_MEASURED)
    lines.append(f"run directory: {result['run_dir']} (per-run logs and step times)")
    return "\n".join(lines)


def emit(result: dict, json_path: str | None, quiet: bool, to_stderr: bool = False,
         html_path: str | None = None) -> None:
    import click
    from ..report import write_atomic
    text = result_to_json(result)
    write_atomic(str(Path(result["run_dir"], "verify.json")), text)
    if html_path:
        from ..reporters.html import render_verify_html
        write_atomic(html_path, render_verify_html(result))
        if not quiet:
            click.echo(f"HTML: {html_path}", err=to_stderr or json_path == "-")
    if json_path == "-":
        click.echo(text, nl=False)
        return
    if json_path:
        write_atomic(json_path, text)
    if not quiet:
        from ..textsafe import terminal_text
        click.echo("\n".join(terminal_text(line) for line in render_table(result).split("\n")),
                   err=to_stderr)
        if json_path:
            click.echo(f"JSON: {json_path}", err=to_stderr)


def verify_after_diagnose(report, script: str | None, args: list[str], run_dir: Path,
                          progress: Callable[[str], None], quiet: bool, to_stderr: bool) -> None:
    """`navdoctor diagnose --verify`: measure the remedies the diagnosis's findings suggest.
    Its problems are reported on one line and leave the diagnosis's exit code alone."""
    import click
    from ..collect.diagnose import BUNDLED_WORKLOAD
    plan = plan_from_report(report, script or str(BUNDLED_WORKLOAD), args)
    if not plan.arms and not plan.code_changes:
        progress("verify: no finding suggests a remedy")
        return
    settings = Settings(classify=True)
    try:
        progress(f"verify: {len(plan.arms)} remedy(ies) to measure, {settings.repeats} runs each, "
                 "interleaved with the baseline")
        result = verify(plan, settings, run_dir / "verify", progress)
        result["diagnosis"] = {"bound": report.verdict.bound, "report": str(run_dir / "report.json")}
        emit(result, None, quiet, to_stderr, html_path=str(run_dir / "verify" / "verify.html"))
    except NavdoctorError as e:
        from ..textsafe import terminal_text
        click.echo(f"navdoctor: verify: {terminal_text(str(e))}", err=True)
