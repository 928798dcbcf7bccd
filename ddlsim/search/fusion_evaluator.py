"""Pricing many data-parallel fusion strategies of one model on one cluster, fast.

The search asks for thousands of predictions of one model under different bucket partitions,
DeAR on or off, and compiled blocks. :class:`FusionEvaluator` prepares what does not change
between them once (the closed-form replay's gradient-ready times, the cost model's encoding of
the graph) and then prices strategies in batches: each is replayed in closed form (DeAR through
the full replay) and, with a cost model, corrected by the strategy head in one batched pass.
Prices are memoised by strategy, so a search that comes back to a candidate does not pay twice
and ``evaluations`` counts distinct strategies.
"""

from collections.abc import Callable, Mapping, Sequence

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.strategy import Strategy
from ddlsim.simulator.cost_model import CostModel, EncodedGraphs, ReplayCostModel
from ddlsim.simulator.costs import uses_ring
from ddlsim.simulator.dp_replay import DataParallelReplay
from ddlsim.simulator.features import ModelGraph, model_graph, strategy_sample
from ddlsim.simulator.runtime import shipped_runtime_costs
from ddlsim.simulator.train import intra_op_threads


class FusionEvaluator:
    """Predicted iteration times (ms) of data-parallel strategies of one rank graph.

    Args:
        graph: the rank's micro-batch graph (any strategy) and ``node_ms`` its profiled times,
            already scaled for ranks sharing cores.
        comm: collective models over the data-parallel ranks (:func:`simulator.costs.comm_models`);
            ``ring_comm`` those of DeAR's ring where the backend runs one (gloo), else ``comm``.
        cost_model: a learned one (``gnn``, ``blend``) corrects the replay; the replay's
            (the default) prices with the replay alone.

    Not thread-safe: the memo grows with every call.
    """

    def __init__(
        self,
        graph: IterationGraph,
        node_ms: Mapping[int, float],
        comm: Mapping[str, AlphaBeta],
        *,
        dp: int,
        ring_comm: Mapping[str, AlphaBeta] | None = None,
        backend: str = "gloo",
        cost_model: CostModel | None = None,
        compute_scale: float = 1.0,
    ) -> None:
        self.graph = graph
        self.comm = dict(comm)
        self.ring_comm = dict(ring_comm) if ring_comm is not None else self.comm
        self.backend = backend
        self.dp = dp
        self.compute_scale = compute_scale
        self.cost_model = cost_model or ReplayCostModel()
        self.replay = DataParallelReplay(
            graph, node_ms, shipped_runtime_costs().scaled(compute_scale)
        )
        self.memo: dict[str, float] = {}
        # Told how many strategies each call priced anew (a search's progress).
        self.on_priced: Callable[[int], None] | None = None
        self._features: ModelGraph | None = None
        self._encoded: EncodedGraphs | None = None
        if self.cost_model.learned:
            # The graph is encoded once; strategies are then priced by the head alone.
            self._features = model_graph(graph, node_ms)
            with intra_op_threads(1):
                self._encoded = self.cost_model.encode({"g": self._features})

    @property
    def predictor(self) -> str:
        """The cost model's name: ``replay``, ``gnn`` or ``blend``."""
        return self.cost_model.name

    @property
    def evaluations(self) -> int:
        """Distinct strategies priced so far."""
        return len(self.memo)

    def price(self, strategies: Sequence[Strategy]) -> list[float]:
        """The predicted iteration time of each strategy (ms), memoised."""
        keys = [s.to_json() for s in strategies]
        todo: dict[str, Strategy] = {}
        for key, strategy in zip(keys, strategies, strict=True):
            if key not in self.memo and key not in todo:
                todo[key] = strategy
        if todo:
            for key, ms in zip(todo, self._price_new(list(todo.values())), strict=True):
                self.memo[key] = ms
            if self.on_priced is not None:
                self.on_priced(len(todo))
        return [self.memo[key] for key in keys]

    def _comm(self, strategy: Strategy) -> dict[str, AlphaBeta]:
        return self.ring_comm if uses_ring(strategy, self.backend) else self.comm

    def _price_new(self, strategies: list[Strategy]) -> list[float]:
        summaries = [
            self.replay.summary(s, self._comm(s), micro_batches=s.parallel.micro_batches)
            for s in strategies
        ]
        if self._features is None or self._encoded is None:
            return [summary.iteration_time_ms for summary in summaries]
        samples = [
            strategy_sample(
                model_key="g",
                graph=self._features,
                strategy=strategy,
                summary=summary,
                comm=self._comm(strategy),
                dp=self.dp,
                compute_scale=self.compute_scale,
            )
            for strategy, summary in zip(strategies, summaries, strict=True)
        ]
        with intra_op_threads(1):
            return self.cost_model.predict(self._encoded, samples)
