"""The replay of parallel plans other than plain data parallelism: FSDP2, tensor parallelism
(with data parallelism beside it) and pipelines, each from the graph captured with the plan,
its per-node times and the cluster's collective fits."""

import dataclasses
from collections.abc import Mapping, Sequence

import torch

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.models import build_model
from ddlsim.data.specs.cluster import parse_bandwidth_gbps
from ddlsim.data.specs.strategy import ParallelPlan
from ddlsim.plans.grid import grid_layers
from ddlsim.plans.stages import block_stack, default_groups, stage_count, tied_parameters
from ddlsim.plans.tp_plans import PLANS, no_plan_reason, tp_family, tp_plan
from ddlsim.simulator.costs import LinkFitLike, comm_models
from ddlsim.simulator.fsdp import replay_fsdp
from ddlsim.simulator.grid import GridCosts, GridModels, analytic_grid, replay_grid
from ddlsim.simulator.pipeline import (
    ShardedStages,
    StageCosts,
    TensorStage,
    replay_pipeline,
    stage_costs,
    stage_spans,
)
from ddlsim.simulator.runtime import RuntimeCosts
from ddlsim.simulator.tensor_parallel import replay_tensor_parallel, split_stage
from ddlsim.simulator.timeline import ReplayResult, UnsupportedPlanError


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
    runtime: RuntimeCosts | None = None,
    compute_scale: float = 1.0,
) -> ReplayResult:
    """Replay ``graph``'s FSDP, tensor-parallel or pipeline plan.

    Args:
        fits: the collective fits of the cluster's backend (any world size and link).
        models: collective models over the data-parallel ranks (:func:`comm_models`).
        runtime: what the plans' runtimes add to the rank's compute, at its compute scale
            (none by default).
        compute_scale: how much slower a rank computes than its profile because ranks share
            cores (:func:`simulator.costs.compute_scale`); stretches the CPU work of the
            tensor-parallel plans' blocking collectives.

    Raises:
        UnsupportedPlanError: a combination the replay does not schedule, or a model the plan
            cannot split.
    """
    replay = _PlanReplay(
        graph,
        durations,
        fits,
        models,
        world_size,
        bandwidth,
        runtime or RuntimeCosts(),
        compute_scale,
    )
    plan = graph.strategy.parallel
    if plan.pp > 1:
        return replay.pipeline()
    if plan.grid:
        return replay.grid()
    if plan.tp > 1 and not plan.fsdp:
        return replay.tensor_parallel()
    if plan.fsdp:
        return replay.fsdp()
    raise UnsupportedPlanError("plain data parallelism is replayed by simulator.replay")


def analytic_parallel_plan(
    graph: IterationGraph,
    durations: Mapping[int, float],
    fits: Sequence[LinkFitLike],
    models: Mapping[str, AlphaBeta],
    *,
    world_size: int,
    bandwidth: str,
) -> float | None:
    """The analytical model's iteration time (ms) of ``graph``'s plan
    (:func:`simulator.grid.analytic_grid`), or ``None`` for a plan it has no closed form of
    (every plan but grids: their replay stands).

    Raises:
        UnsupportedPlanError: a model the grid cannot split.
    """
    if not graph.strategy.parallel.grid:
        return None
    replay = _PlanReplay(graph, durations, fits, models, world_size, bandwidth, RuntimeCosts())
    costs, grid_models = replay.grid_inputs()
    return analytic_grid(
        graph,
        durations,
        costs,
        grid_models,
        micro_batches=graph.strategy.parallel.micro_batches,
    )


@dataclasses.dataclass(frozen=True)
class _PlanReplay:
    """The inputs of :func:`replay_parallel_plan`, and the replay of each kind of plan."""

    graph: IterationGraph
    durations: Mapping[int, float]
    fits: Sequence[LinkFitLike]
    models: Mapping[str, AlphaBeta]
    world_size: int
    bandwidth: str
    runtime: RuntimeCosts
    compute_scale: float = 1.0

    def pipeline(self) -> ReplayResult:
        """A pipeline plan: stages from the model's block stack, p2p from the send/recv fit of
        the cluster's links (between two neighbouring stages)."""
        graph = self.graph
        plan = graph.strategy.parallel
        if plan.tp > 1 or (plan.fsdp and (plan.chunks > 1 or "tp" in plan.stages)):
            raise UnsupportedPlanError(
                f"the replay schedules pipelines with data parallelism or FSDP (one stage a "
                f"rank); tp({plan.tp}) and fsdp with {plan.chunks} stages a rank or tp stages "
                f"are not supported with pp({plan.pp})"
            )
        with torch.device("meta"):
            model = build_model(graph.model)
        stack, tied = block_stack(model), tied_parameters(model)
        if stack is None:
            raise UnsupportedPlanError(
                f"{graph.model.label} has no single stack of blocks to cut into pp({plan.pp}) "
                "stages"
            )
        links = self._link_models(self.world_size)
        p2p = dataclasses.replace(links["sendrecv"], world_size=2)
        tensor = self._tensor_stages(stack.blocks) if "tp" in plan.stages else None
        costs = stage_costs(
            graph, self.durations, stack.blocks, stage_count(plan), tied, tensor=tensor
        )
        return replay_pipeline(
            costs,
            schedule=plan.pp_schedule,
            micro_batches=plan.micro_batches,
            p2p=p2p,
            all_reduce=self.models["all_reduce"],
            ranks=plan.pp,
            tied_all_reduce=self._link_models(plan.pp)["all_reduce"],
            sharded=self._sharded_stages(stack.blocks, costs) if plan.fsdp else None,
        )

    def _sharded_stages(self, blocks: tuple[str, ...], costs: list[StageCosts]) -> ShardedStages:
        """FSDP beside the pipeline: every stage gathers the model's parameters outside the
        blocks (its root: every stage runs the model's own forward) and its blocks', each block
        a group; it reduce-scatters the gradients it has."""
        graph = self.graph
        plan = graph.strategy.parallel
        spans = stage_spans(graph, blocks, stage_count(plan))
        per_block = [
            sum(p.nbytes for p in graph.params if p.name.startswith(f"{b}.")) for b in blocks
        ]
        outside = sum(p.nbytes for p in graph.params) - sum(per_block)
        dp = plan.resolve_dp(self.world_size)
        models = self._link_models(dp)
        group_ms = [
            sum(
                (self.runtime.fsdp_us_per_group + self.runtime.fsdp_us_per_byte * n) / 1e3
                for n in [outside, *per_block[start:end]]
            )
            for start, end in spans
        ]
        return ShardedStages(
            all_gather=models["all_gather"],
            reduce_scatter=models["reduce_scatter"],
            dp=dp,
            first_bytes=tuple(outside + per_block[start] for start, _ in spans),
            rest_bytes=tuple(sum(per_block[start + 1 : end]) for start, end in spans),
            reduce_bytes=tuple(c.grad_bytes for c in costs),
            hooks_ms=tuple(group_ms),
        )

    def _tensor_stages(self, blocks: tuple[str, ...]) -> dict[int, TensorStage]:
        """The ``tp`` stages of ``parallel.stages``: each split over its ``dp`` ranks, its
        collectives from fits of that many ranks; the last one's output resharded to the next
        stage (its share sent by the pipeline's send/recv, the gradient shares all-gathered
        over the stage's ranks in backward)."""
        graph = self.graph
        plan = graph.strategy.parallel
        reason = no_plan_reason(graph.model)
        if reason is not None:
            raise UnsupportedPlanError(
                f"{graph.model.label} has no tensor-parallel plan for its tp stages: {reason}"
            )
        tp_split = tp_plan(graph.model)
        dp = plan.resolve_dp(self.world_size)
        models = self._link_models(dp)
        spans = stage_spans(graph, blocks, len(plan.stages))
        out: dict[int, TensorStage] = {}
        for index, layout in enumerate(plan.stages):
            if layout != "tp":
                continue
            start, end = spans[index]
            sharded, params, forward, backward = split_stage(
                graph,
                tp_split,
                set(blocks[start:end]),
                ranks=dp,
                tp_all_reduce=models["all_reduce"],
                runtime=self.runtime,
            )
            if plan.stages[index + 1] == "batch":
                # the shares' gradients, all-gathered: the stage's output at dp x the samples
                share = _output_bytes(graph, blocks[end - 1])
                backward += models["all_gather"].time_us(share * dp) / 1e3
            out[index] = TensorStage(
                ranks=dp,
                sharded=sharded,
                split_params=params,
                forward_extra_ms=forward,
                backward_extra_ms=backward,
            )
        return out

    def fsdp(self) -> ReplayResult:
        """An FSDP2 plan: its groups (or the executor's default, one per repeated block)."""
        plan = self.graph.strategy.parallel
        if plan.tp > 1:
            raise UnsupportedPlanError(
                f"the replay schedules FSDP with data parallelism only; tp({plan.tp}) is not "
                "supported with fsdp"
            )
        if plan.fsdp_groups is not None:
            groups = [list(g) for g in plan.fsdp_groups]
        else:
            with torch.device("meta"):
                groups = default_groups(build_model(self.graph.model))
        return replay_fsdp(
            self.graph,
            self.durations,
            groups,
            all_gather=self.models["all_gather"],
            reduce_scatter=self.models["reduce_scatter"],
            dp=plan.resolve_dp(self.world_size),
            micro_batches=plan.micro_batches,
            runtime=self.runtime,
        )

    def tensor_parallel(self) -> ReplayResult:
        """A tensor-parallel plan (with data parallelism): the family's split, collectives over
        the ``tp`` ranks from fits of that many ranks on the link."""
        plan = self.graph.strategy.parallel
        reason = no_plan_reason(self.graph.model)
        if reason is not None:
            raise UnsupportedPlanError(
                f"{self.graph.model.label} has no tensor-parallel plan, so tp({plan.tp}) cannot "
                f"apply: {reason}"
            )
        tp_split = tp_plan(self.graph.model)
        tp_models = self._link_models(plan.tp)
        return replay_tensor_parallel(
            self.graph,
            self.durations,
            tp_split,
            tp=plan.tp,
            dp=plan.resolve_dp(self.world_size),
            tp_all_reduce=tp_models["all_reduce"],
            tp_all_gather=tp_models["all_gather"],
            dp_all_reduce=self.models["all_reduce"],
            micro_batches=plan.micro_batches,
            runtime=self.runtime,
            layers=plan.layers,
            vocab=plan.vocab,
            compute_scale=self.compute_scale,
        )

    def grid(self) -> ReplayResult:
        """A grid plan: each axis' collectives from fits of that many ranks on the link."""
        costs, models = self.grid_inputs()
        return replay_grid(
            self.graph,
            self.durations,
            costs,
            models,
            micro_batches=self.graph.strategy.parallel.micro_batches,
            compute_scale=self.compute_scale,
        )

    def grid_inputs(self) -> tuple[GridCosts, GridModels]:
        """The grid's layers and collectives, and the collective models of its axes."""
        plan = self.graph.strategy.parallel
        axes = plan.grid_axes
        family = tp_family(self.graph.model)
        try:
            layers = grid_layers(self.graph.model, axes)
        except InvalidStrategyError as exc:
            raise UnsupportedPlanError(str(exc)) from exc
        assert family is not None  # grid_layers refused the others
        costs = GridCosts.of(self.graph, PLANS[family], layers, axes, overlap=plan.grid_overlap)
        dp = plan.resolve_dp(self.world_size)
        models = GridModels(
            axes={axis: self._link_models(size) for axis, size in axes.items()},
            samples_all_reduce=self._link_models(dp * axes["depth"])["all_reduce"],
            dp_all_reduce=self._link_models(dp)["all_reduce"],
        )
        return costs, models

    def _link_models(self, ranks: int) -> dict[str, AlphaBeta]:
        """Collective models over ``ranks`` ranks of the link (no DeAR ring)."""
        return comm_models(
            self.fits,
            world_size=ranks,
            bandwidth=self.bandwidth,
            bandwidth_gbps=parse_bandwidth_gbps(self.bandwidth),
            ring=False,
        ).models


def _output_bytes(graph: IterationGraph, block: str) -> int:
    """The bytes of the hidden state ``block`` hands on: its last forward node's output."""
    last = [
        n
        for n in graph.nodes
        if n.kind == "compute"
        and n.phase == "forward"
        and (n.module == block or n.module.startswith(f"{block}."))
    ]
    return sum(t.nbytes for t in last[-1].outputs[:1]) if last else 0
