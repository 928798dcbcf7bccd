"""Store records for tests: a plausible value in every field, so that a test names only the
fields it checks (``**overrides``, applied with ``dataclasses.replace``)."""

import dataclasses
from typing import Any

from ddlsim.data.store import CollectiveProfileRecord, KernelProfileRecord, MeasurementRecord


def kernel_profile(graph_hash: str, **overrides: Any) -> KernelProfileRecord:
    """A CPU kernel profile of the graph ``graph_hash`` that timed nodes 0 and 3."""
    profile = KernelProfileRecord(
        graph_hash=graph_hash,
        model="MLP",
        device="cpu",
        device_name="test-cpu",
        iters=5,
        iteration_time_ms=2.5,
        attributed_ms=2.0,
        coverage=0.8,
        node_ms={0: 1.25, 3: 0.75},
        trace_path=None,
        env={"torch": "test"},
    )
    return dataclasses.replace(profile, **overrides)


def collective_profile(**overrides: Any) -> CollectiveProfileRecord:
    """An all-reduce over gloo on 4 ranks behind shaped 1 Gbit/s links."""
    profile = CollectiveProfileRecord(
        collective="all_reduce",
        backend="gloo",
        world_size=4,
        bandwidth="1gbit",
        network="netns",
        alpha_us=120.0,
        busbw_gbps=0.118,
        r2=0.999,
        samples=[{"bytes": 1 << 20, "time_ms": 13.0, "op": "all_reduce"}],
        rank_cores={0: [0], 1: [1], 2: [0], 3: [1]},
        env={"torch": "test"},
    )
    return dataclasses.replace(profile, **overrides)


def measurement(graph_hash: str, strategy_hash: str, **overrides: Any) -> MeasurementRecord:
    """Two iterations of the strategy ``strategy_hash`` on 2 ranks behind 1 Gbit/s links."""
    record = MeasurementRecord(
        model="MLP",
        graph_hash=graph_hash,
        strategy_hash=strategy_hash,
        world_size=2,
        bandwidth="1gbit",
        network="netns",
        iteration_time_ms=[310.5, 312.0],
        peak_memory_bytes=[1 << 30, (1 << 30) + 7],
        applied={"bucket_caps_mb": [4.0], "ddp": True},
        env={"rank_cores": {"0": [0], "1": [1]}},
    )
    return dataclasses.replace(record, **overrides)
