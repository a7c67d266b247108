"""Loops written the way applications write them, each with the remedies navdoctor may advise
as variants, for scoring its predicted speed-ups against measured ones (docs/accuracy.md,
"Predicted speed-ups").

    python bench/advice/loops.py --kind KIND [--variant V] [--steps N] [--small]
    python bench/advice/loops.py --kind KIND --time-variants V1,V2,... [--rounds R]

Kinds (none imports navdoctor or marks its steps; navdoctor finds them):
  seed          the seed article's script: ResNet-50, batch 16, 256x256, eval() but no
                no_grad, fp32 (TF32 convolutions, PyTorch's default)
                variants: no_grad, cuda_graphs (forward captured once, no_grad), amp_bf16,
                channels_last, bf16_cl (both)
  frame_seg     a camera loop: a JPEG decoded with OpenCV, resized and normalised on the CPU,
                LR-ASPP MobileNetV3 at batch 1 (512x512), the logits copied back, argmax,
                the mask resized and blended onto the frame on the CPU
                variants: gpu_pre (resize/normalise on the GPU), gpu_post (argmax, resize and
                blend on the GPU, the blended frame copied back), gpu_pre_post (both)
  street        a street-scene segmenter at 1024x2048 (LR-ASPP, 21 classes): the full fp32
                logits (176 MB) copied back and the argmax taken in numpy
                variants: reduce_on_gpu (argmax on the GPU, a uint8 mask copied back)
  train_loader  ResNet-18 training at batch 64, 160 px, a Dataset that decodes JPEGs and
                augments them on the CPU, DataLoader with 0 workers
                variants: workers4, workers8 (persistent, pinned), amp_bf16
  small_batch1  MobileNetV3-Small inference at batch 1, 224 px, output read each frame
                variants: cuda_graphs, amp_bf16
  sync_metrics  ResNet-18 training at batch 32 whose loop reads the loss, the accuracy and
                every parameter's gradient norm with .item() each step
                variants: no_sync (the same figures accumulated on the GPU, read every 50)
  multi_cam     four cameras' 1080p uint8 frames stacked into one pageable numpy batch, copied
                to the GPU, converted, resized to 384 px and normalised there, ShuffleNetV2 x1.0
                at batch 4, the four labels read back
                variants: pinned (the frames gathered into a pinned staging buffer, copied
                with non_blocking), amp_bf16
  regnet_train  RegNetY-800MF training at batch 96, 192 px, data already on the GPU, SGD with
                momentum, the loss read each step
                variants: amp_bf16, channels_last, bf16_cl (both)
  conf_map      a per-frame obstacle map: DeepLabV3 MobileNetV3 at batch 1 (480x640, the frame
                copied in as uint8 and normalised on the GPU), the fp32 logits copied back, a
                softmax, its maximum and argmax in numpy, pixels of four obstacle classes above
                0.5 confidence kept
                variants: gpu_post (softmax, maximum and argmax on the GPU; a uint8 class map
                and an fp16 confidence map copied back)

--variant runs one variant (default: as_is) for --steps steps and prints `step ms X` per step:
that is what `navdoctor diagnose` runs. --time-variants times the listed variants (as_is
first) in one process, interleaved over --rounds rounds, and prints one JSON line per
variant: {"kind", "variant", "median_ms", "rounds_ms"}. Times are wall time per step
with the step's own synchronisation (a frame loop reads its result back; a training step
reads its loss) or, for the seed script, which never synchronises, the time of --steps
steps after a synchronize, per step.
"""
from __future__ import annotations

import argparse
import io
import json
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
import torchvision

try:
    import cv2
except ImportError:   # PIL serves on machines without OpenCV (its timings are not the GPU's)
    cv2 = None

KINDS = {"seed": ("as_is", "no_grad", "cuda_graphs", "amp_bf16", "channels_last", "bf16_cl"),
         "frame_seg": ("as_is", "gpu_pre", "gpu_post", "gpu_pre_post"),
         "street": ("as_is", "reduce_on_gpu"),
         "train_loader": ("as_is", "workers4", "workers8", "amp_bf16"),
         "small_batch1": ("as_is", "cuda_graphs", "amp_bf16"),
         "sync_metrics": ("as_is", "no_sync"),
         "multi_cam": ("as_is", "pinned", "amp_bf16"),
         "regnet_train": ("as_is", "amp_bf16", "channels_last", "bf16_cl"),
         "conf_map": ("as_is", "gpu_post")}


def _jpeg(h: int, w: int, seed: int) -> bytes:
    """A photo-like frame (smooth gradients, edges, noise), JPEG-encoded."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // max(w, 1)), (y * 255 // max(h, 1)), ((x + y) * 127 // max(h + w, 1))], -1)
    img = (img + rng.integers(0, 40, (h, w, 3))).clip(0, 255).astype(np.uint8)
    img[h // 3: h // 2, w // 4: w // 2] = rng.integers(0, 255, 3)
    if cv2 is not None:
        return cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _decode(data: bytes) -> np.ndarray:
    if cv2 is not None:
        return cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _resize(img: np.ndarray, w: int, h: int, nearest: bool = False) -> np.ndarray:
    if cv2 is not None:
        return cv2.resize(img, (w, h), interpolation=cv2.INTER_NEAREST if nearest else cv2.INTER_LINEAR)
    from PIL import Image
    return np.asarray(Image.fromarray(img).resize((w, h), Image.NEAREST if nearest else Image.BILINEAR))


MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def _norm_tensors(dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """MEAN and STD as (1, 3, 1, 1) tensors on dev, for normalising there."""
    return torch.tensor(MEAN, device=dev).view(1, 3, 1, 1), torch.tensor(STD, device=dev).view(1, 3, 1, 1)


def _frame_on(dev: torch.device, frame: np.ndarray) -> torch.Tensor:
    """An HxWx3 uint8 frame copied to dev as a 1x3xHxW float in [0, 1]."""
    return torch.from_numpy(frame).to(dev).permute(2, 0, 1).unsqueeze(0).float().div_(255)


class Loop:
    """One kind's state; step(variant) runs one step (one frame, one batch)."""

    def __init__(self, kind: str, dev: torch.device, small: bool):
        self.kind, self.dev, self.small = kind, dev, small
        getattr(self, f"_build_{kind}")()

    def sync(self):
        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    # ---- seed -----------------------------------------------------------------------------
    def _build_seed(self):
        side, batch = (64, 2) if self.small else (256, 16)
        self.model = torchvision.models.resnet50().to(self.dev).eval()
        self.model_cl = None
        self.x = torch.randn(batch, 3, side, side, device=self.dev)
        self.graph = None

    def step_seed(self, v: str):
        if v == "as_is":
            return self.model(self.x)
        if v == "no_grad":
            with torch.no_grad():
                return self.model(self.x)
        if v == "cuda_graphs":
            if self.graph is None:
                with torch.no_grad():
                    self.graph, self.static_out = _capture(self.model, self.x)
            self.graph.replay()
            return self.static_out
        cl = v in ("channels_last", "bf16_cl")
        if cl and self.model_cl is None:
            self.model_cl = torchvision.models.resnet50().to(self.dev).eval().to(memory_format=torch.channels_last)
            self.x_cl = self.x.contiguous(memory_format=torch.channels_last)
        model, x = (self.model_cl, self.x_cl) if cl else (self.model, self.x)
        with torch.autocast(self.dev.type, torch.bfloat16, enabled=v in ("amp_bf16", "bf16_cl")):
            return model(x)

    # ---- frame_seg ------------------------------------------------------------------------
    def _build_frame_seg(self):
        self.H, self.W = (120, 160) if self.small else (720, 1280)
        self.side = 64 if self.small else 512
        self.frames = [_jpeg(self.H, self.W, i) for i in range(8)]
        self.model = torchvision.models.segmentation.lraspp_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=21).to(self.dev).eval()
        rng = np.random.default_rng(0)
        self.palette = rng.integers(0, 255, (21, 3)).astype(np.uint8)
        self.palette_t = torch.from_numpy(self.palette).to(self.dev)
        self.mean_t, self.std_t = _norm_tensors(self.dev)
        self.i = 0

    def step_frame_seg(self, v: str):
        frame = _decode(self.frames[self.i % len(self.frames)])
        self.i += 1
        with torch.no_grad():
            if v in ("gpu_pre", "gpu_pre_post"):
                t = _frame_on(self.dev, frame)
                frame_t = t
                x = F.interpolate(t, size=(self.side, self.side), mode="bilinear", align_corners=False)
                x = (x - self.mean_t) / self.std_t
            else:
                small = _resize(frame, self.side, self.side).astype(np.float32) / 255
                x = torch.from_numpy(((small - MEAN) / STD).transpose(2, 0, 1)[None].copy()).to(self.dev)
                frame_t = None
            logits = self.model(x)["out"]
            if v in ("gpu_post", "gpu_pre_post"):
                if frame_t is None:
                    frame_t = _frame_on(self.dev, frame)
                mask = logits.argmax(1, keepdim=True).float()
                mask = F.interpolate(mask, size=(self.H, self.W), mode="nearest").long()[0, 0]
                color = self.palette_t[mask].permute(2, 0, 1).float() / 255
                out = (0.6 * frame_t[0] + 0.4 * color).mul_(255).byte().permute(1, 2, 0).cpu().numpy()
            else:
                lg = logits.cpu().numpy()[0]
                mask = lg.argmax(0).astype(np.uint8)
                mask = _resize(mask, self.W, self.H, nearest=True)
                color = self.palette[mask]
                out = (0.6 * frame + 0.4 * color).astype(np.uint8)
        return out

    # ---- street ---------------------------------------------------------------------------
    def _build_street(self):
        h, w = (64, 128) if self.small else (1024, 2048)
        self.model = torchvision.models.segmentation.lraspp_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=21).to(self.dev).eval()
        self.x = torch.randn(1, 3, h, w, device=self.dev)

    def step_street(self, v: str):
        with torch.no_grad():
            logits = self.model(self.x)["out"]
            if v == "reduce_on_gpu":
                return logits.argmax(1).to(torch.uint8).cpu().numpy()
            return logits.cpu().numpy().argmax(1).astype(np.uint8)

    # ---- train_loader ---------------------------------------------------------------------
    def _build_train_loader(self):
        side, self.batch = (32, 8) if self.small else (160, 64)
        self.side = side
        self.images = [_jpeg(side * 2, side * 2, i) for i in range(64)]
        self.model = torchvision.models.resnet18(num_classes=100).to(self.dev)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loaders = {}

    def _loader(self, v: str):
        if v not in self.loaders:
            ds = _JpegSet(self.images, self.side, 10_000_000)
            workers = {"workers4": 4, "workers8": 8}.get(v, 0)
            kw = dict(num_workers=workers, pin_memory=workers > 0 and self.dev.type == "cuda",
                      persistent_workers=workers > 0)
            if workers:
                kw["prefetch_factor"] = 4
            self.loaders[v] = iter(torch.utils.data.DataLoader(ds, batch_size=self.batch, shuffle=False,
                                                               drop_last=True, **kw))
        return self.loaders[v]

    def step_train_loader(self, v: str):
        x, y = next(self._loader(v))
        x, y = x.to(self.dev, non_blocking=True), y.to(self.dev, non_blocking=True)
        with torch.autocast(self.dev.type, torch.bfloat16, enabled=v == "amp_bf16"):
            loss = F.cross_entropy(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.item()

    # ---- small_batch1 ---------------------------------------------------------------------
    def _build_small_batch1(self):
        side = 64 if self.small else 224
        self.model = torchvision.models.mobilenet_v3_small(num_classes=1000).to(self.dev).eval()
        self.x = torch.randn(1, 3, side, side, device=self.dev)
        self.graph = None

    def step_small_batch1(self, v: str):
        with torch.no_grad():
            if v == "cuda_graphs":
                if self.graph is None:
                    self.graph, self.static_out = _capture(self.model, self.x)
                self.graph.replay()
                out = self.static_out
            else:
                with torch.autocast(self.dev.type, torch.bfloat16, enabled=v == "amp_bf16"):
                    out = self.model(self.x)
            return int(out.argmax())

    # ---- sync_metrics ---------------------------------------------------------------------
    def _build_sync_metrics(self):
        side, batch = (32, 4) if self.small else (128, 32)
        self.model = torchvision.models.resnet18(num_classes=100).to(self.dev)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.x = torch.randn(batch, 3, side, side, device=self.dev)
        self.y = torch.randint(0, 100, (batch,), device=self.dev)
        self.acc = None
        self.n = 0

    def step_sync_metrics(self, v: str):
        out = self.model(self.x)
        loss = F.cross_entropy(out, self.y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if v == "no_sync":
            norms = torch.stack([p.grad.norm() for p in self.model.parameters()])
            figures = torch.cat([loss.detach()[None], (out.argmax(1) == self.y).float().mean()[None], norms])
            self.acc = figures if self.acc is None else self.acc + figures
            self.n += 1
            if self.n % 50 == 0:
                self.acc.tolist()
        else:
            loss.item()
            (out.argmax(1) == self.y).float().mean().item()
            for p in self.model.parameters():
                p.grad.norm().item()
        self.opt.step()

    # ---- multi_cam ------------------------------------------------------------------------
    def _build_multi_cam(self):
        self.H, self.W = (90, 160) if self.small else (1080, 1920)
        self.side = 64 if self.small else 384
        rng = np.random.default_rng(0)
        # eight captured frames per camera, cycled: what a capture thread hands the loop
        self.frames = [[rng.integers(0, 255, (self.H, self.W, 3), dtype=np.uint8) for _ in range(4)]
                       for _ in range(8)]
        self.model = torchvision.models.shufflenet_v2_x1_0(num_classes=10).to(self.dev).eval()
        self.mean_t, self.std_t = _norm_tensors(self.dev)
        self.staging = None
        self.i = 0

    def step_multi_cam(self, v: str):
        cams = self.frames[self.i % len(self.frames)]
        self.i += 1
        with torch.no_grad():
            if v == "pinned":
                if self.staging is None:
                    self.staging = torch.empty((4, self.H, self.W, 3), dtype=torch.uint8,
                                               pin_memory=self.dev.type == "cuda")
                staged = self.staging.numpy()
                for k, f in enumerate(cams):
                    staged[k] = f
                x = self.staging.to(self.dev, non_blocking=True)
            else:
                x = torch.from_numpy(np.stack(cams)).to(self.dev)
            x = x.permute(0, 3, 1, 2).float().div_(255)
            x = F.interpolate(x, size=(self.side, self.side), mode="bilinear", align_corners=False)
            x = (x - self.mean_t) / self.std_t
            with torch.autocast(self.dev.type, torch.bfloat16, enabled=v == "amp_bf16"):
                out = self.model(x)
            return out.argmax(1).tolist()

    # ---- regnet_train ---------------------------------------------------------------------
    def _build_regnet_train(self):
        side, batch = (32, 4) if self.small else (192, 96)
        self.models = {}
        self.x = torch.randn(batch, 3, side, side, device=self.dev)
        self.y = torch.randint(0, 100, (batch,), device=self.dev)

    def step_regnet_train(self, v: str):
        cl = v in ("channels_last", "bf16_cl")
        if cl not in self.models:      # one model per layout, as a script converts once
            torch.manual_seed(0)
            m = torchvision.models.regnet_y_800mf(num_classes=100).to(self.dev)
            if cl:
                m = m.to(memory_format=torch.channels_last)
            self.models[cl] = (m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
                               self.x.contiguous(memory_format=torch.channels_last) if cl else self.x)
        model, opt, x = self.models[cl]
        with torch.autocast(self.dev.type, torch.bfloat16, enabled=v in ("amp_bf16", "bf16_cl")):
            loss = F.cross_entropy(model(x), self.y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    # ---- conf_map -------------------------------------------------------------------------
    OBSTACLES = (2, 6, 7, 15)      # VOC's bicycle, bus, car, person

    def _build_conf_map(self):
        self.H, self.W = (48, 64) if self.small else (480, 640)
        rng = np.random.default_rng(0)
        self.frames = [rng.integers(0, 255, (self.H, self.W, 3), dtype=np.uint8) for _ in range(8)]
        self.model = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=21, aux_loss=False).to(self.dev).eval()
        self.mean_t, self.std_t = _norm_tensors(self.dev)
        self.i = 0

    def step_conf_map(self, v: str):
        frame = self.frames[self.i % len(self.frames)]
        self.i += 1
        with torch.no_grad():
            x = _frame_on(self.dev, frame)
            logits = self.model((x - self.mean_t) / self.std_t)["out"][0]
            if v == "gpu_post":
                conf, cls = logits.softmax(0).max(0)
                cls = cls.to(torch.uint8).cpu().numpy()
                conf = conf.half().cpu().numpy()
            else:
                lg = logits.cpu().numpy()
                e = np.exp(lg - lg.max(0, keepdims=True))
                p = e / e.sum(0, keepdims=True)
                conf, cls = p.max(0), p.argmax(0).astype(np.uint8)
            return np.isin(cls, self.OBSTACLES) & (conf > 0.5)


def _capture(model, x):
    """model(x) captured once in a CUDA graph (after warm-up runs on a side stream, as the
    CUDA graphs notes ask); returns the graph and its static output. x stays the input."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(x)
    return graph, out


class _JpegSet(torch.utils.data.Dataset):
    def __init__(self, images, side, n):
        self.images, self.side, self.n = images, side, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        img = _decode(self.images[i % len(self.images)])
        rng = np.random.default_rng(i)
        y0, x0 = rng.integers(0, img.shape[0] - self.side), rng.integers(0, img.shape[1] - self.side)
        crop = img[y0:y0 + self.side, x0:x0 + self.side].astype(np.float32) / 255
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        crop = (crop - MEAN) / STD
        return torch.from_numpy(crop.transpose(2, 0, 1).copy()), i % 100


def time_steps(loop: Loop, v: str, steps: int) -> list[float]:
    """Per-step wall times in ms (the seed script: one figure, --steps steps over their count)."""
    fn = getattr(loop, f"step_{loop.kind}")
    if loop.kind == "seed":
        loop.sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            fn(v)
        loop.sync()
        return [(time.perf_counter() - t0) * 1000 / steps]
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn(v)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _seed_profile(loop: Loop, variant: str, out_dir: str) -> None:
    from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler
    fn = getattr(loop, f"step_{loop.kind}")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if loop.dev.type == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(out_dir), record_shapes=True,
                 profile_memory=True, with_stack=True) as prof:
        for _ in range(5):
            with record_function("model_inference"):
                fn(variant)
            prof.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=sorted(KINDS), required=True)
    ap.add_argument("--variant", default="as_is")
    ap.add_argument("--time-variants", default=None)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="tiny sizes, for a CPU")
    ap.add_argument("--seed-profile", metavar="DIR", default=None,
                    help="the seed article's own torch.profiler block around --variant (wait 1, "
                         "warmup 1, active 3; record_shapes, profile_memory, with_stack; "
                         "tensorboard_trace_handler(DIR)), as its readers capture a trace")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    dev = torch.device(a.device)
    torch.manual_seed(0)
    loop = Loop(a.kind, dev, a.small)
    if a.seed_profile:
        _seed_profile(loop, a.variant, a.seed_profile)
        return
    if a.time_variants is None:
        if a.variant not in KINDS[a.kind]:
            raise SystemExit(f"--variant {a.variant}: not one of {KINDS[a.kind]}")
        fn = getattr(loop, f"step_{a.kind}")
        for _ in range(a.warmup):
            fn(a.variant)
        loop.sync()
        for _ in range(a.steps):
            t0 = time.perf_counter()
            fn(a.variant)
            loop.sync()
            print(f"step ms {(time.perf_counter() - t0) * 1000:.3f}", flush=True)
        return
    variants = ["as_is"] + [v for v in a.time_variants.split(",") if v and v != "as_is"]
    for v in variants:
        if v not in KINDS[a.kind]:
            raise SystemExit(f"--time-variants {v}: not one of {KINDS[a.kind]}")
        if v == "cuda_graphs" and dev.type != "cuda":
            raise SystemExit("cuda_graphs needs CUDA")
    rounds: dict[str, list[float]] = {v: [] for v in variants}
    for v in variants:                       # warm every variant up first (graphs, workers)
        time_steps(loop, v, a.warmup)
    for _ in range(a.rounds):
        for v in variants:
            rounds[v].append(statistics.median(time_steps(loop, v, a.steps)))
    for v in variants:
        print(json.dumps({"kind": a.kind, "variant": v, "median_ms": round(statistics.median(rounds[v]), 3),
                          "rounds_ms": [round(r, 3) for r in rounds[v]], "device": str(dev),
                          "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None}), flush=True)


if __name__ == "__main__":
    main()
