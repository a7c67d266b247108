"""The bundled navigation workload: what AI glasses for blind and low-vision walkers do per frame.

Camera frames (synthetic street scenes, JPEG-encoded once at start-up) go through a DataLoader
that decodes and preprocesses them on the CPU; then a segmentation model (background / blind
path / crosswalk) and an obstacle detector run on the device, and a few navigation cues are
computed from their outputs on the device.

The defaults are the habits that make such a pipeline slow (no loader workers, pageable memory,
fp32, eager mode); every remedy has a flag, so a diagnosis can be checked against the fix:

    python -m navdoctor.workloads.navigation                      # realtime, both models
    python -m navdoctor.workloads.navigation --mode batched --num-workers 4 --pin-memory \\
        --persistent-workers --amp bf16 --channels-last --gpu-preprocess

It runs as a module or as a plain script (hence no relative imports), and on CPU or CUDA.
No weights or images are downloaded: the models are randomly initialised, which costs the
same time per frame as trained ones.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torchvision.io import decode_jpeg, encode_jpeg, read_file, write_file
from torchvision.models.detection import ssdlite320_mobilenet_v3_large
from torchvision.models.segmentation import lraspp_mobilenet_v3_large

try:
    from navdoctor import step as mark_step
except ImportError:  # run as a plain script without navdoctor installed
    def mark_step():
        pass


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SEG_CLASSES = ("background", "blind_path", "crosswalk")
DET_CLASSES = ("background", "box", "pole", "person")   # obstacle kinds
BLIND_PATH = SEG_CLASSES.index("blind_path")
CLIP_FRAMES = 16            # distinct frames rendered; the loader replays them in a loop
DETECTION_MIN_SCORE = 0.3


# ---------------------------------------------------------------------------------------------
# Synthetic camera frames
# ---------------------------------------------------------------------------------------------

def render_street_scene(width: int, height: int, walked: float, rng: torch.Generator) -> torch.Tensor:
    """One camera frame, uint8 (3, height, width), of a street seen from eye height.

    Sky and buildings above the horizon; below it a road in perspective, sidewalks, a yellow
    tactile-paving strip (blind path) on the right sidewalk, crosswalk stripes that come closer
    as `walked` goes from 0 to 1 along the clip, box obstacles, and sensor noise.
    """
    def uniform(low: float, high: float) -> float:
        return low + (high - low) * torch.rand((), generator=rng).item()

    def colour(r: float, g: float, b: float) -> torch.Tensor:
        return torch.tensor([r, g, b]).view(3, 1, 1)

    ys = torch.linspace(0, 1, height).view(height, 1).expand(height, width)   # 0 = top row
    xs = torch.linspace(0, 1, width).view(1, width).expand(height, width)
    horizon = 0.42
    image = colour(0.55, 0.70, 0.92) * (1.0 - 0.35 * ys)                      # sky gradient

    for _ in range(6):                                                        # buildings
        left, building_width = uniform(0, 0.9), uniform(0.08, 0.25)
        top = horizon - uniform(0.1, 0.35)
        grey = uniform(0.35, 0.7)
        building = (xs >= left) & (xs < left + building_width) & (ys >= top) & (ys < horizon)
        image = torch.where(building, colour(grey, grey * 0.95, grey * 0.9), image)

    depth = ((ys - horizon) / (1 - horizon)).clamp(min=0)    # 0 at the horizon, 1 at the feet
    ground = ys >= horizon
    road_half_width = 0.04 + 0.42 * depth
    road = ground & ((xs - 0.5).abs() < road_half_width)
    image = torch.where(ground & ~road, colour(0.62, 0.60, 0.57), image)      # sidewalks
    image = torch.where(road, colour(0.24, 0.24, 0.26), image)                # asphalt

    # Blind path: a strip beside the right road edge, with raised bars across it.
    strip_centre = 0.5 + road_half_width + 0.03 + 0.10 * depth
    strip = ground & ((xs - strip_centre).abs() < 0.008 + 0.05 * depth)
    bars = torch.sin(60.0 * depth.sqrt()) > 0
    yellow = torch.where(bars, 1.0, 0.82) * colour(0.95, 0.80, 0.10)
    image = torch.where(strip, yellow, image)

    # Crosswalk: a band of stripes across the road that moves towards the viewer.
    band_near = 0.15 + 0.6 * walked
    band = road & (depth > band_near) & (depth < band_near + 0.12)
    stripes = (((xs - 0.5) / road_half_width.clamp(min=1e-3)) * 4).floor().remainder(2) == 0
    image = torch.where(band & stripes, colour(0.92, 0.92, 0.90), image)

    for _ in range(int(uniform(2, 5))):                                       # box obstacles
        near = uniform(0.2, 0.9)                                              # depth of its foot
        size = 0.04 + 0.12 * near
        bottom = horizon + near * (1 - horizon)
        left = uniform(0.1, 0.9 - size)
        box = (xs >= left) & (xs < left + size) & (ys >= bottom - size * 1.3) & (ys < bottom)
        image = torch.where(box, colour(uniform(0.2, 0.9), uniform(0.2, 0.6), uniform(0.1, 0.4)), image)

    image = image * uniform(0.8, 1.15)                                        # exposure
    image = image + 0.03 * torch.randn(image.shape, generator=rng)            # sensor noise
    return (image.clamp(0, 1) * 255).round().to(torch.uint8)


def encode_clip(width: int, height: int, seed: int, quality: int = 90) -> list[torch.Tensor]:
    """Render CLIP_FRAMES frames and JPEG-encode them, as a camera's encoder would."""
    rng = torch.Generator().manual_seed(seed)
    return [encode_jpeg(render_street_scene(width, height, i / CLIP_FRAMES, rng), quality=quality)
            for i in range(CLIP_FRAMES)]


# ---------------------------------------------------------------------------------------------
# Data pipeline
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Preprocess:
    """uint8 frames -> normalised float model input; (3,H,W) on the CPU or (N,3,H,W) on the device."""
    height: int
    width: int
    augment: bool = False    # train-like colour jitter

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        single = frames.dim() == 3
        x = frames.unsqueeze(0) if single else frames
        x = x.float().div_(255)
        if x.shape[-2:] != (self.height, self.width):
            x = F.interpolate(x, size=(self.height, self.width), mode="bilinear",
                              align_corners=False, antialias=True)
        if self.augment:
            shape = (x.shape[0], 1, 1, 1)
            brightness = torch.empty(shape, device=x.device).uniform_(0.8, 1.2)
            contrast = torch.empty(shape, device=x.device).uniform_(0.8, 1.2)
            mean = x.mean(dim=(1, 2, 3), keepdim=True)
            x = ((x - mean) * contrast + mean) * brightness
            x = x.clamp_(0, 1)
        mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
        x = (x - mean) / std
        return x[0] if single else x


class CameraFrames(Dataset):
    """A clip of JPEG frames (bytes in memory, or file paths), replayed `length` items long.

    __getitem__ does what the glasses' host CPU would: read, decode, and, unless the device does
    it (preprocess=None), resize and normalise.
    """

    def __init__(self, clip: list[torch.Tensor] | list[str], length: int,
                 preprocess: Preprocess | None):
        self.clip = clip
        self.length = length
        self.preprocess = preprocess

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        source = self.clip[index % len(self.clip)]
        jpeg = read_file(source) if isinstance(source, str) else source
        frame = decode_jpeg(jpeg)                      # uint8 (3, H, W), on the CPU
        return frame if self.preprocess is None else self.preprocess(frame)


def write_clip(clip: list[torch.Tensor], folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, jpeg in enumerate(clip):
        path = folder / f"frame_{i:03d}.jpg"
        write_file(str(path), jpeg)
        paths.append(str(path))
    return paths


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------

def build_segmenter() -> torch.nn.Module:
    return lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=len(SEG_CLASSES))


def build_detector() -> torch.nn.Module:
    # Frames arrive normalised already, so the detector's own transform must not normalise
    # again (mean 0, std 1); it still resizes to its fixed 320x320 input.
    return ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None,
                                         num_classes=len(DET_CLASSES),
                                         image_mean=[0.0, 0.0, 0.0], image_std=[1.0, 1.0, 1.0])


class StaticShapeDetector(torch.nn.Module):
    """An SSD whose whole forward pass has fixed shapes, so one CUDA graph can capture it.

    torchvision's SSD post-processes image by image with shapes that depend on the data (score
    threshold, per-class top-k, NMS): hundreds of tiny kernels per frame launched from Python,
    and a graph break for torch.compile. Here the batch is resized at once, the anchors are
    computed once, one top-k runs over all anchors and classes (`candidates`, where torchvision
    takes up to 300 per class), and NMS is Fast NMS (YOLACT): a candidate is dropped when any
    higher-scoring candidate of its class overlaps it by more than the IoU threshold, read off
    one (K x K) IoU matrix, also when that candidate was itself dropped. Every frame keeps K
    slots; `keep` marks the detections that survive. Same weights and the same box decoding as
    torchvision's; what survives is a subset of what standard NMS keeps of the same candidates
    (chains of overlapping boxes lose more), fewer detections for the same cost per frame.
    """

    def __init__(self, ssd: torch.nn.Module, candidates: int = 200):
        super().__init__()
        from torchvision.models.detection.image_list import ImageList
        self.backbone, self.head = ssd.backbone, ssd.head
        width, height = ssd.transform.fixed_size                  # torchvision: (width, height)
        self.input_size = (height, width)
        self.box_weights = tuple(float(w) for w in ssd.box_coder.weights)
        self.box_clip = float(ssd.box_coder.bbox_xform_clip)
        self.score_thresh, self.nms_thresh = float(ssd.score_thresh), float(ssd.nms_thresh)
        self.candidates = candidates
        # The anchors depend only on the input size: computed once, here, on the model's device.
        parameter = next(ssd.parameters())
        with torch.no_grad():
            probe = torch.zeros(1, 3, *self.input_size, device=parameter.device, dtype=parameter.dtype)
            features = list(self.backbone(probe).values())
            anchors = ssd.anchor_generator(ImageList(probe, [self.input_size]), features)[0]
        self.register_buffer("anchors", anchors.float(), persistent=False)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """(N, A, 4) offsets against the anchors -> (N, A, 4) boxes x1 y1 x2 y2, input pixels."""
        anchors = self.anchors
        size = anchors[:, 2:] - anchors[:, :2]
        centre = anchors[:, :2] + 0.5 * size
        wx, wy, ww, wh = self.box_weights
        codes = codes.float()
        shift = codes[..., :2] / codes.new_tensor([wx, wy])
        scale = (codes[..., 2:] / codes.new_tensor([ww, wh])).clamp(max=self.box_clip).exp()
        centre, half = centre + shift * size, 0.5 * scale * size
        height, width = self.input_size
        return torch.cat([centre - half, centre + half], dim=-1).clamp(min=0).minimum(
            codes.new_tensor([width, height, width, height]))

    def forward(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        frame_height, frame_width = batch.shape[-2:]
        x = F.interpolate(batch, size=self.input_size, mode="bilinear", align_corners=False)
        out = self.head(list(self.backbone(x).values()))
        boxes = self.decode(out["bbox_regression"])
        scores = F.softmax(out["cls_logits"].float(), dim=-1)[..., 1:]    # background dropped
        foreground_classes = scores.shape[-1]
        top_scores, flat_index = scores.flatten(1).topk(self.candidates, dim=1)   # sorted
        labels = flat_index % foreground_classes + 1
        anchor_index = flat_index // foreground_classes
        top_boxes = boxes.gather(1, anchor_index.unsqueeze(-1).expand(-1, -1, 4))
        same_class = labels.unsqueeze(2) == labels.unsqueeze(1)
        # overlap[i, j] for i ranked above j only (upper triangle): what could suppress j.
        overlap = (pairwise_iou(top_boxes) * same_class).triu(diagonal=1)
        keep = (overlap.amax(dim=1) <= self.nms_thresh) & (top_scores > self.score_thresh)
        height, width = self.input_size
        to_frame = top_boxes.new_tensor([frame_width / width, frame_height / height] * 2)
        return {"boxes": top_boxes * to_frame, "scores": top_scores, "labels": labels, "keep": keep}


def pairwise_iou(boxes: torch.Tensor) -> torch.Tensor:
    """(N, K, 4) boxes x1 y1 x2 y2 -> (N, K, K) intersection over union within each frame."""
    area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    top_left = torch.maximum(boxes[:, :, None, :2], boxes[:, None, :, :2])
    bottom_right = torch.minimum(boxes[:, :, None, 2:], boxes[:, None, :, 2:])
    sides = (bottom_right - top_left).clamp(min=0)
    intersection = sides[..., 0] * sides[..., 1]
    return intersection / (area[:, :, None] + area[:, None, :] - intersection).clamp(min=1e-6)


class NavigationModel(torch.nn.Module):
    """Frame batch on the device -> navigation cues: the part of a step torch.compile may take.

    preprocess: resize and normalise here (on the device) rather than in the loader.
    """

    def __init__(self, segmenter, detector, preprocess: Preprocess | None,
                 memory_format: torch.memory_format):
        super().__init__()
        self.segmenter, self.detector = segmenter, detector
        self.preprocess, self.memory_format = preprocess, memory_format

    def forward(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.preprocess is not None:
            batch = self.preprocess(batch)
        if self.memory_format is torch.channels_last:   # else leave the layout as given
            batch = batch.contiguous(memory_format=torch.channels_last)
        return navigation_cues(self.segmenter, self.detector, batch)


def compile_models(model: NavigationModel, mode: str | None) -> torch.nn.Module:
    """torch.compile what has static shapes: the whole step when the detector is a
    StaticShapeDetector (or absent); otherwise the segmenter and the detector's backbone and
    head, since torchvision's post-processing would split the graph and, with
    mode="reduce-overhead", keep CUDA graphs from being captured at all.
    """
    if not isinstance(model.detector, (StaticShapeDetector, type(None))):
        if model.segmenter is not None:
            model.segmenter = torch.compile(model.segmenter, mode=mode)
        model.detector.backbone = torch.compile(model.detector.backbone, mode=mode)
        model.detector.head = torch.compile(model.detector.head, mode=mode)
        return model
    return torch.compile(model, mode=mode)


def navigation_cues(segmenter, detector, batch: torch.Tensor) -> dict[str, torch.Tensor]:
    """Run the models and reduce their outputs to per-frame cues, all kept on the device.

    blind_path_ahead: share of the walking corridor (lower middle of the frame) that is blind path.
    obstacles_ahead: confident detections whose centre lies in the walking corridor.
    """
    height, width = batch.shape[-2:]
    corridor_left, corridor_right = width / 3, 2 * width / 3
    cues = {}
    if segmenter is not None:
        mask = segmenter(batch)["out"].argmax(dim=1)                      # (N, H, W)
        corridor = mask[:, height // 2:, int(corridor_left):int(corridor_right)]
        cues["blind_path_ahead"] = (corridor == BLIND_PATH).float().mean(dim=(1, 2))

    def obstacles_ahead(found: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per detection (any leading dims): confident, centred in the walking corridor."""
        centre_x = (found["boxes"][..., 0] + found["boxes"][..., 2]) / 2
        in_corridor = (centre_x > corridor_left) & (centre_x < corridor_right)
        return in_corridor & (found["scores"] > DETECTION_MIN_SCORE)

    if isinstance(detector, StaticShapeDetector):
        found = detector(batch)                             # (N, K) slots, `keep` marks live ones
        cues["obstacles_ahead"] = (found["keep"] & obstacles_ahead(found)).sum(dim=1)
    elif detector is not None:
        cues["obstacles_ahead"] = torch.stack(
            [obstacles_ahead(found).sum() for found in detector(list(batch))])
    return cues


# ---------------------------------------------------------------------------------------------
# Command line and main loop
# ---------------------------------------------------------------------------------------------

def parse_resolution(text: str) -> tuple[int, int]:
    """'640x480' -> (640, 480), width first as cameras are named."""
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT such as 320x240, got {text!r}")
    if not (64 <= width <= 4096 and 64 <= height <= 4096):
        raise argparse.ArgumentTypeError(f"resolution {text} is outside 64..4096 px")
    return width, height


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="navigation",
        description="AI-glasses navigation pipeline (navdoctor's bundled workload).")
    p.add_argument("--task", choices=("seg", "det", "both"), default="both",
                   help="segmentation (blind path, crosswalk), obstacle detection, or both")
    p.add_argument("--mode", choices=("realtime", "batched"), default="realtime",
                   help="realtime: one frame at a time with a latency budget; batched: throughput")
    p.add_argument("--resolution", type=parse_resolution, default=(320, 240), metavar="WxH",
                   help="camera frame size (glasses cameras: 320x240 to 640x480); default 320x240")
    p.add_argument("--model-resolution", type=parse_resolution, default=None, metavar="WxH",
                   help="model input size the frames are resized to; default: the camera's")
    p.add_argument("--frames", "--steps", dest="frames", type=positive_int, default=12,
                   help="timed steps: frames in realtime mode, batches in batched mode")
    p.add_argument("--warmup", type=non_negative_int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--budget-ms", type=float, default=100.0,
                   help="realtime per-frame latency budget (default 100 ms, i.e. 10 fps)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="batched mode (default 8)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda if available")
    p.add_argument("--seed", type=int, default=0)
    loader = p.add_argument_group("data loading")
    loader.add_argument("--num-workers", type=non_negative_int, default=0)
    loader.add_argument("--pin-memory", action="store_true",
                        help="page-locked batches, copied with non_blocking=True (CUDA only)")
    loader.add_argument("--persistent-workers", action="store_true")
    loader.add_argument("--prefetch-factor", type=positive_int, default=None,
                        help="batches each worker loads ahead (needs --num-workers > 0)")
    loader.add_argument("--frames-dir", nargs="?", const="", default=None, metavar="DIR",
                        help="write the JPEG frames to DIR (a temporary folder if none is given) "
                             "and read them from files every step")
    loader.add_argument("--gpu-preprocess", action="store_true",
                        help="decode on the CPU, resize and normalise on the device")
    loader.add_argument("--augment", action="store_true", help="train-like colour jitter")
    compute = p.add_argument_group("model execution")
    compute.add_argument("--amp", choices=("off", "bf16", "fp16"), default="off",
                         help="autocast precision (default off: fp32)")
    compute.add_argument("--channels-last", action="store_true")
    compute.add_argument("--compile", action="store_true", help="torch.compile the models")
    compute.add_argument("--cuda-graphs", action="store_true",
                         help='torch.compile(mode="reduce-overhead"), which replays CUDA graphs')
    compute.add_argument("--static-postprocess", action="store_true",
                         help="detector post-processing with fixed shapes (one top-k, Fast NMS) "
                              "instead of torchvision's per-image loop; with --compile or "
                              "--cuda-graphs the whole step is then one graph")
    return p


def resolve_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("navigation: --device cuda, but no CUDA device is available")
    return torch.device(choice)


def autocast_context(device: torch.device, amp: str):
    if amp == "off":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile: a value that was actually measured."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


@dataclass
class Summary:
    device: str
    mode: str
    task: str
    batch_size: int
    frames: int                 # frames timed (steps x batch size)
    median_ms: float            # per step: one frame in realtime mode, one batch in batched mode
    p95_ms: float
    fps: float
    budget_ms: float
    over_budget: int | None     # realtime mode only

    def report(self) -> str:
        unit = "frame" if self.mode == "realtime" else f"step ({self.batch_size} frames)"
        over = (f"{self.over_budget} of {self.frames} frames over {self.budget_ms:g} ms"
                if self.over_budget is not None else "n/a in batched mode")
        return "\n".join([
            "navigation workload summary",
            f"  device      {self.device}",
            f"  mode        {self.mode} (task {self.task}, batch {self.batch_size})",
            f"  frames      {self.frames}",
            f"  {unit} latency: median {self.median_ms:.1f} ms, p95 {self.p95_ms:.1f} ms",
            f"  throughput  {self.fps:.1f} fps",
            f"  budget      {over}",
        ])


def run(args: argparse.Namespace) -> Summary:
    device = resolve_device(args.device)
    on_cuda = device.type == "cuda"
    torch.manual_seed(args.seed)
    notes = []

    pin_memory = args.pin_memory and on_cuda
    if args.pin_memory and not on_cuda:
        notes.append("--pin-memory ignored: it only helps copies to a CUDA device")
    use_cuda_graphs = args.cuda_graphs and on_cuda
    if args.cuda_graphs and not on_cuda:
        notes.append("--cuda-graphs ignored: CUDA graphs need a CUDA device")
    loader_options = {}
    if args.num_workers > 0:
        loader_options = {"persistent_workers": args.persistent_workers,
                          "prefetch_factor": args.prefetch_factor}
    elif args.persistent_workers or args.prefetch_factor:
        notes.append("--persistent-workers/--prefetch-factor ignored: they need --num-workers > 0")

    camera_width, camera_height = args.resolution
    model_width, model_height = args.model_resolution or args.resolution
    preprocess = Preprocess(model_height, model_width, augment=args.augment)
    batch_size = 1 if args.mode == "realtime" else args.batch_size
    total_steps = args.warmup + args.frames

    segmenter = build_segmenter() if args.task in ("seg", "both") else None
    detector = build_detector() if args.task in ("det", "both") else None
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    for model in (segmenter, detector):
        if model is not None:
            model.eval().to(device, memory_format=memory_format)
    if detector is not None and args.static_postprocess:
        detector = StaticShapeDetector(detector)
    model = NavigationModel(segmenter, detector, preprocess if args.gpu_preprocess else None,
                            memory_format).eval()
    if args.compile or use_cuda_graphs:
        model = compile_models(model, mode="reduce-overhead" if use_cuda_graphs else None)
    autocast = autocast_context(device, args.amp)

    with contextlib.ExitStack() as cleanup:
        clip: list = encode_clip(camera_width, camera_height, args.seed)
        if args.frames_dir is not None:
            folder = args.frames_dir or cleanup.enter_context(
                tempfile.TemporaryDirectory(prefix="navframes-"))
            clip = write_clip(clip, Path(folder))
        dataset = CameraFrames(clip, total_steps * batch_size,
                               preprocess=None if args.gpu_preprocess else preprocess)
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, drop_last=True,
                            num_workers=args.num_workers, pin_memory=pin_memory, **loader_options)
        for note in notes:
            print(f"navigation: {note}", file=sys.stderr)

        step_seconds: list[float] = []
        with torch.inference_mode():
            timed_since = step_start = time.perf_counter()
            for step_index, batch in enumerate(loader):
                batch = batch.to(device, non_blocking=pin_memory)
                if use_cuda_graphs:
                    torch.compiler.cudagraph_mark_step_begin()   # last step's outputs are done
                with autocast:
                    model(batch)
                if args.mode == "realtime" and on_cuda:
                    torch.cuda.synchronize()    # a frame's latency ends when its cues are ready
                now = time.perf_counter()
                step_seconds.append(now - step_start)
                mark_step()
                if step_index + 1 == args.warmup:
                    if on_cuda:
                        torch.cuda.synchronize()    # start the throughput clock with an idle GPU
                    timed_since = time.perf_counter()
                step_start = time.perf_counter()
            if on_cuda:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - timed_since

    timed_ms = [seconds * 1000 for seconds in step_seconds[args.warmup:]]
    frames = len(timed_ms) * batch_size
    over_budget = (sum(ms > args.budget_ms for ms in timed_ms)
                   if args.mode == "realtime" else None)
    device_name = f"cuda ({torch.cuda.get_device_name(device)})" if on_cuda else "cpu"
    return Summary(device=device_name, mode=args.mode, task=args.task, batch_size=batch_size,
                   frames=frames, median_ms=statistics.median(timed_ms),
                   p95_ms=percentile(timed_ms, 0.95), fps=frames / elapsed,
                   budget_ms=args.budget_ms, over_budget=over_budget)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    print(run(args).report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
