"""The distribution installs one top-level package, ``ddlsim``, with its data files."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_holds_ddlsim_only(tmp_path: Path) -> None:
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"),
            *("--no-build-isolation", "--wheel-dir", str(tmp_path), str(ROOT)),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("ddlsim-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt")))
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"ddlsim"}
    for module in ("search", "simulator", "workflows", "service", "executor", "profiler"):
        assert f"ddlsim/{module}/__init__.py" in names
    for data in (
        "ddlsim/data/simulator/cost_model.pt",
        "ddlsim/data/datasets/cpu-v3.json.gz",
        "ddlsim/data/store/migrations/script.py.mako",
        "ddlsim/service/static/dashboard.html",
    ):
        assert data in names, f"{data} is not in the wheel"
    assert not any(n.startswith(("ddlsim/tests", "tests/", "benchmarks/")) for n in names)
    assert b"ddlsim = ddlsim.service.cli:run_command_line" in entry_points
