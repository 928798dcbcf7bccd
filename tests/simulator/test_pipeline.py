"""Pipeline replay: schedules worked out on paper, stage costs of a captured model."""

import dataclasses
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.models import build_model
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import resolve_model
from ddlsim.plans.stages import block_stack, tied_parameters
from ddlsim.plans.tp_plans import PLANS
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.simulator.costs import comm_models
from ddlsim.simulator.pipeline import (
    ShardedStages,
    StageCosts,
    TensorStage,
    replay_pipeline,
    stage_costs,
)
from ddlsim.simulator.pipeline_orders import interleaved_order, schedule_order
from ddlsim.simulator.plans import replay_parallel_plan
from ddlsim.simulator.tensor_parallel import split_stage
from ddlsim.simulator.timeline import UnsupportedPlanError

GraphOf = Callable[[str], IterationGraph]
NO_LINK = AlphaBeta(collective="sendrecv", world_size=1, alpha_us=0.0, busbw_gbps=1.0)
NO_DP = AlphaBeta(collective="all_reduce", world_size=1, alpha_us=0.0, busbw_gbps=1.0)


def test_schedule_orders() -> None:
    assert schedule_order("gpipe", 0, 2, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    first = [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    assert schedule_order("1f1b", 0, 2, 4) == first
    last = [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    assert schedule_order("1f1b", 1, 2, 4) == last
    # eager 1F1B: 2 * (stages - stage) - 1 warm-up forwards, the last stage as 1F1B's
    eager = [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]
    assert schedule_order("eager_1f1b", 0, 2, 4) == eager
    assert schedule_order("eager_1f1b", 1, 2, 4) == last
    assert schedule_order("eager_1f1b", 0, 2, 2) == schedule_order("1f1b", 0, 2, 2)
    with pytest.raises(UnsupportedPlanError, match="interleaved_1f1b"):
        schedule_order("interleaved_1f1b", 0, 2, 4)


def test_interleaved_order_by_hand() -> None:
    # 2 ranks, stages 0 and 2 on rank 0, 1 and 3 on rank 1, 2 micro-batches (one round)
    assert interleaved_order(0, 2, 2, 2) == [
        *[("F", 0, 0), ("F", 0, 1), ("F", 2, 0), ("F", 2, 1)],
        *[("B", 2, 0), ("B", 2, 1), ("B", 0, 0), ("B", 0, 1)],
    ]
    assert interleaved_order(1, 2, 2, 2) == [
        *[("F", 1, 0), ("F", 1, 1), ("F", 3, 0), ("B", 3, 0), ("F", 3, 1), ("B", 3, 1)],
        *[("B", 1, 0), ("B", 1, 1)],
    ]
    with pytest.raises(UnsupportedPlanError, match=r"micro_batches\(5\)"):
        interleaved_order(0, 2, 2, 5)


@pytest.mark.parametrize(("ranks", "micro_batches"), [(2, 2), (2, 4), (2, 8), (4, 4), (4, 8)])
def test_interleaved_order_is_torchs(ranks: int, micro_batches: int) -> None:
    # torch's own order (its schedule computes it from these four attributes, no process group)
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    compute = getattr(schedules.ScheduleInterleaved1F1B, "_calculate_single_rank_operations", None)
    if compute is None:
        pytest.skip("this torch computes the interleaved order elsewhere")
    rounds = max(1, micro_batches // ranks)
    fake = SimpleNamespace(
        n_local_stages=2,
        pp_group_size=ranks,
        _n_microbatches=micro_batches,
        microbatches_per_round=micro_batches // rounds,
    )
    for rank in range(ranks):
        theirs = [a for a in compute(fake, rank) if a is not None]
        ours = [(a[0], a[1], a[2]) for a in interleaved_order(rank, ranks, 2, micro_batches)]
        kind = {"F": "FORWARD", "B": "FULL_BACKWARD"}
        assert [(kind[k], s, m) for k, s, m in ours] == [
            (a.computation_type.name, a.stage_index, a.microbatch_index) for a in theirs
        ]


def test_interleaving_shrinks_the_bubble() -> None:
    # the same work cut into 4 stages over 2 ranks instead of 2: the fill and drain halve
    plain = replay_pipeline(
        _stages(2), schedule="1f1b", micro_batches=4, p2p=NO_LINK, all_reduce=NO_DP
    )
    interleaved = replay_pipeline(
        _stages(4, forward=0.5, backward=1.0),
        schedule="interleaved_1f1b",
        micro_batches=4,
        p2p=NO_LINK,
        all_reduce=NO_DP,
        ranks=2,
    )
    assert interleaved.compute_ms == pytest.approx(plain.compute_ms) == pytest.approx(12.0)
    assert interleaved.bubble_ms == pytest.approx(1.5)
    assert plain.bubble_ms == pytest.approx(3.0)
    assert {e.stream for e in interleaved.timeline} >= {"compute 0", "compute 1"}


def _stages(count: int, *, forward: float = 1.0, backward: float = 2.0) -> list[StageCosts]:
    return [
        StageCosts(
            forward_ms=forward,
            backward_ms=backward,
            optimizer_ms=0.0,
            activation_bytes=1 << 20,
            grad_bytes=1 << 20,
        )
        for _ in range(count)
    ]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "eager_1f1b"])
def test_two_stages_four_micro_batches_by_hand(schedule: str) -> None:
    # 4 x (1 + 2) ms of work per stage plus the fill and drain: (stages - 1) * (F + B) = 3 ms
    result = replay_pipeline(
        _stages(2), schedule=schedule, micro_batches=4, p2p=NO_LINK, all_reduce=NO_DP
    )
    assert result.iteration_time_ms == pytest.approx(15.0)
    assert result.compute_ms == pytest.approx(12.0)
    assert result.bubble_ms == pytest.approx(3.0)
    assert result.exposed_comm_ms == 0.0


def test_transfers_and_gradient_sync_add_up() -> None:
    # 1 MiB at 1 Gb/s = 8.39 ms per hop; one micro-batch: F0, hop, F1, B1, hop, B0, then sync
    p2p = AlphaBeta(collective="sendrecv", world_size=2, alpha_us=0.0, busbw_gbps=1.0)
    dp = AlphaBeta(collective="all_reduce", world_size=2, alpha_us=0.0, busbw_gbps=1.0)
    hop = p2p.time_us(1 << 20) / 1e3
    sync = dp.time_us(1 << 20) / 1e3
    result = replay_pipeline(_stages(2), schedule="gpipe", micro_batches=1, p2p=p2p, all_reduce=dp)
    assert result.iteration_time_ms == pytest.approx(1 + hop + 1 + 2 + hop + 2 + sync)
    assert result.exposed_comm_ms == pytest.approx(sync)


def test_fsdp_beside_the_pipeline_gathers_once_and_reduce_scatters_once() -> None:
    # Two stages of 1 ms forward, 2 ms backward, 4 micro-batches (15 ms without sharding).
    # Sharded over dp 2: each stage's first forward of the step waits for its first gather
    # (the rest prefetched beside the forward, here longer than it: its excess exposed too);
    # no gather afterwards; one reduce-scatter after the last backward; a shard's step.
    gather = AlphaBeta(collective="all_gather", world_size=2, alpha_us=100.0, busbw_gbps=1.0)
    scatter = AlphaBeta(collective="reduce_scatter", world_size=2, alpha_us=50.0, busbw_gbps=1.0)
    costs = [dataclasses.replace(c, optimizer_ms=4.0) for c in _stages(2)]
    sharded = ShardedStages(
        all_gather=gather,
        reduce_scatter=scatter,
        dp=2,
        first_bytes=(1 << 16, 1 << 16),
        rest_bytes=(1 << 18, 0),
        reduce_bytes=(1 << 20, 1 << 20),
        hooks_ms=(0.2, 0.2),
    )
    first = gather.time_us(1 << 16) / 1e3
    rest = gather.time_us(1 << 18) / 1e3
    assert rest > 1.0  # longer than the stage's forward it is prefetched beside
    result = replay_pipeline(
        costs, schedule="1f1b", micro_batches=4, p2p=NO_LINK, all_reduce=NO_DP, sharded=sharded
    )
    extra_0 = first + (rest - 1.0) + 0.1
    extra_1 = first + 0.1
    assert sharded.first_forward_extra_ms(0, 1.0) == pytest.approx(extra_0)
    assert sharded.first_forward_extra_ms(1, 1.0) == pytest.approx(extra_1)
    reduce = scatter.time_us(1 << 20) / 1e3 + 0.1
    # Stage 0's first forward starts the pipeline; stage 1's gather is on the critical path too
    # (it waits for the activation, then gathers); stage 0 ends last, then reduce-scatters.
    plain = replay_pipeline(costs, schedule="1f1b", micro_batches=4, p2p=NO_LINK, all_reduce=NO_DP)
    assert result.iteration_time_ms == pytest.approx(
        plain.iteration_time_ms - 4.0 + extra_0 + extra_1 + reduce + 2.0
    )
    assert result.exposed_comm_ms == pytest.approx(reduce)
    names = {event.name for event in result.timeline}
    assert "rank 0 gradient reduce-scatter" in names


def test_stage_costs_of_gpt2_split_the_work(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    node_ms = {n.id: 1.0 for n in graph.nodes if n.kind in ("compute", "optimizer")}
    with torch.device("meta"):
        stack = block_stack(build_model(graph.model))
    assert stack is not None
    costs = stage_costs(graph, node_ms, stack.blocks, 2)
    backward = sum(1 for n in graph.nodes if n.kind == "compute" and n.phase == "backward")
    forward = sum(1 for n in graph.nodes if n.kind == "compute" and n.phase == "forward")
    assert sum(c.backward_ms for c in costs) == pytest.approx(backward)
    assert sum(c.forward_ms for c in costs) > forward  # the second stage reruns the prefix
    assert sum(c.grad_bytes for c in costs) == graph.grad_bytes
    optimizers = sum(1 for n in graph.nodes if n.kind == "optimizer")
    assert sum(c.optimizer_ms for c in costs) == pytest.approx(optimizers)
    spec = graph.model
    hidden = spec.inputs.batch_size * int(spec.inputs.seq_len or 0) * 128 * 4
    assert costs[0].activation_bytes == hidden
    with pytest.raises(UnsupportedPlanError, match="3 pipeline stages need as many blocks"):
        stage_costs(graph, node_ms, stack.blocks, 3)


def test_a_tensor_parallel_stage_runs_all_samples_split(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    node_ms = {n.id: 1.0 for n in graph.nodes if n.kind in ("compute", "optimizer")}
    with torch.device("meta"):
        stack = block_stack(build_model(graph.model))
    assert stack is not None
    plain = stage_costs(graph, node_ms, stack.blocks, 2)
    # Nothing sharded: two ranks' samples, every op whole: twice the work, plus the extras.
    whole = TensorStage(
        ranks=2,
        sharded=frozenset(),
        split_params=frozenset(),
        forward_extra_ms=1.0,
        backward_extra_ms=2.0,
    )
    doubled = stage_costs(graph, node_ms, stack.blocks, 2, tensor={0: whole})
    assert doubled[0].forward_ms == pytest.approx(2 * plain[0].forward_ms + 1.0)
    assert doubled[0].backward_ms == pytest.approx(2 * plain[0].backward_ms + 2.0)
    assert doubled[1] == plain[1]
    # The family's split of the first block: its projections and attention core shard, its
    # norms do not; their collectives at twice the bytes; the split parameters stepped in half
    # and left out of the data-parallel all-reduce.
    latency = AlphaBeta(collective="all_reduce", world_size=2, alpha_us=1e3, busbw_gbps=1e12)
    sharded, params, forward, backward = split_stage(
        graph, PLANS["gpt2"], {stack.blocks[0]}, ranks=2, tp_all_reduce=latency
    )
    assert forward == pytest.approx(2.0) and backward == pytest.approx(2.0)  # two of each
    assert "transformer.h.0.attn.c_attn.weight" in params
    assert not any(".h.1." in name for name in params)
    split = dataclasses.replace(whole, sharded=sharded, split_params=params)
    costs = stage_costs(graph, node_ms, stack.blocks, 2, tensor={0: split})
    assert plain[0].forward_ms < costs[0].forward_ms - 1.0 < 2 * plain[0].forward_ms
    split_bytes = sum(p.nbytes for p in graph.params if p.name in params)
    assert costs[0].grad_bytes == plain[0].grad_bytes - split_bytes
    assert costs[0].optimizer_ms == pytest.approx(plain[0].optimizer_ms - len(params) / 2)


def test_tied_embeddings_are_summed_over_the_pipeline(zoo_graph: GraphOf) -> None:
    # GPT-2's LM head is its input embedding: the first stage and the last both use it
    graph = zoo_graph("gpt2-tiny")
    node_ms = {n.id: 1.0 for n in graph.nodes if n.kind in ("compute", "optimizer")}
    with torch.device("meta"):
        model = build_model(graph.model)
    stack, tied = block_stack(model), tied_parameters(model)
    assert stack is not None and tied == {"transformer.wte.weight": ("transformer.wte", "lm_head")}
    wte = next(p.nbytes for p in graph.params if p.name == "transformer.wte.weight")
    untied = stage_costs(graph, node_ms, stack.blocks, 2)
    costs = stage_costs(graph, node_ms, stack.blocks, 2, tied)
    assert [c.tied for c in costs] == [(("transformer.wte.weight", wte),)] * 2
    assert untied[0].tied == untied[1].tied == ()
    # the last stage steps its copy too; gradients are still counted once
    assert costs[1].optimizer_ms == pytest.approx(untied[1].optimizer_ms + 1.0)
    assert sum(c.grad_bytes for c in costs) == graph.grad_bytes
    pp = AlphaBeta(collective="all_reduce", world_size=2, alpha_us=100.0, busbw_gbps=1.0)
    plain = replay_pipeline(costs, schedule="1f1b", micro_batches=2, p2p=NO_LINK, all_reduce=NO_DP)
    summed = replay_pipeline(
        costs, schedule="1f1b", micro_batches=2, p2p=NO_LINK, all_reduce=NO_DP, tied_all_reduce=pp
    )
    tied_ms = pp.time_us(wte) / 1e3
    assert tied_ms > 1.0
    # both ranks wait for the later one's last backward, then sum
    assert summed.iteration_time_ms >= plain.iteration_time_ms + tied_ms - 1e-6
    assert summed.exposed_comm_ms == pytest.approx(tied_ms)
    assert any("tied gradient" in e.name for e in summed.timeline)
    # interleaved, stages 0 and 2 on rank 0: one module on one rank, nothing to sum
    stages = [dataclasses.replace(c, tied=()) for c in _stages(4)]
    shared = (("w", 1 << 20),)
    stages[0] = dataclasses.replace(stages[0], tied=shared)
    stages[2] = dataclasses.replace(stages[2], tied=shared)

    def interleaved(costs: list[StageCosts]) -> float:
        result = replay_pipeline(
            costs,
            schedule="interleaved_1f1b",
            micro_batches=2,
            p2p=NO_LINK,
            all_reduce=NO_DP,
            ranks=2,
            tied_all_reduce=pp,
        )
        return result.exposed_comm_ms

    assert interleaved(stages) == 0.0
    stages[3] = dataclasses.replace(stages[3], tied=shared)
    assert interleaved(stages) == pytest.approx(pp.time_us(1 << 20) / 1e3)


def test_a_model_without_tied_weights_has_none() -> None:
    with torch.device("meta"):
        assert tied_parameters(build_model(resolve_model("llama-tiny"))) == {}


def test_a_sharded_pipeline_plan_replays_with_gathers_and_reduce_scatters() -> None:
    """gpt2-tiny, pp 2 x FSDP over dp 2 on 4 ranks at 1 Gbit/s, against the same pipeline
    with its gradients all-reduced: the sharded one reduce-scatters (half an all-reduce's
    bytes on a ring) and gathers once a step; interleaving with FSDP is refused."""
    spec = resolve_model("gpt2-tiny")
    plain_plan = {"pp": 2, "micro_batches": 2}
    results = {}
    for name, parallel in (("plain", plain_plan), ("sharded", {**plain_plan, "fsdp": True})):
        strategy = Strategy.from_dict({"parallel": parallel})
        graph = capture_graph(spec, CaptureOptions(strategy=strategy))
        models = comm_models(
            [], world_size=2, bandwidth="1gbit", bandwidth_gbps=1.0, ring=False
        ).models
        results[name] = replay_parallel_plan(
            graph,
            {node.id: 0.1 for node in graph.nodes},
            [],
            models,
            world_size=4,
            bandwidth="1gbit",
        )
    names = {event.name for event in results["sharded"].timeline}
    assert "rank 0 gradient reduce-scatter" in names
    assert "rank 0 gradient all-reduce" not in names
    assert 0 < results["sharded"].exposed_comm_ms < results["plain"].exposed_comm_ms
    interleaved = Strategy.from_dict(
        {
            "parallel": {
                "pp": 2,
                "micro_batches": 2,
                "fsdp": True,
                "pp_schedule": "interleaved_1f1b",
                "virtual_stages": 2,
            }
        }
    )
    graph = capture_graph(resolve_model("llama-tiny"), CaptureOptions(strategy=interleaved))
    with pytest.raises(UnsupportedPlanError, match="fsdp with 2 stages a rank"):
        replay_parallel_plan(graph, {}, [], models, world_size=4, bandwidth="1gbit")
