"""The house stays within its walls: no source file over 450 lines outside tests and
migrations, no function over 80 lines without a reason in its docstring (``Long: ...``)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("ddlsim", "benchmarks", "scripts")
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return sorted(
        path
        for folder in FOLDERS
        for path in (ROOT / folder).rglob("*.py")
        if "migrations" not in path.parts
    )


def test_no_file_over_its_wall() -> None:
    over = [
        f"{path.relative_to(ROOT)}: {lines} lines"
        for path in _sources()
        if (lines := len(path.read_text("utf-8").splitlines())) > MAX_FILE_LINES
    ]
    assert not over, f"split along a seam a reader would name: {over}"


def test_no_long_function_without_its_reason() -> None:
    over = []
    for path in _sources():
        tree = ast.parse(path.read_text("utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            reason = "Long:" in (ast.get_docstring(node) or "")
            if lines > MAX_FUNCTION_LINES and not reason:
                over.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
    assert not over, f"split, or say why not in the docstring ('Long: ...'): {over}"
