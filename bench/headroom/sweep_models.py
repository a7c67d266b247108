"""What the standard compute remedies (bf16 autocast, channels_last, both) measurably do to
torchvision models on a GPU, next to a torch.profiler capture of each as it runs in fp32: the
ground truth for navdoctor's compute headroom (docs/verdict.md, "Compute headroom"), which
predicts the second from the first by kernel names alone.

    python bench/headroom/sweep_models.py --out DIR [--only a,b] [--steps 20] [--budget S]

For each model: the step time (median of --steps, CUDA events at step boundaries, after 5
warm-up steps, cudnn.benchmark on, torch's default TF32 settings) in four variants — fp32,
amp (bf16 autocast), cl (channels_last), amp_cl (both) — in two interleaved rounds, then one
torch.profiler capture of the fp32 variant and one of amp_cl (3 active steps, CPU and CUDA,
no shapes or stacks), written as DIR/<model>.<variant>.json.gz. One JSON line per model goes
to DIR/results.jsonl as soon as it is measured; a model already there is skipped (resumable).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import time

import torch
import torchvision

M = torchvision.models
SEG = M.segmentation
# name -> (constructor, batch, side, mode); inference unless mode == "train"
MODELS = {
    "resnet18": (lambda: M.resnet18(), 64, 224, "infer"),
    "resnet50": (lambda: M.resnet50(), 64, 224, "infer"),
    "resnet50_train": (lambda: M.resnet50(), 32, 224, "train"),
    "mobilenet_v3_large": (lambda: M.mobilenet_v3_large(), 64, 224, "infer"),
    "mobilenet_v3_large_train": (lambda: M.mobilenet_v3_large(), 64, 224, "train"),
    "efficientnet_b0": (lambda: M.efficientnet_b0(), 64, 224, "infer"),
    "convnext_tiny": (lambda: M.convnext_tiny(), 64, 224, "infer"),
    "regnet_y_1_6gf": (lambda: M.regnet_y_1_6gf(), 64, 224, "infer"),
    "densenet121": (lambda: M.densenet121(), 64, 224, "infer"),
    "vit_b_16": (lambda: M.vit_b_16(), 64, 224, "infer"),
    "vit_b_16_train": (lambda: M.vit_b_16(), 16, 224, "train"),
    "swin_t": (lambda: M.swin_t(), 64, 224, "infer"),
    "lraspp_mobilenet_v3_large": (lambda: SEG.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None), 16, 512, "infer"),
    "deeplabv3_mobilenet_v3_large": (lambda: SEG.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None), 16, 512, "infer"),
    "fcn_resnet50": (lambda: SEG.fcn_resnet50(weights=None, weights_backbone=None), 8, 512, "infer"),
    "deeplabv3_resnet50": (lambda: SEG.deeplabv3_resnet50(weights=None, weights_backbone=None), 8, 512, "infer"),
    # held out from headroom.DEPTHWISE_SHARE (committed before their capture, cf50d00):
    # depthwise networks, grouped-convolution ones (not depthwise), a larger ConvNeXt
    "mobilenet_v2": (lambda: M.mobilenet_v2(), 64, 224, "infer"),
    "mnasnet1_0": (lambda: M.mnasnet1_0(), 64, 224, "infer"),
    "shufflenet_v2_x1_0": (lambda: M.shufflenet_v2_x1_0(), 64, 224, "infer"),
    "efficientnet_b2": (lambda: M.efficientnet_b2(), 32, 288, "infer"),
    "resnext50_32x4d": (lambda: M.resnext50_32x4d(), 64, 224, "infer"),
    "convnext_small": (lambda: M.convnext_small(), 64, 224, "infer"),
    "regnet_x_800mf": (lambda: M.regnet_x_800mf(), 64, 224, "infer"),
    "mobilenet_v3_small": (lambda: M.mobilenet_v3_small(), 128, 224, "infer"),
}
VARIANTS = ("fp32", "amp", "cl", "amp_cl")
DEV = torch.device(os.environ.get("HEADROOM_DEVICE", "cuda"))   # cpu: a smoke test only


def build(name: str, variant: str):
    ctor, batch, side, mode = MODELS[name]
    fmt = torch.channels_last if "cl" in variant else torch.contiguous_format
    model = ctor().to(DEV, memory_format=fmt)
    model.train(mode == "train")
    x = torch.randn(batch, 3, side, side, device=DEV).to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if mode == "train" else None
    autocast = torch.autocast(DEV.type, torch.bfloat16, enabled="amp" in variant)

    def step():
        if opt is None:
            with torch.inference_mode(), autocast:
                out = model(x)
            return
        with autocast:
            out = model(x)
            out = out["out"] if isinstance(out, dict) else out
            loss = out.float().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def time_variant(name: str, variant: str, steps: int) -> float:
    torch.backends.cudnn.benchmark = True
    step = build(name, variant)
    for _ in range(5):
        step()
    if DEV.type != "cuda":
        t = []
        for _ in range(steps):
            s = time.perf_counter(); step(); t.append((time.perf_counter() - s) * 1e3)
        return statistics.median(t)
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    ev[0].record()
    for i in range(steps):
        step()
        ev[i + 1].record()
    torch.cuda.synchronize()
    return statistics.median(ev[i].elapsed_time(ev[i + 1]) for i in range(steps))


def capture(name: str, variant: str, path: str) -> None:
    step = build(name, variant)
    sched = torch.profiler.schedule(wait=1, warmup=2, active=3, repeat=1)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if DEV.type == "cuda" else [])
    with torch.profiler.profile(activities=acts, schedule=sched) as prof:
        for _ in range(6):
            step()
            if DEV.type == "cuda":
                torch.cuda.synchronize()
            prof.step()
    raw = path[:-3]
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as a, gzip.open(path, "wb", compresslevel=9) as b:
        shutil.copyfileobj(a, b)
    os.remove(raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", help="comma-separated model names")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--budget", type=float, default=1e9, help="seconds; start no model after it")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    res = os.path.join(a.out, "results.jsonl")
    done = set()
    if os.path.exists(res):
        done = {json.loads(l)["model"] for l in open(res) if l.strip()}
    t0 = time.perf_counter()
    for name in (a.only.split(",") if a.only else MODELS):
        if name in done:
            continue
        if time.perf_counter() - t0 > a.budget:
            print(f"budget reached before {name}", flush=True)
            break
        t = time.perf_counter()
        rounds = []
        try:
            for _ in range(2):
                rounds.append({v: round(time_variant(name, v, a.steps), 3) for v in VARIANTS})
            for v in ("fp32", "amp_cl"):
                capture(name, v, os.path.join(a.out, f"{name}.{v}.json.gz"))
        except Exception as e:          # out of memory, an op without bf16: keep going
            line = {"model": name, "error": f"{type(e).__name__}: {e}"[:300]}
        else:
            med = {v: round(statistics.median(r[v] for r in rounds), 3) for v in VARIANTS}
            _, batch, side, mode = MODELS[name]
            line = {"model": name, "batch": batch, "side": side, "mode": mode, "ms": med,
                    "rounds": rounds, "speedup": {v: round(med["fp32"] / med[v], 3) for v in VARIANTS[1:]},
                    "gpu": torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu", "torch": torch.__version__,
                    "seconds": round(time.perf_counter() - t, 1)}
        if DEV.type == "cuda":
            torch.cuda.empty_cache()
        with open(res, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
