"""Tensor-parallel replay: which ops split, and the collectives a GPT-2 block costs."""

import functools
from collections.abc import Callable

import pytest

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import IterationGraph
from ddlsim.plans.tp_plans import PLANS
from ddlsim.simulator.runtime import RuntimeCosts
from ddlsim.simulator.tensor_parallel import replay_tensor_parallel, sharded_nodes
from ddlsim.simulator.timeline import ReplayResult

GraphOf = Callable[[str], IterationGraph]


def _latency(op: str, ms: float, world_size: int = 2) -> AlphaBeta:
    return AlphaBeta(collective=op, world_size=world_size, alpha_us=ms * 1e3, busbw_gbps=1e12)


def test_the_split_covers_attention_and_mlp_not_norms(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    sharded = sharded_nodes(graph, PLANS["gpt2"])
    by_module: dict[str, set[bool]] = {}
    for node in graph.nodes:
        if node.kind == "compute" and node.phase == "forward":
            by_module.setdefault(node.module, set()).add(node.id in sharded)
    assert by_module["transformer.h.0.attn.c_attn"] == {True}
    assert by_module["transformer.h.0.mlp.c_proj"] == {True}
    assert by_module["transformer.h.0.ln_1"] == {False}
    assert by_module["transformer.ln_f"] == {False}
    # the attention core between the projections runs on local heads
    assert True in by_module["transformer.h.0.attn"]
    backward = [n for n in graph.nodes if n.kind == "compute" and n.phase == "backward"]
    assert any(n.id in sharded for n in backward)


def _gpt2_split_in_two(graph: IterationGraph) -> "functools.partial[ReplayResult]":
    """The tensor-parallel replay of ``graph`` (GPT-2) on 2 ranks, every op 0.1 ms and every
    tensor-parallel collective 1 ms; the caller gives ``dp`` and its all-reduce."""
    node_ms = {n.id: 0.1 for n in graph.nodes if n.kind in ("compute", "optimizer")}
    return functools.partial(
        replay_tensor_parallel,
        graph,
        node_ms,
        PLANS["gpt2"],
        tp=2,
        tp_all_reduce=_latency("all_reduce", 1.0),
        tp_all_gather=_latency("all_gather", 1.0),
    )


def test_gpt2_collectives_and_halved_compute(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    sharded = sharded_nodes(graph, PLANS["gpt2"])
    compute = sum(0.1 / (2 if n.id in sharded else 1) for n in graph.nodes if n.kind == "compute")
    # The optimizer steps half of the split modules' parameters and all of the others
    # (norms, position embeddings).
    split = {"wte", "c_attn", "attn.c_proj", "c_fc", "mlp.c_proj", "lm_head"}
    split_bytes = sum(p.nbytes for p in graph.params if any(p.module.endswith(s) for s in split))
    share = (split_bytes / 2 + graph.grad_bytes - split_bytes) / graph.grad_bytes
    optimizer = 0.1 * len(graph.nodes_of("optimizer")) * share
    tp2 = _gpt2_split_in_two(graph)
    result = tp2(dp=1, dp_all_reduce=_latency("all_reduce", 1.0, world_size=1))
    # two blocks: forward all-reduces after attn.c_proj and mlp.c_proj, backward ones after
    # c_attn and c_fc; the vocabulary-split embedding all-reduces its output, the LM head
    # all-gathers its logits and all-reduces its input gradient: 4 + 4 + 1 + 1 + 1 = 11
    assert result.comm_ms == pytest.approx(11.0)
    assert result.compute_ms == pytest.approx(compute + optimizer)
    assert result.iteration_time_ms == pytest.approx(compute + optimizer + 11.0)
    with_dp = tp2(dp=2, dp_all_reduce=_latency("all_reduce", 5.0))
    assert with_dp.iteration_time_ms == pytest.approx(result.iteration_time_ms + 5.0)


def test_runtime_costs_charge_each_split_module_and_parameter(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    tp2 = functools.partial(
        _gpt2_split_in_two(graph), dp=1, dp_all_reduce=_latency("all_reduce", 1.0, world_size=1)
    )
    costs = RuntimeCosts(tp_us_per_module=300.0, tp_step_us_per_param=20.0)
    # Ten split modules (four a block, the embedding and the LM head), each charged as its
    # forward and its backward end; the split parameters are those of the split modules.
    split = {"wte", "c_attn", "attn.c_proj", "c_fc", "mlp.c_proj", "lm_head"}
    params = sum(1 for p in graph.params if any(p.module.endswith(s) for s in split))
    extra = tp2(runtime=costs).iteration_time_ms - tp2().iteration_time_ms
    assert extra == pytest.approx(10 * 0.3 + params * 0.02)


def test_shared_cores_stretch_the_collectives_cpu_work(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    busy = dict(cpu_alpha_us=2000.0, cpu_us_per_byte=0.0)
    tp2 = functools.partial(
        _gpt2_split_in_two(graph),
        tp_all_reduce=AlphaBeta(
            collective="all_reduce", world_size=2, alpha_us=1e3, busbw_gbps=1e12, **busy
        ),
        tp_all_gather=AlphaBeta(
            collective="all_gather", world_size=2, alpha_us=1e3, busbw_gbps=1e12, **busy
        ),
        dp=2,
        dp_all_reduce=AlphaBeta(
            collective="all_reduce", world_size=2, alpha_us=5e3, busbw_gbps=1e12, **busy
        ),
    )
    alone = tp2()
    # A core of its own: the fits' times, whatever CPU work they measured beside them.
    assert alone.comm_ms == pytest.approx(11.0 + 5.0)
    # Two ranks a core: each of the 12 blocking collectives' 2 ms of CPU work takes twice as
    # long, one more time its CPU work; compute is the caller's to scale.
    shared = tp2(compute_scale=2.0)
    assert shared.comm_ms == pytest.approx(alone.comm_ms + 12 * 2.0)
    assert shared.compute_ms == pytest.approx(alone.compute_ms)


def test_every_block_tp_prices_as_the_uniform_plan(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    tp2 = functools.partial(
        _gpt2_split_in_two(graph), dp=2, dp_all_reduce=_latency("all_reduce", 5.0)
    )
    assert tp2(layers=("tp", "tp")).iteration_time_ms == pytest.approx(tp2().iteration_time_ms)


def test_replicated_blocks_keep_their_time_and_issue_nothing(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    tp2 = functools.partial(
        _gpt2_split_in_two(graph), dp=1, dp_all_reduce=_latency("all_reduce", 1.0, world_size=1)
    )
    result = tp2(layers=("replicate", "replicate"), vocab="replicate")
    compute = 0.1 * len(graph.nodes_of("compute"))
    optimizer = 0.1 * len(graph.nodes_of("optimizer"))  # every parameter whole on every rank
    assert result.comm_ms == pytest.approx(0.0)
    assert result.iteration_time_ms == pytest.approx(compute + optimizer)


def test_batch_blocks_halve_their_compute_and_pay_boxing(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    tp2 = functools.partial(
        _gpt2_split_in_two(graph), dp=1, dp_all_reduce=_latency("all_reduce", 1.0, world_size=1)
    )
    result = tp2(layers=("batch", "batch"), vocab="replicate")
    in_blocks = {
        n.id
        for n in graph.nodes
        if n.kind == "compute" and n.phase == "forward" and n.module.startswith("transformer.h.")
    }
    in_blocks |= {n.id for n in graph.nodes if n.forward_id in in_blocks}
    compute = sum(
        0.1 / (2 if n.id in in_blocks else 1) for n in graph.nodes if n.kind == "compute"
    )
    # One run of batch blocks: its hidden states all-gathered as it ends (forward), their
    # gradient as it is entered (backward), and its gradients all-reduced once: 3 collectives.
    labels = sorted(e.name for e in result.timeline if e.stream == "comm")
    assert labels == [
        "all_gather grad samples into transformer.h.0",
        "all_gather samples after transformer.h.1",
        "batch blocks' gradients all_reduce",
    ]
    assert result.comm_ms == pytest.approx(3.0)
    optimizer = 0.1 * len(graph.nodes_of("optimizer"))
    assert result.iteration_time_ms == pytest.approx(compute + optimizer + 3.0)


def test_a_tp_block_between_batch_blocks_is_boxed_on_both_sides(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    tp2 = functools.partial(
        _gpt2_split_in_two(graph), dp=1, dp_all_reduce=_latency("all_reduce", 1.0, world_size=1)
    )
    mixed = tp2(layers=("batch", "tp"))
    labels = [e.name for e in mixed.timeline if e.stream == "comm"]
    assert labels.count("all_gather samples after transformer.h.0") == 1
    assert labels.count("all_gather grad samples into transformer.h.0") == 1
    # block 1's split collectives remain (2 forward, 2 backward), block 0's are gone
    assert sum(1 for label in labels if ".h.1." in label) == 4
    assert not any(".h.0." in label for label in labels)
