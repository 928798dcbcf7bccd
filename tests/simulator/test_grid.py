"""Grid replay and analytical model (simulator/grid.py): shares, collectives, overlap."""

from collections.abc import Callable

import pytest

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.zoo import ZOO
from ddlsim.plans.grid import grid_layers
from ddlsim.plans.tp_plans import PLANS
from ddlsim.simulator.grid import GridCosts, GridModels, analytic_grid, replay_grid

GraphOf = Callable[[str], IterationGraph]
# gpt2-tiny at its zoo inputs: 4 x 64 tokens, float32, n_embd 128.
FEATURE_BYTES = 4 * 64 * 4


def _axes(rows: int, cols: int, depth: int) -> dict[str, int]:
    return {"rows": rows, "cols": cols, "depth": depth}


def _costs(graph: IterationGraph, axes: dict[str, int], *, overlap: bool = True) -> GridCosts:
    layers = grid_layers(ZOO["gpt2-tiny"], axes)
    return GridCosts.of(graph, PLANS["gpt2"], layers, axes, overlap=overlap)


def _models(axes: dict[str, int], ms: float, *, dp: int = 1) -> GridModels:
    """Every collective ``ms`` of latency (and infinite bandwidth) over more than one rank."""

    def model(op: str, size: int) -> AlphaBeta:
        return AlphaBeta(collective=op, world_size=size, alpha_us=ms * 1e3, busbw_gbps=1e12)

    ops = ("all_reduce", "all_gather", "reduce_scatter")
    return GridModels(
        axes={axis: {op: model(op, size) for op in ops} for axis, size in axes.items()},
        samples_all_reduce=model("all_reduce", dp * axes["depth"]),
        dp_all_reduce=model("all_reduce", dp),
    )


def test_compute_shares_by_kind_of_op(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    costs = _costs(graph, _axes(2, 2, 2))
    by_module: dict[str, set[int]] = {}
    for node in graph.nodes:
        if node.kind == "compute" and node.phase == "forward":
            by_module.setdefault(node.module, set()).add(costs.divisor[node.id])
    assert by_module["transformer.h.0.attn.c_attn"] == {8}  # the block: rows x cols x depth
    assert by_module["transformer.h.0.mlp.c_proj"] == {8}
    assert by_module["transformer.h.0.ln_1"] == {2}  # whole features, the slice's samples
    assert 4 in by_module["transformer.h.0.attn"]  # attention on 1 / cols of the heads
    assert by_module["lm_head"] == {2}


def test_collectives_of_a_2d_grid_and_their_sizes(zoo_graph: GraphOf) -> None:
    costs = _costs(zoo_graph("gpt2-tiny"), _axes(2, 2, 1))
    qkv = {(c.phase, c.kind, c.axis): c for c in costs.collectives["transformer.h.0.attn.c_attn"]}
    assert set(qkv) == {
        ("forward", "all_reduce", "rows"),
        ("backward", "all_reduce", "cols"),
        ("backward", "all_gather", "rows"),
    }
    # the output block's 384 / 2 features, the input's 128 / 2, the whole input gathered
    assert qkv["forward", "all_reduce", "rows"].nbytes == FEATURE_BYTES * 192
    assert qkv["backward", "all_reduce", "cols"].nbytes == FEATURE_BYTES * 64
    assert qkv["backward", "all_reduce", "cols"].overlap == "weight_grad"
    assert qkv["backward", "all_gather", "rows"].nbytes == FEATURE_BYTES * 128
    out = {(c.phase, c.kind, c.axis) for c in costs.collectives["transformer.h.0.attn.c_proj"]}
    assert out == {
        ("forward", "all_reduce", "cols"),
        ("forward", "all_gather", "rows"),
        ("backward", "all_reduce", "rows"),
    }
    assert len(costs.collectives) == 8  # 2 blocks x 4 linear layers


def test_depth_shards_weights_and_splits_samples(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    costs = _costs(graph, _axes(1, 1, 4))
    fc = {(c.phase, c.kind, c.axis): c for c in costs.collectives["transformer.h.0.mlp.c_fc"]}
    assert set(fc) == {("forward", "all_gather", "depth"), ("backward", "reduce_scatter", "depth")}
    assert fc["forward", "all_gather", "depth"].nbytes == 128 * 512 * 4
    assert fc["forward", "all_gather", "depth"].before
    assert fc["backward", "reduce_scatter", "depth"].overlap == "stream"
    weights = sum(
        p.nbytes for p in graph.params if p.module in costs.collectives and "weight" in p.name
    )
    assert costs.shard_grad_bytes == weights // 4
    assert costs.whole_grad_bytes + weights == graph.grad_bytes


@pytest.mark.parametrize("grid", [(2, 2, 1), (1, 2, 2), (4, 1, 1), (1, 1, 4)])
def test_without_overlap_the_replay_is_the_analytic_sum(
    zoo_graph: GraphOf, grid: tuple[int, int, int]
) -> None:
    graph = zoo_graph("gpt2-tiny")
    axes = _axes(*grid)
    node_ms = {n.id: 0.1 for n in graph.nodes if n.kind in ("compute", "optimizer")}
    costs = _costs(graph, axes, overlap=False)
    models = _models(axes, 1.0, dp=2)
    replayed = replay_grid(graph, node_ms, costs, models, micro_batches=2)
    analytic = analytic_grid(graph, node_ms, costs, models, micro_batches=2)
    assert replayed.iteration_time_ms == pytest.approx(analytic)
    count = sum(len(c) for c in costs.collectives.values())
    assert replayed.exposed_comm_ms == pytest.approx(2 * count + 2)  # and the two averages


def test_overlap_hides_backward_collectives(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    axes = _axes(1, 2, 2)
    node_ms = {n.id: 0.5 for n in graph.nodes if n.kind in ("compute", "optimizer")}
    models = _models(axes, 0.2)
    plain = replay_grid(graph, node_ms, _costs(graph, axes, overlap=False), models)
    overlapped = replay_grid(graph, node_ms, _costs(graph, axes, overlap=True), models)
    hidden = sum(
        1
        for group in _costs(graph, axes).collectives.values()
        for c in group
        if c.overlap is not None
    )
    # every reduce-scatter (8 layers), and the column-parallel layers' input-gradient all-reduce
    assert hidden == 12
    assert plain.iteration_time_ms - overlapped.iteration_time_ms == pytest.approx(0.2 * hidden)
    assert overlapped.comm_ms == pytest.approx(plain.comm_ms)
