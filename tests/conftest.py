"""Shared fixtures: captured graphs are cached per test session (capture is deterministic)."""

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ddlsim.data.graph.format import GraphNode, IterationGraph, ParamInfo, TensorMeta
from ddlsim.data.specs.model import InputSpec, ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.profiler.capture import capture_graph
from ddlsim.service.cli import main
from tests.batch_files import BatchRun
from tests.simulator.nodes import collective_node

_CACHE: dict[str, IterationGraph] = {}


@pytest.fixture(autouse=True)
def private_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test gets its own SQLite store and data directory (trained cost models): nothing
    reaches the user's data directory."""
    url = f"sqlite:///{tmp_path / 'ddlsim-test.db'}"
    monkeypatch.setenv("DDLSIM_DB", url)
    monkeypatch.setenv("DDLSIM_DATA_DIR", str(tmp_path / "ddlsim-data"))
    return url


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``long`` start first (the test workers then end together, not one waiting
    for the other's last long test); tests marked ``gpu`` run only where CUDA is available."""
    items.sort(key=lambda item: "long" not in item.keywords)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def zoo_graph() -> Callable[[str], IterationGraph]:
    """Capture a zoo model's graph once per session."""

    def get(name: str) -> IterationGraph:
        if name not in _CACHE:
            _CACHE[name] = capture_graph(ZOO[name])
        return _CACHE[name]

    return get


@pytest.fixture
def tiny_graph() -> IterationGraph:
    """A 4-node iteration: matmul forward, its backward, the weight's gradient, an all-reduce."""
    t = TensorMeta(shape=(2, 2), dtype="float32")
    forward = GraphNode(
        id=0,
        kind="compute",
        phase="forward",
        op="aten.mm.default",
        module="fc",
        inputs=(t, t),
        outputs=(t,),
        flops=16,
        bytes_read=32,
        bytes_written=16,
    )
    nodes = (
        forward,
        # The backward matmul has the forward's shapes and costs.
        dataclasses.replace(forward, id=1, phase="backward", forward_id=0),
        GraphNode(
            id=2,
            kind="grad_ready",
            phase="backward",
            op="grad_ready",
            module="fc",
            param="fc.weight",
            params=("fc.weight",),
            param_bytes=16,
            grad_bytes=16,
        ),
        collective_node(3, "all_reduce", bucket=0, params=("fc.weight",), grad_bytes=16),
    )
    return IterationGraph(
        model=ModelSpec(source="reference", cls="MLP", config={}, inputs=InputSpec(batch_size=2)),
        strategy=Strategy(),
        optimizer="sgd",
        params=(
            ParamInfo(
                name="fc.weight", module="fc", shape=(2, 2), dtype="float32", numel=4, nbytes=16
            ),
        ),
        nodes=nodes,
        edges=((0, 1), (1, 2), (2, 3)),
        env={"torch": "test"},
    )


@pytest.fixture
def profile_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> BatchRun:
    """Runs ``ddlsim profile batch --json`` on a batch file of the given YAML text; its exit
    status and JSON summary."""

    def run(text: str) -> tuple[int, dict[str, Any]]:
        path = tmp_path / "batch.yaml"
        path.write_text(text)
        code = main(["profile", "batch", str(path), "--json"])
        return code, json.loads(capsys.readouterr().out)

    return run
