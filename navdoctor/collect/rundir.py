"""A `navdoctor diagnose` run directory read back: its traces and what the run itself measured,
so that `navdoctor analyze RUN_DIR` (and `compare`) judge it as diagnose did, with the rules and
the navdoctor of today (docs/diagnose.md, "The run directory").

What diagnose leaves (collect/diagnose.py): `kineto.json.gz` (pass 1), `nsys.sqlite` or
`nsys-whole.sqlite` (pass 2), `status-*.json` per pass (the timing runs' statuses hold every
step's time and DataLoader wait), and `report.json`, whose `run` holds the figures the analysis
was given (`unprofiled_step_ms`, `unprofiled_loader_wait_ms`, `unprofiled_loader_waits_ms`).
Those figures are taken from `run` where it is there, else worked out from the timing runs'
statuses as diagnose works them out.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import NavdoctorError

# The traces of a run directory, in the order diagnose analyses them (pass 1, then pass 2);
# a gzipped copy is taken where the plain file is not there.
TRACE_NAMES = (("kineto.json.gz", "kineto.json"),
               ("nsys.sqlite", "nsys.sqlite.gz", "nsys-whole.sqlite", "nsys-whole.sqlite.gz"))
TIMING_RUNS = ("timing", "timing2")


@dataclass
class RunRecord:
    path: Path
    traces: list[str]
    run: dict | None = None                 # report.json's `run`, as diagnose wrote it
    unprofiled_step_ms: float | None = None
    loader_waits_ms: list[float] | None = None
    # each timing run's step without a tracer (two processes where a DataLoader fed the GPU):
    # what the same script gives from one process to the next, measured on its machine
    timing_runs_ms: list[float] = field(default_factory=list)
    source: str = "report.json"             # where the timing figures came from


def is_run_dir(path: str | Path) -> bool:
    """A directory holding a diagnose run's traces (or its report.json)."""
    p = Path(path)
    return p.is_dir() and any((p / n).is_file() for names in TRACE_NAMES for n in names)


def _read_json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def read_run_dir(path: str | Path) -> RunRecord:
    """The run directory's traces and timing figures; a NavdoctorError where it holds none."""
    from ..steady import steady_run_ms
    from .diagnose import timing_window
    p = Path(path)
    traces = []
    for names in TRACE_NAMES:
        found = next((p / n for n in names if (p / n).is_file()), None)
        if found is not None:
            traces.append(str(found))
    if not traces:
        raise NavdoctorError(f"{path}: is a directory, not a trace file nor a `navdoctor diagnose` "
                             "run directory (no kineto.json.gz or nsys.sqlite in it): give trace "
                             "files, a run directory, or --ranks DIR for the ranks of one job")
    report = _read_json(p / "report.json")
    run = report.get("run") if isinstance(report.get("run"), dict) else None
    record = RunRecord(p, traces, run)
    # the timing runs, as collect/diagnose.py's _timing_pass reads them
    nsys_traced = any("nsys" in Path(t).name for t in traces)
    traced = _read_json(p / ("status-nvtx.json" if nsys_traced else "status-torch.json"))
    skip, _ = timing_window(traced) if traced else (0, 0)
    runs = []
    for mode in TIMING_RUNS:
        st = _read_json(p / f"status-{mode}.json")
        steps = [x for x in (st.get("step_ms") or []) if _number(x) is not None][skip:]
        if st.get("exit_code") or len(steps) < 3:
            continue
        waits = st.get("loader_wait_ms")
        runs.append(steady_run_ms(steps, waits[skip:] if isinstance(waits, list) else None))
    record.timing_runs_ms = [r[0] for r in runs if r[0] is not None]
    if run is not None and ("unprofiled_step_ms" in run):
        record.unprofiled_step_ms = _number(run.get("unprofiled_step_ms"))
        waits = run.get("unprofiled_loader_waits_ms")
        one = _number(run.get("unprofiled_loader_wait_ms"))
        if isinstance(waits, list) and all(_number(w) is not None for w in waits) and waits:
            record.loader_waits_ms = [float(w) for w in waits]
        elif one is not None:
            record.loader_waits_ms = [one]
        return record
    # no report.json (diagnose's analysis failed, say): the timing runs' own statuses
    record.source = "status files"
    if runs:
        first = runs[0]
        record.unprofiled_step_ms = first[0]
        if first[1] is not None:
            record.loader_waits_ms = [first[1]]
            if len(runs) > 1 and runs[1][1] is not None:
                record.unprofiled_step_ms = (first[0] + runs[1][0]) / 2
                record.loader_waits_ms.append(runs[1][1])
    return record
