"""Imports point down only (see the layer table in the project design)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("data", "profiler", "simulator", "search", "executor", "service")
# Which of our packages each may import.
ALLOWED = {
    "data": set(),
    "profiler": {"data"},
    "executor": {"data", "profiler"},
    "simulator": {"data"},
    "search": {"data", "simulator"},
    "service": {"data", "profiler", "executor", "simulator", "search"},
}
SERVICE_ONLY = {"fastapi", "uvicorn"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_down(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    for path in files:
        imported = _imports(path)
        ours = (imported & set(PACKAGES)) - {package}
        assert ours <= ALLOWED[package], f"{path.relative_to(ROOT)} imports {ours}"
        if package != "service":
            assert not imported & SERVICE_ONLY, f"{path.relative_to(ROOT)} imports fastapi/uvicorn"
