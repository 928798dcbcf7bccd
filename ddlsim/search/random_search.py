"""Random search (the baseline a smarter search has to beat).

Over a fusion-only problem, :func:`random_fusion` draws from the same space as the
backtracking: contiguous partitions of the gradients in ready order, with a random number of
cuts at random places, DeAR on or off, priced in batches until the budget or the time is spent.
Over the whole space, :class:`RandomSearch` is Optuna's random sampler on a shareable study.
"""

import random
import time
from collections.abc import Sequence

from ddlsim.data.specs.strategy import Strategy
from ddlsim.search.algorithm import (
    Pricer,
    Progress,
    SearchBudget,
    SearchOutcome,
    SearchProblem,
    begin,
    finish,
    reporting,
)
from ddlsim.search.backtrack import BacktrackOptions
from ddlsim.search.optuna_search import OptunaSearch
from ddlsim.search.partitions import strategy_of

BATCH = 256


class RandomSearch(OptunaSearch):
    """Random partitions (:func:`random_fusion`, seeded with ``budget.seed``) for a fusion-only
    problem, which runs in one process (the study settings are unused); Optuna's random sampler
    over the whole space otherwise (see :class:`OptunaSearch`)."""

    name = "random"
    sampler = "random"

    def search(
        self, problem: SearchProblem, budget: SearchBudget, progress: Progress | None = None
    ) -> SearchOutcome:
        if not problem.fusion_only:
            return super().search(problem, budget, progress)
        options = BacktrackOptions(
            budget=budget.evaluations,
            time_limit_s=budget.time_limit_s,
            top=budget.top,
            dear=problem.space.dear,
        )
        with reporting(problem.evaluator, progress):
            return random_fusion(problem.evaluator, problem.order, options, seed=budget.seed)


def random_fusion(
    evaluator: Pricer,
    order: Sequence[str],
    options: BacktrackOptions | None = None,
    *,
    seed: int = 0,
) -> SearchOutcome:
    """Sample and price random partitions (``options``: budget, time limit, top, DeAR).

    Raises:
        InvalidOptionError: a model without gradients.
    """
    options = options or BacktrackOptions()
    begun = begin(evaluator, order)
    rng = random.Random(seed)
    curve = [begun.baseline_ms]
    priced: dict[str, tuple[Strategy, float]] = {}
    n = len(order)
    attempts = 0
    while evaluator.evaluations < options.budget and attempts < 20 * options.budget:
        if time.perf_counter() - begun.start > options.time_limit_s:
            break
        room = min(BATCH, options.budget - evaluator.evaluations)
        batch = []
        for _ in range(room):
            attempts += 1
            k = rng.randint(0, n - 1)
            cuts = tuple(sorted(rng.sample(range(1, n), k=k)))
            batch.append(strategy_of(order, cuts, options.dear and rng.random() < 0.5))
        for strategy, ms in zip(batch, evaluator.price(batch), strict=True):
            if strategy.to_json() not in priced:
                priced[strategy.to_json()] = (strategy, ms)
                curve.append(min(curve[-1], ms))
    return finish(
        begun, priced.values(), evaluations=evaluator.evaluations, curve=curve, top=options.top
    )
