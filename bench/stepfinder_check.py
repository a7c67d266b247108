"""How well steps are inferred where the truth is known: traces that carry step markers
(ProfilerStep#N, navdoctor.step#N) are loaded, their markers hidden (and navdoctor's own
DataLoader ranges, which a hand-made capture would not have), and stepfinder infers steps from
what is left. The inferred steps are compared with the marked ones: count, median length.

Also the calibration of MIN_PERIOD_SCORE: the period score of every real call sequence, and of
the same sequences shuffled (same calls, no order: what "no repeating structure" scores).

    python bench/stepfinder_check.py [TRACE_OR_DIR ...]

Without arguments: fixtures/gpu/*/ and ../shared/public-traces/ (where present). Prints one
line per trace and a summary; nothing is written.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import duckdb
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from navdoctor import breakdown, store, stepfinder  # noqa: E402
from navdoctor.analysis import load_inputs  # noqa: E402
from navdoctor.errors import NavdoctorError  # noqa: E402

TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".sqlite", ".sqlite.gz")


def traces(args: list[str]) -> list[Path]:
    roots = [Path(a) for a in args] or [ROOT / "fixtures" / "gpu", ROOT.parent / "shared" / "public-traces"]
    out = []
    for r in roots:
        if r.is_file():
            out.append(r)
        elif r.is_dir():
            out += sorted(p for p in r.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                          and "labels" not in p.name)
    return out


def check(path: Path, rng: np.random.Generator) -> dict | None:
    con = duckdb.connect(":memory:")
    try:
        store.create_schema(con)
        load_inputs(con, [str(path)])
        if con.execute("SELECT count(*) FROM steps").fetchone()[0] < stepfinder.MIN_STEPS + 1:
            return None
        # Both sets of steps as the verdict sees them: aligned to the GPU work they launched.
        origin = con.execute("SELECT any_value(origin) FROM steps").fetchone()[0]
        breakdown.align_steps_to_gpu(con)
        marked = con.execute("""SELECT count(*), median(end_ns - start_ns) FROM steps""").fetchone()
        con.execute("DELETE FROM steps")
        con.execute("""DELETE FROM nvtx_ranges WHERE name LIKE 'ProfilerStep#%'
                       OR name LIKE 'navdoctor.step#%' OR name = 'navdoctor.dataloader_next'""")
        con.execute("DELETE FROM dataloader_waits WHERE name = 'navdoctor.dataloader_next'")
        seq = stepfinder._call_sequence(con, 1)
        real = shuffled = None
        if seq is not None:
            tok = seq[2]
            real = stepfinder.find_period(tok)
            shuffled = stepfinder.find_period(rng.permutation(tok))
            real_score = _best_score(tok)
            shuffled_score = _best_score(rng.permutation(tok))
        inf = stepfinder.infer_steps(con).get(1)
        breakdown.align_steps_to_gpu(con)
        got = con.execute("SELECT count(*), median(end_ns - start_ns) FROM steps").fetchone()
    except NavdoctorError as e:
        print(f"  skipped {path}: {e}")
        return None
    finally:
        con.close()
    return {"trace": str(path.relative_to(ROOT.parent) if ROOT.parent in path.parents else path),
            "marker": origin, "marked": marked[0], "marked_ms": marked[1] / 1e6,
            "method": inf.method if inf else "none", "inferred": got[0],
            "inferred_ms": (got[1] or 0) / 1e6,
            "score": real_score if seq is not None else None,
            "shuffled_score": shuffled_score if seq is not None else None,
            "period_found": real is not None, "shuffled_found": shuffled is not None}


def _best_score(tok: np.ndarray) -> float | None:
    """find_period's best score with no threshold (MIN_PERIOD_SCORE set to 0 for the call)."""
    keep = stepfinder.MIN_PERIOD_SCORE
    stepfinder.MIN_PERIOD_SCORE = 0.0
    try:
        found = stepfinder.find_period(tok)
    finally:
        stepfinder.MIN_PERIOD_SCORE = keep
    return None if found is None else found[1]


def main() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for p in traces(sys.argv[1:]):
        r = check(p, rng)
        if r is None:
            continue
        rows.append(r)
        ratio = r["inferred_ms"] / r["marked_ms"] if r["marked_ms"] else float("nan")
        fmt = lambda s: "-" if s is None else f"{s:.2f}"  # noqa: E731
        print(f"{r['trace']}\n    {r['marked']} {r['marker']} steps, median {r['marked_ms']:.2f} ms | "
              f"inferred ({r['method']}): {r['inferred']} steps, median {r['inferred_ms']:.2f} ms "
              f"(x{ratio:.2f}) | period score {fmt(r['score'])}, shuffled {fmt(r['shuffled_score'])}")
    if not rows:
        print("no marked traces found")
        return
    good = [r for r in rows if r["marked_ms"] and abs(r["inferred_ms"] / r["marked_ms"] - 1) <= 0.15]
    scores = [r["score"] for r in rows if r["score"] is not None]
    shuffled = [r["shuffled_score"] for r in rows if r["shuffled_score"] is not None]
    print(f"\n{len(rows)} marked traces; inferred median step within 15% of the marked one: "
          f"{len(good)}/{len(rows)}")
    if scores:
        print(f"period score, real sequences: min {min(scores):.2f}, median "
              f"{statistics.median(scores):.2f}; shuffled: max {max(shuffled):.2f}, median "
              f"{statistics.median(shuffled):.2f}; threshold MIN_PERIOD_SCORE = "
              f"{stepfinder.MIN_PERIOD_SCORE}")
        for cut in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
            print(f"  at {cut:.1f}: real sequences kept {sum(s >= cut for s in scores)}/{len(scores)}, "
                  f"shuffled kept {sum(s >= cut for s in shuffled)}/{len(shuffled)}")


if __name__ == "__main__":
    main()
