"""Every trace in ../shared/public-traces through `navdoctor analyze`, one row each (issue #20,
item 7: they all analyse, and their verdicts can be explained from their shares).

    python bench/public_traces.py [--public DIR] [--markdown]

Prints, per trace file (Kineto JSON, Nsight Systems SQLite; the sources' own CSV/Markdown notes
are skipped): where its steps came from, how many, the verdict and its confidence, the class
shares and the findings that fired, or the one-line error. Nothing is copied out of the folder.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the folder beside the project's checkout, or where NAVDOCTOR_PUBLIC_TRACES says
PUBLIC = Path(os.environ.get("NAVDOCTOR_PUBLIC_TRACES") or ROOT.parent / "shared" / "public-traces")
TRACE_SUFFIXES = (".json", ".json.gz", ".js", ".sqlite")


def trace_files(public: Path) -> list[Path]:
    """The trace files of the folder (one level of subfolders, as SOURCES.md lays them out)."""
    return sorted(p for p in public.glob("*/*")
                  if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                  and not p.name.startswith("SOURCE_REF"))


def analyse(path: Path) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        p = subprocess.run([sys.executable, "-m", "navdoctor", "analyze", str(path), "-q",
                            "--json", str(out)], capture_output=True, text=True, timeout=600)
        if p.returncode != 0 or not out.exists():
            return {"error": (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]}
        r = json.loads(out.read_text())
    v = r["verdict"]
    t = v["per_trace"][0]
    return {"origin": t.get("step_origin"), "steps": t["steps"], "step_ms": round(v["step_ms"], 2),
            "bound": v["bound"], "confidence": round(v["confidence"], 2),
            "shares": {k: round(x, 2) for k, x in v["class_shares"].items() if x >= 0.005},
            "findings": [f["rule"] for f in r["findings"] if f["severity"] != "info"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--public", type=Path, default=PUBLIC)
    ap.add_argument("--markdown", action="store_true", help="one Markdown table instead of JSON lines")
    a = ap.parse_args()
    if not a.public.is_dir():
        print(f"error: {a.public} is not a folder", file=sys.stderr)
        return 2
    if a.markdown:
        print("| trace | steps (origin) | verdict (confidence) | class shares | findings |")
        print("|---|---|---|---|---|")
    for path in trace_files(a.public):
        row = {"trace": f"{path.parent.name}/{path.name}", **analyse(path)}
        if not a.markdown:
            print(json.dumps(row), flush=True)
        elif "error" in row:
            print(f"| {row['trace']} | | error: {row['error']} | | |", flush=True)
        else:
            shares = ", ".join(f"{k} {x:.2f}" for k, x in row["shares"].items())
            print(f"| {row['trace']} | {row['steps']} × {row['step_ms']} ms ({row['origin']}) | "
                  f"{row['bound']} ({row['confidence']}) | {shares} | {', '.join(row['findings'])} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
