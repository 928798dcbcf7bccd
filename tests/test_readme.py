"""The README stays short and its examples marked runnable run as written, on the CPU."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
MARK = "<!-- runnable -->"


def runnable_blocks(text: str) -> list[str]:
    """The fenced bash blocks right after a runnable mark."""
    pattern = re.compile(re.escape(MARK) + r"\s*```bash\n(.*?)```", re.DOTALL)
    return pattern.findall(text)


def test_readme_is_read_in_five_minutes() -> None:
    assert len(README.read_text("utf-8").splitlines()) < 150


def test_the_quick_start_has_the_two_commands() -> None:
    text = README.read_text("utf-8")
    start = text.index("## Quick start")
    block = re.search(r"```bash\n(.*?)```", text[start:], re.DOTALL)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["bash scripts/quickstart.sh", "bash scripts/test.sh"]
    ci = (README.parent / ".ci" / "run").read_text("utf-8")
    assert "bash scripts/test.sh" in ci


def test_runnable_marks_find_blocks() -> None:
    blocks = runnable_blocks(README.read_text("utf-8"))
    assert len(blocks) >= 2
    assert all("ddlsim " in block for block in blocks)


@pytest.mark.long
@pytest.mark.parametrize("index", range(len(runnable_blocks(README.read_text("utf-8")))))
def test_readme_example_runs_as_written(index: int, tmp_path: Path) -> None:
    block = runnable_blocks(README.read_text("utf-8"))[index]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "DDLSIM_DB": f"sqlite:///{tmp_path / 'readme.db'}",
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, (
        f"{block}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )
