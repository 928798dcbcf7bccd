"""Backtracking over tensor-fusion decisions (after DisCo's search), driven by the simulator.

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
"""

import dataclasses
import heapq
import itertools
import time
from collections.abc import Sequence

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import Strategy, TensorFusionPlan
from ddlsim.search.fusion_evaluator import Pricer

Cuts = tuple[int, ...]
# Besides DDP's defaults, every gradient alone and one bucket, the search starts from these
# numbers of buckets of about equal bytes: coarse coverage that the moves then refine.
SEED_BUCKETS = (2, 3, 4, 6, 8, 12, 16)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchResult:
    """The best strategy found, the baseline, the ``top`` k, and the best price after each
    evaluation (the convergence curve)."""

    best: Strategy
    best_ms: float
    baseline: Strategy
    baseline_ms: float
    top: tuple[tuple[Strategy, float], ...]
    evaluations: int
    elapsed_s: float
    curve: tuple[float, ...]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BacktrackOptions:
    """Budget and pruning of :func:`backtrack_fusion`."""

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


def begin(evaluator: Pricer, order: Sequence[str]) -> tuple[float, Strategy, float]:
    """A search's start: its clock, and DDP's defaults (the baseline) priced.

    Raises:
        InvalidOptionError: a model without gradients.
    """
    if not order:
        raise InvalidOptionError("the model has no gradients to bucket")
    start = time.perf_counter()
    baseline = Strategy()
    (baseline_ms,) = evaluator.price([baseline])
    return start, baseline, baseline_ms


def finish(
    evaluator: Pricer,
    ranked: Sequence[tuple[Strategy, float]],
    *,
    baseline: Strategy,
    baseline_ms: float,
    start: float,
    curve: Sequence[float],
    top: int,
    baseline_fits: bool = True,
) -> SearchResult:
    """The result of a search whose priced candidates are ``ranked`` (fastest first); the
    baseline stays the best when nothing beat it, unless it does not fit the device."""
    bar = baseline_ms if baseline_fits else float("inf")
    best, best_ms = ranked[0] if ranked and ranked[0][1] < bar else (baseline, baseline_ms)
    return SearchResult(
        best=best,
        best_ms=best_ms,
        baseline=baseline,
        baseline_ms=baseline_ms,
        top=tuple(ranked[:top]),
        evaluations=evaluator.evaluations,
        elapsed_s=time.perf_counter() - start,
        curve=tuple(curve),
    )


def strategy_of(
    order: Sequence[str], cuts: Cuts, dear: bool, base: Strategy | None = None
) -> Strategy:
    """Buckets of the gradients in ready ``order`` cut before each index in ``cuts``; the
    parallel plan and compiled blocks of ``base`` (DDP's by default)."""
    bounds = [0, *cuts, len(order)]
    buckets = tuple(tuple(order[a:b]) for a, b in itertools.pairwise(bounds))
    return dataclasses.replace(
        base or Strategy(), tensor_fusion=TensorFusionPlan(buckets=buckets, dear=dear)
    )


def cuts_of(order: Sequence[str], strategy: Strategy, sizes: Sequence[int]) -> Cuts:
    """Where ``strategy``'s buckets cut the ready ``order`` (buckets that are not contiguous
    runs of it are read as the runs they start)."""
    position = {name: i for i, name in enumerate(order)}
    buckets = strategy.tensor_fusion.assign(list(zip(order, sizes, strict=True)))
    starts = sorted({min(position[p] for p in b.params) for b in buckets})
    return tuple(s for s in starts if s > 0)


def backtrack_fusion(
    evaluator: Pricer,
    order: Sequence[str],
    sizes: Sequence[int],
    options: BacktrackOptions | None = None,
) -> SearchResult:
    """Search bucket partitions of the gradients (ready ``order``, bytes ``sizes``) and DeAR
    under DDP's plan.

    Raises:
        InvalidOptionError: a model without gradients.
    """
    options = options or BacktrackOptions()
    start, baseline, baseline_ms = begin(evaluator, order)
    curve: list[float] = [baseline_ms]
    priced = explore_fusion(
        evaluator,
        order,
        sizes,
        options,
        base=Strategy(),
        budget=options.budget,
        deadline=start + options.time_limit_s,
        curve=curve,
    )
    ranked = sorted(priced, key=lambda item: item[1])
    return finish(
        evaluator,
        ranked[: options.top],
        baseline=baseline,
        baseline_ms=baseline_ms,
        start=start,
        curve=curve,
        top=options.top,
    )


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


def even_cuts(sizes: Sequence[int], buckets: int) -> Cuts:
    """Cuts into ``buckets`` runs of about equal bytes."""
    total = sum(sizes) or 1
    cuts: list[int] = []
    running = 0
    for index, size in enumerate(sizes[:-1], start=1):
        running += size
        if running * buckets >= total * (len(cuts) + 1):
            cuts.append(index)
    return tuple(cuts[: buckets - 1])


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
