"""The package's structure, read from the source with ``ast``: layers, no circles, a small root.

Every import counts, including the lazy ones inside functions: a lazy import that
points upward is still an upward dependency, and two lazy imports can still form a
circle. ``multigpu.backends`` (the adapters) and ``multigpu.benchmarks`` sit outside
the layers: the core never imports them by name (it finds adapters by entry point).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Bottom to top. A module may import its own layer and the layers below it.
LAYERS = [
    "errors",
    "checks",
    "procfs",
    "data",
    "contract",
    "models",
    "optim",
    "parallel",
    "distributed",
    "training",
    "partition",
    "lab",
    "execution",
    "cli",
]
#: Where each source folder is installed.
TREES = {"multigpu": "multigpu", "backends": "multigpu.backends", "benchmarks": "multigpu.benchmarks"}
#: What the adapters may use of the core: the contract, the job description, errors and checks.
ADAPTER_MAY_IMPORT = ("multigpu.errors", "multigpu.checks", "multigpu.contract", "multigpu.distributed.job")
#: Root modules allowed beside the subpackages.
ROOT_MODULES = {"__init__", "__main__", "errors", "checks"}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in TREES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The multigpu modules ``name`` imports, lazy ones included, resolved to modules."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            # "from pkg import mod" imports the module pkg.mod when there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target.startswith("multigpu") and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1])


def _core(module: str) -> bool:
    parts = module.split(".")
    return len(parts) > 1 and parts[1] in LAYERS


def test_the_graph_was_read():
    assert len(MODULES) > 60
    assert "multigpu.parallel.data_parallel" in GRAPH["multigpu.training.trainer"]
    assert "multigpu.training.processes" in GRAPH["multigpu.training.trainer"]


def test_every_core_module_lives_in_a_known_layer():
    unknown = sorted(
        m
        for m in MODULES
        if m.startswith("multigpu.")
        and not m.startswith(("multigpu.backends", "multigpu.benchmarks", "multigpu.__main__"))
        and not _core(m)
    )
    assert not unknown, f"modules outside every layer: {unknown}; add their package to LAYERS in order"


def test_the_root_holds_only_the_entry_points_errors_and_checks():
    root = {p.stem for p in (ROOT / "multigpu").glob("*.py")}
    assert root <= ROOT_MODULES, f"move {sorted(root - ROOT_MODULES)} into a subpackage named for what it holds"
    assert len(root) <= 6


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _core(m)))
def test_no_module_imports_a_higher_layer(module):
    upward = sorted(t for t in GRAPH[module] if _core(t) and _layer(t) > _layer(module))
    assert not upward, f"{module} (layer {LAYERS[_layer(module)]}) imports the higher {upward}"


def test_nothing_below_the_top_imports_the_package_root():
    # ``import multigpu`` runs multigpu/__init__.py, which imports every layer.
    offenders = sorted(
        m
        for m, targets in GRAPH.items()
        if "multigpu" in targets and not m.startswith(("multigpu.benchmarks", "multigpu.__main__", "multigpu.cli"))
    )
    assert not offenders, f"{offenders} import the package root; import the module that holds the name"


def test_the_core_never_names_an_adapter():
    offenders = sorted(
        (m, t) for m, targets in GRAPH.items() if _core(m) for t in targets if t.startswith("multigpu.backends")
    )
    assert not offenders, f"core modules import adapters directly: {offenders}; find them through the registry"


def test_adapters_use_only_the_contract_and_the_job_description():
    offenders = sorted(
        (m, t)
        for m, targets in GRAPH.items()
        if m.startswith("multigpu.backends")
        for t in targets
        if not t.startswith(("multigpu.backends", *ADAPTER_MAY_IMPORT))
    )
    assert not offenders, f"adapters import more of the core than the contract: {offenders}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    # Package __init__ files re-export their modules for users; an edge into an __init__
    # from inside its own package would close a circle through it, so count them all.
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = defaultdict(set, {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert _cycles(graph) == [["a", "b", "c"]]


def test_pyproject_lists_every_package():
    # setuptools installs only the listed packages: a subpackage left out would be missing
    # from a wheel although every test run from the source tree passes.
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join([package, *p.parent.relative_to(ROOT / folder).parts])
        for folder, package in TREES.items()
        for p in (ROOT / folder).rglob("__init__.py")
    }
    assert found <= listed, f"add {sorted(found - listed)} to [tool.setuptools] packages in pyproject.toml"
