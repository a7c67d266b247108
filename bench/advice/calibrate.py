"""Fit and score the what-if model (navdoctor/whatif.py) on measured remedies: predicted
speed-ups against the speed-ups the remedies measured without a tracer.

    python bench/advice/calibrate.py [--cache DIR] [--fit] [--advice RESULTS_DIR ...] [--markdown]

The corpus (points with a capture and measured remedies):
- mixed: fixtures/gpu/mixed (labels.yaml): one cause of idle time mixed with a model's compute;
  each point's cause remedy (data -> num_workers, host -> gpu_postprocess, sync -> fewer_syncs,
  copy -> pin_memory) and the compute remedy (bf16 + channels_last: amp_channels_last). The
  launch points' remedy graphs only the injected ops, not the model, so it is not a
  cuda_graphs point.
- headroom: fixtures/gpu/headroom (labels.yaml): torchvision models in fp32, with bf16
  autocast, channels_last and both (amp_bf16, channels_last, amp_channels_last).
- frameworks: fixtures/gpu/frameworks (labels.yaml): Lightning, timm and transformers scripts
  run as their users write them, their remedies measured by `navdoctor verify` (H100).
- advice: bench/advice/loops.py run on a GPU by gpu_advice.sh (RESULTS_DIR/timings.jsonl and
  RESULTS_DIR/captures/<kind>/): loops as applications write them, every variant timed.

The split: the model is fitted on the mixed corpus's ResNet-50 (H100 and H200) and LR-ASPP
H100 points, the headroom's first 16 models and the first H100 host's seed script and batch-1
classifier (the CUDA graphs points; FIT_ADVICE); every other point (the other model families,
LR-ASPP on the H200, the 8 held-out headroom models, the frameworks' scripts, the other advice
loops and hosts) is held out and scored only. --fit searches the parameters (coordinate
descent on the mean absolute log error of the fit points) and writes
navdoctor/whatif_calibration.json with the ranges: each remedy's 5th and 95th percentiles of
measured / replayed, a 90% interval widened to hold the expectation, taken over the fit points'
cross-validated figures (FOLDS folds by network, each refitted from the model's defaults
without its own fold's points), so that a range holds the error of a figure the fit did not
see. (The parameters shipped are fitted from the current calibration's, not the defaults: the
folds' spread is that of a fit from scratch.) Without --fit the current calibration is scored. Graphs are cached in --cache (one pickle per capture).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import pickle
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from navdoctor import analysis, store, whatif  # noqa: E402

MIXED = ROOT / "fixtures" / "gpu" / "mixed"
HEADROOM = ROOT / "fixtures" / "gpu" / "headroom"
FRAMEWORKS = ROOT / "fixtures" / "gpu" / "frameworks"
ADVICE = ROOT / "fixtures" / "gpu" / "advice"
FRAMEWORK_REMEDY = {"num_workers": "num_workers", "amp_bf16+channels_last": "amp_channels_last",
                    "amp_bf16": "amp_bf16", "gpu-preprocess (code)": "gpu_preprocess"}
CAUSE_REMEDY = {"data": "num_workers", "host": "gpu_postprocess", "sync": "fewer_syncs", "copy": "pin_memory"}
FIT_MIXED = {("resnet50", "H200"), ("resnet50", "H100"), ("lraspp", "H100")}
# the only whole models measured with CUDA graphs: the graph's two parameters are fitted on the
# first host's two graphed loops, and the other hosts' are scored
FIT_ADVICE = {("advice", "seed"), ("advice", "small_batch1")}
ADVICE_REMEDY = {"no_grad": None, "cuda_graphs": "cuda_graphs", "amp_bf16": "amp_bf16",
                 "channels_last": "channels_last", "bf16_cl": "amp_channels_last",
                 "gpu_pre": "gpu_preprocess", "gpu_post": "gpu_postprocess",
                 "gpu_pre_post": None, "reduce_on_gpu": "gpu_postprocess",
                 "workers4": None, "workers8": "num_workers", "no_sync": "fewer_syncs", "pinned": "pin_memory"}


def mixed_points():
    pts = yaml.safe_load((MIXED / "labels.yaml").read_text())["points"]
    for name, p in sorted(pts.items()):
        model, gpu = p.get("model", "resnet50"), p.get("gpu", "H200")
        measured = {"amp_channels_last": p["none_ms"] / p["compute_fixed_ms"]}
        if p["cause"] in CAUSE_REMEDY:
            measured[CAUSE_REMEDY[p["cause"]]] = p["none_ms"] / p["cause_fixed_ms"]
        yield {"name": f"mixed {name}", "group": "mixed", "family": model, "gpu": gpu,
               "trace": str(MIXED / p["file"]),
               "unprofiled_ms": p.get("diagnose_unprofiled_ms", p["none_ms"]),
               "loader_wait_ms": p.get("diagnose_loader_wait_ms"), "measured": measured,
               "measured_base_ms": p["none_ms"], "diagnose_ms": p.get("diagnose_unprofiled_ms"),
               "split": "fit" if (model, gpu) in FIT_MIXED else "held_out"}


def headroom_points():
    labels = yaml.safe_load((HEADROOM / "labels.yaml").read_text())
    for split, key in (("fit", "models"), ("held_out", "held_out")):
        for name, m in sorted((labels.get(key) or {}).items()):
            trace = HEADROOM / f"{name}.fp32.json.gz"
            if not trace.exists():
                continue
            yield {"name": f"headroom {name}", "group": "headroom", "family": name, "gpu": "H100",
                   "trace": str(trace), "unprofiled_ms": m["fp32_ms"], "loader_wait_ms": None,
                   "measured": {"amp_bf16": m["amp"], "channels_last": m["cl"], "amp_channels_last": m["amp_cl"]},
                   "measured_base_ms": m["fp32_ms"], "diagnose_ms": None, "split": split}


def framework_points():
    """The frameworks' own scripts (Lightning, timm, transformers; H100), their remedies measured
    by `navdoctor verify`: all held out."""
    pts = yaml.safe_load((FRAMEWORKS / "labels.yaml").read_text())["points"]
    for name, p in sorted(pts.items()):
        used = [m for m in (p.get("measured") or {}).values()
                if m.get("remedy") in FRAMEWORK_REMEDY and m.get("speedup")]
        measured = {FRAMEWORK_REMEDY[m["remedy"]]: m["speedup"] for m in used}
        if measured:
            yield {"name": f"frameworks {name}", "group": "frameworks", "family": name, "gpu": "H100",
                   "trace": str(FRAMEWORKS / p["file"]), "unprofiled_ms": p["diagnose_unprofiled_ms"],
                   "loader_wait_ms": p.get("diagnose_loader_wait_ms"), "measured": measured,
                   "measured_base_ms": used[0].get("before_ms"), "diagnose_ms": p["diagnose_unprofiled_ms"],
                   "split": "held_out"}


def advice_points(results_dirs):
    for d in results_dirs:
        d = Path(d)
        rows = [json.loads(line) for line in (d / "timings.jsonl").read_text().splitlines() if line.strip()]
        by_kind: dict[str, dict] = {}
        for r in rows:
            by_kind.setdefault(r["kind"], {})[r["variant"]] = r
        for kind, variants in sorted(by_kind.items()):
            cap = d / "captures" / kind if (d / "captures").is_dir() else d / kind
            trace = cap / "nsys.sqlite.gz"
            if not trace.exists() or "as_is" not in variants:
                continue
            report = json.loads((cap / "report.json").read_text()) if (cap / "report.json").exists() else {}
            run = report.get("run") or {}
            base = variants["as_is"]["median_ms"]
            measured = {ADVICE_REMEDY[v]: base / r["median_ms"] for v, r in variants.items()
                        if v != "as_is" and ADVICE_REMEDY.get(v)}
            gpu = (variants["as_is"].get("gpu") or "").replace("NVIDIA ", "")
            yield {"name": f"advice {kind} ({gpu}, {d.name})", "group": "advice", "family": kind, "gpu": gpu,
                   "trace": str(trace), "unprofiled_ms": run.get("unprofiled_step_ms") or base,
                   "loader_wait_ms": run.get("unprofiled_loader_wait_ms"), "measured": measured,
                   "measured_base_ms": base, "diagnose_ms": run.get("unprofiled_step_ms"),
                   "split": "fit" if (d.name, kind) in FIT_ADVICE else "held_out"}


def load_capture(trace: str, cache: Path | None):
    # (the model's code in the key: a graph pickled by another version of it is built again)
    key = hashlib.sha256((trace + str(Path(trace).stat().st_size)).encode()
                         + Path(whatif.__file__).read_bytes()).hexdigest()[:16]
    path = cache / f"{key}.pkl" if cache else None
    if path and path.exists():
        return pickle.loads(path.read_bytes())
    con = store.connect_new(None)
    try:
        analysis.prepare_store(con, [trace])
        cap = whatif.capture(con, 1)
    finally:
        con.close()
    if path:
        path.write_bytes(pickle.dumps(cap))
    return cap


def predictions(points, caps):
    out = []
    for p in points:
        cap = caps[p["name"]]
        if cap is None:
            continue
        w = whatif.predict(cap, p["unprofiled_ms"] * 1e6,
                           p["loader_wait_ms"] * 1e6 if p["loader_wait_ms"] else None,
                           remedies=sorted(p["measured"]))
        # the step diagnose's timing pass measured (where the point has one of its own) against
        # the as-is step the remedies were measured against (their own interleaved timing): two
        # untraced timings of one step, whose disagreement no model of the step can remove
        base, timed = p.get("measured_base_ms"), p.get("diagnose_ms")
        agree = round(timed / base, 3) if base and timed else None
        for rid, measured in p["measured"].items():
            pr = w.predictions.get(rid)
            out.append({"point": p["name"], "group": p["group"], "family": p["family"], "gpu": p["gpu"],
                        "split": p["split"], "remedy": rid, "measured": measured, "baseline_ratio": agree,
                        "expected": pr.expected if pr else None, "low": pr.low if pr else None,
                        "high": pr.high if pr else None, "why_not": pr.why_not if pr else None})
    return out


def loss(rows) -> float:
    """The mean absolute log error, each workload family (its model or loop, GPU and remedy)
    weighing the same however many points it has: the mixed corpus's thirty LR-ASPP points
    would otherwise outweigh a family measured once."""
    count: dict[tuple, int] = {}
    for r in rows:
        key = (r["family"], r["gpu"], r["remedy"])
        count[key] = count.get(key, 0) + 1
    total = weight = 0.0
    for r in rows:
        w = 1.0 / count[(r["family"], r["gpu"], r["remedy"])]
        total += w * (abs(math.log(r["expected"] / r["measured"])) if r["expected"] else 0.5)
        weight += w
    return total / max(weight, 1e-9)


# parameter -> (lowest, highest) value searched, and the remedies whose figures it moves
# (None: every figure; the host's share of the traced step is fitted first)
SEARCH = {
    "host_scale_prior_nsys": ((0.3, 1.0), None), "host_scale_prior_kineto": ((0.2, 1.0), None),
    "matmul_efficiency": ((0.2, 1.0), ("amp_bf16", "amp_channels_last")),
    "other_kernel_factor": ((0.4, 1.1), ("amp_bf16", "amp_channels_last")),
    "autocast_dispatch_ops": ((0.0, 1.0), ("amp_bf16", "amp_channels_last")),
    "autocast_cast_ops": ((0.0, 3.0), ("amp_bf16", "amp_channels_last")),
    "depthwise_half_factor": ((0.6, 3.0), ("amp_bf16",)),
    "depthwise_half_channels_last_factor": ((0.6, 4.0), ("amp_channels_last",)),
    "cast_kernel_ns": ((500, 20_000), ("amp_bf16", "amp_channels_last")),
    "depthwise_channels_last_factor": ((0.8, 2.0), ("channels_last",)),
    "worker_handover_factor": ((0.0, 1.0), ("num_workers",)),
    "host_to_gpu_ratio": ((0.0, 0.5), ("gpu_postprocess", "gpu_preprocess")),
    "pinned_over_pageable": ((1.0, 5.0), ("pin_memory",)),
    "graph_kernel_gap_ns": ((0, 2_000), ("cuda_graphs",)),
    "graph_launch_ns": ((2_000, 30_000), ("cuda_graphs",)),
}


def replay_error(caps, params=None) -> float:
    """The mean |replayed traced step / traced step - 1| over every capture: the replay of
    the trace as it is, before any remedy, should give the traced step (the mean, not the
    median: most captures have few blocking calls, and a median would leave the latencies free
    to break the ones that have many)."""
    if params is not None:
        whatif.CALIBRATION_OVERRIDE.clear()
        whatif.CALIBRATION_OVERRIDE.update({"params": params})
    errs = []
    for cap in caps.values():
        if cap is None:
            continue
        rep = sum(whatif.replay(g) for g in cap.graphs) / len(cap.graphs)
        tr = sum(g.traced_ns for g in cap.graphs) / len(cap.graphs)
        errs.append(abs(rep / tr - 1))
    return statistics.fmean(errs)


def fit_latencies(caps, params: dict) -> dict:
    """launch_latency_ns and sync_latency_ns: the values at which the traced steps replay as
    traced (a grid, then kept)."""
    best = (replay_error(caps, params), params.get("launch_latency_ns"), params.get("sync_latency_ns"))
    for launch in (1_000, 2_000, 3_000, 4_000, 6_000, 8_000):
        for sync in (500, 1_000, 2_000, 3_000, 5_000, 8_000, 12_000):
            trial = dict(params, launch_latency_ns=launch, sync_latency_ns=sync)
            e = replay_error(caps, trial)
            if e < best[0]:
                best = (e, launch, sync)
    print(f"latencies: launch {best[1]} sync {best[2]}: mean replay error {best[0]:.4f}", file=sys.stderr)
    return dict(params, launch_latency_ns=best[1], sync_latency_ns=best[2])


def fit(points, caps, rounds: int = 2, only: list[str] | None = None, start: dict | None = None,
        label: str = "") -> dict:
    """Coordinate descent: each parameter in turn moved up and down within its range, kept
    where the mean absolute log error of the figures it moves (fit points) falls. start: the
    parameters to start from (default: the current calibration's)."""
    params = dict(whatif.calibration().get("params", {}) if start is None else start)
    fit_pts = [p for p in points if p["split"] == "fit"]
    if not only or "launch_latency_ns" in only:
        params = fit_latencies({p["name"]: caps[p["name"]] for p in fit_pts}, params)

    def score(ps, remedies):
        whatif.CALIBRATION_OVERRIDE.clear()
        whatif.CALIBRATION_OVERRIDE.update({"params": ps})
        sel = [dict(p, measured={k: v for k, v in p["measured"].items() if remedies is None or k in remedies})
               for p in fit_pts]
        return loss(predictions([p for p in sel if p["measured"]], caps))
    for rnd in range(rounds):
        for name, ((lo, hi), remedies) in SEARCH.items():
            if only and name not in only:
                continue
            cur = params.get(name, whatif.param(name))
            best = score(params, remedies)
            span = (hi - lo) / (3 * 2 ** rnd)
            for cand in sorted({max(lo, min(hi, cur + k * span)) for k in (-1, 1)} - {cur}):
                trial = dict(params, **{name: cand})
                sc = score(trial, remedies)
                if sc < best - 1e-4:
                    best, params = sc, trial
            print(f"{label}round {rnd} {name} = {params.get(name, cur):.4g} loss {best:.4f}", file=sys.stderr, flush=True)
    return params


FOLDS = 5


# a family's network where its name does not say it: a fold holds every family of one network
# (the mixed corpus's LR-ASPP and the headroom's, ResNet-50 as a model and as the seed script),
# or the fit would see a near-copy of what the fold holds out
NETWORK = {"lraspp": "lraspp_mobilenet_v3_large", "seed": "resnet50", "small_batch1": "mobilenet_v3_small"}


def fold_of(family: str) -> int:
    """A workload family's cross-validation fold (fixed by its network's name)."""
    network = NETWORK.get(family, family.removesuffix("_train"))
    return int(hashlib.sha256(network.encode()).hexdigest(), 16) % FOLDS


_CV: dict = {}      # the corpus, set before the folds' processes fork


def _fold_rows(k: int) -> list[dict]:
    points, caps, start = _CV["points"], _CV["caps"], _CV["start"]
    train = [dict(p, split="fit" if p["split"] == "fit" and fold_of(p["family"]) != k else "out") for p in points]
    params = fit(train, caps, start=start, label=f"fold {k}: ")
    whatif.CALIBRATION_OVERRIDE.clear()
    whatif.CALIBRATION_OVERRIDE.update({"params": params, "ranges": {}})
    return predictions([p for p in points if p["split"] == "fit" and fold_of(p["family"]) == k], caps)


def cross_validated(points, caps, start: dict) -> list[dict]:
    """Each fit point's figure from parameters fitted without its network's fold (FOLDS folds
    by network, each refitted as --fit fits, from `start`): the errors the ranges are taken
    from are then those of figures the fit did not see, as a user's are."""
    import multiprocessing
    _CV.update(points=points, caps=caps, start=start)
    with multiprocessing.get_context("fork").Pool(min(FOLDS, max(1, (os.cpu_count() or 1)))) as pool:
        return [r for rows in pool.map(_fold_rows, range(FOLDS)) for r in rows]


POOLED_BELOW = 10      # workload families


def ranges(rows) -> dict:
    out = {}
    by: dict[str, list[float]] = {}
    families: dict[str, set] = {}
    for r in rows:
        if r["expected"] and r["split"] == "fit":
            by.setdefault(r["remedy"], []).append(r["measured"] / r["expected"])
            by.setdefault("default", []).append(r["measured"] / r["expected"])
            families.setdefault(r["remedy"], set()).add((r["family"], r["gpu"]))
    # a 90% interval (5th and 95th percentiles), widened to hold the expectation itself: a
    # median correction of the replay's bias was tried and ranked more slower remedies first.
    # A remedy measured on fewer than POOLED_BELOW workload families (model or loop, GPU)
    # cannot show its own spread: thirty points of one injected loader on two models vary
    # less than the loaders users write. It gets at least the interval of every remedy's
    # points together.
    def interval(ratios):
        q = statistics.quantiles(sorted(ratios), n=20, method="inclusive")
        return [min(q[0], 1.0), max(q[-1], 1.0)]
    pooled = interval(by["default"]) if len(by.get("default", [])) >= 5 else None
    for rid, ratios in by.items():
        if len(ratios) < 5:
            continue
        lo, hi = interval(ratios)
        if rid != "default" and len(families[rid]) < POOLED_BELOW and pooled:
            lo, hi = min(lo, pooled[0]), max(hi, pooled[1])
        out[rid] = [round(lo, 3), round(hi, 3)]
    return out


BASELINE_AGREE = 0.10


def baseline_agrees(row) -> bool | None:
    """The step diagnose timed and the one the remedy was measured against, two untraced
    timings of the same step, within BASELINE_AGREE of each other (None: the point has one
    timing, used for both)."""
    ratio = row.get("baseline_ratio")
    return None if ratio is None else abs(ratio - 1) <= BASELINE_AGREE


def report(rows, markdown: bool) -> None:
    def tally(sel):
        have = [r for r in sel if r["expected"]]
        within = sum(abs(r["measured"] / r["expected"] - 1) <= 0.20 for r in have)
        inside = sum(r["low"] <= r["measured"] <= r["high"] for r in have)
        return len(sel), len(have), within, inside
    print("| split | remedy | points | with a figure | within ±20% | inside the range |")
    print("|---|---|---:|---:|---:|---:|")
    for split in ("fit", "held_out"):
        for rid in sorted({r["remedy"] for r in rows}):
            n, h, w, i = tally([r for r in rows if r["split"] == split and r["remedy"] == rid])
            if n:
                print(f"| {split} | {rid} | {n} | {h} | {w} ({w / max(h, 1):.0%}) | {i} ({i / max(h, 1):.0%}) |")
        n, h, w, i = tally([r for r in rows if r["split"] == split])
        print(f"| {split} | **all** | {n} | {h} | {w} ({w / max(h, 1):.0%}) | {i} ({i / max(h, 1):.0%}) |")
    # first-ranked: per point, the remedy with the largest expected figure against the measured best
    for split in ("fit", "held_out"):
        pts: dict[str, list] = {}
        for r in rows:
            if r["split"] == split:
                pts.setdefault(r["point"], []).append(r)
        # as the report ranks: the largest expectation, where it is 1.05x or more; else none
        first_of = {pt: max((r for r in rs if r["expected"] and r["expected"] >= 1.05),
                            key=lambda r: r["expected"], default=None) for pt, rs in pts.items()}
        right = slower = total = 0
        for pt, rs in pts.items():
            if len(rs) < 2:
                continue
            total += 1
            best = max(rs, key=lambda r: r["measured"])
            first = first_of[pt]
            if first is None:
                right += best["measured"] < 1.05      # none ranked first, and none helped
                continue
            right += first["remedy"] == best["remedy"] or first["measured"] >= 0.97 * best["measured"]
            slower += first["measured"] < 0.95
        print(f"\n{split}: first-ranked remedy (expected >= 1.05x, as the report ranks) the best measured, "
              f"or within 3% of it, or none ranked where none helped: {right}/{total}; "
              f"first-ranked measured slower than 0.95x: {slower}")
        # the targets are of the first-ranked remedy, one per workload
        firsts = [r for r in first_of.values() if r is not None]
        _, _, within, inside = tally(firsts)
        print(f"{split}: workloads with a first-ranked remedy: {len(firsts)}; its measured speed-up within "
              f"±20% of the expectation: {within} ({within / max(len(firsts), 1):.0%}), inside its range: "
              f"{inside} ({inside / max(len(firsts), 1):.0%})")
        # split by whether the step's two untraced timings (the prediction's, the measurement's)
        # agree within BASELINE_AGREE: where they do not, the host moved between them
        both = "the step diagnose timed and the as-is step the remedy was measured against"
        for words, sel in ((f"{both} within {BASELINE_AGREE:.0%} of each other",
                            [r for r in firsts if baseline_agrees(r) is True]),
                           (f"{both} more than {BASELINE_AGREE:.0%} apart",
                            [r for r in firsts if baseline_agrees(r) is False]),
                           ("one timing of the step for both (no timing pass of the point's own)",
                            [r for r in firsts if baseline_agrees(r) is None])):
            _, _, w, i = tally(sel)
            print(f"{split}:   {words}: {len(sel)}, within ±20%: {w} ({w / max(len(sel), 1):.0%}), "
                  f"inside the range: {i} ({i / max(len(sel), 1):.0%})")
    if markdown:
        return
    print()
    for r in rows:
        if r["split"] == "held_out":
            e = f"{r['expected']:.2f} [{r['low']:.2f}, {r['high']:.2f}]" if r["expected"] else f"- ({r['why_not']})"
            print(f"{r['point']:48} {r['remedy']:18} measured {r['measured']:.2f} expected {e}")


def svg_plot(rows, path: Path) -> None:
    """Measured against predicted speed-up, log axes, one point per remedy and capture (fit:
    grey, held out: coloured by remedy), the diagonal and the ±20% band."""
    pts = [r for r in rows if r["expected"]]
    lo, hi = 0.4, max(8.0, max(max(r["measured"], r["expected"]) for r in pts) * 1.1)
    size, pad = 560, 60
    def xy(v):
        return pad + (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo)) * (size - 2 * pad)
    colours = {"amp_bf16": "#1f77b4", "amp_channels_last": "#ff7f0e", "channels_last": "#2ca02c",
               "fewer_syncs": "#d62728", "gpu_postprocess": "#9467bd", "gpu_preprocess": "#8c564b",
               "num_workers": "#e377c2", "pin_memory": "#17becf", "cuda_graphs": "#bcbd22"}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{size + 170}" height="{size}" '
           f'font-family="sans-serif" font-size="11">', '<rect width="100%" height="100%" fill="white"/>']
    band = [(v, v * 1.2) for v in (lo, hi)] + [(v, v / 1.2) for v in (hi, lo)]
    out.append('<polygon fill="#eee" points="' + " ".join(f"{xy(a):.1f},{size - xy(b):.1f}" for a, b in band) + '"/>')
    out.append(f'<line x1="{xy(lo):.1f}" y1="{size - xy(lo):.1f}" x2="{xy(hi):.1f}" y2="{size - xy(hi):.1f}" stroke="#999"/>')
    for t in (0.5, 1, 2, 4, 8, 16):
        if lo <= t <= hi:
            out.append(f'<text x="{xy(t):.1f}" y="{size - pad + 15}" text-anchor="middle">{t:g}x</text>')
            out.append(f'<text x="{pad - 8}" y="{size - xy(t) + 4:.1f}" text-anchor="end">{t:g}x</text>')
    out.append(f'<text x="{size / 2}" y="{size - 12}" text-anchor="middle">predicted (expected) speed-up</text>')
    out.append(f'<text x="14" y="{size / 2}" transform="rotate(-90 14 {size / 2})" text-anchor="middle">measured speed-up</text>')
    for r in sorted(pts, key=lambda r: r["split"] == "held_out"):
        c = colours.get(r["remedy"], "#333") if r["split"] == "held_out" else "#bbb"
        out.append(f'<circle cx="{xy(r["expected"]):.1f}" cy="{size - xy(r["measured"]):.1f}" r="3" '
                   f'fill="{c}" fill-opacity="0.8"><title>{r["point"]} {r["remedy"]}: measured '
                   f'{r["measured"]:.2f}, expected {r["expected"]:.2f}</title></circle>')
    y = pad
    for rid, c in [("fit points (all remedies)", "#bbb"), *colours.items()]:
        out.append(f'<circle cx="{size + 10}" cy="{y}" r="4" fill="{c}"/><text x="{size + 20}" y="{y + 4}">{rid}</text>')
        y += 18
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/navdoctor-advice-cache"))
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--ranges", action="store_true",
                    help="only the ranges again (the folds refitted), the parameters kept")
    ap.add_argument("--only", nargs="*", help="with --fit: fit only these parameters")
    ap.add_argument("--advice", nargs="*",
                    default=[str(d) for d in sorted(ADVICE.parent.glob("advice*")) if (d / "timings.jsonl").exists()],
                    help="gpu_advice.sh result folders (default: fixtures/gpu/advice*, the committed runs)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--rows", type=Path, help="write every prediction row here (JSON lines)")
    ap.add_argument("--svg", type=Path, help="write the predicted-vs-measured plot here")
    ap.add_argument("--from-measured-base", action="store_true",
                    help="predict from the as-is step the remedies were measured against, not the "
                         "step diagnose timed (what the model gives where the host did not move)")
    a = ap.parse_args()
    a.cache.mkdir(parents=True, exist_ok=True)
    points = [*mixed_points(), *headroom_points(), *framework_points(), *advice_points(a.advice)]
    caps = {}
    for i, p in enumerate(points):
        caps[p["name"]] = load_capture(p["trace"], a.cache)
        print(f"\r{i + 1}/{len(points)} captures", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    if a.fit or a.ranges:
        params = fit(points, caps, only=a.only) if a.fit else dict(whatif.calibration().get("params", {}))
        whatif.CALIBRATION_OVERRIDE.clear()
        whatif.CALIBRATION_OVERRIDE.update({"params": params})
        params = {**whatif.PARAM_DEFAULTS, **params}       # every parameter, written out
        whatif.CALIBRATION_OVERRIDE.update({"ranges": {}})
        # the folds start from the model's defaults: no value fitted on a fold's own points
        # is carried into its refit
        rows = cross_validated(points, caps, dict(whatif.PARAM_DEFAULTS))
        cal = {"version": hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:8],
               "params": {k: round(v, 6) for k, v in sorted(params.items())},
               "ranges": ranges(rows),
               "ranges_from": f"{FOLDS}-fold cross-validation by network on the fit points",
               "fitted_on": sorted({f"{p['group']} {p['family']} {p['gpu']}" for p in points if p["split"] == "fit"}),
               "made_by": "bench/advice/calibrate.py --fit"}
        whatif.CALIBRATION_FILE.write_text(json.dumps(cal, indent=1) + "\n")
        whatif.CALIBRATION_OVERRIDE.clear()
        whatif._calibration_file.cache_clear()
    if a.from_measured_base:
        points = [dict(p, unprofiled_ms=p.get("measured_base_ms") or p["unprofiled_ms"]) for p in points]
    rows = predictions(points, caps)
    print(f"mean |replay error| of the traced steps: {replay_error(caps):.4f}", file=sys.stderr)
    if a.rows:
        a.rows.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if a.svg:
        svg_plot(rows, a.svg)
    report(rows, a.markdown)


if __name__ == "__main__":
    main()
