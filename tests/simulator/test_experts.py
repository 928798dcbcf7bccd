"""Expert parallelism in the replay: each experts layer's exchanges, the busiest rank's experts,
the experts' own gradient reduction, on captured mixtures of experts."""

import functools
import json

import pytest

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.moe import expert_param_names
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.simulator.experts import (
    EXPERT_OPS,
    ExpertMeasures,
    expert_schedule,
)
from ddlsim.simulator.predict import check_replayed
from ddlsim.simulator.replay import replay
from ddlsim.simulator.timeline import UnsupportedPlanError

SPEC = ZOO["mixtral-tiny"]
LAYERS = int(SPEC.config["num_hidden_layers"])
HIDDEN = int(SPEC.config["hidden_size"])
TOKENS = SPEC.inputs.batch_size * (SPEC.inputs.seq_len or 0)
PAIRS = TOKENS * int(SPEC.config["num_experts_per_tok"])


@functools.cache
def _graph(raw: str) -> IterationGraph:
    return capture_graph(SPEC, CaptureOptions(strategy=Strategy.from_dict(json.loads(raw))))


def _comm(ranks: int, alpha_us: float = 100.0) -> dict[str, AlphaBeta]:
    return {
        op: AlphaBeta(collective=op, world_size=ranks, alpha_us=alpha_us, busbw_gbps=1.0)
        for op in EXPERT_OPS
    }


def test_expert_parameters_leave_ddps_buckets_and_step_a_shard_each() -> None:
    dense = _graph('{"parallel": {"dp": 2}}')
    split = _graph('{"parallel": {"dp": 2, "ep": 2}}')
    experts = expert_param_names(split.params, SPEC.config)
    assert len(experts) == 2 * LAYERS
    bucketed = {p for n in split.nodes_of("comm") for p in n.params}
    assert bucketed and not bucketed & experts
    assert {p for n in dense.nodes_of("comm") for p in n.params} >= experts
    sizes = {p.name: p.nbytes for p in split.params}
    steps = {n.param: n for n in split.nodes_of("optimizer")}
    assert len(steps) == len(split.params)
    for name in experts:
        assert steps[name].param_bytes == sizes[name] // 2 and steps[name].bucket is None


def test_each_layer_exchanges_its_token_copies_five_times_with_all_to_all() -> None:
    graph = _graph('{"parallel": {"dp": 2, "ep": 2}}')
    imbalance = {f"model.layers.{i}.mlp.experts": 1.5 for i in range(LAYERS)}
    schedule = expert_schedule(
        graph, ExpertMeasures(imbalance=imbalance), ep_comm=_comm(2), edp_comm=None
    )
    names = [b.name for items in schedule.after.values() for b in items]
    # forward: counts, dispatch, combine; backward: the combine's and the dispatch's gradients
    assert len(names) == 5 * LAYERS
    assert sum("counts" in n for n in names) == LAYERS
    dispatch = next(b for items in schedule.after.values() for b in items if "dispatch" in b.name)
    # the busiest rank receives 1.5x the mean's token copies, fp32 hidden states
    busiest = int(PAIRS * 1.5) * HIDDEN * 4
    assert dispatch.ms == pytest.approx(_comm(2)["all_to_all"].time_us(busiest) / 1e3)
    assert schedule.before_step == ()  # ep == dp: no expert-data-parallel group
    # the busiest rank's grouped matmuls take 1.5x; the experts' steps 1 / ep of theirs
    grouped = [n for n in graph.nodes if "grouped_mm" in n.op]
    assert grouped and all(schedule.scale[n.id] == 1.5 for n in grouped)
    experts = expert_param_names(graph.params, SPEC.config)
    assert {schedule.scale[n.id] for n in graph.nodes_of("optimizer") if n.param in experts} == {
        0.5
    }


def test_all_gather_dispatch_and_the_expert_data_parallel_reduction() -> None:
    graph = _graph('{"parallel": {"dp": 4, "ep": 2, "dispatcher": "all_gather"}}')
    schedule = expert_schedule(
        graph, ExpertMeasures(), ep_comm=_comm(2), edp_comm=_comm(2, alpha_us=7.0)
    )
    ops = [b.name.split()[0] for items in schedule.after.values() for b in items]
    assert ops.count("all_gather") == 4 * LAYERS  # tokens, choices, weights; outputs' grad
    assert ops.count("reduce_scatter") == 3 * LAYERS
    (reduction,) = schedule.before_step
    experts = expert_param_names(graph.params, SPEC.config)
    nbytes = sum(p.nbytes for p in graph.params if p.name in experts) // 2
    assert reduction.ms == pytest.approx(
        _comm(2, alpha_us=7.0)["all_reduce"].time_us(nbytes) / 1e3
    )


def test_the_rank_waits_for_every_exchange() -> None:
    graph = _graph('{"parallel": {"dp": 2, "ep": 2}}')
    node_ms = {n.id: 0.01 for n in graph.nodes if n.kind in ("compute", "optimizer")}
    comm = _comm(2)
    base = replay(graph, node_ms, comm)
    slow = _comm(2, alpha_us=5_000.0)  # 5 ms a collective
    schedule = expert_schedule(graph, ExpertMeasures(), ep_comm=slow, edp_comm=None)
    with_experts = replay(graph, schedule.scaled(node_ms), comm, experts=schedule)
    exchanges = sum(
        b.ms for items in schedule.after.values() for b in items if b.stream == "exchange"
    )
    assert exchanges > 5 * LAYERS * 5.0
    # blocking: the compute and the exchanges add up (nothing hides an exchange)
    assert with_experts.iteration_time_ms >= base.compute_ms + exchanges - 1e-6
    assert with_experts.iteration_time_ms > base.iteration_time_ms + exchanges / 2
    names = {e.name for e in with_experts.timeline}
    assert any("dispatch" in n for n in names) and any("combine" in n for n in names)


def test_plans_the_replay_does_not_schedule_are_named() -> None:
    check_replayed(Strategy.from_dict({"parallel": {"ep": 2}}).parallel)
    with pytest.raises(UnsupportedPlanError, match="ep beside fsdp"):
        check_replayed(Strategy.from_dict({"parallel": {"ep": 2, "fsdp": True}}).parallel)


def test_the_layers_own_bookkeeping_runs_on_the_rank_after_its_first_exchanges() -> None:
    graph = _graph('{"parallel": {"dp": 2, "ep": 2}}')
    measures = ExpertMeasures(forward_ms=0.4, backward_ms=0.3)
    schedule = expert_schedule(graph, measures, ep_comm=_comm(2), edp_comm=None)
    own = [b for items in schedule.after.values() for b in items if b.stream == "compute"]
    assert sorted(b.ms for b in own) == [0.3] * LAYERS + [0.4] * LAYERS
    node_ms = {n.id: 0.01 for n in graph.nodes if n.kind in ("compute", "optimizer")}
    bare = expert_schedule(graph, ExpertMeasures(), ep_comm=_comm(2), edp_comm=None)
    with_own = replay(graph, node_ms, _comm(2), experts=schedule)
    without = replay(graph, node_ms, _comm(2), experts=bare)
    # compute the rank does itself: the iteration grows by all of it
    grown = with_own.iteration_time_ms - without.iteration_time_ms
    assert grown == pytest.approx(LAYERS * 0.7, rel=1e-6)
    assert measures.scaled(2.0).forward_ms == 0.8
