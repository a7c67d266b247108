"""Issue #18's checks over run_cases.py's cases.jsonl (one or several files, later lines win).

    python bench/thirdparty/summarise.py RESULTS/cases.jsonl [MORE.jsonl ...]

Per case: the script's own meters (unprofiled, and in each profiled run), then for `diagnose`
and each hand capture: steps against the script's iterations (+-10%), the median step against
the script's own median iteration in that same run (+-15%; for `diagnose`, over the iterations
its schedule recorded: the profiler slows the frames it records, so the whole run's median is
not the yardstick there), the class against diagnose's, and for train.py the data share
against the script's (+-10 points).
"""
from __future__ import annotations

import json
import statistics
import sys


def load(paths: list[str]) -> dict[tuple[str, str], dict]:
    rows = {}
    for p in paths:
        for line in open(p):
            if line.strip():
                r = json.loads(line)
                rows[(r["case"], r["stage"])] = r
    return rows


def ok(flag: bool) -> str:
    return "ok  " if flag else "FAIL"


def check_trace(label: str, kept: dict, meters: dict, expect_steps: int | None) -> list[str]:
    out = []
    med = meters.get("median_ms")
    for trace, k in kept.items():
        line = f"    {label} {trace}: {k['steps']} steps ({k['origin']})"
        if expect_steps:
            line += f" vs {expect_steps} {ok(abs(k['steps'] - expect_steps) <= 0.1 * expect_steps)}"
        if med:
            line += (f"; median step {k['median_step_ms']:.1f} ms vs the script's {med:.1f} ms "
                     f"{ok(abs(k['median_step_ms'] - med) <= 0.15 * med)}")
        out.append(line)
        if k.get("inference"):
            out.append(f"      {k['inference']}")
    return out


def recorded(meters: dict, recording: dict | None) -> dict:
    """The script's meters over the iterations the schedule recorded (steps wait+warmup on,
    `active` of them), when the run's per-iteration times are known."""
    times = meters.get("iter_ms")
    if not times or not recording:
        return meters
    first = recording["wait"] + recording["warmup"]
    window = times[first:first + recording["active"]]
    return {**meters, "median_ms": statistics.median(window)} if window else meters


def main() -> None:
    rows = load(sys.argv[1:])
    cases = sorted({c for c, _ in rows})
    for case in cases:
        plain = rows.get((case, "plain"), {}).get("meters", {})
        print(f"== {case}: unprofiled {plain.get('iterations')} iterations, median "
              f"{plain.get('median_ms')} ms, data share {plain.get('data_share')}")
        diag = rows.get((case, "diagnose"))
        diag_bound = None
        if diag and diag.get("report"):
            rep = diag["report"]
            diag_bound = rep["bound"]
            line = (f"  diagnose: {rep['bound']} ({rep['confidence']}), data {rep['shares']['data']:.2f}, "
                    f"{rep['steps']} steps, step source {rep.get('run', {}).get('step_source')}")
            if plain.get("data_share") is not None:
                line += f"; data share vs script {ok(abs(rep['shares']['data'] - plain['data_share']) <= 0.10)}"
                expect_io = plain["data_share"] >= 0.5
                line += f"; class follows {ok((rep['bound'] == 'io') == expect_io)}"
            print(line)
            passes = {p["pass"]: p for p in rep.get("run", {}).get("passes", [])}
            for p in passes.values():
                print(f"    pass {p['pass']}: {p['steps']} steps by {p['step_source']}"
                      f"{' (' + p['step_module'] + ')' if p.get('step_module') else ''}, "
                      f"recording {p.get('recording')}, whole run {p.get('whole_run')}")
            for note in rep.get("run", {}).get("notes") or []:
                print(f"    note: {note}")
            recording = next((p["recording"] for p in passes.values() if p.get("recording")), None)
            active = recording["active"] if recording else None
            pm = diag.get("pass_meters", {})
            for trace, k in (diag.get("kept") or {}).items():
                log = "nsys-pass.log" if "sqlite" in trace else "torch-pass.log"
                print("\n".join(check_trace("", {trace: k}, recorded(pm.get(log, plain), recording),
                                             active)))
        elif diag:
            print(f"  diagnose: failed (rc {diag.get('rc')})")
        for kind in ("nsys", "torch"):
            h = rows.get((case, f"hand-{kind}"))
            if not h:
                continue
            if not h.get("report"):
                print(f"  hand {kind}: no report (capture rc {h.get('capture_rc')}, "
                      f"analyze rc {h.get('analyze_rc')})")
                continue
            rep = h["report"]
            line = f"  hand {kind}: {rep['bound']} ({rep['confidence']}), data {rep['shares']['data']:.2f}"
            if diag_bound:
                line += f"; same class as diagnose {ok(rep['bound'] == diag_bound)}"
            print(line)
            meters = h.get("meters") or plain
            print("\n".join(check_trace("", h.get("kept") or {}, meters, meters.get("iterations"))))


if __name__ == "__main__":
    main()
