import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
# A small CPU training loop for `diagnose` runs; {before} is code to run first (empty: none)
CPU_TRAINING_LOOP = textwrap.dedent("""
    import sys, time, torch
    {before}
    model = torch.nn.Linear(16, 2)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.randn(48, 16), torch.randint(0, 2, (48,))), batch_size=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
""")

# The rule-check cache (navdoctor/rulecheck.py) of the test session is its own, not the
# user's ~/.cache/navdoctor: every session starts with nothing remembered.
if "NAVDOCTOR_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile
    _cache = tempfile.mkdtemp(prefix="navdoctor-test-cache-")
    os.environ["NAVDOCTOR_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, True)


def run_cli(*args, cwd=None, env=None, timeout=600):
    """Run `navdoctor ARGS` as a user would (a separate process); returns CompletedProcess."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "navdoctor.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=full_env, timeout=timeout)


def sigint_as_in_a_terminal() -> None:
    """preexec_fn for a child that a test interrupts: a shell starts background jobs (`pytest
    &`, some CI runners) with SIGINT ignored, the children inherit that, and Python then never
    raises KeyboardInterrupt, so the test would see a run that ignores Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def cli():
    return run_cli
