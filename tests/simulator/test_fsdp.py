"""FSDP replay: a two-group schedule worked out on paper, and a captured model."""

from collections.abc import Callable

import pytest
import torch

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import IterationGraph, ParamInfo
from ddlsim.data.models import build_model
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.plans.stages import default_groups
from ddlsim.simulator.fsdp import ROOT, group_of_nodes, replay_fsdp
from ddlsim.simulator.runtime import RuntimeCosts
from tests.simulator.nodes import compute_node, update_node

GraphOf = Callable[[str], IterationGraph]


def _two_layers() -> IterationGraph:
    """forward a (1 ms), forward b (1), backward b (2), backward a (2), two updates (0.5)."""

    nodes = (
        compute_node(0, "forward", "a"),
        compute_node(1, "forward", "b"),
        compute_node(2, "backward", "b", 1),
        compute_node(3, "backward", "a", 0),
        update_node(4, "b.weight"),
        update_node(5, "a.weight"),
    )
    params = tuple(
        ParamInfo(name=f"{m}.weight", module=m, shape=(1,), dtype="float32", numel=1, nbytes=4)
        for m in ("a", "b")
    )
    return IterationGraph(
        model=ZOO["mlp"],
        strategy=Strategy.from_dict({"parallel": {"fsdp": True}}),
        optimizer="adamw",
        params=params,
        nodes=nodes,
        edges=((0, 1), (1, 2), (2, 3), (3, 4), (3, 5)),
    )


def _latency_only(op: str, ms: float) -> AlphaBeta:
    return AlphaBeta(collective=op, world_size=2, alpha_us=ms * 1e3, busbw_gbps=1e12)


def test_two_groups_by_hand() -> None:
    graph = _two_layers()
    node_ms = {0: 1.0, 1: 1.0, 2: 2.0, 3: 2.0, 4: 0.5, 5: 0.5}
    result = replay_fsdp(
        graph,
        node_ms,
        [["a"], ["b"]],
        all_gather=_latency_only("all_gather", 0.5),
        reduce_scatter=_latency_only("reduce_scatter", 0.25),
        dp=2,
    )
    # all-gather a [0, .5]; forward a [.5, 1.5] while b is prefetched [.5, 1]; forward b
    # [1.5, 2.5]; backward: gather b again [2.5, 3], backward b [3, 5] (a prefetched [3, 3.5]),
    # reduce-scatter b [5, 5.25] under backward a [5, 7], reduce-scatter a [7, 7.25], then the
    # shard's half of the two updates: 0.5 ms.
    assert result.iteration_time_ms == pytest.approx(7.75)
    assert result.compute_ms == pytest.approx(6.5)
    assert result.exposed_comm_ms == pytest.approx(1.25)
    assert result.comm_ms == pytest.approx(4 * 0.5 + 2 * 0.25)


def test_groups_of_a_captured_model(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    with torch.device("meta"):
        groups = default_groups(build_model(graph.model))
    assert groups == [["transformer.h.0"], ["transformer.h.1"]]
    member = group_of_nodes(graph, groups)
    assert set(member.values()) == {ROOT, 0, 1}
    node_ms = {n.id: 0.1 for n in graph.nodes if n.kind in ("compute", "optimizer")}
    compute = sum(0.1 for n in graph.nodes if n.kind == "compute")

    def iteration(busbw_gbps: float) -> float:
        ag = AlphaBeta(collective="all_gather", world_size=2, alpha_us=0, busbw_gbps=busbw_gbps)
        rs = AlphaBeta(
            collective="reduce_scatter", world_size=2, alpha_us=0, busbw_gbps=busbw_gbps
        )
        result = replay_fsdp(graph, node_ms, groups, all_gather=ag, reduce_scatter=rs, dp=2)
        return result.iteration_time_ms

    fast, slow = iteration(1e9), iteration(0.1)
    optimizer = sum(0.1 for n in graph.nodes if n.kind == "optimizer") / 2
    assert fast == pytest.approx(compute + optimizer, rel=1e-6)
    assert slow > fast + 50  # 6 MB of parameters gathered twice at 0.1 Gb/s


def test_runtime_costs_charge_each_group_start_and_the_optimizer() -> None:
    graph = _two_layers()
    node_ms = {0: 1.0, 1: 1.0, 2: 2.0, 3: 2.0, 4: 0.5, 5: 0.5}

    def run(runtime: RuntimeCosts | None) -> float:
        return replay_fsdp(
            graph,
            node_ms,
            [["a"], ["b"]],
            all_gather=_latency_only("all_gather", 0.0),
            reduce_scatter=_latency_only("reduce_scatter", 0.0),
            dp=2,
            runtime=runtime,
        ).iteration_time_ms

    costs = RuntimeCosts(fsdp_us_per_group=400.0, fsdp_step_us_per_param=100.0)
    # Two groups, each starting its forward and its backward (0.2 ms each time), and 2
    # parameters at 0.1 ms in the optimizer; free collectives leave nothing to overlap.
    assert run(costs) - run(None) == pytest.approx(4 * 0.2 + 2 * 0.1)


def test_each_group_pays_once_a_phase_though_the_root_runs_in_pieces(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    groups = [["transformer.h.0"], ["transformer.h.1"]]
    member = group_of_nodes(graph, groups)
    forward = [member[n.id] for n in graph.nodes if n.kind == "compute" and n.phase == "forward"]
    runs = [g for i, g in enumerate(forward) if i == 0 or forward[i - 1] != g]
    assert runs.count(ROOT) > 1  # embeddings before the blocks, the head after them
    free = {
        op: AlphaBeta(collective=op, world_size=2, alpha_us=0, busbw_gbps=1e12)
        for op in ("all_gather", "reduce_scatter")
    }
    node_ms = {n.id: 0.1 for n in graph.nodes if n.kind in ("compute", "optimizer")}
    result = replay_fsdp(
        graph,
        node_ms,
        groups,
        all_gather=free["all_gather"],
        reduce_scatter=free["reduce_scatter"],
        dp=2,
        runtime=RuntimeCosts(fsdp_us_per_group=1000.0),
    )
    charged = [e for e in result.timeline if e.name.startswith("fsdp group")]
    # the two blocks and the root, each as its forward and as its backward starts
    assert len(charged) == 2 * 3
    assert sum(e.end_ms - e.start_ms for e in charged) == pytest.approx(6 * 0.5)
