"""Verdicts and rules on real traces captured by navdoctor's own collectors.

fixtures/gpu: H200 captures of the labelled corpus (see fixtures/gpu/labels.yaml);
fixtures/cpu: CPU captures of fixtures/cpu/cpu_train.py. A rule change that breaks a verdict
or a rule that stops firing where it must (or fires where it must not) fails here.
"""
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from navdoctor.analysis import analyze
from navdoctor.rules import load_rules

FIX = Path(__file__).resolve().parent.parent / "fixtures"
LABELS = yaml.safe_load((FIX / "gpu" / "labels.yaml").read_text())["fixtures"]


def gpu(name, which=("kineto", "nsys")):
    files = {"kineto": "kineto.json.gz", "nsys": "nsys.sqlite.gz"}
    return tuple(str(FIX / "gpu" / name / files[w]) for w in which)


@lru_cache(maxsize=None)
def run(paths: tuple[str, ...]):
    return analyze(list(paths), load_rules())


def as_labelled(bound: str, label: str) -> bool:
    """label: a class, or "not:<class>" where only that is certain (see labels.yaml)."""
    return bound != label[4:] if label.startswith("not:") else bound == label


def labelled(which):
    """The fixtures' names, a known miss (labels.yaml `known_miss`: the verdict of that trace
    or pair is not yet the measured label) marked strict xfail: it fails again once it
    is right, so that the label file is mended."""
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=LABELS[n]["known_miss_why"]))
            if which in LABELS[n].get("known_miss", ()) else n for n in sorted(LABELS)]


@pytest.mark.parametrize("name", labelled("pair"))
def test_pair_verdict_matches_label(name):
    a = run(gpu(name))
    label = LABELS[name]["label"]
    assert as_labelled(a.verdict.bound, label), (a.verdict.bound, a.verdict.shares)
    if not label.startswith("not:") and label != "balanced":
        assert a.verdict.confidence >= 0.5
    assert abs(sum(a.verdict.shares.values()) - 1) < 0.01


@pytest.mark.parametrize("name", labelled("kineto"))
def test_kineto_trace_alone(name):
    a = run(gpu(name, ("kineto",)))
    assert as_labelled(a.verdict.bound, LABELS[name]["kineto"]), (a.verdict.bound, a.verdict.shares)


@pytest.mark.parametrize("name", labelled("nsys"))
def test_nsys_trace_alone(name):
    a = run(gpu(name, ("nsys",)))
    assert as_labelled(a.verdict.bound, LABELS[name]["nsys"]), (a.verdict.bound, a.verdict.shares)


def fired(paths):
    return {f.rule.id for f in run(paths).findings}


# rule -> (a trace where it must fire, a trace where it must not)
RULE_CASES = {
    "io-dataloader-wait": (gpu("io_jpeg_decode"), gpu("compute_convnet")),
    # input read on the loop's thread, no DataLoader in the trace (a plain nsys capture of an
    # ultralytics stream); quiet where the DataLoader's waits are seen (that is the rule above)
    "io-input-on-loop-thread": ((str(FIX / "gpu" / "handmade" / "yolo_seg_stream.nsys.sqlite.gz"),),
                                gpu("io_jpeg_decode")),
    # CPU preprocessing around graph replays (no --gpu-preprocess): host work, no launches
    "io-host-cpu-work": (gpu("nav_realtime_tuned"), gpu("compute_convnet")),
    "compute-gpu-bound": (gpu("compute_convnet"), gpu("io_jpeg_decode")),
    "compute-no-tensor-cores": (gpu("compute_matmul"), gpu("nav_tuned")),
    # NCHW convolutions that cuDNN runs in NHWC (TF32, ResNet-18) vs channels_last (bf16)
    "compute-layout-conversions": (gpu("memory_pageable_copy_fixed"), gpu("compute_convnet_fixed")),
    "memory-copy-time": (gpu("memory_pageable_copy"), gpu("launch_batch1_small")),
    "memory-pageable-copies": (gpu("memory_pageable_copy"), gpu("compute_convnet")),
    "memory-sync-stalls": (gpu("memory_item_sync"), gpu("nav_default")),
    "memory-frequent-sync-calls": (gpu("memory_item_sync"), gpu("compute_convnet")),
    "launch-overhead": (gpu("launch_python_loop"), gpu("compute_matmul")),
    "launch-tiny-kernels": (gpu("launch_batch1_small"), gpu("compute_convnet")),
    "launch-host-bound-graphed": (gpu("nav_realtime_tuned"), gpu("launch_batch1_small")),
    "gpu-idle-gaps": (gpu("io_jpeg_decode"), gpu("launch_batch1_small")),
    "gpu-low-utilization": (gpu("memory_item_sync"), gpu("compute_convnet")),
    # decoding on the loop's thread (num_workers=0) vs a wait on storage
    "io-jpeg-decode-on-cpu": (gpu("io_jpeg_decode"), gpu("io_slow_storage")),
    "launch-indexing-python-loop": (gpu("launch_python_loop"), gpu("launch_python_loop_fixed")),
    "trace-cpu-only": ((str(FIX / "cpu" / "train_steps.json.gz"),), gpu("compute_convnet")),
    "trace-no-steps": ((str(FIX / "cpu" / "train_no_steps.json.gz"),),
                       (str(FIX / "cpu" / "train_steps.json.gz"),)),
}


@pytest.mark.parametrize("rule", sorted(RULE_CASES))
def test_rule_fires_and_holds_back_on_real_traces(rule):
    fires_on, quiet_on = RULE_CASES[rule]
    assert rule in fired(fires_on)
    assert rule not in fired(quiet_on)


def test_every_builtin_rule_has_cases():
    from test_synthetic_rules import SYNTHETIC_CASES
    # the job rules (rules/job.yaml) read several ranks at once: tests/test_ranks.py has their cases
    ids = {r.id for r in load_rules() if Path(r.source_file or "").name != "job.yaml"}
    assert ids == set(RULE_CASES) | set(SYNTHETIC_CASES)


def test_findings_quote_numbers_and_rank_by_time():
    a = run(gpu("io_jpeg_decode"))
    top = a.findings[0]
    assert top.rule.id == "io-dataloader-wait"
    assert "%" in top.message and "ms" in top.message
    shares = [f.at_stake_share for f in a.findings]
    assert shares == sorted(shares, reverse=True)


def test_kineto_and_nsys_disagreement_is_reported():
    a = run(gpu("memory_item_sync_fixed"))
    assert a.verdict.bound == "compute"
    assert any("kineto" in d and "nsys" in d for d in a.verdict.disagreements)


FIXED = sorted(n for n in LABELS if LABELS[n].get("fixed_of"))


@pytest.mark.parametrize("name", FIXED)
def test_remedy_removes_the_old_problem(name):
    entry = LABELS[name]
    old = LABELS[entry["fixed_of"]]["label"]
    a = run(gpu(name))
    fired_ids = {f.rule.id for f in a.findings}
    assert not fired_ids & set(entry["must_not_fire"]), fired_ids
    if old != "compute" and not entry.get("known_miss"):
        assert a.verdict.bound != old


@pytest.mark.parametrize("which", [("kineto",), ("nsys",), ("kineto", "nsys")])
def test_a_step_already_in_a_cuda_graph_is_not_told_to_use_cuda_graphs(which):
    # One graph replay per frame: the launch rules that advise CUDA graphs hold back ...
    graphed = fired(gpu("nav_realtime_tuned", which))
    assert not graphed & {"launch-overhead", "launch-tiny-kernels"}, graphed
    # ... while graphs for the models alone, with SSD's post-processing launched kernel by
    # kernel around them, are still told to capture the step.
    half = fired(gpu("nav_realtime_graphs", which))
    assert "launch-overhead" in half and "launch-host-bound-graphed" not in half, half
