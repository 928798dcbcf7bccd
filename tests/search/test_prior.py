"""The analytical prior over grid plans (search/prior.py) and the grids of the plan space."""

from collections.abc import Sequence

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.plans.feasibility import model_supports
from ddlsim.search.plans import candidate_plans, grid_shapes
from ddlsim.search.prior import grid_prior
from ddlsim.search.space import Space


def test_grid_shapes_are_every_factorisation_that_divides_the_ranks() -> None:
    shapes = grid_shapes(4)
    assert len(shapes) == 9  # 3 with tp 2, 6 with tp 4
    assert (1, 1, 1) not in shapes and (2, 2, 1) in shapes and (1, 1, 4) in shapes
    assert all(4 % (r * c * d) == 0 for r, c, d in shapes)
    assert len(grid_shapes(8)) == 3 + 6 + 10


def test_candidate_plans_hold_the_grids_the_model_divides() -> None:
    spec = ZOO["llama-tiny"].with_inputs(batch_size=8)
    grids = [p for p in candidate_plans(spec, 4, model_supports) if p.grid]
    # llama-tiny has 2 key/value heads: no grid with 4 columns
    assert {p.grid for p in grids} == set(grid_shapes(4)) - {(1, 4, 1)}
    assert all(p.grid_overlap for p in grids)


def _plans() -> list[ParallelPlan]:
    return [
        ParallelPlan(),
        ParallelPlan(tp=2),
        ParallelPlan(grid=(2, 1, 1)),
        ParallelPlan(grid=(1, 2, 1)),
        ParallelPlan(grid=(1, 1, 2)),
    ]


def test_the_prior_orders_grids_and_drops_the_slow_ones() -> None:
    times: dict[tuple[int, ...], float] = {(2, 1, 1): 130.0, (1, 2, 1): 100.0, (1, 1, 2): 120.0}
    asked: list[int] = []

    def analytic(strategies: Sequence[Strategy]) -> list[float]:
        asked.append(len(strategies))
        return [times[s.parallel.grid] for s in strategies]

    kept = grid_prior(_plans(), analytic, keep=0.25)
    assert [p.label for p in kept] == ["ddp", "tp2", "tp2 grid 1x2x1", "tp2 grid 1x1x2"]
    assert asked == [3]  # the grids only, in one call
    everything = grid_prior(_plans(), analytic, keep=1.0)
    assert [p.grid for p in everything if p.grid] == [(1, 2, 1), (1, 1, 2), (2, 1, 1)]


def test_without_grids_the_prior_changes_nothing() -> None:
    plans = [ParallelPlan(), ParallelPlan(tp=2)]

    def analytic(strategies: Sequence[Strategy]) -> list[float]:
        pytest.fail("no grid to price")

    assert grid_prior(plans, analytic) == plans


def test_the_evaluator_prices_grids_analytically_without_counting_evaluations() -> None:
    from tests.search.test_space import _evaluator

    evaluator = _evaluator(world_size=4)
    grids = [Strategy(parallel=ParallelPlan(grid=shape)) for shape in ((1, 2, 2), (2, 2, 1))]
    analytic = evaluator.analytic(grids)
    assert all(ms > 0 for ms in analytic) and evaluator.evaluations == 0
    replayed = evaluator.predicted(grids)
    assert evaluator.evaluations == 2
    # the closed form charges every collective in full: never below the overlapped replay
    assert all(a >= r * 0.999 for a, r in zip(analytic, replayed, strict=True))
    with pytest.raises(InvalidOptionError, match="prices grid plans"):
        evaluator.analytic([Strategy(parallel=ParallelPlan(tp=2))])
    space = Space(plans=(ParallelPlan(),), total_grad_mb=1.0, layer_blocks=2, batch_size=8)
    assert space.layer_layouts(ParallelPlan(grid=(1, 2, 1))) == ()
    # the grid's memory: a quarter of the blocks' weights as shards, half gathered
    tp_memory = evaluator.memory(Strategy(parallel=ParallelPlan(tp=4)))
    grid_memory = evaluator.memory(grids[0])
    assert grid_memory.grads_bytes <= tp_memory.grads_bytes
    assert grid_memory.activations_bytes < tp_memory.activations_bytes
