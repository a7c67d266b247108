import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def run_cli(*args, cwd=None, env=None, timeout=600):
    """Run `navdoctor ARGS` as a user would (a separate process); returns CompletedProcess."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "navdoctor.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=full_env, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli
