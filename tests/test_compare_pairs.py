"""`navdoctor compare` with one capture a side, on pairs a user would bring (docs/compare.md,
"One capture a side"): a real fix is called faster, captures of one configuration made in two
processes (A/A) stay within the noise."""
import json
import random
from pathlib import Path

import pytest

from kineto_factory import KinetoTrace

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "fixtures" / "gpu"
MIXED = GPU / "mixed"
PUBLIC = ROOT.parent / "shared" / "public-traces"


def loader_bound_run(path, step_ms, wait_ms, steps=10, noise=0.03, seed=0):
    """A training run like a ResNet-50 on a V100 fed by a DataLoader: each step waits wait_ms
    for its batch on the loop's thread, then the GPU computes (its kernels launched back to back,
    the loop synchronising on the loss at the end)."""
    rng = random.Random(seed)
    k = KinetoTrace()
    t = 0.0
    for n in range(steps):
        dur = step_ms * 1000 * (1 + rng.gauss(0, noise))
        wait = wait_ms * 1000 * (1 + rng.gauss(0, noise))
        k.step(n, t, dur)
        k.dataloader(t + 5, wait)
        gpu_us = dur - wait - 60
        cpu = t + wait + 10
        for i in range(20):
            k.launch_kernel("void cudnn::cnn::conv2d_grouped_direct_kernel<float>(float*)",
                            cpu + i * 5, cpu + 20 + i * gpu_us / 20, gpu_us / 20 - 2)
        k.sync(cpu + 110, t + dur - 20 - (cpu + 110))
        t += dur + 15
    return k.write(path)


def compare_json(cli, before, after, *extra):
    r = cli("compare", before, after, "--json", "-", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_dataloader_fix_of_1_26x_is_faster(cli, tmp_path):
    """The shape of the public V100 pair of the issue (num_workers=0 -> 4: 177.6 -> 141.1 ms a
    step, the DataLoader wait 59 -> 1 ms): 10 steps a capture whose step times do not overlap."""
    before = loader_bound_run(tmp_path / "w0.json", 177.6, 59.0, seed=1)
    after = loader_bound_run(tmp_path / "w4.json", 141.1, 1.0, seed=2)
    j = compare_json(cli, before, after)
    st = j["step_time"]
    assert st["result"] == "faster", st
    assert 1.2 < st["speedup"] < 1.32 and st["ci"][0] > 1.05
    assert st["method"] == "steps" and st["run_to_run"]["source"] == "halves of each capture"
    data = next(b for b in j["buckets"] if b["bucket"] == "data")
    assert data["before_ms"] > 50 and data["after_ms"] < 5
    # the mean step is the one `analyze` reports for the same trace
    a = json.loads(cli("analyze", before, "--json", "-", "-q").stdout)
    assert st["before_ms"] == pytest.approx(a["verdict"]["step_ms"], abs=0.01)
    assert j["before"]["captures"][0]["step_ms"] == pytest.approx(a["verdict"]["step_ms"], abs=0.01)


def test_an_a_a_pair_of_the_same_configuration_is_no_change(cli, tmp_path):
    """Two captures of the same run configuration, same steps, made in two processes."""
    before = loader_bound_run(tmp_path / "a.json", 177.6, 59.0, seed=3)
    after = loader_bound_run(tmp_path / "b.json", 177.6, 59.0, seed=4)
    assert compare_json(cli, before, after)["step_time"]["result"] == "no change beyond the noise"


@pytest.mark.parametrize("pair", [("memory_item_sync", "memory_item_sync_fixed"),
                                  ("launch_python_loop", "launch_python_loop_fixed")])
def test_committed_remedy_pairs_are_faster(cli, pair):
    """fixtures/gpu's H200 captures, a baseline and its remedy, one capture a side."""
    j = compare_json(cli, GPU / pair[0] / "nsys.sqlite.gz", GPU / pair[1] / "nsys.sqlite.gz")
    assert j["step_time"]["result"] == "faster", j["step_time"]


@pytest.mark.parametrize("pair", [
    # steps alone: 1.26x [1.05, 1.54], faster; H100, two capture runs (fixtures/gpu/mixed/labels.yaml)
    ("h100_data_0.2", "h100r11_data_0.2"),
    # steps alone: 0.67x [0.53, 0.87], slower; H100, two capture runs
    ("lraspp_data_0.3", "h100r12x_lraspp_data_0.3")])
def test_recaptures_of_one_configuration_stay_within_the_noise(cli, pair):
    """The mixed corpus captured some configurations again in a later capture run (same model,
    cause and amount, another process): their steps alone differ beyond their own spread, and
    the run-to-run term measured from the captures keeps them at no change."""
    j = compare_json(cli, MIXED / f"{pair[0]}.nsys.sqlite.gz", MIXED / f"{pair[1]}.nsys.sqlite.gz")
    st = j["step_time"]
    assert st["result"] == "no change beyond the noise", st
    assert not (st["step_ci"][0] <= 1 <= st["step_ci"][1]), "the steps alone would call it"


def _public_workers_pair():
    """The public ResNet-50 V100 traces of num_workers=0 and 4 (kineto's TensorBoard plugin
    samples), where ../shared/public-traces holds them."""
    if not PUBLIC.is_dir():
        return None
    found = {}
    for f in sorted(PUBLIC.rglob("*.json*")):
        name = str(f.relative_to(PUBLIC)).lower()
        if "resnet50" in name and "autograd" not in name:
            for w in ("0", "4"):
                if f"num_workers_{w}" in name:
                    found.setdefault(w, f)
    return (found["0"], found["4"]) if len(found) == 2 else None


def test_public_v100_workers_pair_is_faster(cli):
    pair = _public_workers_pair()
    if pair is None:
        pytest.skip("the public ResNet-50 num_workers=0/4 traces are not in ../shared/public-traces")
    st = compare_json(cli, *pair)["step_time"]
    assert st["result"] == "faster", st
