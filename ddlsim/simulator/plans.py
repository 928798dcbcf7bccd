"""The replay of parallel plans other than plain data parallelism: FSDP2, tensor parallelism
(with data parallelism beside it) and pipelines, each from the graph captured with the plan,
its per-node times and the cluster's collective fits."""

import dataclasses
from collections.abc import Mapping, Sequence

import torch

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.models import build_model
from ddlsim.data.specs.cluster import parse_bandwidth_gbps
from ddlsim.data.specs.strategy import ParallelPlan
from ddlsim.data.stages import block_stack, default_groups, stage_count, tied_parameters
from ddlsim.data.tp_plans import PLANS, tp_family
from ddlsim.simulator.costs import LinkFitLike, comm_models
from ddlsim.simulator.fsdp import replay_fsdp
from ddlsim.simulator.pipeline import replay_pipeline, stage_costs
from ddlsim.simulator.replay import ReplayResult, UnsupportedPlanError
from ddlsim.simulator.tensor_parallel import replay_tensor_parallel


def is_data_parallel(plan: ParallelPlan) -> bool:
    """Whether the plan is plain data parallelism (DDP or the executor's buckets)."""
    return plan.pp == 1 and plan.tp == 1 and not plan.fsdp


def replay_parallel_plan(
    graph: IterationGraph,
    durations: Mapping[int, float],
    fits: Sequence[LinkFitLike],
    models: Mapping[str, AlphaBeta],
    *,
    world_size: int,
    bandwidth: str,
) -> ReplayResult:
    """Replay ``graph``'s FSDP, tensor-parallel or pipeline plan.

    Args:
        fits: the collective fits of the cluster's backend (any world size and link).
        models: collective models over the data-parallel ranks (:func:`comm_models`).

    Raises:
        UnsupportedPlanError: a combination the replay does not schedule, or a model the plan
            cannot split.
    """
    plan = graph.strategy.parallel
    if plan.pp > 1:
        return _replay_pipeline(
            graph, durations, fits, models, world_size=world_size, bandwidth=bandwidth
        )
    if plan.tp > 1 and not plan.fsdp:
        return _replay_tensor_parallel(
            graph, durations, fits, models, world_size=world_size, bandwidth=bandwidth
        )
    if plan.fsdp:
        return _replay_fsdp(graph, durations, models, dp=plan.resolve_dp(world_size))
    raise UnsupportedPlanError("plain data parallelism is replayed by simulator.replay")


def _replay_pipeline(
    graph: IterationGraph,
    durations: Mapping[int, float],
    fits: Sequence[LinkFitLike],
    models: Mapping[str, AlphaBeta],
    *,
    world_size: int,
    bandwidth: str,
) -> ReplayResult:
    """A pipeline plan: stages from the model's block stack, p2p from the send/recv fit of the
    cluster's links (between two neighbouring stages)."""
    plan = graph.strategy.parallel
    if plan.tp > 1 or plan.fsdp:
        raise UnsupportedPlanError(
            f"the replay schedules pipelines with data parallelism only; tp({plan.tp}) and "
            f"fsdp({plan.fsdp}) are not supported with pp({plan.pp})"
        )
    with torch.device("meta"):
        model = build_model(graph.model)
    stack, tied = block_stack(model), tied_parameters(model)
    if stack is None:
        raise UnsupportedPlanError(
            f"{graph.model.label} has no single stack of blocks to cut into pp({plan.pp}) stages"
        )
    links = _link_models(fits, world_size, bandwidth)
    p2p = dataclasses.replace(links["sendrecv"], world_size=2)
    costs = stage_costs(graph, durations, stack.blocks, stage_count(plan), tied)
    return replay_pipeline(
        costs,
        schedule=plan.pp_schedule,
        micro_batches=plan.micro_batches,
        p2p=p2p,
        all_reduce=models["all_reduce"],
        ranks=plan.pp,
        tied_all_reduce=_link_models(fits, plan.pp, bandwidth)["all_reduce"],
    )


def _replay_fsdp(
    graph: IterationGraph,
    durations: Mapping[int, float],
    models: Mapping[str, AlphaBeta],
    *,
    dp: int,
) -> ReplayResult:
    """An FSDP2 plan: its groups (or the executor's default, one per repeated block)."""
    plan = graph.strategy.parallel
    if plan.tp > 1:
        raise UnsupportedPlanError(
            f"the replay schedules FSDP with data parallelism only; tp({plan.tp}) is not "
            "supported with fsdp"
        )
    if plan.fsdp_groups is not None:
        groups = [list(g) for g in plan.fsdp_groups]
    else:
        with torch.device("meta"):
            groups = default_groups(build_model(graph.model))
    return replay_fsdp(
        graph,
        durations,
        groups,
        all_gather=models["all_gather"],
        reduce_scatter=models["reduce_scatter"],
        dp=dp,
        micro_batches=plan.micro_batches,
    )


def _replay_tensor_parallel(
    graph: IterationGraph,
    durations: Mapping[int, float],
    fits: Sequence[LinkFitLike],
    models: Mapping[str, AlphaBeta],
    *,
    world_size: int,
    bandwidth: str,
) -> ReplayResult:
    """A tensor-parallel plan (with data parallelism): the family's split, collectives over the
    ``tp`` ranks from fits of that many ranks on the link."""
    plan = graph.strategy.parallel
    family = tp_family(graph.model)
    if family is None:
        raise UnsupportedPlanError(
            f"{graph.model.label} has no tensor-parallel plan, so tp({plan.tp}) cannot apply"
        )
    tp_models = _link_models(fits, plan.tp, bandwidth)
    return replay_tensor_parallel(
        graph,
        durations,
        PLANS[family],
        tp=plan.tp,
        dp=plan.resolve_dp(world_size),
        tp_all_reduce=tp_models["all_reduce"],
        tp_all_gather=tp_models["all_gather"],
        dp_all_reduce=models["all_reduce"],
        micro_batches=plan.micro_batches,
    )


def _link_models(fits: Sequence[LinkFitLike], ranks: int, bandwidth: str) -> dict[str, AlphaBeta]:
    """Collective models over ``ranks`` ranks of the link (no DeAR ring)."""
    return comm_models(
        fits,
        world_size=ranks,
        bandwidth=bandwidth,
        bandwidth_gbps=parse_bandwidth_gbps(bandwidth),
        ring=False,
    ).models
