"""Ultralytics YOLO segmentation over a folder of frames with `predict(stream=True)`, the way
its documentation shows a video/camera loop: a generator of results, one per frame, batch 1.
Ultralytics reads, letterboxes and post-processes the frames itself; this driver only
iterates and times (the loop a user writes; nothing here is for a profiler).

The model is built from its YAML (random weights: the GPU machine cannot download the
checkpoint; the network, its kernels and the post-processing are the same).

Prints `frame N ms X` per result (from the previous result to this one) and a summary line.

    python bench/thirdparty/yolo_stream.py --frames DIR [--model yolov8n-seg.yaml] [--device 0]
"""
from __future__ import annotations

import argparse
import statistics
import time

from ultralytics import YOLO


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", required=True)
    ap.add_argument("--model", default="yolov8n-seg.yaml")
    ap.add_argument("--device", default=None, help="ultralytics device string: 0, cpu")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--conf", type=float, default=0.25)
    args = ap.parse_args()

    model = YOLO(args.model, task="segment")
    times, last = [], time.perf_counter()
    for n, result in enumerate(model.predict(source=args.frames, stream=True, verbose=False,
                                             imgsz=args.imgsz, conf=args.conf, device=args.device)):
        kept = 0 if result.boxes is None else len(result.boxes)
        now = time.perf_counter()
        times.append((now - last) * 1e3)
        last = now
        print(f"frame {n} ms {times[-1]:.3f} boxes {kept}", flush=True)
    if times:
        print(f"frames {len(times)} median_ms {statistics.median(times):.3f}", flush=True)


if __name__ == "__main__":
    main()
