"""The dashboard: its data pairs measurements with predictions, and the page, loaded in headless
Chromium, plots every stored point and search.

The browser test needs Debian's ``chromium`` and ``chromium-driver``
(:mod:`tests.service.browser`)."""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import MeasurementRecord, PredictionRecord, Store, strategy_hash
from ddlsim.data.store.tasks import TaskQueue
from ddlsim.service.api import Settings, create_app
from tests.service.browser import browser_or_skip, chromium
from tests.service.serving import serving

GraphOf = Callable[[str], IterationGraph]
DEAR = Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": 1, "dear": True}})


def _seed(db: str, graph: IterationGraph) -> None:
    """Two runs of mlp (DDP's defaults, DeAR), each with its prediction, and a finished search."""
    with Store.open(db) as store:
        graph_hash = store.save_graph(graph=graph)
        for strategy, measured, predicted in ((Strategy(), 100.0, 90.0), (DEAR, 200.0, 150.0)):
            store.save_strategy(strategy=strategy)
            store.save_measurement(
                measurement=MeasurementRecord(
                    model="mlp",
                    graph_hash=graph_hash,
                    strategy_hash=strategy_hash(strategy),
                    world_size=2,
                    bandwidth="1gbit",
                    network="netns",
                    iteration_time_ms=[measured, measured * 1.1, measured * 0.9],
                    peak_memory_bytes=[1, 1],
                    applied={},
                    env={},
                )
            )
            store.save_prediction(
                prediction=PredictionRecord(
                    model="mlp",
                    graph_hash=graph_hash,
                    strategy_hash=strategy_hash(strategy),
                    cluster={"world_size": 2, "bandwidth": "1gbit", "backend": "gloo"},
                    iteration_time_ms=predicted,
                    breakdown={},
                    simulator_version="test",
                )
            )
        queue = TaskQueue(store)
        queue.submit("execution", {"model": {"name": "mlp"}, "world_size": 2, "strategy": {}})
        run = queue.claim("w")
        assert run is not None
        queue.finish(
            run,
            {
                "measured_ms": 100.0,
                "predicted_ms": 90.0,
                "predicted_timeline": [
                    {"name": "aten.mm", "lane": "compute", "start_ms": 5.0, "end_ms": 50.0},
                    {"name": "all_reduce", "lane": "comm", "start_ms": 30.0, "end_ms": 90.0},
                ],
                "measured_trace": [
                    {"name": "step", "lane": 0, "start_ms": 0.0, "end_ms": 60.0},
                    {"name": "gloo:all_reduce", "lane": 1, "start_ms": 35.0, "end_ms": 99.0},
                ],
            },
        )
        queue.submit("search", {"model": "mlp"})
        task = queue.claim("w")
        assert task is not None
        queue.finish(
            task,
            {
                "model": "<i>evil</i>",
                "world_size": 2,
                "algo": "tpe",
                "baseline": {"predicted_ms": 100.0},
                "best": {"predicted_ms": 80.0},
                "convergence": [100.0, 95.0, 80.0, 80.0],
            },
        )


@pytest.fixture
def seeded(tmp_path: Path, zoo_graph: GraphOf) -> str:
    db = f"sqlite:///{tmp_path / 'dash.db'}"
    _seed(db, zoo_graph("mlp"))
    return db


def test_the_data_pairs_runs_with_their_predictions(seeded: str) -> None:
    with TestClient(create_app(Settings(db=seeded, token="t", simulator="replay"))) as client:
        data = client.get("/v1/dashboard").json()
        page = client.get("/").text
    points = sorted(data["points"], key=lambda p: p["measured_ms"])
    assert [(p["kind"], p["measured_ms"], p["predicted_ms"]) for p in points] == [
        ("buckets", 100.0, 90.0),
        ("dear", 200.0, 150.0),
    ]
    assert points[1]["error"] == pytest.approx(-0.25)
    assert data["errors"]["by_kind"] == [
        {"kind": "buckets", "points": 1, "mape": pytest.approx(0.1), "median_error": -0.1},
        {"kind": "dear", "points": 1, "mape": pytest.approx(0.25), "median_error": -0.25},
    ]
    (family,) = data["errors"]["by_family"]
    assert family["points"] == 2 and family["mape"] == pytest.approx(0.175)
    (search,) = data["searches"]
    assert search["convergence"] == [100.0, 95.0, 80.0, 80.0]
    (run,) = data["timelines"]
    assert run["model"] == "mlp" and run["kind"] == "buckets" and run["measured_ms"] == 100.0
    assert 'id="scatter"' in page and "/v1/dashboard" in page


@pytest.fixture
def server(seeded: str, tmp_path: Path) -> Iterator[str]:
    args = ("--no-worker", "--db", seeded, "--simulator", "replay")
    with serving(*args, token="t", stop_timeout_s=30) as address:
        yield address


def test_the_page_plots_the_stored_points_in_chromium(server: str) -> None:
    browser_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium() as driver:
        driver.get(f"{server}/")
        WebDriverWait(driver, 30).until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, "#scatter circle.point")) == 2
        )
        tips = [
            t.get_attribute("textContent") or ""
            for t in driver.find_elements(By.CSS_SELECTOR, "#scatter circle.point title")
        ]
        assert all("mlp on 2 ranks" in tip for tip in tips), tips
        assert any("DeAR" in tip for tip in tips)
        assert len(driver.find_elements(By.CSS_SELECTOR, "#convergence polyline.curve")) == 1
        rows = driver.find_elements(By.CSS_SELECTOR, "#by-kind tbody tr")
        assert [r.find_element(By.TAG_NAME, "td").text for r in rows] == ["buckets", "dear"]
        status = driver.find_element(By.ID, "status").text
        assert status.startswith("2 measured runs"), status
        # a name from the store is shown as text, never parsed as markup
        legend = driver.find_element(By.ID, "search-legend")
        assert "<i>evil</i>" in legend.text and not legend.find_elements(By.TAG_NAME, "i")
        # the chosen run's replayed streams and measured threads, one bar per event
        WebDriverWait(driver, 30).until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, "#timeline rect.event")) == 4
        )
        labels = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#timeline text")]
        assert "replay: compute" in labels and "measured: training thread" in labels
