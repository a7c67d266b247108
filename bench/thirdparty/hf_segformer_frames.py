"""A per-frame segmentation loop with Hugging Face transformers, written as its docs show it,
with nothing for a profiler: a SegFormer built from its config (random weights: nothing is
downloaded), the model's own image processor on each camera frame (resize, rescale,
normalise: NumPy on the CPU), the model, and the processor's post-processing back to the
frame's size, read back to the host. No DataLoader, optimizer or markers. `--gpu-preprocess`
is the I/O remedy written as code (the frame goes to the GPU as uint8 and is resized and
normalised there), for timing it against the loop as written.
Prints `frame N ms X` per frame (the script's own meter) and a summary line.

    python bench/thirdparty/hf_segformer_frames.py [--frames 150] [--variant b2] [--height 720]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from transformers import SegformerConfig, SegformerForSemanticSegmentation
from transformers import SegformerImageProcessor

# The published SegFormer sizes (hidden sizes and depths of the MiT encoders).
VARIANTS = {
    "b0": dict(hidden_sizes=[32, 64, 160, 256], depths=[2, 2, 2, 2], decoder_hidden_size=256),
    "b2": dict(hidden_sizes=[64, 128, 320, 512], depths=[3, 4, 6, 3], decoder_hidden_size=768),
}


def camera(count: int, height: int):
    """Frames as a camera driver hands them over: new H×W×3 uint8 arrays."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (height, height * 16 // 9, 3), dtype=np.uint8)
    for n in range(count):
        yield np.roll(base, n, axis=1)


def on_device(frame: np.ndarray, processor, device) -> torch.Tensor:
    """The processor's resize, rescale and normalise, done on the GPU from the uint8 frame."""
    x = torch.from_numpy(frame).to(device, non_blocking=True).permute(2, 0, 1)[None].float()
    size = processor.size
    x = torch.nn.functional.interpolate(x, size=(size["height"], size["width"]),
                                        mode="bilinear", align_corners=False)
    mean = torch.tensor(processor.image_mean, device=device).view(1, 3, 1, 1)
    std = torch.tensor(processor.image_std, device=device).view(1, 3, 1, 1)
    return (x * processor.rescale_factor - mean) / std


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--variant", default="b2", choices=sorted(VARIANTS))
    ap.add_argument("--height", type=int, default=720)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gpu-preprocess", action="store_true")
    args = ap.parse_args()
    config = SegformerConfig(num_labels=19, **VARIANTS[args.variant])
    model = SegformerForSemanticSegmentation(config).eval().to(args.device)
    processor = SegformerImageProcessor(size={"height": 512, "width": 512})
    times, last = [], time.perf_counter()
    with torch.no_grad():
        for n, frame in enumerate(camera(args.frames, args.height)):
            if args.gpu_preprocess:
                inputs = {"pixel_values": on_device(frame, processor, args.device)}
            else:
                inputs = processor(images=frame, return_tensors="pt").to(args.device)
            outputs = model(**inputs)
            seg = processor.post_process_semantic_segmentation(
                outputs, target_sizes=[frame.shape[:2]])[0]
            free = float((seg == 0).float().mean())    # read back: one sync per frame
            now = time.perf_counter()
            times.append((now - last) * 1e3)
            last = now
            print(f"frame {n} ms {times[-1]:.3f} free {free:.2f}", flush=True)
    if times:
        print(f"frames {len(times)} median_ms {statistics.median(times[1:] or times):.3f}",
              flush=True)


if __name__ == "__main__":
    main()
