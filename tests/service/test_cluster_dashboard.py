"""The GPU clusters' page, loaded in headless Chromium: a stored cluster search's layouts as
stacked bars of where their iteration goes, and every shipped published run as a point of
predicted against published and a row of the table (:mod:`tests.service.browser`)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.store import Store
from ddlsim.data.store.tasks import TaskQueue
from ddlsim.data.zoo import ZOO
from ddlsim.workflows.published import describe_published, published_files
from ddlsim.workflows.scale_jobs import LayoutSearchRequest, search_cluster
from tests.service.browser import browser_or_skip, chromium
from tests.service.serving import serving

TOP = 5


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """A service whose store holds one finished cluster search of gpt2-tiny on two nodes."""
    browser_or_skip()
    db = f"sqlite:///{tmp_path / 'clusters.db'}"
    request = LayoutSearchRequest(
        model=ZOO["gpt2-tiny"],
        cluster=GpuClusterSpec.parse("dgx-h100:2"),
        global_batch=32,
        seq_len=128,
        top=TOP,
    )
    with Store.open(db) as store:
        queue = TaskQueue(store)
        queue.submit("cluster-search", request.to_json())
        task = queue.claim("w")
        assert task is not None
        queue.finish(task, search_cluster(request))
    with serving("--no-worker", "--db", db, token="t", stop_timeout_s=30) as address:
        yield address


def test_the_page_draws_the_layouts_and_the_published_runs_in_chromium(server: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    runs = sum(describe_published(name)["rows"] for name in published_files())
    with chromium() as driver:
        driver.get(f"{server}/clusters")
        WebDriverWait(driver, 30).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#layouts rect.segment")
        )
        labels = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#layouts text")]
        assert [label for label in labels if label[:2] in {f"{i}." for i in range(1, TOP + 1)}]
        assert labels[0].startswith("1. dp"), labels
        parts = {
            s.get_attribute("data-part")
            for s in driver.find_elements(By.CSS_SELECTOR, "#layouts rect.segment")
        }
        legend = driver.find_element(By.ID, "parts-legend").text
        assert "compute" in parts and all(part in legend for part in parts)
        status = driver.find_element(By.ID, "search-status").text
        assert "gpt2-tiny" in status or "GPT2LMHeadModel" in status, status
        # every file is predicted on the server the first time: seconds each
        WebDriverWait(driver, 240).until(
            lambda d: "MAPE" in d.find_element(By.ID, "published-status").text
        )
        points = driver.find_elements(By.CSS_SELECTOR, "#published-scatter circle.point")
        rows = driver.find_elements(By.CSS_SELECTOR, "#published-table tbody tr")
        assert len(rows) == runs and len(points) == runs, (len(rows), len(points), runs)
        tip = points[0].find_element(By.TAG_NAME, "title").get_attribute("textContent") or ""
        assert "published" in tip and "APE" in tip
        first = rows[0].find_elements(By.TAG_NAME, "td")
        assert first[-1].text.endswith("%") and first[1].text.startswith("dp")
