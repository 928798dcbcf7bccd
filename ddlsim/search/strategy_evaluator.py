"""The price and the memory of any strategy of one model on one cluster.

A strategy is a point of the search space: a parallel plan (``dp x tp x pp``, FSDP,
micro-batches, the pipeline schedule; :mod:`search.plans`), a tensor-fusion plan (buckets, DeAR)
and an op-fusion plan (compiled blocks). :class:`StrategyEvaluator` prices any of them:
data-parallel ones (with or without gradient accumulation) through a :class:`FusionEvaluator` of
the rank's micro-batch, in batches, others by replaying the graph captured with their plan (FSDP,
tensor parallel, pipelines), each corrected by the cost model; it also predicts each plan's peak
memory per device (:mod:`simulator.memory`) and says which fit the device's capacity. Infeasible
strategies are never priced: the searches prune them.
"""

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import torch

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.models import build_model
from ddlsim.data.specs.cluster import parse_bandwidth_gbps
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.plans.stages import block_stack, default_groups
from ddlsim.plans.tp_activations import activation_split_paths
from ddlsim.search.fusion_evaluator import FusionEvaluator
from ddlsim.simulator.calibration import DEFAULT_CONFIDENCE, RISK_KINDS, Calibration, risk_kind
from ddlsim.simulator.cost_model import AnalyticCostModel, CostModel, ReplayCostModel
from ddlsim.simulator.costs import BackendFit, comm_models, rank_spec, scaled
from ddlsim.simulator.memory import MemoryEstimate, peak_memory
from ddlsim.simulator.plans import is_data_parallel
from ddlsim.simulator.predict import predict

Profiles = Callable[[ModelSpec], tuple[IterationGraph, Mapping[int, float]]]
"""The rank's micro-batch graph of a model spec and its profiled node times (ms)."""
Capture = Callable[[ModelSpec, Strategy], IterationGraph]
# What a rank's micro-batch keeps for backward, by module path (profiler.saved.saved_bytes).
Saved = Callable[[ModelSpec], Mapping[str, int]]
"""The graph of a model (at a rank's micro-batch) captured under a strategy (the profiler's)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """The cluster a search prices for: ranks, link, the backend's collective fits (any world
    size and link), the memory of each device (``None``: unconstrained), and how much slower
    a rank computes than its profile (ranks sharing cores)."""

    world_size: int
    bandwidth: str
    fits: Sequence[BackendFit]
    capacity_bytes: int | None = None
    backend: str = "gloo"
    compute_scale: float = 1.0


class StrategyEvaluator:
    """Predicted iteration times (ms) and peak memory of any strategy of one model.

    Args:
        spec: the model at its global batch.
        profiles: the rank's micro-batch graph and its profiled node times (ms) for a model
            spec at a micro-batch (the store's kernel profile, taken when missing).
        capture: the graph of a rank's micro-batch under a plan (FSDP, TP, pipelines).
        cost_model: corrects the replay (:mod:`simulator.cost_model`); the replay alone by
            default. One model serves every plan and micro-batch.
        calibration: held-out errors of predicted speed-ups by kind (the cost model's
            checkpoint has them); with it, :meth:`price` scores each strategy at its kind's
            ``confidence`` quantile, so that a search prefers margins its kind can be trusted
            with; without it, :meth:`price` is the prediction.

    Not thread-safe: one evaluator per search worker.
    """

    def __init__(
        self,
        spec: ModelSpec,
        cluster: Cluster,
        profiles: Profiles,
        capture: Capture,
        *,
        cost_model: CostModel | None = None,
        optimizer: str = "adamw",
        calibration: Calibration | None = None,
        confidence: float = DEFAULT_CONFIDENCE,
        saved: Saved | None = None,
    ) -> None:
        self.spec = spec
        self.saved = saved
        self.cluster = cluster
        self.profiles = profiles
        self.capture = capture
        self.cost_model = cost_model or ReplayCostModel()
        self.optimizer = optimizer
        self.calibration = calibration
        self.confidence = confidence
        # Each kind's factor, once: the search scores thousands of strategies.
        self._factors = (
            {k: calibration.kind_factor(k, confidence, cluster.world_size) for k in RISK_KINDS}
            if calibration is not None
            else {}
        )
        self.memo: dict[str, float] = {}
        # Told how many strategies each call priced (a progress bar).
        self.on_priced: Callable[[int], None] | None = None
        self._fusion: dict[int, FusionEvaluator] = {}
        self._memory: dict[ParallelPlan, MemoryEstimate] = {}
        with torch.device("meta"):
            model = build_model(spec)
        stack = block_stack(model)
        self.blocks: tuple[str, ...] = stack.blocks if stack is not None else ()
        self.fsdp_groups = [tuple(g) for g in default_groups(model)]
        self._links: dict[tuple[int, bool], dict[str, AlphaBeta]] = {}
        self._analytic: dict[str, float] = {}

    @property
    def evaluations(self) -> int:
        """Distinct strategies priced so far."""
        return len(self.memo)

    @property
    def predictor(self) -> str:
        """The cost model's name: ``replay``, ``gnn`` or ``blend``."""
        return self.cost_model.name

    def links(self, dp: int, *, ring: bool) -> dict[str, AlphaBeta]:
        key = (dp, ring)
        if key not in self._links:
            self._links[key] = comm_models(
                self.cluster.fits,
                world_size=dp,
                bandwidth=self.cluster.bandwidth,
                bandwidth_gbps=parse_bandwidth_gbps(self.cluster.bandwidth),
                ring=ring,
            ).models
        return self._links[key]

    def fusion(self, plan: ParallelPlan) -> FusionEvaluator:
        """The evaluator of data-parallel strategies at ``plan``'s micro-batch."""
        rank = rank_spec(self.spec, Strategy(parallel=plan), self.cluster.world_size)
        batch = rank.inputs.batch_size
        if batch not in self._fusion:
            graph, node_ms = self.profiles(rank)
            dp = plan.resolve_dp(self.cluster.world_size)
            self._fusion[batch] = FusionEvaluator(
                graph,
                scaled(node_ms, self.cluster.compute_scale),
                self.links(dp, ring=False),
                ring_comm=self.links(dp, ring=True),
                dp=dp,
                backend=self.cluster.backend,
                cost_model=self.cost_model,
                compute_scale=self.cluster.compute_scale,
            )
        return self._fusion[batch]

    def memory(self, strategy: Strategy) -> MemoryEstimate:
        """The predicted peak memory per device of ``strategy``'s plan."""
        plan = strategy.parallel
        if plan not in self._memory:
            rank = rank_spec(self.spec, strategy, self.cluster.world_size)
            graph, _ = self.profiles(rank)
            split = activation_split_paths(self.spec) if self.saved is not None else frozenset()
            self._memory[plan] = peak_memory(
                graph,
                strategy,
                world_size=self.cluster.world_size,
                blocks=self.blocks,
                fsdp_groups=self.fsdp_groups,
                optimizer=self.optimizer,
                saved=self.saved(rank) if self.saved is not None else None,
                split=split.__contains__,
            )
        return self._memory[plan]

    def feasible(self, strategy: Strategy) -> bool:
        """Whether the plan's predicted peak fits the device (always, without a capacity)."""
        capacity = self.cluster.capacity_bytes
        return capacity is None or self.memory(strategy).total_bytes <= capacity

    def price(self, strategies: Sequence[Strategy]) -> list[float]:
        """What a search minimises: each strategy's predicted iteration time (ms) scored by the
        calibration (:meth:`Calibration.factor`: times the ``confidence`` quantile of its kind's
        held-out speed-up errors), or the prediction itself without a calibration."""
        times = self.predicted(strategies)
        if not self._factors:
            return times
        return [
            ms * self._factors[risk_kind(strategy)]
            for strategy, ms in zip(strategies, times, strict=True)
        ]

    def predicted(self, strategies: Sequence[Strategy]) -> list[float]:
        """The predicted iteration time of each strategy (ms), memoised; data-parallel ones
        are priced in one batch per micro-batch size."""
        keys = [s.to_json() for s in strategies]
        todo: dict[str, Strategy] = {}
        for key, strategy in zip(keys, strategies, strict=True):
            if key not in self.memo:
                todo.setdefault(key, strategy)
        by_batch: dict[int, list[tuple[str, Strategy]]] = {}
        for key, strategy in todo.items():
            plan = strategy.parallel
            if is_data_parallel(plan):
                evaluator = self.fusion(plan)
                by_batch.setdefault(id(evaluator), []).append((key, strategy))
            else:
                self.memo[key] = self._price_plan(strategy)
        for group in by_batch.values():
            evaluator = self.fusion(group[0][1].parallel)
            times = evaluator.price([s for _, s in group])
            for (key, _), ms in zip(group, times, strict=True):
                self.memo[key] = ms
        if todo and self.on_priced is not None:
            self.on_priced(len(todo))
        return [self.memo[key] for key in keys]

    def analytic(self, strategies: Sequence[Strategy]) -> list[float]:
        """The analytical model's time (ms) of each grid strategy (``simulator.grid``),
        memoised apart from :attr:`memo`: a prior's estimates are not evaluations.

        Raises:
            InvalidOptionError: a strategy without a grid (the model has no closed form of it).
        """
        out = []
        for strategy in strategies:
            if not strategy.parallel.grid:
                raise InvalidOptionError(
                    f"the analytical model prices grid plans; {strategy.parallel.label} is not one"
                )
            key = strategy.to_json()
            if key not in self._analytic:
                self._analytic[key] = self._price_plan(strategy, AnalyticCostModel())
            out.append(self._analytic[key])
        return out

    def _price_plan(self, strategy: Strategy, cost_model: CostModel | None = None) -> float:
        rank = rank_spec(self.spec, strategy, self.cluster.world_size)
        profiled, node_ms = self.profiles(rank)
        graph = self.capture(rank, strategy)
        prediction = predict(
            graph,
            profiled=profiled,
            node_ms=node_ms,
            collective_profiles=self.cluster.fits,
            world_size=self.cluster.world_size,
            bandwidth=self.cluster.bandwidth,
            backend=self.cluster.backend,
            cost_model=cost_model or self.cost_model,
            compute_scale=self.cluster.compute_scale,
        )
        return prediction.iteration_time_ms
