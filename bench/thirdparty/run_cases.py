"""Issue #18's evidence on the GPU machine: third-party scripts, each run unprofiled (its own
meters), under `navdoctor diagnose`, and captured by hand (plain `nsys profile` as the seed
article shows it; a plain torch.profiler.profile() around the script) then `navdoctor analyze`d.

    python bench/thirdparty/run_cases.py WORK RESULTS [--cases a,b] [--budget SECONDS]

WORK: scratch space (data sets, run directories, captures); RESULTS: cases.jsonl (one line per
stage of each case, written as it finishes, so a killed call keeps what it did), the logs, the
reports, and the hand captures packed for the trip back (pack_results). Cases already in
RESULTS/cases.jsonl are skipped, so a later run with the same RESULTS resumes. Summarise with
bench/thirdparty/summarise.py RESULTS/cases.jsonl.

Nothing here reads navdoctor's internals: it drives the CLI and reads the report and the
DuckDB file the CLI writes (the median step over the steps the verdict kept).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TRAIN = ROOT / ".gpu" / "thirdparty" / "vision_classification" / "train.py"
PY = sys.executable
WINDOW = 20   # torchvision's MetricLogger prints the mean of the last 20 iterations

# Each case: the script and its arguments ({small}, {large}, {frames} filled in), whether it
# is captured by hand too, and how its own meters are read.
CASES = {
    "train_w0": dict(script=str(TRAIN), meters="train", workers=0, hand=True, data="small"),
    "train_w2": dict(script=str(TRAIN), meters="train", workers=2, hand=False, data="small"),
    "train_w4": dict(script=str(TRAIN), meters="train", workers=4, hand=False, data="small"),
    "train_w12": dict(script=str(TRAIN), meters="train", workers=12, hand=True, data="large"),
    "yolo_seg_stream": dict(script=str(HERE / "yolo_stream.py"), meters="frames", hand=True,
                            args=["--frames", "{frames}", "--device", "0"]),
    "frame_loop": dict(script=str(HERE / "frame_loop.py"), meters="frames", hand=True,
                       args=["--frames", "{frames}", "--device", "cuda"]),
    "nav_realtime": dict(script=None, meters="nav", hand=False, args=[]),
}
DATA = {"small": (2048, 10), "large": (4608, 10)}   # train images (32 and 72 batches of 64)
FRAMES = 120


def train_args(case: dict, work: Path) -> list[str]:
    return ["--data-path", str(work / f"imagefolder-{case['data']}"), "--model", "resnet50",
            "--batch-size", "64", "--epochs", "1", "--workers", str(case["workers"]),
            "--print-freq", "1", "--output-dir", ""]


def case_command(name: str, work: Path) -> tuple[str | None, list[str]]:
    case = CASES[name]
    if case["meters"] == "train":
        return case["script"], train_args(case, work)
    return case["script"], [a.format(frames=work / "frames") for a in case["args"]]


# --- the scripts' own meters ------------------------------------------------------------------

TRAIN_LINE = re.compile(r"Epoch: \[\d+\]\s+\[\s*(\d+)/(\d+)\].*?img/s: ([\d.eE+-]+).*?"
                        r"time: ([\d.]+)\s+data: ([\d.]+)")
FRAME_LINE = re.compile(r"^frame (\d+) ms ([\d.]+)", re.M)


def unwindow(means: list[float], window: int = WINDOW) -> list[float]:
    """Per-iteration values from the running means of the last `window` values."""
    xs: list[float] = []
    for i, m in enumerate(means):
        prev = means[i - 1] if i else 0.0
        xs.append((i + 1) * m - i * prev if i < window else xs[i - window] + window * (m - prev))
    return xs


def train_meters(log: str, workers: int) -> dict:
    rows = [m.groups() for m in TRAIN_LINE.finditer(log)]
    if not rows:
        return {"error": "no meter lines"}
    iter_s = unwindow([float(r[3]) for r in rows])
    data_s = unwindow([float(r[4]) for r in rows])
    # Steady: after the cold start and the loader's prefetch buffer (workers x 2 batches).
    skip = max(5, 2 * workers + 3)
    it, da = iter_s[skip:], data_s[skip:]
    return {"iterations": len(rows), "steady_from": skip,
            "median_ms": round(statistics.median(it) * 1e3, 2),
            "mean_ms": round(statistics.fmean(it) * 1e3, 2),
            "data_share": round(sum(da) / sum(it), 4),
            "data_share_last_window": round(float(rows[-1][4]) / float(rows[-1][3]), 4),
            "iter_ms": [round(x * 1e3, 2) for x in iter_s],
            "data_ms": [round(x * 1e3, 2) for x in data_s]}


def frame_meters(log: str) -> dict:
    times = [float(m.group(2)) for m in FRAME_LINE.finditer(log)]
    if not times:
        return {"error": "no frame lines"}
    steady = times[5:] or times
    return {"iterations": len(times), "steady_from": 5,
            "median_ms": round(statistics.median(steady), 2),
            "mean_ms": round(statistics.fmean(steady), 2), "iter_ms": times}


def nav_meters(log: str) -> dict:
    m = re.search(r"median[^\d]*([\d.]+) ?ms", log)
    return {"median_ms": float(m.group(1))} if m else {"error": "no median line"}


# --- navdoctor's side ---------------------------------------------------------------------------

def kept_steps(db: Path) -> dict:
    """Per trace: the median and count of the steps the verdict kept, and their origin."""
    import duckdb
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("""
            SELECT s.trace_id, i.path, count(*), median(s.end_ns - s.start_ns) / 1e6,
                   any_value(s.origin)
            FROM steady_steps s JOIN inputs i USING (trace_id) GROUP BY 1, 2 ORDER BY 1""").fetchall()
        inferred = {r[0]: r[1] for r in con.execute(
            "SELECT trace_id, note FROM step_inference").fetchall()}
    finally:
        con.close()
    return {Path(r[1]).name: {"steps": r[2], "median_step_ms": round(r[3], 3), "origin": r[4],
                              "inference": inferred.get(r[0])} for r in rows}


def summarise_report(path: Path) -> dict:
    rep = json.loads(path.read_text())
    v = rep["verdict"]
    out = {"bound": v["bound"], "confidence": v["confidence"], "steps": v["steps"],
           "step_ms": v["step_ms"], "step_source": v.get("step_source"),
           "shares": v["shares"], "notes": v["notes"], "disagreements": v["disagreements"],
           "per_trace": [{k: t.get(k) for k in ("source", "bound", "confidence", "steps",
                                                "step_ms", "step_origin", "stall_steps")}
                         | {"data": t["shares"].get("data")} for t in v["per_trace"]],
           "findings": [f["rule"] for f in rep["findings"]]}
    if rep.get("run"):
        out["run"] = {"step_source": rep["run"].get("step_source"), "notes": rep["run"].get("notes"),
                      "passes": [{k: p.get(k) for k in ("pass", "steps", "step_source", "step_module",
                                                        "whole_run", "recording", "seconds")}
                                 for p in rep["run"].get("passes", [])]}
    return out


# --- running ------------------------------------------------------------------------------------

def run(cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> tuple[int, float, str]:
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        rc, text = p.returncode, p.stdout
    except FileNotFoundError as e:
        rc, text = 127, str(e)
    except subprocess.TimeoutExpired as e:
        rc, text = 124, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    log.write_text(text)
    return rc, round(time.monotonic() - t0, 1), text


def navdoctor(*args: str) -> list[str]:
    return [PY, "-m", "navdoctor.cli", *args]


def record(results: Path, row: dict) -> None:
    with open(results / "cases.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: row[k] for k in row if k not in ("meters", "report")})[:400], flush=True)


def done_stages(results: Path) -> set[tuple[str, str]]:
    p = results / "cases.jsonl"
    if not p.exists():
        return set()
    return {(r["case"], r["stage"]) for r in map(json.loads, p.read_text().splitlines()) if r.get("ok")}


def prepare_data(work: Path, names: list[str]) -> None:
    for kind in {CASES[n].get("data") for n in names} - {None}:
        d = work / f"imagefolder-{kind}"
        if not d.exists():
            train, classes = DATA[kind]
            subprocess.run([PY, str(HERE / "make_images.py"), "imagefolder", str(d), "--train",
                            str(train), "--val", "128", "--classes", str(classes)], check=True)
    if not (work / "frames").exists():
        subprocess.run([PY, str(HERE / "make_images.py"), "frames", str(work / "frames"),
                        "--count", str(FRAMES)], check=True)


def meters_of(case: dict, text: str) -> dict:
    return (train_meters(text, case["workers"]) if case["meters"] == "train" else
            frame_meters(text) if case["meters"] == "frames" else nav_meters(text))


def run_case(name: str, work: Path, results: Path, done: set, deadline: float,
             stages: set[str]) -> None:
    case = CASES[name]
    done = done | {(name, s) for s in ("plain", "diagnose", "hand-nsys", "hand-torch")
                   if s not in stages}
    script, args = case_command(name, work)
    logs = results / "logs"
    logs.mkdir(exist_ok=True)
    base = [PY, script, *args] if script else [PY, "-m", "navdoctor.workloads.navigation"]

    def left() -> float:
        return deadline - time.monotonic()

    if (name, "plain") not in done and left() > 30:
        rc, secs, text = run(base, logs / f"{name}.plain.log", left())
        meters = meters_of(case, text)
        record(results, {"case": name, "stage": "plain", "ok": rc == 0, "rc": rc, "seconds": secs,
                         "meters": meters})
    if (name, "diagnose") not in done and left() > 60:
        out = work / "runs" / name
        report = results / f"{name}.diagnose.json"
        cmd = navdoctor("diagnose", "--out", str(out), "--json", str(report), "-q",
                        *([script, *args] if script else []))
        rc, secs, _ = run(cmd, logs / f"{name}.diagnose.log", left())
        row = {"case": name, "stage": "diagnose", "ok": rc == 0 and report.exists(), "rc": rc,
               "seconds": secs}
        if report.exists():
            row["report"] = summarise_report(report)
            run_dir = Path(json.loads(report.read_text())["run"]["dir"])
            if (run_dir / "trace.duckdb").exists():
                row["kept"] = kept_steps(run_dir / "trace.duckdb")
            # The script's own meters in each profiled pass (its output is in the pass logs).
            row["pass_meters"] = {}
            for log in sorted(run_dir.glob("*-pass*.log")):
                shutil.copyfile(log, logs / f"{name}.diagnose.{log.name}")
                row["pass_meters"][log.name] = meters_of(case, log.read_text(errors="replace"))
        record(results, row)
    if not case["hand"]:
        return
    hand = work / "hand"
    hand.mkdir(exist_ok=True)
    captures = {"nsys": hand / f"{name}.hand.sqlite", "torch": hand / f"{name}.hand.kineto.json"}
    for kind, trace in captures.items():
        if (name, f"hand-{kind}") in done or left() < 60:
            continue
        for stale in (trace, trace.with_suffix(".nsys-rep")):   # of a killed earlier call
            stale.unlink(missing_ok=True)
        if kind == "nsys":
            cmd = ["nsys", "profile", "-t", "cuda,nvtx,osrt", "--sample=none", "--export=sqlite",
                   "-o", str(trace.with_suffix("")), *base]
        else:
            cmd = [PY, str(HERE / "profile_whole.py"), str(trace), *base[1:]]
        rc, secs, text = run(cmd, logs / f"{name}.hand-{kind}.log", left())
        row = {"case": name, "stage": f"hand-{kind}", "capture_rc": rc, "capture_seconds": secs,
               "ok": False, "meters": meters_of(case, text)}   # its own meters, in this run
        if trace.exists():
            report = results / f"{name}.hand-{kind}.json"
            db = hand / f"{name}.hand-{kind}.duckdb"
            db.unlink(missing_ok=True)
            rc, secs, _ = run(navdoctor("analyze", str(trace), "--json", str(report), "--db", str(db), "-q"),
                              logs / f"{name}.hand-{kind}.analyze.log", max(30, left()))
            row.update(analyze_rc=rc, analyze_seconds=secs, ok=rc == 0 and report.exists(),
                       trace_mb=round(trace.stat().st_size / 2**20, 1))
            if report.exists():
                row["report"] = summarise_report(report)
            if db.exists():
                row["kept"] = kept_steps(db)
        record(results, row)


def pack_results(work: Path, results: Path, out: Path, max_mb: float = 15.0) -> None:
    """Bring back what fits in 8 files: RESULTS as one archive, then the hand captures (nsys
    exports trimmed of what navdoctor never reads) gzipped, largest-first packing."""
    sys.path.insert(0, str(ROOT / "bench"))
    from trim_capture import trim_sqlite
    import gzip
    out.mkdir(parents=True, exist_ok=True)
    staged = work / "staged"
    staged.mkdir(exist_ok=True)
    items = []
    for f in sorted((work / "hand").glob("*.hand.sqlite")):
        dest = staged / (f.name + ".gz")
        if not dest.exists():
            trim_sqlite(f, dest)
        items.append(dest)
    for f in sorted((work / "hand").glob("*.hand.kineto.json")):
        dest = staged / (f.name + ".gz")
        if not dest.exists():
            with open(f, "rb") as src, gzip.open(dest, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
        items.append(dest)
    with tarfile.open(out / "results.tar.gz", "w:gz") as tar:
        tar.add(results, arcname="results")
    bins: list[list[Path]] = []
    sizes: list[float] = []
    skipped = []
    for item in sorted(items, key=lambda p: -p.stat().st_size):
        mb = item.stat().st_size / 2**20
        for i, s in enumerate(sizes):
            if s + mb <= max_mb:
                bins[i].append(item)
                sizes[i] += mb
                break
        else:
            if mb <= max_mb and len(bins) < 7:
                bins.append([item])
                sizes.append(mb)
            else:
                skipped.append(f"{item.name} ({mb:.1f} MB)")
    for i, b in enumerate(bins, start=1):
        with tarfile.open(out / f"captures-{i}.tar", "w") as tar:
            for item in b:
                tar.add(item, arcname=item.name)
    (out / "packed.txt").write_text("\n".join(
        [f"captures-{i}.tar: " + ", ".join(p.name for p in b) for i, b in enumerate(bins, 1)]
        + [f"left out: {s}" for s in skipped]) + "\n")


def reanalyze(captures: Path, logs: Path, results: Path) -> None:
    """Analyse hand captures brought back from the GPU machine again, here, with the current
    navdoctor (after a fix), reading the script's meters from the capture logs."""
    import gzip
    results.mkdir(parents=True, exist_ok=True)
    for gz in sorted(captures.glob("*.hand.*.gz")):
        name, rest = gz.name.split(".hand.", 1)
        kind = "nsys" if rest.startswith("sqlite") else "torch"
        trace = results / gz.name[:-3]
        if kind == "nsys":   # the nsys reader needs the file itself
            with gzip.open(gz, "rb") as src, open(trace, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            trace = gz
        report, db = results / f"{name}.hand-{kind}.json", results / f"{name}.hand-{kind}.duckdb"
        report.unlink(missing_ok=True)
        db.unlink(missing_ok=True)
        rc, secs, _ = run(navdoctor("analyze", str(trace), "--json", str(report), "--db", str(db), "-q"),
                          results / f"{name}.hand-{kind}.analyze.log", 600)
        log = logs / f"{name}.hand-{kind}.log"
        row = {"case": name, "stage": f"hand-{kind}", "ok": rc == 0, "analyze_rc": rc,
               "analyze_seconds": secs, "reanalyzed": True,
               "meters": meters_of(CASES[name], log.read_text()) if log.exists() else {}}
        if report.exists():
            row["report"] = summarise_report(report)
        if db.exists():
            row["kept"] = kept_steps(db)
        record(results, row)
        if kind == "nsys":
            trace.unlink()


def main() -> None:
    if sys.argv[1:2] == ["--reanalyze"]:
        if len(sys.argv) != 5:
            sys.exit("usage: run_cases.py --reanalyze CAPTURES_DIR LOGS_DIR RESULTS")
        reanalyze(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("results", type=Path)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--stages", default="plain,diagnose,hand-nsys,hand-torch")
    ap.add_argument("--budget", type=float, default=480, help="start nothing after this many seconds")
    ap.add_argument("--pack", type=Path, default=None, help="pack results and captures here at the end")
    args = ap.parse_args()
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f"unknown case(s): {', '.join(unknown)} (known: {', '.join(CASES)})")
    args.work.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    prepare_data(args.work, names)
    done = done_stages(args.results)
    for name in names:
        if time.monotonic() < deadline - 30:
            run_case(name, args.work, args.results, done, deadline, set(args.stages.split(",")))
    if args.pack:
        pack_results(args.work, args.results, args.pack)


if __name__ == "__main__":
    main()
