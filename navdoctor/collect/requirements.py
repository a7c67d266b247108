"""What `diagnose` and `verify` need beyond the base install: PyTorch (and torchvision for the
bundled workload), which `pip install 'navdoctor[run]'` adds (docs/install.md). Checked before
anything runs, by looking for the packages without importing them: `analyze`, `compare` and
`rules` never import torch."""
from __future__ import annotations

import importlib.util

from ..errors import NavdoctorError

RUN_EXTRA = "pip install 'navdoctor[run]'"


def missing_packages(names: tuple[str, ...]) -> list[str]:
    """The packages among names that this interpreter cannot import."""
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def require_torch(command: str, bundled: bool) -> None:
    """One line naming what to install when torch (or, for the bundled workload, torchvision)
    is missing; the caller's exit code is 2 (a usage error)."""
    missing = missing_packages(("torch", "torchvision") if bundled else ("torch",))
    if missing:
        raise NavdoctorError(f"`navdoctor {command}` runs the script under PyTorch, and "
                             f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                             f"installed here: {RUN_EXTRA} (analyze, compare and rules need neither)")
