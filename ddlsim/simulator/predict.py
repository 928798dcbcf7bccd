"""``predict``: the iteration time of a strategy, from a captured graph and stored profiles.

The caller (``ddlsim predict``) captures the graph with the strategy at the rank's micro-batch
(:func:`simulator.costs.rank_spec`) and finds a kernel profile of the same model at that
micro-batch; this module moves the profile's times onto the graph, models the collectives and
replays the iteration.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.cluster import burst_bytes, parse_bandwidth_gbps
from ddlsim.data.specs.parallel import ParallelPlan
from ddlsim.data.store import PredictionRecord, strategy_hash
from ddlsim.simulator.cost_model import SIMULATOR_VERSION, CostModel, ReplayCostModel
from ddlsim.simulator.costs import BackendFit, comm_models, scaled, uses_ring
from ddlsim.simulator.dp_replay import DataParallelReplay, ReplaySummary
from ddlsim.simulator.experts import (
    EXPERT_OPS,
    ExpertMeasures,
    ExpertSchedule,
    expert_schedule,
)
from ddlsim.simulator.features import block_sample, model_graph, strategy_sample
from ddlsim.simulator.plans import (
    analytic_parallel_plan,
    is_data_parallel,
    replay_parallel_plan,
)
from ddlsim.simulator.replay import replay, transfer_durations
from ddlsim.simulator.runtime import shipped_runtime_costs
from ddlsim.simulator.timeline import ReplayResult, UnsupportedPlanError


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prediction:
    """A predicted iteration and what it was computed from."""

    graph: IterationGraph
    world_size: int
    bandwidth: str
    backend: str
    result: ReplayResult
    comm_sources: Mapping[str, str]
    simulator_version: str = SIMULATOR_VERSION
    predictor: str = "replay"
    corrected_ms: float | None = None
    compute_scale: float = 1.0
    # (block, eager ms in the kernel profile, predicted ms compiled) of each compiled block
    fused_blocks: tuple[tuple[str, float, float], ...] = ()

    @property
    def iteration_time_ms(self) -> float:
        """The cost model's time where one applied, else the replay's."""
        return self.corrected_ms if self.corrected_ms is not None else self.replay_ms

    @property
    def replay_ms(self) -> float:
        return self.result.iteration_time_ms

    def breakdown(self) -> dict[str, float]:
        """The replay's breakdown, scaled to the predicted time when a cost model corrected it
        (the replay's own time is kept as ``replay_ms``)."""
        raw = self.result.breakdown()
        scale = self.iteration_time_ms / self.replay_ms if self.replay_ms > 0 else 1.0
        out = {key: value * scale for key, value in raw.items()}
        out["replay_ms"] = self.replay_ms
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.graph.model.label,
            "strategy": self.graph.strategy.to_dict(),
            "world_size": self.world_size,
            "bandwidth": self.bandwidth,
            "backend": self.backend,
            "iteration_time_ms": self.iteration_time_ms,
            "breakdown": self.breakdown(),
            "predictor": self.predictor,
            "compute_scale": self.compute_scale,
            "collective_models": dict(self.comm_sources),
            "simulator_version": self.simulator_version,
            "fused_blocks": [
                {"block": block, "eager_ms": eager, "compiled_ms": compiled}
                for block, eager, compiled in self.fused_blocks
            ],
        }

    def record(self) -> PredictionRecord:
        return PredictionRecord(
            model=self.graph.model.label,
            graph_hash=self.graph.graph_hash,
            strategy_hash=strategy_hash(self.graph.strategy),
            cluster={
                "world_size": self.world_size,
                "bandwidth": self.bandwidth,
                "backend": self.backend,
            },
            iteration_time_ms=self.iteration_time_ms,
            breakdown=self.breakdown(),
            simulator_version=self.simulator_version,
        )


def check_replayed(plan: ParallelPlan) -> None:
    """Raises:
    UnsupportedPlanError: a plan this machine's executor runs but the replay does not
        schedule yet (experts split over ranks beside FSDP, context parallelism, ZeRO), rather than
        pricing it as plain data parallelism.
    """
    unscheduled = {
        "ep beside fsdp": plan.ep > 1 and plan.fsdp,
        "cp": plan.cp > 1,
        "zero": bool(plan.zero),
    }
    named = [f"parallel.{key}" for key, used in unscheduled.items() if used]
    if named:
        raise UnsupportedPlanError(
            f"the replay does not schedule {', '.join(named)} yet: ddlsim run measures the "
            "plan, and ddlsim predict --cluster prices it on GPU clusters"
        )


def replayed_dp(plan: ParallelPlan, world_size: int) -> int:
    """The data-parallel degree of a plan the replay schedules.

    Raises:
        UnsupportedPlanError: as :func:`check_replayed`.
        InvalidStrategyError: ``dp * tp * pp * cp != world_size``.
    """
    check_replayed(plan)
    return plan.resolve_dp(world_size)


def predict(
    graph: IterationGraph,
    *,
    profiled: IterationGraph,
    node_ms: Mapping[int, float],
    collective_profiles: Sequence[BackendFit],
    world_size: int,
    bandwidth: str,
    backend: str = "gloo",
    cost_model: CostModel | None = None,
    compute_scale: float = 1.0,
    experts_measured: ExpertMeasures | None = None,
) -> Prediction:
    """Replay ``graph`` (captured with its strategy at the rank's micro-batch).

    Args:
        profiled: the graph the kernel profile ``node_ms`` timed (same model and micro-batch,
            any strategy).
        collective_profiles: collective fits (the store's, and the shipped dataset's of links
            the store has none of: :func:`workflows.profiles.link_fits`); those of
            ``backend`` over the data-parallel ranks on ``bandwidth`` are used, the link's
            nominal rate where none matches.
        bandwidth: the link as ``ddlsim`` names it (``1gbit``, ``none`` for unshaped).
        compute_scale: how much slower a rank computes than the profile (ranks sharing
            cores, :func:`simulator.costs.compute_scale`).
        cost_model: a learned one (``gnn`` or ``blend``) corrects the replay of any plan and
            prices each compiled block (its fused-block head); the analytical one prices grid
            plans in closed form; the replay's (:class:`ReplayCostModel`, the default) leaves
            the replay as it is. Expert-parallel plans are replayed alone (no learned model
            has seen one).
        experts_measured: what was measured of expert parallelism here (the routers'
            imbalance, its bookkeeping a layer at the profile's speed); none: balanced, free.

    Raises:
        InvalidOptionError: the profiled graph is of another model or inputs.
        UnsupportedPlanError: a plan the replay does not schedule yet.
        InvalidStrategyError: ``dp * tp * pp != world_size``.

    Long: most of it is its arguments' documentation; the body assembles one replay's inputs,
    each from the one before, then applies the cost model.
    """
    dp = replayed_dp(graph.strategy.parallel, world_size)
    node_ms = scaled(node_ms, compute_scale)
    fits = [p for p in collective_profiles if p.backend == backend]
    models = _comm(graph, fits, dp=dp, bandwidth=bandwidth, backend=backend)
    durations = transfer_durations(profiled, node_ms, graph)
    runtime = shipped_runtime_costs().scaled(compute_scale)
    experts = None
    if graph.strategy.parallel.ep > 1:
        measured = (experts_measured or ExpertMeasures()).scaled(compute_scale)
        experts, durations, models = _experts(
            graph, fits, dp=dp, bandwidth=bandwidth, measures=measured, priced=(durations, models)
        )
    if is_data_parallel(graph.strategy.parallel):
        result = replay(graph, durations, models.models, runtime=runtime, experts=experts)
    else:
        result = replay_parallel_plan(
            graph, durations, fits, models.models, world_size=world_size, bandwidth=bandwidth,
            runtime=runtime, compute_scale=compute_scale,
        )  # fmt: skip
    prediction = Prediction(
        graph=graph,
        world_size=world_size,
        bandwidth=bandwidth,
        backend=backend,
        result=result,
        comm_sources=models.sources,
        compute_scale=compute_scale,
    )
    cost_model = cost_model or ReplayCostModel()
    analytic_ms = None
    if cost_model.name == "analytic" and not is_data_parallel(graph.strategy.parallel):
        analytic_ms = analytic_parallel_plan(
            graph, durations, fits, models.models, world_size=world_size, bandwidth=bandwidth
        )
    if analytic_ms is not None:
        return dataclasses.replace(
            prediction,
            predictor="analytic",
            corrected_ms=analytic_ms,
            simulator_version=cost_model.version,
        )
    if not cost_model.learned or experts is not None:
        return prediction
    return _corrected(
        prediction,
        cost_model,
        profiled=profiled,
        node_ms=node_ms,
        runtime=runtime,
        comm=models.models,
        dp=dp,
    )


def _comm(
    graph: IterationGraph, fits: Sequence[BackendFit], *, dp: int, bandwidth: str, backend: str
) -> Any:
    """The collectives' models over the data-parallel ranks, and where each came from."""
    return comm_models(
        fits,
        world_size=dp,
        bandwidth=bandwidth,
        bandwidth_gbps=parse_bandwidth_gbps(bandwidth),
        ring=uses_ring(graph.strategy, backend),
    )


def _experts(
    graph: IterationGraph,
    fits: Sequence[BackendFit],
    *,
    dp: int,
    bandwidth: str,
    measures: ExpertMeasures,
    priced: tuple[dict[int, float], Any],
) -> tuple[ExpertSchedule, dict[int, float], Any]:
    """Expert parallelism's schedule, with its collectives over the expert-parallel and
    expert-data-parallel groups; ``priced``: the nodes' durations and the data-parallel
    collectives' models, returned with the schedule's scaling and its models' sources."""
    plan = graph.strategy.parallel
    gbps = parse_bandwidth_gbps(bandwidth)

    def over(ranks: int) -> Any:
        return comm_models(
            fits, world_size=ranks, bandwidth=bandwidth, bandwidth_gbps=gbps, ring=False,
            ops=EXPERT_OPS,
        )  # fmt: skip

    ep_models = over(plan.ep)
    edp = dp // plan.ep
    edp_models = over(edp) if edp > 1 else None
    schedule = expert_schedule(
        graph,
        measures,
        ep_comm=ep_models.models,
        edp_comm=edp_models.models if edp_models is not None else None,
        burst_bytes=burst_bytes(gbps),
    )
    sources = {f"{op} over ep {plan.ep}": ep_models.sources[op] for op in EXPERT_OPS[:-1]}
    if edp_models is not None:
        sources[f"all_reduce over edp {edp}"] = edp_models.sources["all_reduce"]
    durations, models = priced
    models = dataclasses.replace(models, sources={**models.sources, **sources})
    return schedule, schedule.scaled(durations), models


def _corrected(
    prediction: Prediction,
    cost_model: CostModel,
    *,
    profiled: IterationGraph,
    node_ms: Mapping[int, float],
    runtime: Any,
    comm: Any,
    dp: int,
) -> Prediction:
    """``prediction`` corrected by a learned cost model: the strategy head's correction of the
    replay, and the fused-block head's time of each compiled block."""
    graph, result, compute_scale = prediction.graph, prediction.result, prediction.compute_scale
    data_parallel = is_data_parallel(graph.strategy.parallel)
    summary = (
        DataParallelReplay(profiled, node_ms, runtime).summary(
            graph.strategy, comm, micro_batches=graph.strategy.parallel.micro_batches
        )
        if data_parallel
        else ReplaySummary.of(result)
    )
    key = profiled.graph_hash
    features = model_graph(profiled, node_ms)
    sample = strategy_sample(
        model_key=key,
        graph=features,
        strategy=graph.strategy,
        summary=summary,
        comm=comm,
        dp=dp,
        compute_scale=compute_scale,
    )
    encoded = cost_model.encode({key: features})
    (corrected,) = cost_model.predict(encoded, [sample])
    blocks = [
        b
        for path in graph.strategy.op_fusion.compiled
        if (
            b := block_sample(
                model_key=key, graph=features, block=path, compute_scale=compute_scale
            )
        )
        is not None
    ]
    fused = cost_model.predict_fused(encoded, blocks)
    # A data-parallel sample's replay is the closed form of the same schedule; apply its
    # correction to the full replay's time.
    corrected *= result.iteration_time_ms / summary.iteration_time_ms
    return dataclasses.replace(
        prediction,
        predictor=cost_model.name,
        corrected_ms=corrected,
        simulator_version=cost_model.version,
        fused_blocks=tuple((b.block, b.eager_ms, ms) for b, ms in zip(blocks, fused, strict=True)),
    )
