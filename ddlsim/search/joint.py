"""Backtracking over the whole space: parallel plans, then tensor fusion, then op fusion.

1. Every parallel plan of :func:`search.plans.candidate_plans` whose predicted peak memory fits
   the device is priced with DDP's fusion defaults; the others are pruned, never priced.
2. Under each data-parallel plan that fits (plain, or with gradient accumulation), fastest
   first, the fusion backtracking (:func:`search.backtrack.explore_fusion`) refines buckets and
   DeAR; the budget left is shared among them, the fastest plan getting the most.
3. The ``top`` strategies so far then try compiling the first ``k`` blocks of the model's
   stack, for every ``k`` under a data-parallel plan, and half and all of them under other plans
   (each such price is a replay of a captured graph).

The result ranks every strategy priced; ``pruned`` lists the plans that did not fit.
"""

import dataclasses
import time
from collections.abc import Sequence

from ddlsim.data.errors import DdlsimError
from ddlsim.data.specs.strategy import OpFusionPlan, ParallelPlan, Strategy
from ddlsim.search.backtrack import BacktrackOptions, SearchResult, begin, explore_fusion, finish
from ddlsim.search.plans import plan_label
from ddlsim.search.strategy_evaluator import StrategyEvaluator
from ddlsim.simulator.plans import is_data_parallel


@dataclasses.dataclass(frozen=True, kw_only=True)
class JointResult:
    """A whole-space search: its result, and the plans pruned with the reason."""

    result: SearchResult
    pruned: tuple[tuple[str, str], ...]


def backtrack_all(
    evaluator: StrategyEvaluator,
    plans: Sequence[ParallelPlan],
    order: Sequence[str],
    sizes: Sequence[int],
    options: BacktrackOptions | None = None,
    *,
    op_fusion: bool = True,
) -> JointResult:
    """Search ``plans`` x bucket partitions x DeAR x compiled blocks.

    Raises:
        InvalidOptionError: a model without gradients.
    """
    options = options or BacktrackOptions()
    start, baseline, baseline_ms = begin(evaluator, order)
    deadline = start + options.time_limit_s
    curve = [baseline_ms]
    priced: dict[str, tuple[Strategy, float]] = {baseline.to_json(): (baseline, baseline_ms)}
    pruned: list[tuple[str, str]] = []

    def record(strategies: Sequence[Strategy]) -> None:
        room = options.budget - evaluator.evaluations
        # Strategies of a plan over capacity are never priced (DDP's defaults, priced as the
        # reference, must not lead to compiled variants of their plan).
        fresh = [s for s in strategies if s.to_json() not in priced and evaluator.feasible(s)][
            : max(0, room)
        ]
        for strategy in fresh:
            try:
                (ms,) = evaluator.price([strategy])
            except DdlsimError as exc:  # a plan the simulator cannot schedule for this model
                pruned.append((plan_label(strategy.parallel), str(exc)))
                continue
            priced[strategy.to_json()] = (strategy, ms)
            curve.append(min(curve[-1], ms))

    fitting = []
    for plan in plans:
        strategy = Strategy(parallel=plan)
        if evaluator.feasible(strategy):
            fitting.append(strategy)
        else:
            peak = evaluator.memory(strategy).total_gib
            pruned.append((plan_label(plan), f"predicted peak {peak:.2f} GiB over capacity"))
    record(fitting)
    data_parallel = sorted(
        (
            priced[s.to_json()]
            for s in fitting
            if s.to_json() in priced and is_data_parallel(s.parallel)
        ),
        key=lambda item: item[1],
    )
    for index, (base, _) in enumerate(data_parallel):
        if time.perf_counter() > deadline:
            break
        left = options.budget - evaluator.evaluations
        share = left // (2 if index < len(data_parallel) - 1 else 1)
        found = explore_fusion(
            evaluator,
            order,
            sizes,
            options,
            base=base,
            budget=evaluator.evaluations + share,
            deadline=deadline,
            curve=curve,
        )
        for strategy, ms in found:
            priced.setdefault(strategy.to_json(), (strategy, ms))
    blocks = evaluator.blocks
    if op_fusion and blocks and time.perf_counter() < deadline:
        ranked = sorted(priced.values(), key=lambda item: item[1])[: options.top]
        tries = []
        for strategy, _ in ranked:
            counts = (
                range(1, len(blocks) + 1)
                if is_data_parallel(strategy.parallel)
                else sorted({max(1, len(blocks) // 2), len(blocks)})
            )
            tries += [
                dataclasses.replace(strategy, op_fusion=OpFusionPlan(compiled=blocks[:k]))
                for k in counts
            ]
        record(tries)
    fits = evaluator.feasible(baseline)
    if not fits:  # priced as the reference, but never a pick
        del priced[baseline.to_json()]
    ranked = sorted(priced.values(), key=lambda item: item[1])
    result = finish(
        evaluator,
        ranked[: options.top],
        baseline=baseline,
        baseline_ms=baseline_ms,
        start=start,
        curve=curve,
        top=options.top,
        baseline_fits=fits,
    )
    return JointResult(result=result, pruned=tuple(pruned))
