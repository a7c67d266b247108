"""Score the compute headroom against its ground truth, no GPU needed: every fp32 capture in
fixtures/gpu/headroom (made by sweep_models.py) analysed with the current code, its expected
speed-up from bf16 autocast + channels_last (verdict.compute_headroom) beside the speed-up
those remedies measured unprofiled (labels.yaml). Prints one Markdown table for the sweep's
models and one for the models held out from the depthwise line, each with Spearman's rank
correlation (ties given their mean rank) and the mean absolute error of the prediction.

    python bench/headroom/score_headroom.py [--fixtures fixtures/gpu/headroom]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from navdoctor.analysis import analyze  # noqa: E402
from navdoctor.headroom import DEPTHWISE_SHARE  # noqa: E402
from navdoctor.rules import load_rules  # noqa: E402


def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5


def table(title: str, models: dict, folder: Path, rules) -> None:
    print(f"{title}\n")
    print("| model | mode | measured amp_cl | predicted | depthwise (of kernel time) "
          "| layout conversions | fp32 verdict | measured cl alone |")
    print("|---|---|---|---|---|---|---|---|")
    pred, meas = [], []
    for name, m in models.items():
        v = analyze([str(folder / f"{name}.fp32.json.gz")], rules).verdict
        h = v.compute_headroom
        k = h["kernel_ms"] or 1.0
        pred.append(h["speedup_expected"])
        meas.append(m["amp_cl"])
        over = " (over the line)" if h["depthwise_ms"] >= DEPTHWISE_SHARE * h["kernel_ms"] else ""
        print(f"| {name} | {m['mode']} | {m['amp_cl']:.2f} | {h['speedup_expected']:.2f} | "
              f"{h['depthwise_ms'] / k:.1%}{over} | {h['layout_ms'] / k:.0%} | {v.bound} | {m['cl']:.2f} |")
    mae = sum(abs(p - q) for p, q in zip(pred, meas)) / len(pred)
    print(f"\n{len(pred)} models: Spearman {spearman(pred, meas):.2f}, "
          f"mean absolute error {mae:.2f}\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixtures", type=Path, default=ROOT / "fixtures/gpu/headroom")
    a = ap.parse_args()
    labels = yaml.safe_load((a.fixtures / "labels.yaml").read_text())
    rules = load_rules()
    table("The sweep", labels["models"], a.fixtures, rules)
    table("Held out from the depthwise line", labels["held_out"], a.fixtures, rules)
    return 0


if __name__ == "__main__":
    sys.exit(main())
