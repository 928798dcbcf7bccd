"""The whole strategy space: candidate plans, the memory model, pricing any plan, the joint
backtracking with memory pruning, and the Optuna samplers over it (NSGA-II's Pareto front)."""

import math
import time
from collections.abc import Mapping

import pytest

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.data.zoo import resolve_model
from ddlsim.plans.feasibility import model_supports
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.search.algorithm import SearchStart
from ddlsim.search.backtrack import BacktrackOptions, backtrack_all, backtrack_fusion
from ddlsim.search.optuna_search import (
    StudyOptions,
    finished_trials,
    open_study,
    optimize,
    outcome_from_study,
)
from ddlsim.search.plans import candidate_plans
from ddlsim.search.space import Space
from ddlsim.search.strategy_evaluator import Cluster, StrategyEvaluator
from ddlsim.simulator.calibration import MIN_ERRORS, RISK_KINDS, Calibration, risk_kind
from ddlsim.simulator.memory import GIB, peak_memory

GPT2 = resolve_model("gpt2-tiny").with_inputs(batch_size=8, seq_len=32)


def _profiles(rank: ModelSpec) -> tuple[IterationGraph, Mapping[int, float]]:
    # FLOP-proportional compute: the space's pricing, not a profile, is under test
    graph = capture_graph(rank)
    node_ms = {
        n.id: 0.01 + n.flops / 2e8 for n in graph.nodes if n.kind in ("compute", "optimizer")
    }
    return graph, node_ms


def _evaluator(
    capacity_gib: float | None = None,
    world_size: int = 2,
    calibration: Calibration | None = None,
) -> StrategyEvaluator:
    cluster = Cluster(
        world_size=world_size,
        bandwidth="1gbit",
        fits=[],
        capacity_bytes=None if capacity_gib is None else int(capacity_gib * GIB),
    )
    return StrategyEvaluator(GPT2, cluster, _profiles, _capture, calibration=calibration)


def _capture(rank: ModelSpec, strategy: Strategy) -> IterationGraph:
    return capture_graph(rank, CaptureOptions(strategy=strategy))


def test_candidate_plans_fit_the_world_size_and_the_batch() -> None:
    plans = candidate_plans(GPT2, 4, model_supports)
    labels = [p.label for p in plans]
    assert plans[0] == ParallelPlan() and len(set(labels)) == len(labels)
    for plan in plans:
        dp = plan.resolve_dp(4)
        assert dp * plan.tp * plan.pp == 4 and 8 % (dp * plan.micro_batches) == 0
    assert any(p.fsdp for p in plans) and any(p.tp == 2 for p in plans)
    # two blocks: pipelines of one stage a rank only (interleaving needs four stages)
    assert {p.pp_schedule for p in plans if p.pp > 1} == {"gpipe", "1f1b", "eager_1f1b"}
    # a tensor-parallel first stage where each stage has two ranks
    assert {p.stages for p in plans if p.stages} == {("tp", "batch")}
    assert not any(p.stages for p in candidate_plans(GPT2, 2, model_supports))
    # the reference MLP has no tensor-parallel plan; its Sequential body pipelines
    mlp = candidate_plans(resolve_model("mlp"), 4, model_supports)
    assert all(p.tp == 1 and not p.stages for p in mlp) and any(p.pp == 2 for p in mlp)


def test_memory_model_adds_up_and_shards() -> None:
    graph, _ = _profiles(GPT2.with_inputs(batch_size=4))
    weights = sum(p.nbytes for p in graph.params)
    ddp = peak_memory(graph, Strategy(), world_size=2)
    assert ddp.weights_bytes == weights and ddp.optimizer_bytes == 2 * weights
    assert ddp.total_bytes == (
        ddp.weights_bytes
        + ddp.grads_bytes
        + ddp.optimizer_bytes
        + ddp.buffers_bytes
        + ddp.activations_bytes
        + ddp.transient_bytes
    )
    assert ddp.activations_bytes > 0
    evaluator = _evaluator()
    fsdp = peak_memory(
        graph,
        Strategy(parallel=ParallelPlan(fsdp=True)),
        world_size=2,
        blocks=evaluator.blocks,
        fsdp_groups=evaluator.fsdp_groups,
    )
    assert fsdp.optimizer_bytes == ddp.optimizer_bytes // 2
    assert fsdp.total_bytes < ddp.total_bytes
    gpipe = Strategy(parallel=ParallelPlan(pp=2, micro_batches=4, pp_schedule="gpipe"))
    one_f = Strategy(parallel=ParallelPlan(pp=2, micro_batches=4, pp_schedule="1f1b"))
    eager = Strategy(parallel=ParallelPlan(pp=2, micro_batches=4, pp_schedule="eager_1f1b"))
    kept = {
        name: peak_memory(graph, s, world_size=2, blocks=evaluator.blocks).activations_bytes
        for name, s in (("gpipe", gpipe), ("1f1b", one_f), ("eager", eager))
    }
    # 1F1B keeps pp micro-batches in flight, eager 1F1B 2 * pp - 1, GPipe all of them
    assert kept["1f1b"] < kept["eager"] < kept["gpipe"]


def test_the_evaluator_prices_every_kind_of_plan_and_memoises() -> None:
    evaluator = _evaluator()
    strategies = [Strategy(parallel=p) for p in candidate_plans(GPT2, 2, model_supports)]
    times = evaluator.price(strategies)
    assert all(ms > 0 for ms in times) and evaluator.evaluations == len(strategies)
    assert evaluator.price(strategies[:3]) == times[:3]
    assert evaluator.evaluations == len(strategies)
    # gradient accumulation runs two micro-batches of half the size: priced at that batch
    accumulate = Strategy(parallel=ParallelPlan(micro_batches=2))
    assert evaluator.fusion(accumulate.parallel) is not evaluator.fusion(ParallelPlan())


def test_a_calibrated_search_needs_a_margin_its_kind_can_be_trusted_with() -> None:
    graph, _ = _profiles(GPT2.with_inputs(batch_size=4))
    sizes = {p.name: p.nbytes for p in graph.params}
    order = list(graph.grad_ready_order)
    options = BacktrackOptions(budget=150, time_limit_s=120)
    plain = _evaluator()
    free = backtrack_fusion(plain, order, [sizes[n] for n in order], options)
    assert free.best != Strategy() and free.best_ms < free.baseline_ms
    assert plain.price([free.best]) == plain.predicted([free.best])
    # every kind's held-out speed-ups were 5 % worse than the best one's predicted margin
    error = math.log(free.baseline_ms / free.best_ms) + 0.05
    kinds = {kind: (error,) * MIN_ERRORS for kind in RISK_KINDS if kind != "default"}
    strict = _evaluator(calibration=Calibration(predictor="replay", errors=kinds))
    kept = backtrack_fusion(strict, order, [sizes[n] for n in order], options)
    assert kept.best == Strategy() and kept.best_ms == kept.baseline_ms
    (scored,), (predicted,) = strict.price([free.best]), strict.predicted([free.best])
    assert risk_kind(free.best) != "default"
    assert predicted == pytest.approx(free.best_ms)
    assert scored == pytest.approx(predicted * math.exp(error))
    assert strict.price([Strategy()]) == strict.predicted([Strategy()])
    # errors of one kind only: the search moves to the best of the other kinds
    hooks_only = Calibration(
        predictor="replay",
        errors={**{k: (0.0,) * MIN_ERRORS for k in kinds}, "hooks": (1.0,) * MIN_ERRORS},
    )
    moved = backtrack_fusion(
        _evaluator(calibration=hooks_only), order, [sizes[n] for n in order], options
    )
    assert risk_kind(moved.best) != "hooks"


def test_joint_backtracking_prunes_plans_over_capacity() -> None:
    free = _evaluator()
    ddp_gib = free.memory(Strategy()).total_gib
    fsdp_gib = free.memory(Strategy(parallel=ParallelPlan(fsdp=True))).total_gib
    assert fsdp_gib < ddp_gib
    # a device between the two: DDP's plan does not fit, FSDP's does
    tight = _evaluator(capacity_gib=(ddp_gib + fsdp_gib) / 2)
    graph, _ = _profiles(GPT2.with_inputs(batch_size=4))
    sizes = {p.name: p.nbytes for p in graph.params}
    order = list(graph.grad_ready_order)
    space = Space(
        plans=tuple(candidate_plans(GPT2, 2, model_supports)),
        total_grad_mb=sum(sizes.values()) / 2**20,
        blocks=tight.blocks,
    )
    joint = backtrack_all(
        tight,
        space,
        order,
        [sizes[n] for n in order],
        BacktrackOptions(budget=120, time_limit_s=120),
    )
    # DDP's plan is over the device's capacity: pruned, never priced
    assert joint.pruned[f"predicted peak {ddp_gib:.2f} GiB over capacity"] >= 1
    for strategy, _ in joint.top:
        assert tight.feasible(strategy)
    assert tight.feasible(joint.best) or joint.best == Strategy()
    assert joint.evaluations <= 120
    curve = joint.curve
    assert list(curve) == sorted(curve, reverse=True)


def test_nsga2_keeps_a_pareto_front_of_time_and_memory() -> None:
    evaluator = _evaluator()
    graph, _ = _profiles(GPT2.with_inputs(batch_size=4))
    space = Space(
        plans=tuple(candidate_plans(GPT2, 2, model_supports)),
        total_grad_mb=sum(p.nbytes for p in graph.params) / 2**20,
        blocks=evaluator.blocks,
    )
    trials = open_study("nsga2", StudyOptions(study_name="pareto", seed=1))
    start = time.perf_counter()
    (baseline_ms,) = evaluator.price([Strategy()])
    optimize(trials, evaluator, space, budget=40, deadline=start + 120)
    assert finished_trials(trials) == 40
    begun = SearchStart(start=start, baseline=Strategy(), baseline_ms=baseline_ms)
    result = outcome_from_study(trials, space, begun, top=5)
    assert result.pareto, "a two-objective study has a front"
    points = [(point.scored_ms, point.peak_memory_gib) for point in result.pareto]
    for ms, gib in points:  # no point of the front dominates another
        assert not any(o[0] <= ms and o[1] <= gib and o != (ms, gib) for o in points)
    times = [ms for ms, _ in points]
    assert times == sorted(times)
    assert result.best_ms <= min(times) + 1e-9
    for point in result.pareto:  # the front's strategies are what they say
        assert evaluator.price([point.strategy]) == [pytest.approx(point.scored_ms)]


def test_space_strategies_round_trip_through_trial_parameters() -> None:
    plans = tuple(candidate_plans(GPT2, 2, model_supports))
    space = Space(plans=plans, total_grad_mb=10.0, blocks=("h.0", "h.1"))
    ddp = space.strategy({"plan": "ddp", "log_cap_mb": 0.0, "first_share": 0.5, "dear": True})
    assert ddp.tensor_fusion.bucket_cap_mb == pytest.approx(1.0)
    assert ddp.tensor_fusion.first_bucket_cap_mb == pytest.approx(0.5)
    assert ddp.tensor_fusion.dear and ddp.op_fusion.compiled == ()
    label = next(p for p in plans if p.pp > 1).label
    piped = space.strategy({"plan": label, "compiled_blocks": 2})
    assert piped.parallel.pp > 1 and piped.op_fusion.compiled == ("h.0", "h.1")
