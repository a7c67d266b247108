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
