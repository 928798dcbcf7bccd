"""Pricing many data-parallel fusion strategies of one model on one cluster, fast.

The search asks for thousands of predictions of one model under different bucket partitions,
DeAR on or off, and compiled blocks. :class:`FusionEvaluator` prepares what does not change
between them once (the closed-form replay's gradient-ready times, the cost model's encoding of
the graph) and then prices strategies in batches: each is replayed in closed form (DeAR through
the full replay) and, with a cost model, corrected by the strategy head in one batched pass.
Prices are memoised by strategy, so a search that comes back to a candidate does not pay twice
and ``evaluations`` counts distinct strategies.
"""

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
from torch_geometric.data import Batch

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.strategy import Strategy
from ddlsim.simulator.costs import uses_ring
from ddlsim.simulator.fast import DataParallelReplay
from ddlsim.simulator.features import ModelGraph, model_graph, strategy_sample
from ddlsim.simulator.gnn import IterationCostModel
from ddlsim.simulator.train import intra_op_threads


class Pricer(Protocol):
    """What a search needs of an evaluator: memoised prices (ms) of strategies, in batches,
    and how many distinct strategies it has priced."""

    @property
    def evaluations(self) -> int: ...

    def price(self, strategies: Sequence[Strategy]) -> list[float]: ...


class FusionEvaluator:
    """Predicted iteration times (ms) of data-parallel strategies of one rank graph.

    Args:
        graph: the rank's micro-batch graph (any strategy) and ``node_ms`` its profiled times,
            already scaled for ranks sharing cores.
        comm: collective models over the data-parallel ranks (:func:`simulator.costs.comm_models`);
            ``ring_comm`` those of DeAR's ring where the backend runs one (gloo), else ``comm``.
        cost_model: a trained model and its meta; its ``predictor`` (``gnn`` or ``blend``)
            corrects the replay; ``None`` (or ``replay``) prices with the replay alone.
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
        cost_model: tuple[IterationCostModel, Mapping[str, Any]] | None = None,
        compute_scale: float = 1.0,
    ) -> None:
        self.graph = graph
        self.comm = dict(comm)
        self.ring_comm = dict(ring_comm) if ring_comm is not None else self.comm
        self.backend = backend
        self.dp = dp
        self.compute_scale = compute_scale
        self.replay = DataParallelReplay(graph, node_ms)
        self.memo: dict[str, float] = {}
        self._model: IterationCostModel | None = None
        self._weight = 0.0
        self._encoded: ModelGraph | None = None
        if cost_model is not None:
            model, meta = cost_model
            predictor = str(meta.get("predictor", "gnn"))
            if predictor in ("gnn", "blend"):
                self._model = model
                self._weight = 1.0 if predictor == "gnn" else 0.5
                self._encoded = model_graph(graph, node_ms)
                with torch.no_grad(), intra_op_threads(1):
                    self._batch = Batch.from_data_list([self._encoded.data])
                    self._h, _ = model.encode(self._batch)

    @property
    def predictor(self) -> str:
        if self._model is None:
            return "replay"
        return "gnn" if self._weight == 1.0 else "blend"

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
        return [self.memo[key] for key in keys]

    def _comm(self, strategy: Strategy) -> dict[str, AlphaBeta]:
        return self.ring_comm if uses_ring(strategy, self.backend) else self.comm

    def _price_new(self, strategies: list[Strategy]) -> list[float]:
        summaries = [
            self.replay.summary(s, self._comm(s), micro_batches=s.parallel.micro_batches)
            for s in strategies
        ]
        if self._model is None or self._encoded is None:
            return [summary.iteration_time_ms for summary in summaries]
        samples = [
            strategy_sample(
                model_key="g",
                graph=self._encoded,
                strategy=strategy,
                summary=summary,
                comm=self._comm(strategy),
                dp=self.dp,
                compute_scale=self.compute_scale,
            )
            for strategy, summary in zip(strategies, summaries, strict=True)
        ]
        with torch.no_grad(), intra_op_threads(1):
            corrections = self._model.corrections(self._h, self._batch, {"g": 0}, samples)
        return [
            s.replay_ms * math.exp(self._weight * float(c))
            for s, c in zip(samples, corrections, strict=True)
        ]
