"""Shared fixtures: captured graphs are cached per test session (capture is deterministic)."""

from collections.abc import Callable

import pytest

from data.graph.format import IterationGraph
from data.zoo import ZOO
from profiler.capture import capture_graph

_CACHE: dict[str, IterationGraph] = {}


@pytest.fixture(scope="session")
def zoo_graph() -> Callable[[str], IterationGraph]:
    """Capture a zoo model's graph once per session."""

    def get(name: str) -> IterationGraph:
        if name not in _CACHE:
            _CACHE[name] = capture_graph(ZOO[name])
        return _CACHE[name]

    return get
