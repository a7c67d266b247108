"""Every trace of ../shared/public-traces analyses (issue #20, item 7), read in place and never
copied; and what they showed about the loaders and the steps holds. Skipped where the folder
is absent (a clean clone elsewhere)."""
import sys
from pathlib import Path

import pytest

from navdoctor.analysis import analyze
from navdoctor.rules import load_rules

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from public_traces import PUBLIC, trace_files  # noqa: E402  (bench/public_traces.py)

pytestmark = pytest.mark.skipif(not PUBLIC.is_dir(), reason="../shared/public-traces absent (NAVDOCTOR_PUBLIC_TRACES names another place)")


def _files():
    return [str(p.relative_to(PUBLIC)) for p in trace_files(PUBLIC)] if PUBLIC.is_dir() else []


@pytest.mark.parametrize("name", _files())
def test_public_trace_analyses(name):
    a = analyze([str(PUBLIC / name)], load_rules())
    v = a.verdict
    assert v.bound in ("io", "compute", "memory", "launch", "balanced", "unknown")
    if v.bound != "unknown":
        assert sum(v.shares.values()) == pytest.approx(1.0, abs=0.01)
    assert not a.rule_failures, [f.rule_id for f in a.rule_failures]


def _one(folder: str) -> str:
    return str(next(p for p in trace_files(PUBLIC) if p.parent.name == folder))


def test_kineto_cuda_sync_records_are_the_host_threads():
    """HTA's AlexNet param-bench trace (Kineto with cuda_sync records on the GPU's row): the
    host launching and allocating between its syncs is not one long sync stall."""
    a = analyze([_one("hta_alexnet_param_bench_a100")], load_rules())
    assert a.verdict.shares["sync"] < 0.2 and a.verdict.bound == "launch"
    assert "memory-sync-stalls" not in {f.rule.id for f in a.findings}


def test_small_capture_is_judged_on_its_gpu_work():
    """A CUDA streams vector-add sample's nsys capture (16 copies and kernels behind 365 ms of
    start-up): one step over its GPU work, copy-bound as the sample is, not launch-bound."""
    a = analyze([_one("gpu4_vecadd_streams_t4")], load_rules())
    tv = a.verdict.per_trace[0]
    assert tv.step_origin == "gpu-window" and tv.steps == 1 and tv.step_ms < 10
    assert a.verdict.bound == "memory" and a.verdict.shares["copy"] > 0.5


def test_one_step_is_no_frame_loop():
    """A TimeSformer inference trace of one ProfilerStep: no '1 of 1 frames' over budget."""
    a = analyze([_one("tracelens_h100_timesformer_infer")], load_rules())
    assert "realtime-frame-budget" not in {f.rule.id for f in a.findings}
