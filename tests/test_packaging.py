"""A wheel must carry every subpackage and the built-in rules (pyproject.toml lists packages
explicitly, because rules/ is mapped into the package)."""
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")
ROOT = Path(__file__).resolve().parent.parent


def _setuptools_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_subpackage_is_packaged():
    listed = set(_setuptools_config()["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "navdoctor").rglob("__init__.py")}
    assert found <= listed, f"add to pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"


def test_builtin_rules_go_into_the_wheel():
    cfg = _setuptools_config()
    assert cfg["package-dir"]["navdoctor.rules_builtin"] == "rules"
    patterns = cfg["package-data"]["navdoctor.rules_builtin"]
    rule_files = sorted((ROOT / "rules").iterdir())
    assert rule_files and all(any(f.match(p) for p in patterns) for f in rule_files)


def test_python_m_navdoctor_is_the_command(tmp_path):
    """`python -m navdoctor` runs the same CLI (for a venv whose scripts are not on PATH), with
    its exit codes: 0 for --help, 2 and one line for a missing trace."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "PYTHONPATH": str(ROOT)}   # this checkout, not another installed copy
    ok = subprocess.run([sys.executable, "-m", "navdoctor", "--help"], capture_output=True, text=True,
                        cwd=tmp_path, env=env)
    assert ok.returncode == 0 and "diagnose" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "navdoctor", "analyze", str(tmp_path / "missing.json")],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_two_installs_one_tool():
    """The base install has no torch; the `run` extra adds torch and torchvision; the README's
    first command installs that extra with its pins and runs diagnose, its second is exactly
    what .ci/run runs (docs/install.md)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {d.split(">")[0].split("=")[0].split("[")[0].strip().lower() for d in project["dependencies"]}
    assert not base & {"torch", "torchvision"} and {"duckdb", "numpy", "pydantic", "pyyaml", "click", "plotly"} <= base
    assert {d.split(">")[0] for d in project["optional-dependencies"]["run"]} == {"torch", "torchvision"}
    readme = (ROOT / "README.md").read_text()
    commands = [line.strip() for line in readme.splitlines() if line.startswith("    python3 -m venv")]
    first, second = commands[:2]
    pins = "pip install torch==2.14.1 torchvision==0.29.1 -e "
    assert pins + "'.[run]'" in first and first.endswith("navdoctor diagnose")
    assert pins + "'.[run,test]'" in second and second.endswith("pytest -q")
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python3")]
    assert ci == [second]
