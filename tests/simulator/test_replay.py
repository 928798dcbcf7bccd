"""Replay on hand-made graphs whose schedules can be worked out on paper, and on captured ones."""

import json
from typing import Any

import pytest

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.format import GraphNode, IterationGraph, ParamInfo
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.simulator.cpu_load import MAX_CPU_SHARE, CpuLoad
from ddlsim.simulator.replay import replay, transfer_durations
from ddlsim.simulator.timeline import ReplayResult, UnsupportedPlanError
from tests.simulator.nodes import compute_node, update_node

MIB = 1024 * 1024
# Two layers a -> b, one parameter each, one bucket each (b's gradient is ready first).
DURATIONS = {0: 1.0, 1: 1.0, 2: 2.0, 5: 2.0}
OPTIMIZER_MS = 0.5


def _graph(strategy: dict[str, Any]) -> IterationGraph:
    """forward a, forward b, backward b, b ready, [collective 0], backward a, a ready,
    [collective 1], ([all-gathers] with DeAR), update b, update a."""
    parsed = Strategy.from_dict(strategy)
    first = "reduce_scatter" if parsed.tensor_fusion.dear else "all_reduce"

    def ready(i: int, param: str) -> GraphNode:
        return GraphNode(
            id=i, kind="grad_ready", phase="backward", op="grad_ready", module="", param=param
        )

    def collective(i: int, op: str, bucket: int, param: str) -> GraphNode:
        return GraphNode(
            id=i,
            kind="comm",
            phase="comm",
            op=op,
            module="",
            params=(param,),
            grad_bytes=MIB,
            bucket=bucket,
        )

    nodes = [
        compute_node(0, "forward", "a"),
        compute_node(1, "forward", "b"),
        compute_node(2, "backward", "b"),
        ready(3, "b.weight"),
        collective(4, first, 0, "b.weight"),
        compute_node(5, "backward", "a"),
        ready(6, "a.weight"),
        collective(7, first, 1, "a.weight"),
    ]
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (2, 5), (5, 6), (6, 7)]
    delivers = {0: 4, 1: 7}
    if parsed.tensor_fusion.dear:
        nodes += [collective(8, "all_gather", 0, "b.weight")]
        nodes += [collective(9, "all_gather", 1, "a.weight")]
        edges += [(4, 8), (7, 9)]
        delivers = {0: 8, 1: 9}
    n = len(nodes)
    nodes += [update_node(n, "b.weight", 0), update_node(n + 1, "a.weight", 1)]
    edges += [(delivers[0], n), (delivers[1], n + 1)]
    params = tuple(
        ParamInfo(
            name=f"{m}.weight", module=m, shape=(512, 512), dtype="float32", numel=1, nbytes=4
        )
        for m in ("a", "b")
    )
    return IterationGraph(
        model=ZOO["mlp"],
        strategy=parsed,
        optimizer="adamw",
        params=params,
        nodes=tuple(nodes),
        edges=tuple(edges),
    )


def _durations(graph: IterationGraph) -> dict[int, float]:
    out = dict(DURATIONS)
    out.update({n.id: OPTIMIZER_MS for n in graph.nodes_of("optimizer")})
    return out


def _comm(ms_per_mib: float, world_size: int = 2) -> dict[str, AlphaBeta]:
    """One link under which an all-reduce of one MiB takes ``ms_per_mib`` at two ranks (a ring
    all-reduce moves 2(n-1)/n = 1 of the buffer per rank; reduce-scatter and all-gather half)."""
    busbw = MIB / (ms_per_mib * 1e3 * 125.0) if ms_per_mib else float("inf")
    return {
        name: AlphaBeta(collective=name, world_size=world_size, alpha_us=0.0, busbw_gbps=busbw)
        for name in ("all_reduce", "reduce_scatter", "all_gather")
    }


def _replayed(strategy: dict[str, Any], ms_per_mib: float) -> ReplayResult:
    """The two-layer graph under ``strategy``, replayed on the link of :func:`_comm`."""
    graph = _graph(strategy)
    return replay(graph, _durations(graph), _comm(ms_per_mib))


def test_without_communication_the_iteration_is_the_sum_of_its_nodes() -> None:
    result = _replayed({}, 0.0)
    assert result.iteration_time_ms == pytest.approx(6.0 + 2 * OPTIMIZER_MS)
    assert result.exposed_comm_ms == pytest.approx(0.0)


def test_all_reduce_overlaps_backward_and_the_last_one_is_exposed() -> None:
    # forward 0-2, backward b 2-4, all-reduce b 4-5 (under backward a 4-6), all-reduce a 6-7,
    # then the optimizer (waiting for both) 7-8.
    result = _replayed({}, 1.0)
    assert result.iteration_time_ms == pytest.approx(8.0)
    assert result.compute_ms == pytest.approx(7.0)
    assert result.exposed_comm_ms == pytest.approx(1.0)
    assert result.comm_ms == pytest.approx(2.0)


def test_slow_links_serialize_the_buckets_on_the_comm_stream() -> None:
    # all-reduce b 4-9, all-reduce a after it 9-14, optimizer 14-15.
    result = _replayed({}, 5.0)
    assert result.iteration_time_ms == pytest.approx(15.0)
    assert result.exposed_comm_ms == pytest.approx(8.0)


def test_dear_hides_all_gathers_in_the_next_forward() -> None:
    # Reduce-scatters and all-gathers take 0.5 ms. From the end t of a backward: reduce-scatter
    # a t..t+0.5, all-gather a (first layer first) t+0.5..t+1, all-gather b t+1..t+1.5. The
    # next forward waits until t+1 for a's bucket, updates a, runs a, updates b (ready by then),
    # runs b: 1 ms of waiting an iteration, 7 ms of compute.
    result = _replayed({"tensor_fusion": {"dear": True}}, 1.0)
    assert result.iteration_time_ms == pytest.approx(8.0)
    assert result.compute_ms == pytest.approx(7.0)
    # With the same links plain all-reduce waits as long: DeAR only moves the wait here.
    assert _replayed({}, 1.0).iteration_time_ms == pytest.approx(8.0)


def test_dear_beats_all_reduce_when_the_forward_can_hide_the_all_gathers() -> None:
    graph = _graph({"tensor_fusion": {"dear": True}})
    durations = _durations(graph) | {0: 4.0, 1: 4.0}  # a long forward
    plain = _graph({})
    plain_durations = _durations(plain) | {0: 4.0, 1: 4.0}
    dear = replay(graph, durations, _comm(3.0)).iteration_time_ms
    all_reduce = replay(plain, plain_durations, _comm(3.0)).iteration_time_ms
    assert dear < all_reduce


def test_micro_batches_repeat_compute_and_communicate_once() -> None:
    result = _replayed({"parallel": {"micro_batches": 2}}, 1.0)
    # Two forward+backward passes (12 ms), the last all-reduce exposed (1), the optimizer (1).
    assert result.iteration_time_ms == pytest.approx(14.0)
    assert [e.micro_batch for e in result.timeline if e.stream == "comm"] == [1, 1]


def test_timeline_exports_as_a_chrome_trace() -> None:
    trace = _replayed({}, 1.0).chrome_trace()
    spans = [e for e in json.loads(json.dumps(trace))["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in spans} == {1, 2}
    assert sum(1 for e in spans if e["name"].startswith("all_reduce")) == 2


def test_refusals_name_what_is_missing() -> None:
    graph = _graph({})
    with pytest.raises(InvalidOptionError, match="no collective model for all_reduce"):
        replay(graph, _durations(graph), {})
    with pytest.raises(InvalidOptionError, match=r"iterations\(2\) must be >= 3"):
        replay(graph, _durations(graph), _comm(1.0), iterations=2)
    fsdp = _graph({"parallel": {"fsdp": True}})
    with pytest.raises(UnsupportedPlanError, match=r"fsdp\(True\)"):
        replay(fsdp, _durations(fsdp), _comm(1.0))


def test_profiled_times_move_to_a_graph_of_another_strategy() -> None:
    spec = ZOO["mlp"]
    profiled = capture_graph(spec)
    other = capture_graph(
        spec, CaptureOptions(strategy=Strategy.from_dict({"tensor_fusion": {"dear": True}}))
    )
    node_ms = {n.id: float(n.id) for n in profiled.nodes if n.kind in ("compute", "optimizer")}
    moved = transfer_durations(profiled, node_ms, other)
    source = [n.id for n in profiled.nodes if n.kind == "compute"]
    target = [n.id for n in other.nodes if n.kind == "compute"]
    assert [moved[t] for t in target] == [float(s) for s in source]
    updates = {n.param: n.id for n in profiled.nodes_of("optimizer")}
    for node in other.nodes_of("optimizer"):
        assert moved[node.id] == float(updates[node.param])
    with pytest.raises(InvalidOptionError, match="not of the same model"):
        transfer_durations(capture_graph(ZOO["gpt2-tiny"]), node_ms, other)


def test_cpu_load_slows_only_the_compute_it_overlaps() -> None:
    load = CpuLoad()
    assert load.finish(0.0, 5.0) == pytest.approx(5.0)  # no collective: full rate
    load.add(2.0, 6.0, 2.0)  # half the core from 2 to 6 ms
    load.add(10.0, 12.0, 0.5)  # a quarter from 10 to 12 ms
    # 2 ms at full rate, then 4 ms at half (2 of work), then 1 more ms: ends at 7.
    assert load.finish(0.0, 5.0) == pytest.approx(7.0)
    # Work inside the first interval only: 1 ms of it takes 2.
    assert load.finish(3.0, 1.0) == pytest.approx(5.0)
    # Across the gap and into the second: 3 ms to 6 gives 1.5, 6-10 gives 4 (5.5), then 1.5
    # more at 3/4 takes 2 ms.
    assert load.finish(3.0, 7.0) == pytest.approx(12.0)
    # Compute that starts after both loses nothing; a query earlier than the last still works.
    assert load.finish(20.0, 1.0) == pytest.approx(21.0)
    assert load.finish(0.0, 1.0) == pytest.approx(1.0)


def test_cpu_load_caps_a_cpu_bound_collective() -> None:
    load = CpuLoad()
    load.add(0.0, 1.0, 5.0)  # more compute than its own duration: capped
    assert load.finish(0.0, 1.0) == pytest.approx(1.0 + (1.0 - (1.0 - MAX_CPU_SHARE)))
    load.add(2.0, 2.0, 1.0)  # empty intervals and free collectives are ignored
    load.add(3.0, 4.0, 0.0)
    assert load.finish(2.0, 2.0) == pytest.approx(4.0)
