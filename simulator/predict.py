"""``predict``: the iteration time of a strategy, from a captured graph and stored profiles.

The caller (``ddlsim predict``) captures the graph with the strategy at the rank's micro-batch
(:func:`simulator.costs.rank_spec`) and finds a kernel profile of the same model at that
micro-batch; this module moves the profile's times onto the graph, models the collectives and
replays the iteration.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from data.comm_model import AlphaBeta
from data.graph.format import IterationGraph
from data.models import build_model
from data.specs.cluster import parse_bandwidth_gbps
from data.stages import block_stack, default_groups
from data.store import CollectiveProfileRecord, PredictionRecord, strategy_hash
from data.tp_plans import PLANS, tp_family
from simulator.costs import comm_models, scaled, uses_ring
from simulator.fast import DataParallelReplay
from simulator.features import model_graph, strategy_sample
from simulator.fsdp import replay_fsdp
from simulator.gnn import IterationCostModel
from simulator.pipeline import replay_pipeline, stage_costs
from simulator.replay import ReplayResult, UnsupportedPlanError, replay, transfer_durations
from simulator.tensor_parallel import replay_tensor_parallel
from simulator.train import Predictor, predict_samples

# 2: compute scaled for ranks sharing cores; FSDP, tensor and pipeline plans.
SIMULATOR_VERSION = "replay-2"
COST_MODEL_VERSION = "gnn-1"


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


def predict(
    graph: IterationGraph,
    *,
    profiled: IterationGraph,
    node_ms: Mapping[int, float],
    collective_profiles: Sequence[CollectiveProfileRecord],
    world_size: int,
    bandwidth: str,
    backend: str = "gloo",
    cost_model: tuple[IterationCostModel, Mapping[str, Any]] | None = None,
    compute_scale: float = 1.0,
) -> Prediction:
    """Replay ``graph`` (captured with its strategy at the rank's micro-batch).

    Args:
        profiled: the graph the kernel profile ``node_ms`` timed (same model and micro-batch,
            any strategy).
        collective_profiles: stored fits; those of ``backend`` over the data-parallel ranks on
            ``bandwidth`` are used, the link's nominal rate where none matches.
        bandwidth: the link as ``ddlsim`` names it (``1gbit``, ``none`` for unshaped).
        compute_scale: how much slower a rank computes than the profile (ranks sharing
            cores, :func:`simulator.costs.compute_scale`).
        cost_model: a trained model and its meta; its ``predictor`` (``gnn`` or ``blend``)
            corrects the replay, ``replay`` (or no model) leaves it as it is.

    Raises:
        InvalidOptionError: the profiled graph is of another model or inputs.
        UnsupportedPlanError: a plan the replay does not schedule yet.
        InvalidStrategyError: ``dp * tp * pp != world_size``.
    """
    dp = graph.strategy.parallel.resolve_dp(world_size)
    node_ms = scaled(node_ms, compute_scale)
    models = comm_models(
        [p for p in collective_profiles if p.backend == backend],
        world_size=dp,
        bandwidth=bandwidth,
        bandwidth_gbps=parse_bandwidth_gbps(bandwidth),
        ring=uses_ring(graph.strategy, backend),
    )
    durations = transfer_durations(profiled, node_ms, graph)
    plan = graph.strategy.parallel
    if plan.pp > 1 or (plan.tp > 1 and not plan.fsdp):
        replay_plan = _replay_pipeline if plan.pp > 1 else _replay_tensor_parallel
        result = replay_plan(
            graph,
            durations,
            collective_profiles,
            models.models,
            world_size=world_size,
            bandwidth=bandwidth,
            backend=backend,
        )
    elif plan.fsdp:
        result = _replay_fsdp(graph, durations, models.models, dp=dp)
    else:
        result = replay(graph, durations, models.models)
    prediction = Prediction(
        graph=graph,
        world_size=world_size,
        bandwidth=bandwidth,
        backend=backend,
        result=result,
        comm_sources=models.sources,
        compute_scale=compute_scale,
    )
    data_parallel = plan.pp == 1 and plan.tp == 1 and not plan.fsdp
    if cost_model is None or not data_parallel:  # the cost model knows data parallelism only
        return prediction
    model, meta = cost_model
    predictor = str(meta.get("predictor", "gnn"))
    if predictor not in ("gnn", "blend"):
        return prediction
    summary = DataParallelReplay(profiled, node_ms).summary(
        graph.strategy, models.models, micro_batches=graph.strategy.parallel.micro_batches
    )
    key = profiled.graph_hash
    sample = strategy_sample(
        model_key=key,
        graph=(encoded := model_graph(profiled, node_ms)),
        strategy=graph.strategy,
        summary=summary,
        comm=models.models,
        dp=dp,
        compute_scale=compute_scale,
    )
    chosen: Predictor = "blend" if predictor == "blend" else "gnn"
    (corrected,) = predict_samples(model, {key: encoded}, [sample], chosen)
    # The sample's replay is the closed form of the same schedule; apply its correction to the
    # full replay's time.
    corrected *= result.iteration_time_ms / summary.iteration_time_ms
    return dataclasses.replace(
        prediction,
        predictor=predictor,
        corrected_ms=corrected,
        simulator_version=f"{COST_MODEL_VERSION}+{SIMULATOR_VERSION}",
    )


def _replay_pipeline(
    graph: IterationGraph,
    durations: Mapping[int, float],
    collective_profiles: Sequence[CollectiveProfileRecord],
    models: Mapping[str, AlphaBeta],
    *,
    world_size: int,
    bandwidth: str,
    backend: str,
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
        stack = block_stack(build_model(graph.model))
    if stack is None:
        raise UnsupportedPlanError(
            f"{graph.model.label} has no single stack of blocks to cut into pp({plan.pp}) stages"
        )
    links = _link_models(collective_profiles, backend, world_size, bandwidth)
    p2p = dataclasses.replace(links["sendrecv"], world_size=2)
    costs = stage_costs(graph, durations, stack.blocks, plan.pp)
    return replay_pipeline(
        costs,
        schedule=plan.pp_schedule,
        micro_batches=plan.micro_batches,
        p2p=p2p,
        all_reduce=models["all_reduce"],
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
    collective_profiles: Sequence[CollectiveProfileRecord],
    models: Mapping[str, AlphaBeta],
    *,
    world_size: int,
    bandwidth: str,
    backend: str,
) -> ReplayResult:
    """A tensor-parallel plan (with data parallelism): the family's split, collectives over the
    ``tp`` ranks from fits of that many ranks on the link."""
    plan = graph.strategy.parallel
    family = tp_family(graph.model)
    if family is None:
        raise UnsupportedPlanError(
            f"{graph.model.label} has no tensor-parallel plan, so tp({plan.tp}) cannot apply"
        )
    tp_models = _link_models(collective_profiles, backend, plan.tp, bandwidth)
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


def _link_models(
    profiles: Sequence[CollectiveProfileRecord], backend: str, ranks: int, bandwidth: str
) -> dict[str, AlphaBeta]:
    """Collective models over ``ranks`` ranks of the link (no DeAR ring)."""
    return comm_models(
        [p for p in profiles if p.backend == backend],
        world_size=ranks,
        bandwidth=bandwidth,
        bandwidth_gbps=parse_bandwidth_gbps(bandwidth),
        ring=False,
    ).models
