"""Add a device call's mixed-corpus points to fixtures/gpu/mixed (issue #20): each point's trimmed
nsys capture copied in, and a line in labels.yaml with its unprofiled timings (the label is not
written: tests/test_mixed_corpus.py derives it). Known misses are added by hand after scoring,
with the reason.

    python bench/mixed/add_points.py RESULTS.jsonl CAPTURES --key-prefix lraspp5 --gpu H100 \
        [--labels fixtures/gpu/mixed/labels.yaml] [--comment "..."]

CAPTURES holds the unpacked archives of bench/mixed/gpu_mix.sh (one folder per point, named as
run_mix.py names them: [<model>_]<kind>_<share>, with nsys.sqlite.gz). Each point becomes
`<key-prefix>_[<model>_]<kind>_<share>` (file and key; the model but ResNet-50's); a key already in
labels.yaml is an error.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("captures", type=Path)
    ap.add_argument("--key-prefix", required=True)
    ap.add_argument("--gpu", required=True, help="as nvidia-smi names the card, short: H100, H200")
    ap.add_argument("--labels", type=Path, default=ROOT / "fixtures/gpu/mixed/labels.yaml")
    ap.add_argument("--comment", default="", help="a comment line written above the new points")
    a = ap.parse_args()
    have = yaml.safe_load(a.labels.read_text())["points"]
    stages: dict[tuple, dict] = {}
    timed: dict[tuple, float] = {}     # diagnose's own timing pass, where it ran
    waited: dict[tuple, dict] = {}     # ... and the GPU's wait for DataLoader batches in it (each run's)
    for line in a.results.read_text().splitlines():
        row = json.loads(line)
        if row.get("stage") == "diagnose" and row.get("unprofiled_step_ms"):
            timed[(row.get("model", "resnet50"), row["kind"], row["share_target"])] = row["unprofiled_step_ms"]
            if row.get("unprofiled_loader_wait_ms") is not None:
                waited[(row.get("model", "resnet50"), row["kind"], row["share_target"])] = \
                    {"diagnose_loader_wait_ms": row["unprofiled_loader_wait_ms"],
                     **({"diagnose_loader_waits_ms": row["unprofiled_loader_waits_ms"]}
                        if row.get("unprofiled_loader_waits_ms") else {})}
        if row.get("stage", "").startswith("plain_") and row.get("median_ms"):
            key = (row.get("model", "resnet50"), row["kind"], row["share_target"])
            stages.setdefault(key, {"amount": row["amount"]})[row["stage"][6:]] = row
    lines = [f"  # {a.comment}"] if a.comment else []
    for (model, kind, share), t in sorted(stages.items()):
        folder = a.captures / (f"{kind}_{share}" if model == "resnet50" else f"{model}_{kind}_{share}")
        capture = folder / "nsys.sqlite.gz"
        if not {"none", "cause", "compute"} <= set(t) or not capture.exists():
            print(f"skipped {model} {kind} {share}: " + ("no nsys capture" if not capture.exists()
                                                        else "a variant was not timed"))
            continue
        # (the model in the key as in the folder: two models' points of one share must not
        # share a key, nor a file)
        key = f"{a.key_prefix}_{kind}_{share}" if model == "resnet50" else f"{a.key_prefix}_{model}_{kind}_{share}"
        if key in have:
            print(f"error: {key} is already in {a.labels}", file=sys.stderr)
            return 2
        have[key] = None
        shutil.copy(capture, a.labels.parent / f"{key}.nsys.sqlite.gz")
        fixes = [f for f in ("none", "cause", "compute", "compile") if f in t]
        entry = {"file": f"{key}.nsys.sqlite.gz", "gpu": a.gpu,
                 **({"model": model} if model != "resnet50" else {}), "cause": kind,
                 "amount": t["amount"], "none_ms": t["none"]["median_ms"],
                 "cause_fixed_ms": t["cause"]["median_ms"], "compute_fixed_ms": t["compute"]["median_ms"],
                 **({"compile_fixed_ms": t["compile"]["median_ms"]} if "compile" in t else {}),
                 **({"diagnose_unprofiled_ms": timed[model, kind, share]}
                    if (model, kind, share) in timed else {}),
                 **waited.get((model, kind, share), {})}
        if all("runs_ms" in t[f] for f in fixes):
            entry["runs_ms"] = [t[f]["runs_ms"] for f in fixes]
        flow = yaml.safe_dump(entry, default_flow_style=True, sort_keys=False, width=10**6)
        lines.append(f"  {key}: {flow.strip()}")
    with a.labels.open("a") as out:
        out.write("\n".join(lines) + "\n")
    print(f"{len(lines) - bool(a.comment)} points added to {a.labels}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
