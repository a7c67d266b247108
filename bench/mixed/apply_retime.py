"""Write retime_sync.py's timings into labels.yaml: each point's none_ms, cause_fixed_ms,
compute_fixed_ms and runs_ms become the new medians and runs, and the old three are kept as
`timed_before_read_fix` (so the change of label, if any, stays visible). Prints each point's
label before and after (tests/test_mixed_corpus.py's policy_label).

    python bench/mixed/apply_retime.py RESULTS.jsonl [...] [--skip-model convnexttiny] [--dry-run]

--skip-model: a model whose as-is reads copied too (ConvNeXt's permuted blocks), so its old
timings are one workload (reads that copy) throughout and its capture is of that workload.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
LABELS = ROOT / "fixtures" / "gpu" / "mixed" / "labels.yaml"
sys.path.insert(0, str(ROOT / "tests"))
from test_mixed_corpus import policy_label  # noqa: E402  (the label of record, one definition)


def set_field(line: str, name: str, value: str) -> str:
    """One flow-mapping field of a labels.yaml line, replaced (or added before the closing
    brace). Values here are numbers or lists of numbers."""
    pat = re.compile(rf"(\b{name}: )(\[\[.*?\]\]|\[.*?\]|[-\d.]+)")
    if pat.search(line):
        return pat.sub(lambda m: m.group(1) + value, line, count=1)
    return line.rstrip()[:-1].rstrip() + f", {name}: {value}}}\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--skip-model", action="append", default=[])
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    # the last row of a point wins (a point timed again after a failed or partial call)
    rows = list({row["point"]: row for row in (json.loads(x) for r in a.results
                                                for x in r.read_text().splitlines() if x.strip())}.values())
    points = yaml.safe_load(LABELS.read_text())["points"]
    lines = LABELS.read_text().splitlines(keepends=True)
    for row in rows:
        key = row["point"]
        if row["model"] in a.skip_model or row.get("rc") or not all(row["runs_ms"].values()):
            print(f"{key}: left as it was ({'skipped model' if row['model'] in a.skip_model else 'failed run'})")
            continue
        old = points[key]
        new = {**old, "none_ms": row["none_ms"], "cause_fixed_ms": row["cause_ms"],
               "compute_fixed_ms": row["compute_ms"]}
        print(f"{key}: as is / cause / compute {old['none_ms']} / {old['cause_fixed_ms']} / "
              f"{old['compute_fixed_ms']} -> {row['none_ms']} / {row['cause_ms']} / "
              f"{row['compute_ms']}; label {policy_label(old)} -> {policy_label(new)}")
        i = next(n for n, x in enumerate(lines) if x.startswith(f"  {key}: {{"))
        line = lines[i]
        if "timed_before_read_fix" not in line:
            line = set_field(line, "timed_before_read_fix",
                             f"[{old['none_ms']}, {old['cause_fixed_ms']}, {old['compute_fixed_ms']}]")
        for name, v in (("none_ms", row["none_ms"]), ("cause_fixed_ms", row["cause_ms"]),
                        ("compute_fixed_ms", row["compute_ms"])):
            line = set_field(line, name, f"{v}")
        runs = [row["runs_ms"][f] for f in ("none", "cause", "compute")]
        # (the old runs stay in their bench/results file; the old medians in timed_before_read_fix)
        line = set_field(line, "runs_ms", json.dumps(runs))
        lines[i] = line
    if not a.dry_run:
        LABELS.write_text("".join(lines))
        yaml.safe_load(LABELS.read_text())     # still YAML


if __name__ == "__main__":
    main()
