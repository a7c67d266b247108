"""Run the labelled corpus through `navdoctor diagnose` and score the verdicts.

    python bench/run_corpus.py [--only ID,...] [--runs-dir DIR] [--archive PATH] [--timing-repeats N]
                               [--results FILE [--resume] [--budget SECONDS]]

For every entry of bench/corpus.yaml: `navdoctor diagnose` (both passes when nsys is there),
then the confusion matrix of expected against diagnosed class. With --timing-repeats N, each
before/after pair is also run N times without profiling, interleaved, and the median step time
(and its spread) is printed. --archive packs each run's traces and report into one .tar.gz.

--results FILE appends each entry's verdict to FILE as one JSON line (with the machine and the
time), as soon as it is known. With --resume, entries whose verdict is there already (same
script and args; the last line of an id wins) are not run again and the matrix covers
them all; with --budget, no entry is started after that many seconds. So the whole corpus,
which takes longer than one call to the GPU machine may run, is one command repeated until
it says "all N entries".
"""
from __future__ import annotations

import argparse
import datetime
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


def entry_key(entry: dict) -> dict:
    """What a kept verdict must match to be reused: the command that was diagnosed. (The
    label is not part of it: a verdict does not depend on what was expected of it.)"""
    return {"script": entry["script"], "args": [str(a) for a in entry.get("args", [])]}


def machine() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return out.splitlines()[0] if out else "no NVIDIA GPU"


def load_kept(results: Path, entries: list[dict]) -> dict:
    saved = {}
    if results.exists():
        for line in results.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:   # blank, or cut short by a run stopped while writing it
                continue
            saved[record["id"]] = record
    kept = {}
    for e in entries:
        record = saved.get(e["id"])
        # Only the fields entry_key has now: earlier records also kept the label in "key".
        if record and {k: record.get("key", {}).get(k) for k in ("script", "args")} == entry_key(e):
            kept[e["id"]] = record["result"] | {"kept": f"{record['finished']} on {record['machine']}"}
    return kept


def keep(results: Path, entry: dict, result: dict, gpu: str) -> None:
    record = {"id": entry["id"], "key": entry_key(entry), "machine": gpu,
              "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "result": result}
    results.parent.mkdir(parents=True, exist_ok=True)
    with results.open("a") as f:   # one line per entry, written when it is known
        f.write(json.dumps(record) + "\n")


def print_result(entry: dict, r: dict) -> None:
    ok = expected_ok(entry["label"], r["bound"])
    when = f"kept from {r['kept']}" if r.get("kept") else f"{r['seconds']:.0f}s"
    print(f"{'OK ' if ok else 'BAD'} {entry['id']:32} expected {entry['label']:18} got {r['bound']:9} "
          f"conf {r.get('confidence', 0):.2f} {r.get('per_trace', '')} "
          f"shares {json.dumps(r.get('shares', {}))} ({when}) {r.get('error', '')}", flush=True)
    print(f"    findings: {r.get('findings')}", flush=True)


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
    p.add_argument("--results", metavar="FILE", help="append each entry's verdict to FILE (JSON lines)")
    p.add_argument("--resume", action="store_true",
                   help="with --results: reuse the verdicts kept there; run only the others")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="start no entry after this many seconds (then rerun with --resume)")
    opts = p.parse_args()
    if opts.resume and not opts.results:
        p.error("--resume needs --results FILE")
    if opts.fixtures:
        return score_fixtures()
    entries = load_corpus(set(opts.only.split(",")) if opts.only else None)
    runs_dir = Path(opts.runs_dir)
    results_file = Path(opts.results) if opts.results else None
    results = load_kept(results_file, entries) if opts.resume else {}
    not_run = []
    if not opts.no_diagnose:
        gpu, started = machine(), time.time()
        for e in entries:
            if e["id"] in results:
                print_result(e, results[e["id"]])
                continue
            if opts.budget is not None and time.time() - started >= opts.budget:
                not_run.append(e["id"])
                continue
            r = diagnose(e, runs_dir, opts.diagnose_args.split())
            results[e["id"]] = r
            if results_file and r["bound"] != "error":
                keep(results_file, e, r, gpu)
            print_result(e, r)
        print_matrix(entries, results)
        if opts.archive:
            pack(results, Path(opts.archive))
    if opts.timing_repeats:
        print_timings(entries, opts.timing_repeats)
    bad = [e["id"] for e in entries if e["id"] in results and not expected_ok(e["label"], results[e["id"]]["bound"])]
    print(f"\n{len(results) - len(bad)}/{len(results)} verdicts as labelled" + (f"; wrong: {bad}" if bad else ""))
    if not opts.no_diagnose:
        print(f"all {len(entries)} entries" if not not_run else
              f"{len(not_run)} of {len(entries)} entries not run (budget spent): {','.join(not_run)}; "
              "run the same command again with --resume")
    return 1 if bad else (3 if not_run else 0)


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
