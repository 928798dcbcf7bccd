"""The closed-form data-parallel replay equals the full replay, strategy by strategy."""

import random
from collections.abc import Callable
from typing import Any

import pytest

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.graph.annotate import with_strategy
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.strategy import Strategy
from ddlsim.simulator.dp_replay import DataParallelReplay
from ddlsim.simulator.replay import replay, transfer_durations
from ddlsim.simulator.runtime import RuntimeCosts

GraphOf = Callable[[str], IterationGraph]


def _durations(graph: IterationGraph, seed: int) -> dict[int, float]:
    rng = random.Random(seed)
    return {
        n.id: rng.uniform(0.01, 0.5) for n in graph.nodes if n.kind in ("compute", "optimizer")
    }


def _comm(busbw_gbps: float, *, cpu: bool = False) -> dict[str, AlphaBeta]:
    """Collectives at ``busbw_gbps``; with ``cpu``, each takes compute from the rank: 200 us a
    call and a quarter of its wire time a byte."""
    per_byte = 0.25 * 8e-3 / busbw_gbps if cpu else 0.0
    return {
        op: AlphaBeta(
            collective=op,
            world_size=2,
            alpha_us=300.0,
            busbw_gbps=busbw_gbps,
            cpu_alpha_us=200.0 if cpu else 0.0,
            cpu_us_per_byte=per_byte,
        )
        for op in ("all_reduce", "reduce_scatter", "all_gather")
    }


STRATEGIES: list[dict[str, Any]] = [
    {},
    {"tensor_fusion": {"bucket_cap_mb": 0.25}},
    {"tensor_fusion": {"bucket_caps_mb": [65536]}},
    {"tensor_fusion": {"bucket_caps_mb": [0.1, 1, 0.5]}},
    {"tensor_fusion": {"bucket_cap_mb": 1, "dear": True}},
    {"tensor_fusion": {"bucket_cap_mb": 0.05, "dear": True}},
    {"tensor_fusion": {"bucket_caps_mb": [65536], "dear": True}},
    {"tensor_fusion": {"bucket_caps_mb": [0.1, 1, 0.5], "dear": True}},
]


@pytest.mark.parametrize("name", ["gpt2-tiny", "t5-tiny", "mlp"])
@pytest.mark.parametrize("busbw_gbps", [0.1, 1.0, 50.0])
@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.parametrize("cpu", [False, True], ids=["wire", "wire+cpu+copies"])
def test_fast_replay_equals_the_full_replay(
    name: str, busbw_gbps: float, micro_batches: int, cpu: bool, zoo_graph: GraphOf
) -> None:
    base = zoo_graph(name)
    node_ms = _durations(base, seed=len(name))
    # With cpu, the runtime's gradient copies cost 50 us a pass and 0.1 ms a MiB, and each
    # bucket 0.3 ms (hooks) or 0.2 ms (DDP) more.
    costs = RuntimeCosts(
        copy_alpha_us=50.0,
        copy_us_per_byte=1e-4,
        hooks_us_per_bucket=300.0,
        ddp_us_per_bucket=200.0,
    )
    runtime = costs if cpu else RuntimeCosts()
    fast = DataParallelReplay(base, node_ms, runtime)
    comm = _comm(busbw_gbps, cpu=cpu)
    order = base.grad_ready_order
    explicit = {"tensor_fusion": {"buckets": [order[1::2], order[0::2]]}}
    explicit_dear = {
        "tensor_fusion": {"buckets": [order[1::3], order[0::3], order[2::3]], "dear": True}
    }
    for raw in [*STRATEGIES, explicit, explicit_dear]:
        strategy = Strategy.from_dict(
            {**raw, "parallel": {"micro_batches": micro_batches}} if micro_batches > 1 else raw
        )
        graph = with_strategy(base, strategy)
        full = replay(graph, transfer_durations(base, node_ms, graph), comm, runtime=runtime)
        got = fast.summary(strategy, comm, micro_batches=micro_batches)
        assert got.iteration_time_ms == pytest.approx(full.iteration_time_ms, rel=1e-9)
        assert got.compute_ms == pytest.approx(full.compute_ms, rel=1e-9)
        assert got.comm_ms == pytest.approx(full.comm_ms, rel=1e-9, abs=1e-9)
        launched = [n.bucket for n in graph.nodes_of("comm") if n.op != "all_gather"]
        assert len(got.buckets) == len(launched)


def test_bucket_timings_follow_the_fifo_stream(zoo_graph: GraphOf) -> None:
    base = zoo_graph("gpt2-tiny")
    fast = DataParallelReplay(base, _durations(base, seed=1))
    summary = fast.summary(
        Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": 0.5}}), _comm(0.1)
    )
    previous_end = 0.0
    for bucket in summary.buckets:
        assert bucket.start_ms == pytest.approx(max(previous_end, bucket.ready_ms))
        assert bucket.end_ms > bucket.start_ms
        previous_end = bucket.end_ms
    assert sum(b.grad_bytes for b in summary.buckets) == base.grad_bytes


def test_collectives_cpu_work_and_copies_slow_the_replay(zoo_graph: GraphOf) -> None:
    base = zoo_graph("gpt2-tiny")
    node_ms = _durations(base, seed=3)
    runtime = RuntimeCosts(copy_us_per_byte=1e-4)
    for raw in ({}, {"tensor_fusion": {"bucket_cap_mb": 1, "dear": True}}):
        strategy = Strategy.from_dict(raw)
        graph = with_strategy(base, strategy)
        durations = transfer_durations(base, node_ms, graph)
        wire = replay(graph, durations, _comm(1.0)).iteration_time_ms
        cpu = replay(graph, durations, _comm(1.0, cpu=True)).iteration_time_ms
        both = replay(graph, durations, _comm(1.0, cpu=True), runtime=runtime)
        assert wire < cpu < both.iteration_time_ms
        copies = [e for e in both.timeline if e.name.startswith("copy bucket")]
        assert copies and all(e.end_ms > e.start_ms for e in copies)


def test_explicit_buckets_are_checked_and_priced_alike_when_seen_again(
    zoo_graph: GraphOf,
) -> None:
    base = zoo_graph("gpt2-tiny")
    fast = DataParallelReplay(base, _durations(base, seed=2))
    comm = _comm(1.0, cpu=True)
    order = base.grad_ready_order
    halves = Strategy.from_dict({"tensor_fusion": {"buckets": [order[1::2], order[0::2]]}})
    first = fast.summary(halves, comm)
    # other strategies sharing its groups, then the same one again: the same figures
    fast.summary(
        Strategy.from_dict({"tensor_fusion": {"buckets": [order[0::2], order[1::2]]}}), comm
    )
    assert fast.summary(halves, comm) == first
    # as many names as gradients, one of them unknown
    unknown = Strategy.from_dict({"tensor_fusion": {"buckets": [["not_a_weight"], order[1:]]}})
    with pytest.raises(InvalidStrategyError, match="not_a_weight"):
        fast.summary(unknown, comm)
    missing = Strategy.from_dict({"tensor_fusion": {"buckets": [order[1:]]}})
    with pytest.raises(InvalidStrategyError, match="miss 1 gradient"):
        fast.summary(missing, comm)
