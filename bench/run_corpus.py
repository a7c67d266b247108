"""Run the labelled corpus through `navdoctor diagnose` and score the verdicts.

    python bench/run_corpus.py [--only ID,...] [--runs-dir DIR] [--archive PATH] [--timing-repeats N]

For every entry of bench/corpus.yaml: `navdoctor diagnose` (both passes when nsys is there),
then the confusion matrix of expected against diagnosed class. With --timing-repeats N, each
before/after pair is also run N times without profiling, interleaved, and the median step time
(and its spread) is printed. --archive packs each run's traces and report into one .tar.gz.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CLASSES = ["io", "compute", "memory", "launch", "balanced", "unknown"]


def load_corpus(only: set[str] | None) -> list[dict]:
    entries = yaml.safe_load((ROOT / "bench" / "corpus.yaml").read_text())
    entries = entries["workloads"] if isinstance(entries, dict) else entries
    return [e for e in entries if not only or e["id"] in only]


def script_cmd(entry: dict) -> list[str]:
    script = entry["script"]
    path = ROOT / script if not script.startswith("-m") else None
    return ([str(path)] if path else script.split()) + [str(a) for a in entry.get("args", [])]


def diagnose(entry: dict, runs_dir: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "navdoctor.cli", "diagnose", "--out", str(runs_dir / entry["id"]),
           "-q", "--json", "-", *extra, *script_cmd(entry)]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    seconds = time.time() - t0
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        return {"bound": "error", "error": " | ".join(tail), "seconds": seconds}
    v = report["verdict"]
    return {"bound": v["bound"], "confidence": v["confidence"], "shares": v["shares"],
            "per_trace": {t["source"]: t["bound"] for t in v["per_trace"]},
            "findings": [f["rule"] for f in report["findings"]],
            "run_dir": (report.get("run") or {}).get("dir"), "seconds": seconds,
            "exit": proc.returncode}


def expected_ok(label: str, bound: str) -> bool:
    """label: a class, 'a|b', 'not:<class>', or 'healthy' (GPU-bound or balanced: none of
    the classes a remedy of the seed article targets besides compute)."""
    if label == "healthy":
        return bound in ("compute", "balanced")
    if label.startswith("not:"):
        return bound not in label[4:].split("|")
    return bound in label.split("|")


def step_time(entry: dict) -> float | None:
    proc = subprocess.run([sys.executable, *script_cmd(entry)], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    # bench/workloads: "median step time 12.34 ms"; navigation: "frame latency: median 12.3 ms"
    # or "step (32 frames) latency: median 96.1 ms"
    m = (re.search(r"median step time ([0-9.]+) ?ms", proc.stdout)
         or re.search(r"latency: median ([0-9.]+) ?ms", proc.stdout))
    return float(m.group(1)) if m else None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--only", help="comma-separated ids")
    p.add_argument("--runs-dir", default="navdoctor-runs/corpus")
    p.add_argument("--archive", help="write traces + reports of every run to this .tar.gz")
    p.add_argument("--timing-repeats", type=int, default=0)
    p.add_argument("--no-diagnose", action="store_true")
    p.add_argument("--diagnose-args", default="", help="extra args for diagnose, e.g. '--no-nsys'")
    p.add_argument("--fixtures", action="store_true",
                   help="no GPU needed: score the committed captures in fixtures/gpu instead")
    opts = p.parse_args()
    if opts.fixtures:
        return score_fixtures()
    entries = load_corpus(set(opts.only.split(",")) if opts.only else None)
    runs_dir = Path(opts.runs_dir)
    results = {}
    if not opts.no_diagnose:
        for e in entries:
            r = diagnose(e, runs_dir, opts.diagnose_args.split())
            results[e["id"]] = r
            ok = expected_ok(e["label"], r["bound"])
            print(f"{'OK ' if ok else 'BAD'} {e['id']:32} expected {e['label']:18} got {r['bound']:9} "
                  f"conf {r.get('confidence', 0):.2f} {r.get('per_trace', '')} "
                  f"shares {json.dumps(r.get('shares', {}))} ({r['seconds']:.0f}s) {r.get('error', '')}",
                  flush=True)
            print(f"    findings: {r.get('findings')}", flush=True)
        print_matrix(entries, results)
        if opts.archive:
            pack(results, Path(opts.archive))
    if opts.timing_repeats:
        print_timings(entries, opts.timing_repeats)
    bad = [e["id"] for e in entries if e["id"] in results and not expected_ok(e["label"], results[e["id"]]["bound"])]
    print(f"\n{len(results) - len(bad)}/{len(results)} verdicts as labelled" + (f"; wrong: {bad}" if bad else ""))
    return 1 if bad else 0


def score_fixtures() -> int:
    """Confusion matrix of the committed H200 captures (fixtures/gpu/labels.yaml)."""
    sys.path.insert(0, str(ROOT))
    from navdoctor.analysis import analyze
    from navdoctor.rules import load_rules
    labels = yaml.safe_load((ROOT / "fixtures/gpu/labels.yaml").read_text())["fixtures"]
    rules = load_rules()
    entries, results = [], {}
    for name, e in labels.items():
        d = ROOT / "fixtures/gpu" / name
        a = analyze([str(d / "kineto.json.gz"), str(d / "nsys.sqlite.gz")], rules)
        label = e["label"] if not e.get("fixed_of") else f"fixed:{labels[e['fixed_of']]['label']}"
        entries.append({"id": name, "label": label})
        results[name] = {"bound": a.verdict.bound}
        fired = [f.rule.id for f in a.findings]
        print(f"{name:28} label {e['label']:8} verdict {a.verdict.bound:8} conf {a.verdict.confidence:.2f} "
              f"step {a.verdict.step_ms:8.2f} ms  findings {', '.join(fired)}")
    print_matrix(entries, results)
    wrong = [n for n, e in labels.items() if not expected_ok(e["label"], results[n]["bound"])]
    print(f"\n{len(labels) - len(wrong)}/{len(labels)} verdicts as labelled" + (f"; wrong: {wrong}" if wrong else ""))
    return 1 if wrong else 0


def print_matrix(entries: list[dict], results: dict) -> None:
    rows = {}
    for e in entries:
        if e["id"] not in results:
            continue
        label = e["label"] if not e["label"].startswith("not:") else "healthy(" + e["label"] + ")"
        rows.setdefault(label, {}).setdefault(results[e["id"]]["bound"], 0)
        rows[label][results[e["id"]]["bound"]] += 1
    cols = sorted({c for r in rows.values() for c in r}, key=lambda c: CLASSES.index(c) if c in CLASSES else 99)
    print("\nconfusion matrix (rows: expected, columns: diagnosed)")
    print(f"{'':28}" + "".join(f"{c:>10}" for c in cols))
    for label, counts in sorted(rows.items()):
        print(f"{label:28}" + "".join(f"{counts.get(c, 0):>10}" for c in cols))


def print_timings(entries: list[dict], repeats: int) -> None:
    by_id = {e["id"]: e for e in entries}
    pairs = [(by_id[e["fixed_of"]], e) for e in entries if e.get("fixed_of") in by_id]
    print(f"\nstep time before/after the remedy (median of {repeats} runs, interleaved; spread = min..max)")
    for before, after in pairs:
        times = {"before": [], "after": []}
        for _ in range(repeats):
            for key, entry in (("before", before), ("after", after)):
                t = step_time(entry)
                if t is not None:
                    times[key].append(t)
        if not times["before"] or not times["after"]:
            print(f"  {after['id']}: no timing printed")
            continue
        b, a = statistics.median(times["before"]), statistics.median(times["after"])
        print(f"  {before['id']:28} {b:9.2f} ms [{min(times['before']):.2f}..{max(times['before']):.2f}]"
              f"  -> {after['id']:28} {a:9.2f} ms [{min(times['after']):.2f}..{max(times['after']):.2f}]"
              f"  speedup {b / a:5.2f}x", flush=True)


def pack(results: dict, archive: Path) -> None:
    with tarfile.open(archive, "w:gz") as tar:
        for rid, r in results.items():
            d = r.get("run_dir")
            if not d:
                continue
            for name in ("kineto.json.gz", "nsys.sqlite", "report.json", "torch-pass.log", "nsys-pass.log"):
                f = ROOT / d / name if not Path(d).is_absolute() else Path(d) / name
                if f.exists():
                    tar.add(f, arcname=f"{rid}/{name}")
    print(f"archive: {archive} ({archive.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    sys.exit(main())
