"""The analytical model as the search's prior over grid plans (AxoNN picks its grid in closed
form; here the closed form orders and prunes the grids before the simulator scores any).

Every grid plan of the space is priced by :func:`simulator.grid.analytic_grid` (no replay, no
learned correction, not counted as an evaluation); the grids slower than ``1 + keep`` times the
fastest by that estimate leave the space, and the rest follow the other plans fastest first, so
that a search that walks the plans in order (backtracking) or samples them (Optuna) spends its
evaluations on the grids the closed form favours. ``benchmarks/grid_prior.py`` counts the
evaluations a search needs to reach its pick with and without it.
"""

from collections.abc import Callable, Sequence

from ddlsim.data.specs.strategy import ParallelPlan, Strategy

PRIOR_KEEP = 0.25
"""Grids whose analytical time is within this share of the fastest grid's stay in the space."""

Analytic = Callable[[Sequence[Strategy]], list[float]]
"""The analytical time (ms) of each grid strategy."""


def grid_prior(
    plans: Sequence[ParallelPlan], analytic: Analytic, *, keep: float = PRIOR_KEEP
) -> list[ParallelPlan]:
    """``plans`` with the grids ordered by ``analytic`` time and those over ``1 + keep`` times
    the fastest grid's dropped; the other plans first, in their order."""
    grids = [plan for plan in plans if plan.grid]
    if not grids:
        return list(plans)
    times = analytic([Strategy(parallel=plan) for plan in grids])
    fastest = min(times)
    kept = sorted(
        (item for item in zip(times, range(len(grids)), grids, strict=True)
         if item[0] <= fastest * (1 + keep)),
        key=lambda item: (item[0], item[1]),
    )  # fmt: skip
    return [plan for plan in plans if not plan.grid] + [plan for _, _, plan in kept]
