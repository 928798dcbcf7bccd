"""Pipeline replay: schedules worked out on paper, stage costs of a captured model."""

from collections.abc import Callable

import pytest
import torch

from data.comm_model import AlphaBeta
from data.graph.format import IterationGraph
from data.models import build_model
from data.stages import block_stack
from simulator.pipeline import StageCosts, replay_pipeline, schedule_order, stage_costs
from simulator.replay import UnsupportedPlanError

GraphOf = Callable[[str], IterationGraph]
NO_LINK = AlphaBeta(collective="sendrecv", world_size=1, alpha_us=0.0, busbw_gbps=1.0)
NO_DP = AlphaBeta(collective="all_reduce", world_size=1, alpha_us=0.0, busbw_gbps=1.0)


def test_schedule_orders() -> None:
    assert schedule_order("gpipe", 0, 2, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    first = [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    assert schedule_order("1f1b", 0, 2, 4) == first
    last = [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    assert schedule_order("1f1b", 1, 2, 4) == last
    with pytest.raises(UnsupportedPlanError, match="interleaved_1f1b"):
        schedule_order("interleaved_1f1b", 0, 2, 4)


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


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
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
