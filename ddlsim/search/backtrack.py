"""Backtracking over tensor-fusion decisions (after DisCo's search), and over the whole space.

A fusion decision is where the gradients, in the order they become ready, are cut into buckets
(and, per partition, whether DeAR decouples their all-reduce). The search is best-first with
backtracking: it keeps every partition it has priced (memoised by the evaluator) and always
expands the best one not yet expanded, pricing its neighbours in one batch (two adjacent
buckets fused, a bucket split at any gradient, a boundary moved by one, DeAR flipped). A
neighbour more than ``slack`` slower than the best seen is pruned: never expanded, so the
search falls back to the next most promising partition instead of following a bad path. It
stops when the budget of evaluations or the time is spent, or when nothing is left to expand.
Starting points: DDP's defaults (the baseline), every gradient alone, all in one bucket, and
2 to 16 buckets of about equal bytes, each with DeAR off and on.

Over the whole space (:func:`backtrack_all`):

1. Every parallel plan of the space whose predicted peak memory fits the device is priced with
   DDP's fusion defaults; the others are pruned, never priced.
2. Under each data-parallel plan that fits (plain, or with gradient accumulation), fastest
   first, the fusion backtracking refines buckets and DeAR; the budget left is shared among
   them, the fastest plan getting the most.
3. Under each tensor-parallel plan that fits, fastest first, per-layer placements
   (:func:`explore_layers`): the uniform placements, then one block at a time moved to
   another layout while the price drops.
4. The ``top`` strategies so far then try compiling the first ``k`` blocks of the space, for
   every ``k`` under a data-parallel plan, and half and all of them under other plans (each
   such price is a replay of a captured graph).
"""

import dataclasses
import heapq
import time
from collections.abc import Callable, Sequence

from ddlsim.data.errors import DdlsimError, InvalidOptionError
from ddlsim.data.specs.strategy import VOCAB_LAYOUTS, OpFusionPlan, Strategy
from ddlsim.search.algorithm import (
    Pricer,
    Progress,
    SearchAlgorithm,
    SearchBudget,
    SearchOutcome,
    SearchProblem,
    SpaceEvaluator,
    begin,
    finish,
    reporting,
)
from ddlsim.search.partitions import Cuts, cuts_of, even_cuts, strategy_of
from ddlsim.search.space import Space
from ddlsim.simulator.plans import is_data_parallel

# Besides DDP's defaults, every gradient alone and one bucket, the search starts from these
# numbers of buckets of about equal bytes: coarse coverage that the moves then refine.
SEED_BUCKETS = (2, 3, 4, 6, 8, 12, 16)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BacktrackOptions:
    """Budget and pruning of :func:`backtrack_fusion` and :func:`backtrack_all`."""

    budget: int = 2000
    time_limit_s: float = 60.0
    slack: float = 0.10
    top: int = 5
    dear: bool = True

    def __post_init__(self) -> None:
        if self.budget < 1 or not self.time_limit_s > 0 or self.slack < 0 or self.top < 1:
            raise InvalidOptionError(
                f"budget({self.budget}) and top({self.top}) must be >= 1, "
                f"time_limit_s({self.time_limit_s}) > 0 and slack({self.slack}) >= 0"
            )


class Backtrack(SearchAlgorithm):
    """DisCo-style backtracking: over fusion alone for a fusion-only problem
    (:func:`backtrack_fusion`), else over plans, fusion and compiled blocks
    (:func:`backtrack_all`). Deterministic: it draws nothing at random, so the seed is unused.

    Args:
        slack: how much slower than the best seen (0.10: 10 %) a partition may be and still be
            expanded.
    """

    name = "backtrack"

    def __init__(self, *, slack: float = 0.10) -> None:
        self.slack = slack

    def search(
        self, problem: SearchProblem, budget: SearchBudget, progress: Progress | None = None
    ) -> SearchOutcome:
        options = BacktrackOptions(
            budget=budget.evaluations,
            time_limit_s=budget.time_limit_s,
            slack=self.slack,
            top=budget.top,
            dear=problem.space.dear,
        )
        evaluator = problem.evaluator
        with reporting(evaluator, progress):
            if problem.fusion_only:
                return backtrack_fusion(evaluator, problem.order, problem.sizes, options)
            return backtrack_all(evaluator, problem.space, problem.order, problem.sizes, options)


def backtrack_fusion(
    evaluator: Pricer,
    order: Sequence[str],
    sizes: Sequence[int],
    options: BacktrackOptions | None = None,
) -> SearchOutcome:
    """Search bucket partitions of the gradients (ready ``order``, bytes ``sizes``) and DeAR
    under DDP's plan.

    Raises:
        InvalidOptionError: a model without gradients.
    """
    options = options or BacktrackOptions()
    begun = begin(evaluator, order)
    curve: list[float] = [begun.baseline_ms]
    priced = explore_fusion(
        evaluator,
        order,
        sizes,
        options,
        base=Strategy(),
        budget=options.budget,
        deadline=begun.start + options.time_limit_s,
        curve=curve,
    )
    return finish(begun, priced, evaluations=evaluator.evaluations, curve=curve, top=options.top)


def backtrack_all(
    evaluator: SpaceEvaluator,
    space: Space,
    order: Sequence[str],
    sizes: Sequence[int],
    options: BacktrackOptions | None = None,
) -> SearchOutcome:
    """Search ``space``: its plans x bucket partitions x DeAR x its compiled blocks. The
    outcome ranks every strategy priced; ``pruned`` counts the plans that did not fit the
    device or that the simulator could not schedule, by reason.

    Raises:
        InvalidOptionError: a model without gradients.

    Long: one backtracking loop over plans, partitions and blocks whose memo, bounds and pruning
    counts every step reads and updates.
    """
    options = options or BacktrackOptions()
    begun = begin(evaluator, order, fusion=space.tensor_fusion)
    baseline = begun.baseline
    deadline = begun.start + options.time_limit_s
    curve = [begun.baseline_ms]
    priced: dict[str, tuple[Strategy, float]] = {baseline.to_json(): (baseline, begun.baseline_ms)}
    pruned: dict[str, int] = {}

    def prune(reason: str) -> None:
        pruned[reason] = pruned.get(reason, 0) + 1

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
                prune(str(exc))
                continue
            priced[strategy.to_json()] = (strategy, ms)
            curve.append(min(curve[-1], ms))

    fitting = []
    for plan in space.plans:
        strategy = Strategy(parallel=plan)
        if evaluator.feasible(strategy):
            fitting.append(strategy)
        else:
            peak = evaluator.memory(strategy).total_gib
            prune(f"predicted peak {peak:.2f} GiB over capacity")
    record(fitting)
    data_parallel = sorted(
        (
            priced[s.to_json()]
            for s in fitting
            if s.to_json() in priced and is_data_parallel(s.parallel) and space.tensor_fusion
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

    def price_layers(strategies: Sequence[Strategy]) -> list[float | None]:
        record(strategies)
        return [priced[s.to_json()][1] if s.to_json() in priced else None for s in strategies]

    def spent() -> bool:
        return evaluator.evaluations >= options.budget or time.perf_counter() > deadline

    tensor_parallel = sorted(
        (priced[s.to_json()] for s in fitting if s.to_json() in priced and s.parallel.tp > 1),
        key=lambda item: item[1],
    )
    for base, _ in tensor_parallel:
        layouts = space.layer_layouts(base.parallel)
        if layouts and not spent():
            explore_layers(
                base,
                layouts,
                space.layer_blocks,
                price=price_layers,
                done=spent,
                stacks=space.layer_stacks,
            )
    blocks = space.blocks
    if blocks and time.perf_counter() < deadline:
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
    return finish(
        begun,
        priced.values(),
        evaluations=evaluator.evaluations,
        curve=curve,
        top=options.top,
        baseline_fits=fits,
        pruned=pruned,
    )


def explore_layers(
    base: Strategy,
    layouts: Sequence[str],
    blocks: int,
    *,
    price: Callable[[Sequence[Strategy]], list[float | None]],
    done: Callable[[], bool],
    stacks: Sequence[int] = (),
) -> Strategy:
    """Per-layer placements under ``base``'s tensor-parallel plan: the best of the uniform
    placements (every block ``tp``, ``replicate`` or ``batch``, the vocabulary split or whole;
    not everything whole, where every tensor-parallel rank would repeat the same work),
    then one block at a time moved to another layout (and the vocabulary's flipped) while that
    lowers the price, sweep after sweep, until a sweep changes nothing or ``done()``. Starting
    from the uniform ones, its result is never priced above the best uniform placement.
    ``price`` gives ``None`` for a strategy it could not price. ``stacks`` gives each block's
    stack where blocks of one stack must share a layout (T5's, whose first block computes the
    position bias the others read): a move then moves the whole stack. The best strategy
    found."""

    def placed(layers: Sequence[str], vocab: str) -> Strategy:
        uniform_tp = all(layout == "tp" for layout in layers)
        plan = dataclasses.replace(
            base.parallel, layers=() if uniform_tp else tuple(layers), vocab=vocab
        )
        return dataclasses.replace(base, parallel=plan)

    def idle(layers: Sequence[str], vocab: str) -> bool:
        # Every block and the vocabulary whole: the tensor-parallel ranks all compute the same
        # thing, which fewer ranks would do as well; not a placement worth offering.
        return vocab == "replicate" and all(layout == "replicate" for layout in layers)

    seeds: list[tuple[tuple[str, ...], str]] = [
        ((layout,) * blocks, vocab)
        for layout in layouts
        for vocab in VOCAB_LAYOUTS
        if not idle((layout,) * blocks, vocab)
    ]
    prices = price([placed(*seed) for seed in seeds])
    scored = [(ms, seed) for ms, seed in zip(prices, seeds, strict=True) if ms is not None]
    if not scored:
        return base
    best_ms, (layers, vocab) = min(scored, key=lambda item: item[0])
    improved = True
    while improved and not done():
        improved = False
        for index in range(blocks + 1):  # the last move flips the vocabulary
            if done():
                break
            moves: list[tuple[tuple[str, ...], str]]
            if index < blocks:
                together = [i for i in range(blocks) if stacks and stacks[i] == stacks[index]]
                if together and together[0] != index:
                    continue  # the stack moved with its first block
                moved_blocks = set(together or [index])
                moves = [
                    (tuple(alt if i in moved_blocks else x for i, x in enumerate(layers)), vocab)
                    for alt in layouts
                    if alt != layers[index]
                ]
            else:
                moves = [(layers, other) for other in VOCAB_LAYOUTS if other != vocab]
            moves = [move for move in moves if not idle(*move)]
            for (moved, moved_vocab), ms in zip(
                moves, price([placed(*move) for move in moves]), strict=True
            ):
                if ms is not None and ms < best_ms:
                    best_ms, layers, vocab, improved = ms, moved, moved_vocab, True
    return placed(layers, vocab)


def explore_fusion(
    evaluator: Pricer,
    order: Sequence[str],
    sizes: Sequence[int],
    options: BacktrackOptions,
    *,
    base: Strategy,
    budget: int,
    deadline: float,
    curve: list[float],
) -> list[tuple[Strategy, float]]:
    """The backtracking itself, under ``base``'s parallel plan and compiled blocks, until the
    evaluator has priced ``budget`` strategies in all or the clock passes ``deadline``
    (``time.perf_counter``); every partition priced, with its price. ``curve`` gets the best
    price so far after each evaluation (it starts from the caller's best)."""
    n = len(order)
    seeds: list[tuple[Cuts, bool]] = [
        (cuts_of(order, base, sizes), False),
        (tuple(range(1, n)), False),
        ((), False),
        *((even_cuts(sizes, k), False) for k in SEED_BUCKETS if k < n),
    ]
    if options.dear:
        seeds += [(cuts, True) for cuts, _ in seeds]
    priced: dict[tuple[Cuts, bool], float] = {}
    frontier: list[tuple[float, Cuts, bool]] = []
    expanded: set[tuple[Cuts, bool]] = set()
    best_ms = min(curve) if curve else float("inf")

    def price(states: list[tuple[Cuts, bool]]) -> None:
        nonlocal best_ms
        fresh = [s for s in dict.fromkeys(states) if s not in priced]
        fresh = fresh[: max(0, budget - evaluator.evaluations)]
        if not fresh:
            return
        times = evaluator.price([strategy_of(order, c, d, base) for c, d in fresh])
        for state, ms in zip(fresh, times, strict=True):
            priced[state] = ms
            best_ms = min(best_ms, ms)
            curve.append(best_ms)
            if ms <= best_ms * (1 + options.slack):
                heapq.heappush(frontier, (ms, *state))

    price(seeds)
    while frontier and evaluator.evaluations < budget and time.perf_counter() < deadline:
        ms, cuts, dear = heapq.heappop(frontier)
        if (cuts, dear) in expanded or ms > best_ms * (1 + options.slack):
            continue  # pruned since it was pushed: backtrack to the next best
        expanded.add((cuts, dear))
        price(_neighbours(cuts, dear, n, flip_dear=options.dear))
    return [(strategy_of(order, c, d, base), ms) for (c, d), ms in priced.items()]


def _neighbours(cuts: Cuts, dear: bool, n: int, *, flip_dear: bool) -> list[tuple[Cuts, bool]]:
    """Partitions one decision away: two adjacent buckets fused (a cut removed), a bucket split
    anywhere (a cut added), a boundary moved by one gradient, or DeAR flipped."""
    present = set(cuts)
    out: list[tuple[Cuts, bool]] = []
    for i in range(len(cuts)):
        out.append((cuts[:i] + cuts[i + 1 :], dear))
    for i, cut in enumerate(cuts):
        for moved in (cut - 1, cut + 1):
            if 0 < moved < n and moved not in present:
                out.append((tuple(sorted((*cuts[:i], moved, *cuts[i + 1 :]))), dear))
    out += [(tuple(sorted((*cuts, c))), dear) for c in range(1, n) if c not in present]
    if flip_dear:
        out.append((cuts, not dear))
    return out
