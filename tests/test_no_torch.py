"""The base install has no torch (docs/install.md, "Two installs"): analyze, compare, rules and
every reporter run without importing it, and diagnose and verify say in one line what to install.
Each command runs in a fresh interpreter whose import system refuses torch and torchvision and
records every attempt to import them, even one a `try: import torch` would swallow."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures"
MEMORY = FIX / "gpu" / "memory_item_sync"

# Runs `navdoctor ARGS` with torch and torchvision unimportable; prints on its last stderr line
# the modules it was asked for (JSON), whatever the command's exit code.
_BLOCKED = """
import importlib.abc, json, sys
tried = []
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchvision"):
            tried.append(name)
            raise ImportError(f"{name} is blocked by the test")
        return None
sys.meta_path.insert(0, NoTorch())
sys.argv = ["navdoctor", *sys.argv[1:]]
from navdoctor.cli import run
try:
    run()
    code = 0
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else 1
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchvision"))
sys.stdout.flush()
sys.stderr.write("\\nNOTORCH " + json.dumps({"tried": tried, "loaded": loaded}) + "\\n")
sys.exit(code)
"""


def _no_torch(args: list[str], cwd: Path) -> tuple[int, str, str, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", _BLOCKED, *args], capture_output=True, text=True,
                       cwd=cwd, env=env, timeout=300)
    head, _, tail = p.stderr.rpartition("NOTORCH ")
    assert tail, f"the command never finished: {p.stderr[-2000:]}"
    return p.returncode, p.stdout, head, json.loads(tail)


def test_the_hook_sees_an_import_of_torch(tmp_path):
    """The check can fail: a module that imports torch inside a try is still seen."""
    (tmp_path / "sneaky.py").write_text("try:\n    import torch\nexcept ImportError:\n    pass\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    code = _BLOCKED.replace("from navdoctor.cli import run", "import sneaky\nfrom navdoctor.cli import run")
    p = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=120)
    assert json.loads(p.stderr.rpartition("NOTORCH ")[2])["tried"] == ["torch"]


def test_analyze_writes_every_report_without_torch(tmp_path):
    code, out, err, seen = _no_torch(
        ["analyze", str(MEMORY / "kineto.json.gz"), str(MEMORY / "nsys.sqlite.gz"),
         "--json", "r.json", "--markdown", "r.md", "--html", "r.html"], tmp_path)
    assert code == 0, err
    assert seen == {"tried": [], "loaded": []}
    assert json.loads((tmp_path / "r.json").read_text())["verdict"]["bound"] == "memory"
    assert (tmp_path / "r.md").read_text().startswith("<!-- navdoctor report")
    assert "<!-- navdoctor html report" in (tmp_path / "r.html").read_text()[:200]
    assert "VERDICT" in out


def test_compare_and_rules_run_without_torch(tmp_path):
    before = FIX / "cpu" / "train_steps.json.gz"
    code, out, err, seen = _no_torch(["compare", str(before), str(before), "--json", "c.json",
                                      "--html", "c.html"], tmp_path)
    assert code == 0, err
    assert seen == {"tried": [], "loaded": []}
    assert json.loads((tmp_path / "c.json").read_text())["step_time"]["result"]
    for args in (["rules", "list"], ["rules", "check", str(ROOT / "rules")],
                 ["rules", "explain", "io-dataloader-wait"],
                 ["rules", "test", str(ROOT / "docs" / "examples")]):
        code, out, err, seen = _no_torch(args, tmp_path)
        assert code == 0, (args, err)
        assert seen == {"tried": [], "loaded": []}, args


@pytest.mark.parametrize("command", ["diagnose", "verify"])
def test_diagnose_and_verify_say_what_to_install(tmp_path, command):
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    code, out, err, _ = _no_torch([command, str(script)], tmp_path)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "pip install 'navdoctor[run]'" in lines[0], err
    assert "never runs" not in out
    assert not any(p.name.startswith("navdoctor-runs") for p in tmp_path.iterdir())
