"""Score the mixed corpus (issue #20, items 5 and 6): each point's captures analysed with the
current code, against the label its unprofiled timings give.

    python bench/mixed/score_mix.py RESULTS.jsonl [RESULTS.jsonl ...] --captures DIR [--markdown]
    python bench/mixed/score_mix.py --labels fixtures/gpu/mixed/labels.yaml [--markdown]

RESULTS are run_mix.py's lines (plain_none / plain_cause / plain_compute medians per point);
DIR/<kind>_<share>/ holds the point's kineto.json.gz and nsys.sqlite.gz (trim_capture.py).

The label, fixed before scoring: the class whose remedy made the unprofiled step fastest, if
that remedy gave at least 1.05x (verify's margin, docs/verify.md); `balanced` when neither did.
Where a point was also timed with the second compute remedy (torch.compile, `compile`),
compute's speed-up is the better of its two remedies.
A second reading (reported beside it, `share label`): the written policy applied to the
unprofiled timings, the cause's class where the cause's remedy took 20% or more off the step
((as is - cause fixed) / as is >= 0.20), else compute.
A third reading (`policy label`): the best-remedy label where a remedy helped, and where none
did, the share rule's (the written policy on the unprofiled timings; docs/verdict.md,
"Policy": `balanced` only where no cause dominates, and a step that no remedy shortens, its GPU
busy, is compute-bound by the seed article's definition even when bf16 does not help).
The estimate check: for each class with a measured remedy, the report's
estimated_gain[class].speedup_up_to against the measured speed-up of that remedy.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from navdoctor.analysis import analyze  # noqa: E402
from navdoctor.gains import verdict_gains  # noqa: E402
from navdoctor.rules import load_rules  # noqa: E402

CAUSE_CLASS = {"data": "io", "host": "io", "launch": "launch", "sync": "memory", "copy": "memory"}
MARGIN = 1.05


def measured_label(kind: str, t: dict) -> tuple[dict[str, float], str]:
    """The measured speed-up of each class's remedy (t: unprofiled ms as is, cause fixed,
    compute fixed, and compile where timed) and the label they give (the rule in this module's
    docstring)."""
    compute_ms = min(t["compute"], t.get("compile") or t["compute"])
    measured = {CAUSE_CLASS[kind]: t["none"] / t["cause"], "compute": t["none"] / compute_ms}
    best = max(measured, key=measured.get)
    return measured, best if measured[best] >= MARGIN else "balanced"
CLASSES = ("io", "compute", "memory", "launch")


def points(paths):
    out: dict[tuple, dict] = {}
    for p in paths:
        for line in Path(p).read_text().splitlines():
            row = json.loads(line)
            st = row.get("stage", "")
            key = (row.get("model", "resnet50"), row.get("kind"), row.get("share_target"))
            if st.startswith("plain_") and row.get("median_ms"):
                out.setdefault(key, {})[st[6:]] = row["median_ms"]
            elif st == "diagnose" and row.get("unprofiled_step_ms"):   # diagnose's own pass 3
                out.setdefault(key, {})["diagnose"] = row["unprofiled_step_ms"]
                # each timing run's wait where diagnose timed two (the verdict's edge check)
                out[key]["loader_wait"] = (row.get("unprofiled_loader_waits_ms")
                                           or row.get("unprofiled_loader_wait_ms"))
    return out


def from_results(results: list[str], captures: Path):
    """(point name, kind, timings, trace paths, the step without a tracer) from run_mix.py's
    lines and a captures folder: diagnose's own timing pass where it ran, else the point's
    unprofiled median as is."""
    for (model, kind, share), t in sorted(points(results).items()):
        prefix = "" if model == "resnet50" else f"{model}_"
        cap = captures / f"{prefix}{kind}_{share}"
        traces = [str(f) for f in (cap / "kineto.json.gz", cap / "nsys.sqlite.gz") if f.exists()]
        if {"none", "cause", "compute"} <= set(t) and traces:
            yield (f"{prefix.replace('_', ' ')}{kind} {share}", kind, t, traces,
                   t.get("diagnose") or t["none"], t.get("loader_wait"), model, None)


def from_labels(labels: Path, current_method: bool = False):
    """The same from a fixtures folder's labels.yaml (fixtures/gpu/mixed): no GPU needed.
    current_method: leave out a data point captured without the loader wait timed
    (diagnose_loader_wait_ms) where its configuration (GPU, model, target share: the key's
    last part; the amounts of one share differ a little between calibrations) was captured
    again with it: a rule about method, not results (docs/accuracy.md, "Mixed corpus")."""
    import yaml
    points = yaml.safe_load(labels.read_text())["points"]

    def config(name, p):
        return p.get("gpu", "H200"), p.get("model", "resnet50"), p["cause"], name.rsplit("_", 1)[1]
    measured = {config(n, p) for n, p in points.items() if "diagnose_loader_wait_ms" in p}
    for name, p in sorted(points.items()):
        if (current_method and p["cause"] == "data" and "diagnose_loader_wait_ms" not in p
                and config(name, p) in measured):
            continue
        kind_share = name.removeprefix(p.get("gpu", "H200").lower() + "_").replace("_", " ")
        yield (f"{p.get('gpu', 'H200')} {kind_share}", p["cause"],
               {"none": p["none_ms"], "cause": p["cause_fixed_ms"], "compute": p["compute_fixed_ms"],
                **({"compile": p["compile_fixed_ms"]} if "compile_fixed_ms" in p else {})},
               [str(labels.parent / p["file"])], p.get("diagnose_unprofiled_ms", p["none_ms"]),
               p.get("diagnose_loader_waits_ms") or p.get("diagnose_loader_wait_ms"),
               p.get("model", "resnet50"), p.get("gpu", "H200"))


def sweep_close(rows: list[dict], bands: list[float]) -> None:
    """docs/accuracy.md, "Close calls": what each band would make of these verdicts (the class
    is not changed by the band, only whether the verdict is a close call)."""
    import navdoctor.verdict as vd
    keep = vd.CLOSE_BAND
    try:
        for band in bands:
            vd.CLOSE_BAND = band
            firm_ok = firm = close = named = 0
            for r in rows:
                others = vd.close_call(r["cls"], r["bound"], True, r["by_cost"])
                if others:
                    close += 1
                    named += r["label"] in [r["bound"], *others]
                else:
                    firm += 1
                    firm_ok += r["bound"] == r["label"]
            print(f"close band {band:.2f}: not close calls, as labelled {firm_ok}/{firm}; "
                  f"close calls {close}, naming the label {named}")
    finally:
        vd.CLOSE_BAND = keep


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="*")
    ap.add_argument("--captures", type=Path)
    ap.add_argument("--labels", type=Path, help="score a fixtures folder's labels.yaml instead")
    ap.add_argument("--close-bands", help="also sweep verdict.CLOSE_BAND over these values (e.g. 0,0.05,0.07)")
    ap.add_argument("--only", help="with --labels: only the points whose name contains this (lraspp), or not (!lraspp)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--current-method", action="store_true",
                    help="with --labels: without the data points whose configuration was captured "
                         "again with the loader wait timed (their first captures lacked it)")
    ap.add_argument("--nsys-only", action="store_true", help="score the nsys capture alone (as labels.yaml does)")
    ap.add_argument("--assumed-tracer", action="store_true",
                    help="the tracer's cost per CUDA call assumed (5 us), as `analyze` without "
                         "--unprofiled-step-ms; by default it is measured from the point's step "
                         "without a tracer: diagnose's timing pass where labels.yaml has it "
                         "(diagnose_unprofiled_ms), else the point's unprofiled as-is median")
    a = ap.parse_args()
    if bool(a.labels) == bool(a.results and a.captures):
        ap.error("give RESULTS... --captures DIR, or --labels LABELS.yaml")
    rules = load_rules()
    rows = []
    if a.current_method and not a.labels:
        ap.error("--current-method needs --labels")
    source = from_labels(a.labels, a.current_method) if a.labels else from_results(a.results, a.captures)
    if a.only:
        neg, text = a.only.startswith("!"), a.only.lstrip("!")
        source = [x for x in source if (text in x[0].replace(" ", "_")) != neg]
    for point, kind, t, traces, unprofiled, loader_wait, model, gpu in source:
        if a.nsys_only:
            traces = [x for x in traces if ".sqlite" in x] or traces
        measured, label = measured_label(kind, t)
        cause_share = 1 - t["cause"] / t["none"]
        share_label = CAUSE_CLASS[kind] if cause_share >= 0.20 else "compute"
        an = analyze(traces, rules, unprofiled_step_ms=None if a.assumed_tracer else unprofiled,
                     unprofiled_loader_wait_ms=None if a.assumed_tracer else loader_wait)
        v = an.verdict
        eg = verdict_gains(v)    # as the report gives it
        gains = {c: g["speedup_up_to"] for c, g in eg.items()}
        expected = {c: g["speedup_expected"] for c, g in eg.items()}
        first = next((f.rule.category for f in an.findings
                      if str(f.rule.category) in CLASSES), None)
        rows.append(dict(point=point, family=f"{model} {gpu}" if gpu else model, traces="+".join(Path(x).name.split(".")[0] for x in traces),
                         none=t["none"], cause=t["cause"], compute=t["compute"], compile=t.get("compile"),
                         measured={k: round(x, 2) for k, x in measured.items()}, label=label,
                         share_label=share_label,
                         policy_label=label if label != "balanced" else share_label,
                         close_to=v.close_to,
                         by_cost=v.class_by_tracer_cost, cls=dict(v.class_shares),
                         bound=v.bound, confidence=round(v.confidence, 2),
                         class_shares={k: round(x, 2) for k, x in v.class_shares.items()},
                         tracer=(v.tracer_cost or {}).get("share"), gains=gains, expected=expected,
                         first=str(first) if first else None, step_ms=v.step_ms))
    ok = sum(r["bound"] == r["label"] for r in rows)
    share_ok = sum(r["bound"] == r["share_label"] for r in rows)
    helped = [r for r in rows if r["label"] != "balanced"]
    firm = [r for r in helped if not r["close_to"]]
    close = [r for r in helped if r["close_to"]]
    est = [(r["point"], c, r["gains"].get(c), m) for r in rows for c, m in r["measured"].items()
           if r["gains"].get(c) is not None]
    held = sum(g >= m for _, _, g, m in est)
    exp = [(r["point"], c, r["expected"].get(c, 1.0), m) for r in rows for c, m in r["measured"].items()]
    exp_held = sum(g >= m for _, _, g, m in exp)
    ranked = [r for r in rows if r["label"] != "balanced" and r["first"]]
    first_ok = sum(r["first"] == r["label"] for r in ranked)
    if a.markdown:
        print("| point | unprofiled ms: as is / cause fixed / compute fixed | measured speed-up | label (share rule) | verdict (conf.) | close call with | io / compute / memory / launch | tracer cost | expected (cause) | up to (cause, compute) | first finding |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            cs = r["class_shares"]
            cause = next(c for c in r["measured"] if c != "compute")
            compiled = f" (compile {r['compile']:.1f})" if r["compile"] else ""
            print(f"| {r['point']} | {r['none']:.1f} / {r['cause']:.1f} / {r['compute']:.1f}{compiled} | "
                  f"{cause} {r['measured'][cause]:.2f}x, compute {r['measured']['compute']:.2f}x | "
                  f"{r['label']} ({r['share_label']}) | {'**' if r['bound'] != r['label'] else ''}{r['bound']}"
                  f"{'**' if r['bound'] != r['label'] else ''} ({r['confidence']:.2f}) | "
                  f"{', '.join(r['close_to'] or []) or '-'} | "
                  f"{cs.get('io', 0):.2f} / {cs.get('compute', 0):.2f} / {cs.get('memory', 0):.2f} / {cs.get('launch', 0):.2f} | "
                  f"{(r['tracer'] or 0):.0%} | {r['expected'].get(cause, 1.0)}x | {r['gains'].get(cause)}x, {r['gains'].get('compute')}x | {r['first']} |")
        print()
    else:
        for r in rows:
            print(json.dumps(r))
    conf = Counter((r["label"], r["bound"]) for r in rows)
    print(f"as labelled: {ok}/{len(rows)}; confusion (label -> verdict): "
          + ", ".join(f"{l}->{b}: {n}" for (l, b), n in sorted(conf.items())))
    print(f"as labelled by the share rule: {share_ok}/{len(rows)}")
    pol = Counter((r["policy_label"], r["bound"]) for r in rows if r["policy_label"] != r["bound"])
    print(f"as labelled by the policy label (best remedy, else the share rule): "
          f"{sum(r['bound'] == r['policy_label'] for r in rows)}/{len(rows)}; misses (label -> verdict): "
          + (", ".join(f"{l}->{b}: {n}" for (l, b), n in sorted(pol.items())) or "none"))
    print(f"where a remedy helped: firm verdicts as labelled {sum(r['bound'] == r['label'] for r in firm)}/{len(firm)}; "
          f"close calls {len(close)}, naming the label {sum(r['label'] in [r['bound'], *r['close_to']] for r in close)}")
    if a.close_bands:
        sweep_close(rows, [float(b) for b in a.close_bands.split(",")])
    print(f"estimate >= measured: {held}/{len(est)}; misses: "
          + (", ".join(f"{p} {c} est {g} < {m:.2f}" for p, c, g, m in est if g < m) or "none"))
    print(f"expected >= measured: {exp_held}/{len(exp)} (an estimate, not a bound)")
    print(f"first-ranked finding's class is the best measured remedy's: {first_ok}/{len(ranked)}")
    by_family: dict[str, list[int]] = {}
    for r in rows:
        n = by_family.setdefault(r["family"], [0, 0])
        n[0] += r["bound"] == r["policy_label"]
        n[1] += 1
    print("by model and GPU, as labelled (policy label): "
          + ", ".join(f"{f} {ok}/{n}" for f, (ok, n) in sorted(by_family.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
