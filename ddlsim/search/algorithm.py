"""One interface for every strategy search: what is searched, within what budget, what comes back.

A :class:`SearchAlgorithm` takes a :class:`SearchProblem` (the evaluator that prices strategies,
the :class:`Space` of plans, fusion and compiled blocks, the gradients in ready order, and for a
search on live runs the function that measures one) and a :class:`SearchBudget` (evaluations,
seconds, how many candidates to keep, the seed) and returns a :class:`SearchOutcome`. The
algorithms are chosen by name through :mod:`search.registry`. :func:`begin` and :func:`finish`
are the bookkeeping every simulator search shares: DDP's defaults priced first as the baseline,
and the ranked result.
"""

import abc
import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import ClassVar, Protocol

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.search.space import Space

Progress = Callable[[int], None]
"""``progress(n)``: ``n`` more strategies were priced (or, searching live runs, measured)."""


class Pricer(Protocol):
    """What a search needs of an evaluator: memoised prices (ms) of strategies, in batches, how
    many distinct strategies it has priced, and a hook told how many each call priced anew."""

    on_priced: Progress | None

    @property
    def evaluations(self) -> int: ...

    def price(self, strategies: Sequence[Strategy]) -> list[float]: ...


class PeakMemory(Protocol):
    """A strategy's predicted peak memory per device."""

    @property
    def total_gib(self) -> float: ...


class SpaceEvaluator(Pricer, Protocol):
    """A :class:`Pricer` of the whole space, which also says whether a strategy's plan fits the
    device and predicts its peak memory (:class:`search.strategy_evaluator.StrategyEvaluator`)."""

    def feasible(self, strategy: Strategy) -> bool: ...

    def memory(self, strategy: Strategy) -> PeakMemory: ...


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SearchBudget:
    """How much a search may spend: ``evaluations`` distinct strategies priced (live runs for a
    search that measures), ``time_limit_s`` seconds of wall time; it keeps the ``top``
    candidates, and ``seed`` seeds whatever it draws at random.

    Raises:
        InvalidOptionError: ``evaluations`` or ``top`` below 1, a time limit not above 0.
    """

    evaluations: int = 2000
    time_limit_s: float = 60.0
    top: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.evaluations < 1 or self.top < 1 or not self.time_limit_s > 0:
            raise InvalidOptionError(
                f"evaluations({self.evaluations}) and top({self.top}) must be >= 1 and "
                f"time_limit_s({self.time_limit_s}) > 0"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchProblem:
    """What is searched: strategies of one model on one cluster.

    ``evaluator`` prices them (ms; memoised, so a strategy seen twice costs once), ``space``
    says which plans, fusion choices and compiled blocks a search may pick, ``order`` and
    ``sizes`` are the gradients in the order they become ready and their bytes (bucket
    partitions cut this order). ``fusion_only``: the search keeps DDP's plan and searches tensor
    fusion alone (the space then holds DDP's plan only and no blocks). ``measure`` returns a
    strategy's measured iteration time (ms) from a live run, for searches without the simulator.

    Raises:
        InvalidOptionError: ``order`` and ``sizes`` of different lengths, or a fusion-only
            problem whose space holds other plans or blocks.
    """

    evaluator: SpaceEvaluator
    space: Space
    order: Sequence[str]
    sizes: Sequence[int]
    fusion_only: bool = False
    measure: Callable[[Strategy], float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", tuple(self.order))
        object.__setattr__(self, "sizes", tuple(self.sizes))
        if len(self.order) != len(self.sizes):
            raise InvalidOptionError(
                f"order({len(self.order)} gradients) and sizes({len(self.sizes)}) differ"
            )
        if self.fusion_only and (self.space.plans != (ParallelPlan(),) or self.space.blocks):
            raise InvalidOptionError(
                f"a fusion-only search keeps DDP's plan; its space has {len(self.space.plans)} "
                f"plans and {len(self.space.blocks)} blocks"
            )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ParetoPoint:
    """A strategy of a two-objective search's Pareto front: its score (the evaluator's price,
    ms) and its predicted peak memory per device (GiB)."""

    strategy: Strategy
    scored_ms: float
    peak_memory_gib: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchOutcome:
    """What a search found.

    Times are the evaluator's prices in ms (the prediction, scored by a calibration where the
    evaluator has one), or measured times for a search on live runs. ``best`` is the fastest
    strategy priced, or DDP's defaults (``baseline``) when nothing beat them; ``top`` the
    fastest ``top`` candidates, fastest first; ``evaluations`` the distinct strategies priced;
    ``curve`` the best price after each evaluation (the convergence curve). ``pareto`` is a
    two-objective search's front, fastest first; ``pruned`` counts the strategies never priced,
    by reason (a plan over the device's memory, one the simulator cannot schedule).
    """

    best: Strategy
    best_ms: float
    baseline: Strategy
    baseline_ms: float
    top: tuple[tuple[Strategy, float], ...]
    evaluations: int
    elapsed_s: float
    curve: tuple[float, ...]
    pareto: tuple[ParetoPoint, ...] = ()
    pruned: Mapping[str, int] = dataclasses.field(default_factory=dict)


class SearchAlgorithm(abc.ABC):
    """A strategy search, chosen by :attr:`name` (:func:`search.registry.search_algorithm`).

    Contract of :meth:`search`:

    - It prices strategies of ``problem.space`` with ``problem.evaluator`` (or measures them
      with ``problem.measure``) and returns the best it found; times are in ms.
    - It starts from DDP's defaults, the baseline, priced as the reference. It never prices a
      strategy of another plan that the evaluator says does not fit the device (the
      reasons are counted in ``pruned``), and picks the baseline only if it fits.
    - It prices at most ``budget.evaluations`` distinct strategies, counted as the evaluator
      counts them (a search that shares an Optuna study counts finished trials: the baseline is
      priced besides them), and stops starting new work once ``budget.time_limit_s`` seconds have
      passed; the work in flight then finishes (one batch, trial or run).
    - ``progress(n)``, when given, is called from the searching thread with the number of
      strategies newly priced (or runs measured) each time some are; the evaluator's own
      ``on_priced`` hook is set to it for the search and restored after.
    - With the same problem, budget and seed, and the time limit not reached, it returns the
      same strategies, prices and curve (``elapsed_s`` aside).
    - It is not thread-safe: it mutates the evaluator (memo, hook). One search at a time per
      evaluator; searches that share an Optuna study run in separate processes.
    """

    name: ClassVar[str]

    @abc.abstractmethod
    def search(
        self, problem: SearchProblem, budget: SearchBudget, progress: Progress | None = None
    ) -> SearchOutcome:
        """Search ``problem`` within ``budget`` (see the class docstring).

        Raises:
            InvalidOptionError: a problem this algorithm cannot search (a model without
                gradients; no ``measure`` for a search on live runs; a study's storage Optuna
                cannot open).
        """


@contextlib.contextmanager
def reporting(evaluator: Pricer, progress: Progress | None) -> Iterator[None]:
    """``progress`` hears of every strategy ``evaluator`` newly prices inside the block: its
    ``on_priced`` hook, restored after (left as it is without ``progress``)."""
    if progress is None:
        yield
        return
    before = evaluator.on_priced
    evaluator.on_priced = progress
    try:
        yield
    finally:
        evaluator.on_priced = before


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SearchStart:
    """A search's start (:func:`begin`): its clock (``time.perf_counter()``, s) and DDP's
    defaults, the baseline, priced (ms)."""

    start: float
    baseline: Strategy
    baseline_ms: float


def begin(evaluator: Pricer, order: Sequence[str], *, fusion: bool = True) -> SearchStart:
    """A search's start: its clock, and DDP's defaults (the baseline) priced.

    Raises:
        InvalidOptionError: a model without gradients, where tensor fusion is searched
            (``fusion``).
    """
    if fusion and not order:
        raise InvalidOptionError("the model has no gradients to bucket")
    start = time.perf_counter()
    baseline = Strategy()
    (baseline_ms,) = evaluator.price([baseline])
    return SearchStart(start=start, baseline=baseline, baseline_ms=baseline_ms)


def finish(
    begun: SearchStart,
    priced: Iterable[tuple[Strategy, float]],
    *,
    evaluations: int,
    curve: Sequence[float],
    top: int,
    baseline_fits: bool = True,
    pruned: Mapping[str, int] | None = None,
    pareto: Sequence[ParetoPoint] = (),
) -> SearchOutcome:
    """The outcome of a search that began with ``begun`` and ``priced`` these candidates
    (``evaluations`` distinct strategies in all): the ``top`` fastest, fastest first; the
    baseline stays the best when nothing beat it, unless it does not fit the device."""
    ranked = sorted(priced, key=lambda item: item[1])
    bar = begun.baseline_ms if baseline_fits else float("inf")
    best, best_ms = (
        ranked[0] if ranked and ranked[0][1] < bar else (begun.baseline, begun.baseline_ms)
    )
    return SearchOutcome(
        best=best,
        best_ms=best_ms,
        baseline=begun.baseline,
        baseline_ms=begun.baseline_ms,
        top=tuple(ranked[:top]),
        evaluations=evaluations,
        elapsed_s=time.perf_counter() - begun.start,
        curve=tuple(curve),
        pareto=tuple(pareto),
        pruned=dict(pruned or {}),
    )
