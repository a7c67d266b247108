"""One cause of GPU idle time mixed with a fixed amount of GPU compute, in a set proportion:
the mixed corpus of issue #20 (the verdict policy's ground truth).

The model (`--model`) is a torchvision ResNet-50 trained with SGD (fp32, batch 64 at 192 px,
`resnet50`, the default) or an LR-ASPP MobileNetV3 segmenting camera-sized frames in inference
(fp32, 512 px, `lraspp`: the navigation use case; `--batch` sets its batch, which `--calibrate`
picks so that the model alone takes ~15 ms or more), or in the same way a DeepLabV3 MobileNetV3
(`deeplabv3mnv3`) or an FCN ResNet-50 (`fcn50`), or two more classifiers trained as ResNet-50
is: a ConvNeXt-Tiny (`convnexttiny`) and an EfficientNet-B0 (`effnetb0`); the batch stays on the
GPU. On top of it
each step carries one cause of idle time, in an amount:

  data    --amount MS   CPU "augmentation" per batch in a DataLoader (workers 0)
                        fix: --workers 8 (persistent), the seed article's first I/O remedy
  host    --amount MS   CPU post-processing of each step's predictions on the loop thread
                        fix: the post-processing done on the GPU (no read-back, no CPU loop)
  launch  --amount N    N tiny elementwise GPU ops per step from a Python loop
                        fix: the same ops captured once in a CUDA graph and replayed
  sync    --amount N    N `.item()` reads per step, spread over the model's layers
                        fix: no reads inside the step (values stay on the GPU)
  copy    --amount MB   an extra MB of pageable host memory copied to the GPU per step
                        fix: pinned memory and a non_blocking copy
  none                  the model alone

`--fix cause` applies the cause's remedy, `--fix compute` the compute remedy (bf16 autocast
and channels_last), `--fix compile` a second compute remedy: the model through torch.compile
(fp32, default mode; compiled once per process and reused by later runs of the same model, so
that --repeat does not pay the compile again; not with the sync cause, whose reads inside
every layer would break the graph at each one). Step times come from CUDA events at the step boundaries (no per-step
synchronize, which would add a stall of its own). `--calibrate` prints the model's step time
and each cause's cost per unit of amount, from which run_mix.py picks amounts.

Prints `fix F steps N median_ms X` per variant. MIX_DEVICE=cpu runs it on the CPU (a smoke
test of the script where no GPU is at hand; its timings mean nothing).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch
import torchvision

MODELS = {"resnet50": dict(batch=64, side=192, classes=100),
          "lraspp": dict(batch=32, side=512, classes=21, seg=True),
          # two more segmentation families, held out from the compute headroom's design
          # (docs/accuracy.md): a MobileNetV3 DeepLabV3 and an FCN on a ResNet-50 backbone
          "deeplabv3mnv3": dict(batch=16, side=512, classes=21, seg=True),
          "fcn50": dict(batch=8, side=512, classes=21, seg=True),
          # two classifier families held out (chosen, with their shares, before any of
          # their points ran), trained as ResNet-50 is: a compute-heavy modern one, and a
          # mobile one with depthwise convolutions
          "convnexttiny": dict(batch=64, side=192, classes=100, arch="convnext_tiny"),
          "effnetb0": dict(batch=64, side=192, classes=100, arch="efficientnet_b0")}
SEGMENTERS = {"lraspp": "lraspp_mobilenet_v3_large", "deeplabv3mnv3": "deeplabv3_mobilenet_v3_large",
              "fcn50": "fcn_resnet50"}
DEV = torch.device(os.environ.get("MIX_DEVICE", "cuda"))
ON_GPU = DEV.type == "cuda"
try:
    from navdoctor import step as mark_step
except ImportError:
    def mark_step():
        pass


def busy_cpu(ms: float, state: np.ndarray) -> np.ndarray:
    """Real CPU work (a repeated box blur of a small image) until `ms` have passed."""
    end = time.perf_counter() + ms / 1e3
    x = state
    while time.perf_counter() < end:
        x = (x + np.roll(x, 1, 0) + np.roll(x, 1, 1)) / 3.0
    return x


def gpu_sync():
    if ON_GPU:
        torch.cuda.synchronize()


class Samples(torch.utils.data.Dataset):
    """Samples as the model takes them: float images for the classifier, uint8 camera frames
    (made float on the GPU) for the segmenter."""

    def __init__(self, n: int, ms_per_sample: float, side: int, classes: int, frames: bool):
        self.n, self.ms, self.classes = n, ms_per_sample, classes
        rng = np.random.default_rng(0)
        self.patch = rng.random((32, 32), dtype=np.float32)
        if frames:
            self.sample = torch.from_numpy(rng.integers(0, 256, (3, side, side), dtype=np.uint8))
        else:
            self.sample = torch.from_numpy(rng.random((3, side, side), dtype=np.float32))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        busy_cpu(self.ms, self.patch)
        return self.sample.clone(), i % self.classes


class EventTimer:
    def __init__(self):
        self.marks = []
        self.lap()

    def lap(self):
        if ON_GPU:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
        else:
            e = time.perf_counter()
        self.marks.append(e)

    def times_ms(self):
        gpu_sync()
        if ON_GPU:
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]


def add_sync_hooks(model: torch.nn.Module, n: int) -> int:
    """`.item()` reads spread over the leaf modules, n per step in all."""
    leaves = [m for m in model.modules() if not list(m.children())]
    per = [n // len(leaves) + (1 if i < n % len(leaves) else 0) for i in range(len(leaves))]
    for m, k in zip(leaves, per):
        if k:
            def hook(_m, _inp, out, k=k):
                for _ in range(k):
                    # one element, no copy: the earlier read, reshape(-1)[0], of a
                    # non-contiguous output (ConvNeXt's permuted blocks, any channels_last
                    # activation) copied the whole tensor each read
                    out[(0,) * out.dim()].item()
            m.register_forward_hook(hook)
    return sum(per)


def tiny_ops(t: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        t = t * 0.999 + 0.001
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=("none", "data", "host", "launch", "sync", "copy"), default="none")
    ap.add_argument("--amount", type=float, default=0.0)
    ap.add_argument("--fix", default="none",
                    help="none | cause | compute, or several with commas (one run each, in turn)")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--model", choices=tuple(MODELS), default="resnet50")
    ap.add_argument("--batch", type=int, help="the model's batch (default: MODELS')")
    ap.add_argument("--calibrate", action="store_true")
    a = ap.parse_args()
    cfg = {**MODELS[a.model], "name": a.model, **({"batch": a.batch} if a.batch else {})}
    if a.calibrate:
        print(json.dumps(calibrate(cfg, a.batch is None)))
        return
    for fix in a.fix.split(","):
        if fix not in ("none", "cause", "compute", "compile"):
            raise SystemExit(f"--fix {fix}: expected none, cause, compute or compile")
        if fix == "compile" and a.kind == "sync":
            raise SystemExit("--fix compile: not with --kind sync (a graph break at every read)")
        print(f"fix {fix} steps {a.steps} median_ms {run(cfg, a.kind, a.amount, fix, a.steps):.3f}", flush=True)


_COMPILED: dict = {}


def build(cfg: dict, fix: str):
    torch.backends.cudnn.benchmark = True
    if fix == "compile" and cfg["name"] in _COMPILED:
        return _COMPILED[cfg["name"]]
    fmt = torch.channels_last if fix == "compute" else torch.contiguous_format
    if cfg.get("seg"):
        ctor = getattr(torchvision.models.segmentation, SEGMENTERS[cfg["name"]])
        model = ctor(weights=None, weights_backbone=None, num_classes=cfg["classes"]).eval()
    else:
        model = getattr(torchvision.models, cfg.get("arch", cfg["name"]))(num_classes=cfg["classes"])
    model = model.to(DEV, memory_format=fmt)
    # the classifiers train (SGD), the segmenters infer
    opt = None if cfg.get("seg") else torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(cfg["batch"], 3, cfg["side"], cfg["side"], device=DEV).to(memory_format=fmt)
    y = torch.randint(0, cfg["classes"], (cfg["batch"],), device=DEV)
    if fix == "compile":
        _COMPILED[cfg["name"]] = built = (torch.compile(model), opt, x, y)
        return built
    return model, opt, x, y


def forward_step(model, opt, x, y, autocast, aux=None):
    """One step: a training step (forward, loss, backward, SGD) or a segmentation inference.
    Returns per-sample logits (batch, classes) for the host cause's post-processing; `aux`
    (the copy cause's memory) is used by the step so that the copy is part of it."""
    if opt is None:
        with torch.inference_mode(), autocast:
            logits = model(x)["out"].amax((2, 3))
            return logits if aux is None else logits + 0.0 * aux[:1].sum()
    with autocast:
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
    if aux is not None:
        loss = loss + 0.0 * aux[:1].sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return logits


def run(cfg: dict, kind: str, amount: float, fix: str, steps: int) -> float:
    model, opt, x0, y0 = build(cfg, fix)
    dev = DEV
    autocast = torch.autocast(dev.type, torch.bfloat16, enabled=fix == "compute")
    fmt = torch.channels_last if fix == "compute" else torch.contiguous_format
    cause_fixed = fix == "cause"
    if kind == "sync" and not cause_fixed:
        add_sync_hooks(model, int(amount))
    state = np.random.default_rng(1).random((32, 32), dtype=np.float32)
    small = torch.ones(1024, device=dev)
    graph = None
    if kind == "launch" and cause_fixed and ON_GPU:
        static_in = small.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            tiny_ops(static_in, int(amount))          # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = tiny_ops(static_in, int(amount))
    extra = None
    if kind == "copy":
        n = int(amount * 2**20 / 4)
        extra = torch.rand(n)
        if cause_fixed and ON_GPU:
            extra = extra.pin_memory()
    if kind == "data":
        workers = 8 if cause_fixed else 0
        frames = bool(cfg.get("seg"))
        batch = cfg["batch"]
        loader = torch.utils.data.DataLoader(
            Samples(batch * (steps + 2), amount / batch, cfg["side"], cfg["classes"], frames),
            batch_size=batch, num_workers=workers, pin_memory=ON_GPU,
            persistent_workers=workers > 0, prefetch_factor=4 if workers else None)

        def on_device(xb):
            xb = xb.to(dev, non_blocking=True)
            return (xb.float().div_(255) if frames else xb).to(memory_format=fmt)
        batches = ((on_device(xb), yb.to(dev, non_blocking=True)) for xb, yb in loader)
    else:
        batches = ((x0, y0) for _ in range(steps + 2))
    timer = None
    for n, (x, y) in enumerate(batches):
        if n == 2:                  # two warm-up steps (cuDNN autotuning, allocator)
            gpu_sync()
            timer = EventTimer()
        aux = extra.to(dev, non_blocking=cause_fixed) if kind == "copy" else None
        logits = forward_step(model, opt, x, y, autocast, aux)
        if kind == "host":
            if cause_fixed:
                top = logits.detach().float().softmax(1).topk(5, 1)      # stays on the GPU
            else:
                probs = logits.detach().float().softmax(1).cpu().numpy()
                state = busy_cpu(amount, state + probs[0, :1].mean())
        if kind == "launch":
            if graph is not None:
                graph.replay()
            else:
                small = tiny_ops(small, int(amount))
        if timer is not None:
            timer.lap()
        mark_step()
        if n + 1 >= steps + 2:
            break
    return statistics.median(timer.times_ms())


def calibrate(cfg: dict, pick_batch: bool) -> dict:
    """The model's step time and each cause's cost per unit of amount. For the segmenter with
    no --batch, the batch doubles from 8 until the model alone takes >= 15 ms (at most 64), so
    that the compute part of a mixed step is the GPU's, as in the classifier's points."""
    out = {"model": cfg["name"]}
    if pick_batch and cfg.get("seg"):
        cfg["batch"] = 8
        while (ms := run(cfg, "none", 0, "none", 12)) < 15 and cfg["batch"] < 64:
            cfg["batch"] *= 2
    out["batch"] = cfg["batch"]
    out["model_ms"] = run(cfg, "none", 0, "none", 20)
    out["model_compute_fixed_ms"] = run(cfg, "none", 0, "compute", 20)
    if os.environ.get("MIX_COMPILE"):
        t = time.perf_counter()
        out["model_compile_fixed_ms"] = run(cfg, "none", 0, "compile", 20)
        out["compile_s"] = round(time.perf_counter() - t, 1)
    small = torch.ones(1024, device=DEV)
    gpu_sync()
    t = time.perf_counter()
    tiny_ops(small, 4000)
    gpu_sync()
    out["launch_ms_per_op"] = (time.perf_counter() - t) * 1e3 / 4000
    with_syncs = run(cfg, "sync", 320, "none", 12)
    out["sync_ms_per_read"] = max(1e-4, (with_syncs - out["model_ms"]) / 320)
    host = torch.rand(64 * 2**18)
    gpu_sync()
    t = time.perf_counter()
    for _ in range(5):
        host.to(DEV)
    gpu_sync()
    out["copy_ms_per_mb"] = (time.perf_counter() - t) * 1e3 / (5 * 64)
    return out


if __name__ == "__main__":
    main()
