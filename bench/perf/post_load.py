#!/usr/bin/env python3
"""Time the phases of an analysis that come after the load, without paying the load each time.

    # once: load a trace into a store file (nothing else)
    python bench/perf/post_load.py save TRACE BASE.duckdb
    # each time: copy BASE into memory, then step inference, alignment, breakdown, views,
    # rules, verdict, with each phase's wall and CPU time
    python bench/perf/post_load.py run BASE.duckdb [--keep OUT.duckdb] [--json REPORT]

`run` works on an in-memory copy of BASE (as `analyze` without --db does), under the same
DuckDB settings; --keep writes the analysed store to OUT (for comparing two versions).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import duckdb  # noqa: E402

from navdoctor import analysis, breakdown, engine, profiling, stepfinder, store, views  # noqa: E402
from navdoctor import verdict as verdict_mod  # noqa: E402


def save(trace: str, base: str) -> None:
    con = store.connect_new(base)
    store.create_schema(con)
    t0 = time.perf_counter()
    analysis.load_inputs(con, [trace])
    con.execute("CHECKPOINT")
    con.close()
    print(f"loaded {trace} into {base} in {time.perf_counter() - t0:.1f} s")


def run(base: str, keep: str | None, report: str | None) -> None:
    from navdoctor.rules import load_rules
    rules = load_rules([])
    for r in rules:
        engine.check_read_only(r)
    con = duckdb.connect(keep or ":memory:")
    store.configure(con)
    con.execute(f"ATTACH '{base}' AS base (READ_ONLY)")
    con.execute("COPY FROM DATABASE base TO " + ("memory" if not keep else con.execute(
        "SELECT current_database()").fetchone()[0]))
    con.execute("DETACH base")
    con.execute("CHECKPOINT")
    for macro in store.MACROS:
        con.execute(macro)
    store.register_functions(con)
    profiling.start()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    with profiling.phase("steps.infer"):
        inferred = stepfinder.infer_steps(con)
        breakdown.ensure_steps(con)
    with profiling.phase("steps.align_to_gpu"):
        breakdown.align_steps_to_gpu(con)
    with profiling.phase("breakdown"):
        breakdown.compute_breakdown(con)
    with profiling.phase("views"):
        views.create_views(con)
    if not keep:
        engine.lock_down(con)
    with profiling.phase("rules"):
        ev = engine.evaluate_rules(con, rules)
    with profiling.phase("verdict"):
        verdict = verdict_mod.compute_verdict(con)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    phases = profiling.stop()
    for p in phases:
        if p["phase"].count(".") <= 1 or p["wall_s"] >= 0.05:
            print(f"  {p['phase']:<44} {p['wall_s']:8.3f} wall {p['cpu_s']:8.3f} cpu")
    print(f"  {'total after load':<44} {wall:8.3f} wall {cpu:8.3f} cpu   "
          f"(load avg {os.getloadavg()[0]:.2f})")
    if report:
        with open(report, "w") as f:
            json.dump({"verdict": repr(verdict), "failures": [repr(x) for x in ev.failures],
                       "findings": sorted(repr((x.rule.id, x.metrics, x.message)) for x in ev.findings),
                       "inferred": repr(inferred), "phases": phases}, f, indent=1)
    con.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("trace")
    s.add_argument("base")
    r = sub.add_parser("run")
    r.add_argument("base")
    r.add_argument("--keep")
    r.add_argument("--json")
    a = ap.parse_args()
    if a.cmd == "save":
        save(a.trace, a.base)
    else:
        run(a.base, a.keep, a.json)


if __name__ == "__main__":
    main()
