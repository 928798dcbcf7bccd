"""Backtracking over bucket partitions: it beats DDP's defaults and random search of the same
budget where the link makes bucketing matter, never prices a partition twice, and keeps to its
budget."""

import random
from collections.abc import Callable

import pytest

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.strategy import Strategy
from ddlsim.search.backtrack import BacktrackOptions, backtrack_fusion
from ddlsim.search.fusion_evaluator import FusionEvaluator
from ddlsim.search.partitions import cuts_of, strategy_of
from ddlsim.simulator.dp_replay import DataParallelReplay
from ddlsim.simulator.replay import comm_models_for_link

GraphOf = Callable[[str], IterationGraph]


def _setting(graph: IterationGraph) -> tuple[dict[int, float], dict[str, AlphaBeta]]:
    # FLOP-proportional compute; a slow link with a large per-collective latency, so that
    # neither one bucket per gradient nor a single bucket is best
    node_ms = {
        n.id: 0.01 + n.flops / 2e8 for n in graph.nodes if n.kind in ("compute", "optimizer")
    }
    return node_ms, comm_models_for_link(2, 1.0, alpha_us=2000.0)


def _sizes(graph: IterationGraph) -> list[int]:
    nbytes = {p.name: p.nbytes for p in graph.params}
    return [nbytes[name] for name in graph.grad_ready_order]


def test_backtracking_beats_the_baseline_and_random_search(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    node_ms, comm = _setting(graph)
    order = graph.grad_ready_order
    evaluator = FusionEvaluator(graph, node_ms, comm, dp=2)
    result = backtrack_fusion(evaluator, order, _sizes(graph), BacktrackOptions(budget=300))
    assert result.evaluations <= 300 and result.evaluations == len(evaluator.memo)
    assert result.best_ms < result.baseline_ms
    assert result.best_ms == min(ms for _, ms in result.top)
    assert list(result.curve) == sorted(result.curve, reverse=True)  # best so far only falls
    # the prices are the replay's, recomputed independently
    replay = DataParallelReplay(graph, node_ms, evaluator.replay.runtime)
    assert result.best_ms == pytest.approx(replay.summary(result.best, comm).iteration_time_ms)
    # random contiguous partitions, same budget
    rng = random.Random(0)
    sampled = []
    for _ in range(result.evaluations):
        cuts = tuple(sorted(rng.sample(range(1, len(order)), k=rng.randint(0, 12))))
        sampled.append(strategy_of(order, cuts, rng.random() < 0.5))
    random_best = min(FusionEvaluator(graph, node_ms, comm, dp=2).price(sampled))
    assert result.best_ms <= random_best


def test_cuts_round_trip(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("gpt2-tiny")
    order, sizes = graph.grad_ready_order, _sizes(graph)
    for cuts in [(), (3,), (1, 5, 9), tuple(range(1, len(order)))]:
        assert cuts_of(order, strategy_of(order, cuts, False), sizes) == cuts
    ddp = cuts_of(order, Strategy(), sizes)
    assert list(ddp) == sorted(ddp) and all(0 < c < len(order) for c in ddp)


def test_the_evaluator_memoises(zoo_graph: GraphOf) -> None:
    graph = zoo_graph("mlp")
    node_ms, comm = _setting(graph)
    evaluator = FusionEvaluator(graph, node_ms, comm, dp=2)
    one = Strategy.from_dict({"tensor_fusion": {"bucket_cap_mb": 1}})
    first = evaluator.price([one, Strategy(), one])
    assert evaluator.evaluations == 2 and first[0] == first[2]
    assert evaluator.price([one]) == [first[0]] and evaluator.evaluations == 2
    assert evaluator.predictor == "replay"


def test_options_are_checked(zoo_graph: GraphOf) -> None:
    with pytest.raises(InvalidOptionError, match=r"budget\(0\)"):
        BacktrackOptions(budget=0)
    graph = zoo_graph("mlp")
    node_ms, comm = _setting(graph)
    with pytest.raises(InvalidOptionError, match="no gradients"):
        backtrack_fusion(FusionEvaluator(graph, node_ms, comm, dp=2), [], [])
