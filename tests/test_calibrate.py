"""The scoring of the what-if model against measured remedies (bench/advice/calibrate.py), on
which docs/accuracy.md's "Predicted speed-ups" figures rest: which remedy counts as first-ranked,
the tallies split by whether the step's two untraced timings agree, the folds, the ranges, and
how a GPU run of the advice loops becomes points."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench" / "advice"))
import calibrate  # noqa: E402


def _row(point, remedy, measured, expected, ratio=None, split="held_out", family="f"):
    return {"point": point, "group": "g", "family": family, "gpu": "H100", "split": split,
            "remedy": remedy, "measured": measured, "expected": expected,
            "low": None if expected is None else expected * 0.75,
            "high": None if expected is None else expected * 1.3, "why_not": None,
            "baseline_ratio": ratio}


def _held_out_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("held_out:")]


def test_the_first_ranked_remedy_is_the_largest_expectation_from_1_05(capsys):
    """As the report ranks: the largest expected speed-up of 1.05x or more is first; a point
    whose remedies are all expected under 1.05x ranks none, which is right where none helped."""
    rows = [_row("a", "cuda_graphs", 2.0, 1.9, 1.0), _row("a", "amp_bf16", 0.8, 1.2, 1.0),   # first: graphs, within
            _row("b", "num_workers", 3.0, 2.0, 1.5), _row("b", "pin_memory", 1.1, 1.1, 1.5),  # first: workers, 1.5 off
            _row("c", "amp_bf16", 1.0, 1.04), _row("c", "channels_last", 1.02, 1.0)]          # none ranked, none helped
    calibrate.report(rows, markdown=True)
    lines = _held_out_lines(capsys)
    assert "none helped: 3/3" in lines[0] and "slower than 0.95x: 0" in lines[0]
    assert "first-ranked remedy: 2;" in lines[1] and "±20% of the expectation: 1 (50%)" in lines[1]


def test_the_tallies_split_by_whether_the_steps_two_timings_agree(capsys):
    """A point timed by diagnose within 10% of the step its remedies were measured against is
    'within'; more than 10% apart, 'apart'; a point with one timing for both is neither."""
    assert calibrate.baseline_agrees({"baseline_ratio": 1.09}) is True
    assert calibrate.baseline_agrees({"baseline_ratio": 0.85}) is False
    assert calibrate.baseline_agrees({"baseline_ratio": None}) is None
    rows = [_row("a", "cuda_graphs", 2.0, 1.9, 1.02), _row("b", "cuda_graphs", 3.0, 1.9, 1.6),
            _row("c", "cuda_graphs", 1.9, 1.9, None)]
    calibrate.report(rows, markdown=True)
    within, apart, one = _held_out_lines(capsys)[2:5]
    assert "within 10% of each other: 1, within ±20%: 1 (100%)" in within
    assert "more than 10% apart: 1, within ±20%: 0 (0%)" in apart
    assert "one timing of the step for both" in one and ": 1, within ±20%: 1" in one


def test_a_fold_holds_every_family_of_one_network():
    """The seed script is a ResNet-50, the batch-1 classifier a MobileNetV3-Small, the mixed
    corpus's LR-ASPP the headroom's; a training variant is its network's."""
    assert calibrate.fold_of("seed") == calibrate.fold_of("resnet50") == calibrate.fold_of("resnet50_train")
    assert calibrate.fold_of("lraspp") == calibrate.fold_of("lraspp_mobilenet_v3_large")
    assert calibrate.fold_of("small_batch1") == calibrate.fold_of("mobilenet_v3_small")
    assert len({calibrate.fold_of(f"net{i}") for i in range(40)}) == calibrate.FOLDS


def test_a_remedy_of_few_families_gets_at_least_the_pooled_interval():
    """A remedy measured on fewer than POOLED_BELOW families cannot show its own spread: its
    range is at least the interval of every fit point together, and always holds 1."""
    rows = [_row(f"p{i}", "num_workers", 1.0 + 0.01 * i, 1.0, split="fit", family="one") for i in range(10)]
    rows += [_row(f"q{i}", "amp_bf16", 0.6 + 0.1 * i, 1.0, split="fit", family=f"m{i}") for i in range(10)]
    rng = calibrate.ranges(rows)
    assert rng["num_workers"][0] <= rng["default"][0] and rng["num_workers"][1] >= rng["default"][1]
    assert rng["amp_bf16"][0] < 1.0 < rng["amp_bf16"][1]
    assert all(lo <= 1.0 <= hi for lo, hi in rng.values())
    held = [_row("h", "num_workers", 5.0, 1.0, family="other")]    # held-out points do not widen it
    assert calibrate.ranges(rows + held) == rng


def test_an_advice_run_becomes_points_with_both_timings(tmp_path):
    """gpu_advice.sh's folder: each kind's speed-ups are the as-is step over each variant's
    (variants without a remedy id left out), predicted from diagnose's timing pass where the
    report has one; without it, from the as-is step, and the point has one timing for both."""
    rows = [{"kind": "seed", "variant": v, "median_ms": ms, "gpu": "NVIDIA H100 80GB HBM3"}
            for v, ms in (("as_is", 6.0), ("cuda_graphs", 4.0), ("no_grad", 5.0))]
    rows += [{"kind": "street", "variant": v, "median_ms": ms} for v, ms in (("as_is", 240.0), ("reduce_on_gpu", 6.0))]
    (tmp_path / "timings.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    for kind, run in (("seed", {"unprofiled_step_ms": 6.6}), ("street", {})):
        cap = tmp_path / "captures" / kind
        cap.mkdir(parents=True)
        (cap / "nsys.sqlite.gz").write_bytes(b"")
        (cap / "report.json").write_text(json.dumps({"run": run}))
    pts = {p["family"]: p for p in calibrate.advice_points([tmp_path])}
    assert pts["seed"]["measured"] == {"cuda_graphs": pytest.approx(1.5)}
    assert pts["seed"]["unprofiled_ms"] == 6.6 and pts["seed"]["diagnose_ms"] == 6.6
    assert pts["seed"]["measured_base_ms"] == 6.0 and pts["seed"]["gpu"] == "H100 80GB HBM3"
    assert pts["street"]["measured"] == {"gpu_postprocess": pytest.approx(40.0)}
    assert pts["street"]["unprofiled_ms"] == 240.0 and pts["street"]["diagnose_ms"] is None
    assert all(p["split"] == "held_out" for p in pts.values())


def test_every_timed_variant_has_a_remedy_decision():
    """Each variant gpu_advice.sh times is either scored as one of navdoctor's remedies or left
    out on purpose (None in ADVICE_REMEDY); a variant missing there would drop silently from
    the scored figures. And what gpu_advice.sh times, loops.py can run."""
    import re

    import loops      # bench/advice, on the path as calibrate is
    script = (Path(calibrate.__file__).parent / "gpu_advice.sh").read_text()
    timed = dict(re.findall(r'\[(\w+)\]="([\w,]+)"', script))
    assert set(timed) == set(loops.KINDS)
    for kind, variants in timed.items():
        for v in variants.split(","):
            assert v in loops.KINDS[kind], (kind, v)
            assert v in calibrate.ADVICE_REMEDY, (kind, v)
    from navdoctor import whatif
    scored = {r for r in calibrate.ADVICE_REMEDY.values() if r}
    assert scored <= set(whatif.TRANSFORMS), scored - set(whatif.TRANSFORMS)
