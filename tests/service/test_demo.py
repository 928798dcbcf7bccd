"""The README's main job (``scripts/quickstart.sh``) in small: ``ddlsim serve`` with its worker,
and the demo pipeline through the API, profile to executions, every result stored."""

from pathlib import Path

from ddlsim.data.store import Store
from ddlsim.service.demo import Client, run_demo
from ddlsim.service.output import verification_lines
from tests.service.serving import serving


def test_the_demo_pipeline_runs_end_to_end(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'demo.db'}"
    with serving("--db", db, token="demo", stop_timeout_s=60) as url:
        out = run_demo(
            Client(url, "demo", timeout_s=300),
            model="mlp",
            world_size=2,
            bandwidth="1gbit",
            measure_budget_s=0,
        )
    assert all(ms > 0 for ms in out["predicted"].values())
    assert out["search"]["best"]["predicted_ms"] <= out["search"]["baseline"]["predicted_ms"]
    search = out["search"]
    # The pick and DDP's defaults ran side by side in one launch: one measurement each, or one
    # in all when the pick is DDP's defaults.
    kept = bool(search.get("kept_baseline"))
    assert len(search["verified"]) == (1 if kept else 2)
    lines = verification_lines(search)
    if kept:
        assert len(lines) == 1 and "the pick is DDP's defaults: one measurement" in lines[0]
    else:
        assert isinstance(search["significant"], bool)
        low, high = search["speedup_interval"]
        assert low <= search["speedup"] <= high
    with Store.open(db) as store:
        measurements = store.measurements()
        assert len(measurements) == len(search["verified"])
        assert all(m.env["side_by_side"] == len(measurements) for m in measurements)
        assert store.collective_profiles(backend="gloo"), "the link was profiled"
