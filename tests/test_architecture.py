"""The package's layers point one way (docs/architecture.md): every import of a navdoctor
module, at the top of a file or inside a function, goes to a module of the same layer or of a
lower one, and no two modules import each other, directly or around a loop. Read from the
source with `ast`, so a late import inside a function counts as much as one at the top."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "navdoctor"

# Lowest first. A module's layer is that of its longest prefix listed here.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("navdoctor", "navdoctor.errors", "navdoctor.profiling",
                    "navdoctor.kernelnames", "navdoctor.steady", "navdoctor.rule_expr",
                    "navdoctor.textsafe", "navdoctor.gpus")),
    # what runs in the user's process, and the catalogues of remedies and statistics it shares
    ("collectors", ("navdoctor.collect", "navdoctor.workloads", "navdoctor.verify.remedies",
                    "navdoctor.verify.runner", "navdoctor.verify.stats", "navdoctor.verify.demo",
                    "navdoctor.verify")),
    ("store and rule files", ("navdoctor.store", "navdoctor.rules", "navdoctor.rule_models",
                              "navdoctor.loaders.base", "navdoctor.loaders.sqlite_pages")),
    ("loaders", ("navdoctor.loaders",)),
    ("steps and breakdown", ("navdoctor.stepjoin", "navdoctor.stepfinder", "navdoctor.breakdown")),
    ("views", ("navdoctor.views", "navdoctor.headroom")),
    ("engine", ("navdoctor.engine", "navdoctor.rulecheck")),
    ("verdict and gains", ("navdoctor.verdict", "navdoctor.gains", "navdoctor.whatif")),
    ("analysis", ("navdoctor.analysis",)),
    ("report", ("navdoctor.report_fields", "navdoctor.report_models", "navdoctor.report")),
    # above one trace's analysis: the job layer and the HTML page's data and rendering
    ("ranks and reporters", ("navdoctor.ranks", "navdoctor.reporters")),
    ("tools", ("navdoctor.compare", "navdoctor.verify.command", "navdoctor.ruletest",
               "navdoctor.schemas")),
    ("commands", ("navdoctor.commands",)),
    ("cli", ("navdoctor.cli", "navdoctor.__main__")),
]


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(package: Path) -> dict[str, Path]:
    return {_module_name(p, package): p for p in package.rglob("*.py")}


MODULES = _modules(PACKAGE)


def _layer(module: str) -> int:
    best, best_len = None, -1
    for i, (_name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            # (the package itself, "navdoctor", holds no module below it: each is listed)
            inside = module.startswith(prefix + ".") and prefix != "navdoctor"
            if (module == prefix or inside) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def _imports(module: str, modules: dict[str, Path] = MODULES) -> set[str]:
    """The navdoctor modules `module` imports (a name imported from a package counts as its
    submodule where one exists)."""
    path = modules[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "navdoctor"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "navdoctor":
                continue
            subs = {f"{target}.{a.name}" for a in node.names} & modules.keys()
            found |= subs or {target}
            if node.module and subs != {f"{target}.{a.name}" for a in node.names}:
                found.add(target)
    return {m for m in found if m in modules and m != module}


GRAPH = {m: _imports(m) for m in MODULES}


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    up = sorted(f"{dep} ({LAYERS[_layer(dep)][0]})" for dep in GRAPH[module]
                if _layer(dep) > _layer(module))
    assert not up, f"{module} ({LAYERS[_layer(module)][0]}) imports a higher layer: {up}"


def test_no_import_cycle():
    """Tarjan's strongly connected components: none with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_a_late_upward_import(tmp_path):
    """On a small package: an import inside a function, relative or absolute, is read, and
    an upward one is what the layer check reports."""
    pkg = tmp_path / "navdoctor"
    (pkg / "reporters").mkdir(parents=True)
    for f in ("__init__.py", "cli.py", "reporters/__init__.py", "reporters/data.py"):
        (pkg / f).write_text("")
    (pkg / "analysis.py").write_text(
        "import duckdb\n\ndef f():\n    from .reporters import data\n    import navdoctor.cli\n")
    modules = _modules(pkg)
    found = _imports("navdoctor.analysis", modules)
    assert found == {"navdoctor.reporters.data", "navdoctor.cli"}
    assert all(_layer(m) > _layer("navdoctor.analysis") for m in found)
