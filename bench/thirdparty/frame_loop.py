"""A per-frame navigation loop written the way an application would write it, with nothing
for a profiler: frames read one at a time from a folder (OpenCV, or PIL where OpenCV is
missing), resized and normalised on the CPU, then a segmenter and a detector per frame, and a
small post-processing step that reads the results back. No DataLoader, no optimizer, no
navdoctor import, no step markers: navdoctor has to find the frames itself (issue #18).

Prints one line per frame (`frame N ms X`, from the previous frame's end to this one's) and a
summary line; the evidence harness (run_cases.py) reads them as the script's own meters.

    python bench/thirdparty/frame_loop.py --frames DIR [--device cuda] [--small]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torchvision

try:
    import cv2
except ImportError:  # PIL serves where OpenCV is not installed (the CI machine)
    cv2 = None


def read_frames(folder: Path, limit: int | None):
    """A generator, as camera readers are: one decoded RGB frame (H, W, 3 uint8) at a time."""
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    for path in paths[:limit]:
        if cv2 is not None:
            frame = cv2.imread(str(path), cv2.IMREAD_COLOR)
            yield cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
        else:
            from PIL import Image
            with Image.open(path) as im:
                yield np.asarray(im.convert("RGB"))


def preprocess(frame: np.ndarray, size: tuple[int, int], device: torch.device) -> torch.Tensor:
    w, h = size
    if cv2 is not None:
        frame = cv2.resize(frame, (w, h), interpolation=cv2.INTER_LINEAR)
    else:
        from PIL import Image
        frame = np.asarray(Image.fromarray(frame).resize((w, h)))
    x = torch.from_numpy(frame).permute(2, 0, 1).float().div_(255)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    return ((x - mean) / std).unsqueeze(0).to(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=Path, required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--limit", type=int, default=None, help="at most this many frames")
    ap.add_argument("--small", action="store_true", help="small input, for a CPU")
    args = ap.parse_args()
    device = torch.device(args.device)
    size = (160, 120) if args.small else (640, 480)

    # Models built before the loop, random weights (nothing to download).
    segmenter = torchvision.models.segmentation.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=4).eval().to(device)
    detector = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=5,
        score_thresh=0.3, detections_per_img=50).eval().to(device)

    times, last = [], time.perf_counter()
    with torch.inference_mode():
        for n, frame in enumerate(read_frames(args.frames, args.limit)):
            x = preprocess(frame, size, device)
            mask = segmenter(x)["out"].argmax(1)[0]
            boxes = detector(list(x))[0]["boxes"]
            h, w = mask.shape
            corridor = mask[h // 2:, w // 3: 2 * w // 3]
            blocked = float((corridor != 0).float().mean())   # reads back: a sync per frame
            kept = int(boxes.shape[0])
            now = time.perf_counter()
            times.append((now - last) * 1e3)
            last = now
            print(f"frame {n} ms {times[-1]:.3f} blocked {blocked:.2f} boxes {kept}", flush=True)
    if times:
        print(f"frames {len(times)} median_ms {statistics.median(times):.3f}", flush=True)


if __name__ == "__main__":
    main()
