"""The corpus workloads and the bundled navigation workload run on the CPU (tiny sizes)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = sorted(p.name for p in (ROOT / "bench/workloads").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("name", WORKLOADS)
def test_corpus_workload_runs_small(name):
    r = subprocess.run([sys.executable, str(ROOT / "bench/workloads" / name), "--small", "--steps", "3",
                        "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "median step time" in r.stdout


def test_navigation_workload_runs_as_a_plain_script():
    r = subprocess.run([sys.executable, str(ROOT / "navdoctor/workloads/navigation.py"), "--frames", "2",
                        "--warmup", "1", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "frame latency" in r.stdout


# The static-shape detector (--static-postprocess) must find what torchvision's SSD finds.

@pytest.fixture(scope="module")
def navigation_module():
    sys.path.insert(0, str(ROOT / "navdoctor/workloads"))
    try:
        import navigation
        yield navigation
    finally:
        sys.path.remove(str(ROOT / "navdoctor/workloads"))


def _detector_with_varied_scores(navigation):
    import torch
    torch.manual_seed(0)
    ssd = navigation.build_detector().eval()
    with torch.no_grad():   # random init scores every anchor and class alike; spread them
        for m in ssd.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 2)
                m.weight.normal_(1, 0.2)
                m.bias.normal_(0, 0.2)
        for p in ssd.head.parameters():
            p.normal_(0, 0.3)
    return ssd


def test_static_detector_decodes_boxes_as_torchvision_does(navigation_module):
    import torch
    from torchvision.models.detection.image_list import ImageList
    from torchvision.ops import clip_boxes_to_image
    ssd = _detector_with_varied_scores(navigation_module)
    static = navigation_module.StaticShapeDetector(ssd)
    probe = torch.rand(1, 3, 320, 320)
    with torch.no_grad():
        features = list(ssd.backbone(probe).values())
        anchors = ssd.anchor_generator(ImageList(probe, [(320, 320)]), features)[0]
        codes = ssd.head(features)["bbox_regression"]
    assert torch.allclose(static.anchors, anchors)
    expected = clip_boxes_to_image(ssd.box_coder.decode_single(codes[0], anchors), (320, 320))
    assert torch.allclose(static.decode(codes)[0], expected, atol=1e-3)


def test_static_detector_keeps_the_best_box_of_each_cluster_and_class(navigation_module):
    import torch
    static = navigation_module.StaticShapeDetector(_detector_with_varied_scores(navigation_module))
    boxes = torch.tensor([[[0., 0, 10, 10], [1, 0, 11, 10], [1, 0, 11, 10], [50, 50, 60, 60]]])
    iou = navigation_module.pairwise_iou(boxes)[0]
    assert iou[0, 1] == pytest.approx(9 / 11) and iou[0, 3] == 0 and iou[1, 2] == pytest.approx(1)
    # Through the detector: the best-scoring box of the frame survives NMS, and every kept
    # box of a class overlaps every better kept box of that class by at most nms_thresh.
    with torch.no_grad():
        found = static(torch.rand(2, 3, 240, 320))
    for frame in range(2):
        keep = found["keep"][frame]
        assert keep[0]
        kept_boxes, kept_labels = found["boxes"][frame][keep], found["labels"][frame][keep]
        overlap = navigation_module.pairwise_iou(kept_boxes[None])[0].triu(diagonal=1)
        same = kept_labels[:, None] == kept_labels[None, :]
        assert (overlap[same] <= static.nms_thresh + 1e-6).all()
        assert 1 < int(keep.sum()) < keep.numel()   # NMS dropped some, kept several


def test_static_detector_finds_torchvisions_best_detection(navigation_module):
    import torch
    ssd = _detector_with_varied_scores(navigation_module)
    static = navigation_module.StaticShapeDetector(ssd)
    frames = torch.rand(2, 3, 240, 320)
    with torch.no_grad():
        reference, found = ssd(list(frames)), static(frames)
    for frame in range(2):
        scores = reference[frame]["scores"]
        assert scores[0] > scores[1] + 1e-4      # one best detection, so the check means something
        assert found["scores"][frame][0] == pytest.approx(float(scores[0]), rel=1e-5)
        assert found["labels"][frame][0] == reference[frame]["labels"][0]
        # in the frame's pixels (240 high), not the detector's 320x320 input
        assert torch.allclose(found["boxes"][frame][0], reference[frame]["boxes"][0], atol=1e-2)


def test_navigation_workload_runs_with_static_postprocessing():
    r = subprocess.run([sys.executable, str(ROOT / "navdoctor/workloads/navigation.py"), "--frames", "2",
                        "--warmup", "1", "--device", "cpu", "--static-postprocess", "--gpu-preprocess"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "frame latency" in r.stdout


def test_fast_nms_keeps_a_subset_of_what_standard_nms_keeps(navigation_module):
    import torch
    from torchvision.ops import batched_nms
    static = navigation_module.StaticShapeDetector(_detector_with_varied_scores(navigation_module))
    with torch.no_grad():
        found = static(torch.rand(2, 3, 240, 320))
    for frame in range(2):
        boxes, scores = found["boxes"][frame], found["scores"][frame]
        labels, keep = found["labels"][frame], found["keep"][frame]
        # IoU does not change under the per-axis rescaling to the frame, so NMS on these boxes
        # is NMS on the detector's.
        live = scores > static.score_thresh
        standard = set(torch.nonzero(live).flatten()[
            batched_nms(boxes[live], scores[live], labels[live], static.nms_thresh)].tolist())
        ours = set(torch.nonzero(keep).flatten().tolist())
        assert ours and ours <= standard
        assert len(ours) < len(standard)     # chains of overlaps: Fast NMS drops more
