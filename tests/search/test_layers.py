"""Per-layer placements in the search: the local search over block layouts never ends above
the best uniform placement, finds a mixed optimum when one exists, and stops when told."""

import itertools
from collections.abc import Callable, Sequence

from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.search.backtrack import explore_layers
from ddlsim.search.space import Space

BASE = Strategy(parallel=ParallelPlan(tp=2))
LAYOUTS = ("tp", "replicate", "batch")


def _pricer(
    costs: Sequence[dict[str, float]], switch: float, calls: list[int]
) -> Callable[[Sequence[Strategy]], list[float | None]]:
    """Block ``i`` in layout ``l`` costs ``costs[i][l]``; every change of layout between
    neighbours ``switch``; a whole vocabulary 1 more than a split one."""

    def price(strategies: Sequence[Strategy]) -> list[float | None]:
        calls.append(len(strategies))
        out: list[float | None] = []
        for strategy in strategies:
            layers = strategy.parallel.layers or ("tp",) * len(costs)
            total = sum(cost[layout] for cost, layout in zip(costs, layers, strict=True))
            total += switch * sum(a != b for a, b in itertools.pairwise(layers))
            out.append(total + (1.0 if strategy.parallel.vocab == "replicate" else 0.0))
        return out

    return price


def test_a_mixed_optimum_is_found_and_beats_every_uniform_placement() -> None:
    # Wide blocks want tp, narrow ones batch; the switch is cheap enough to mix.
    costs = [{"tp": 1.0, "replicate": 5.0, "batch": 4.0}] * 3 + [
        {"tp": 6.0, "replicate": 5.0, "batch": 2.0}
    ] * 3
    calls: list[int] = []
    best = explore_layers(BASE, LAYOUTS, 6, price=_pricer(costs, 0.5, calls), done=lambda: False)
    assert best.parallel.layers == ("tp",) * 3 + ("batch",) * 3
    assert best.parallel.vocab == "split"
    assert best.parallel.tp == 2
    # 5 uniform seeds (not everything whole), then sweeps of 2 moves a block and 1 vocabulary
    # flip until one is quiet
    assert calls[0] == 5
    assert set(calls[1:]) <= {1, 2}


def test_a_costly_switch_keeps_the_best_uniform_placement() -> None:
    costs = [{"tp": 1.0, "replicate": 5.0, "batch": 1.5}] * 3 + [
        {"tp": 2.0, "replicate": 5.0, "batch": 1.0}
    ] * 3
    best = explore_layers(BASE, LAYOUTS, 6, price=_pricer(costs, 10.0, []), done=lambda: False)
    assert best.parallel.layers == ("batch",) * 6  # 7.5 against tp's 9.0; mixing costs 10


def test_every_block_tp_is_the_plan_itself() -> None:
    costs = [{"tp": 1.0, "replicate": 5.0, "batch": 5.0}] * 4
    best = explore_layers(BASE, LAYOUTS, 4, price=_pricer(costs, 0.0, []), done=lambda: False)
    assert best == BASE  # no layers written: the same strategy (and key) as the uniform plan


def test_done_stops_after_the_seeds() -> None:
    costs = [
        {"tp": 1.0, "replicate": 5.0, "batch": 4.0},
        {"tp": 6.0, "replicate": 5.0, "batch": 2.0},
    ]
    calls: list[int] = []
    best = explore_layers(BASE, LAYOUTS, 2, price=_pricer(costs, 0.0, calls), done=lambda: True)
    assert calls == [5]
    assert best.parallel.layers in (("batch", "batch"), ())


def test_unpriceable_placements_are_skipped() -> None:
    def price(strategies: Sequence[Strategy]) -> list[float | None]:
        return [None if "batch" in s.parallel.layers else 1.0 for s in strategies]

    best = explore_layers(BASE, LAYOUTS, 2, price=price, done=lambda: False)
    assert "batch" not in best.parallel.layers


def test_the_space_offers_batch_only_where_tp_divides_the_micro_batch() -> None:
    space = Space(
        plans=(ParallelPlan(),), total_grad_mb=1.0, layer_blocks=2, batch_size=4, world_size=4
    )
    assert space.layer_layouts(ParallelPlan(tp=2)) == LAYOUTS  # dp 2: 2 samples a rank
    assert space.layer_layouts(ParallelPlan(tp=2, micro_batches=2)) == ("tp", "replicate")
    assert space.layer_layouts(ParallelPlan()) == ()
    assert (
        Space(plans=(ParallelPlan(),), total_grad_mb=1.0).layer_layouts(ParallelPlan(tp=2)) == ()
    )


def test_everything_whole_is_never_offered() -> None:
    costs = [{"tp": 5.0, "replicate": 1.0, "batch": 5.0}] * 2
    best = explore_layers(BASE, LAYOUTS, 2, price=_pricer(costs, 0.0, []), done=lambda: False)
    # Whole blocks are cheapest, but with a whole vocabulary the ranks would repeat each other.
    assert best.parallel.layers == ("replicate", "replicate")
    assert best.parallel.vocab == "split"


def test_blocks_of_a_stack_that_share_a_layout_move_together() -> None:
    # Two stacks of three blocks (T5's encoder and decoder): the first stack wants batch, the
    # second tp; every placement priced keeps each stack in one layout.
    costs = [{"tp": 4.0, "replicate": 5.0, "batch": 1.0}] * 3 + [
        {"tp": 1.0, "replicate": 5.0, "batch": 4.0}
    ] * 3
    seen: list[tuple[str, ...]] = []
    pricer = _pricer(costs, 0.0, [])

    def price(strategies: Sequence[Strategy]) -> list[float | None]:
        seen.extend(s.parallel.layers or ("tp",) * 6 for s in strategies)
        return pricer(strategies)

    stacks = (0, 0, 0, 1, 1, 1)
    best = explore_layers(BASE, LAYOUTS, 6, price=price, done=lambda: False, stacks=stacks)
    assert best.parallel.layers == ("batch",) * 3 + ("tp",) * 3
    assert all(len(set(layers[:3])) == 1 and len(set(layers[3:])) == 1 for layers in seen)
