"""Imports point down only, and no module imports one of its own callers.

The layers (the project design's table): data <- plans, cluster <- profiler, executor,
simulator <- search <- workflows <- service (the executor captures graphs with the profiler).
Every import counts, also one deferred into a function.
"""

import ast
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ddlsim"
# Which of ddlsim's subpackages each may import (besides itself).
ALLOWED = {
    "data": set(),
    "plans": {"data"},
    "cluster": {"data"},
    "profiler": {"data", "plans", "cluster"},
    "executor": {"data", "plans", "cluster", "profiler"},
    "simulator": {"data", "plans"},
    "search": {"data", "plans", "simulator"},
    "workflows": {"data", "plans", "cluster", "profiler", "executor", "simulator", "search"},
    "service": {
        "data",
        "plans",
        "cluster",
        "profiler",
        "executor",
        "simulator",
        "search",
        "workflows",
    },
    # ``python -m ddlsim`` (as launchers start it): the command line and nothing else.
    "__main__": {"service"},
}
SERVICE_ONLY = {"fastapi", "uvicorn", "starlette"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, module: str, known: Collection[str] = ()) -> Iterator[str]:
    """Every module ``module`` (at ``path``) names in an import, absolute or relative.

    ``from package import name`` names the submodule ``package.name`` when that is one of the
    ``known`` modules (as ``import package.name`` does), else ``package`` (a name it defines or
    re-exports)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                name = f"{base}.{alias.name}"
                yield name if name in known else base


def _graph() -> dict[str, set[str]]:
    """Module -> the ddlsim modules it imports."""
    modules = _modules()
    return {
        name: {m for m in _imports(path, name, modules) if m in modules and m != name}
        for name, path in modules.items()
    }


def _layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else "ddlsim"


def test_the_layers_are_known() -> None:
    layers = {_layer(m) for m in _modules()} - {"ddlsim"}
    assert layers == set(ALLOWED), f"a subpackage without a layer: {layers ^ set(ALLOWED)}"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_point_down(layer: str) -> None:
    modules = _modules()
    for module, imported in _graph().items():
        if _layer(module) != layer:
            continue
        upward = {m for m in imported if _layer(m) not in ALLOWED[layer] | {layer}}
        assert not upward, f"{module} imports {sorted(upward)} (a layer above {layer})"
        if layer != "service":
            names = {n.split(".")[0] for n in _imports(modules[module], module)}
            assert not names & SERVICE_ONLY, f"{module} imports {names & SERVICE_ONLY}"


def test_no_module_imports_its_callers() -> None:
    """No cycle of imports between modules (Tarjan's strongly connected components)."""
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert not cycles, f"modules that import each other: {cycles}"


def test_benchmarks_use_the_workflows_not_the_service() -> None:
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        imported = set(_imports(path, path.stem))
        service = sorted(m for m in imported if m.startswith("ddlsim.service"))
        assert not service, f"{path.relative_to(ROOT)} imports {service}"


def test_the_checker_reads_every_form_of_import(tmp_path: Path) -> None:
    """The walk itself: relative imports resolved, submodules told from names."""
    module = tmp_path / "mod.py"
    module.write_text(
        "from ..service import api, cli_name\nimport ddlsim.search.algorithm\n"
        "from ddlsim.data.store import writers\n"
    )
    known = {"ddlsim.service.api", "ddlsim.data.store.writers"}
    names = set(_imports(module, "ddlsim.data.mod", known))
    assert names == {
        "ddlsim.service.api",  # a submodule
        "ddlsim.service",  # a name the package defines
        "ddlsim.search.algorithm",
        "ddlsim.data.store.writers",
    }
