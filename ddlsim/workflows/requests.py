"""What each use case is asked: typed, validated, frozen requests, and the one home of their
defaults.

The command line and the REST API both build these and take their defaults from here
(:func:`defaults`), so that ``ddlsim search`` and ``POST /v1/strategy-requests`` cannot drift
apart; a test holds them together. Validation happens on construction and names the bad value.
A request that travels through the job queue is stored as :meth:`to_json` and read back with
:meth:`from_json`; the JSON keys are the REST API's field names.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.executor.run import MAX_SIDE_BY_SIDE, RunOptions
from ddlsim.plans.tp_plans import check_tensor_parallel
from ddlsim.simulator.calibration import DEFAULT_CONFIDENCE, check_confidence

Progress = Callable[[float | None, str], None]
"""``progress(fraction, message)``: how far a use case is (``None`` when it cannot tell) and
what it does now. It may raise to stop the work (a cancelled job); the use case lets that
exception through."""

SEARCH_ALGORITHMS = ("backtrack", "tpe", "cmaes", "nsga2", "random", "autotune")
OPTUNA_SAMPLERS = ("tpe", "cmaes", "nsga2", "random")
SEARCH_SPACES = ("all", "fusion")
SEARCH_PRIORS = ("analytic", "none")
OPTIMIZERS = ("adamw", "sgd")


def no_progress(fraction: float | None, message: str) -> None:
    """A :data:`Progress` that listens to nothing."""


def defaults(request_type: type) -> dict[str, Any]:
    """The default of every field of a request type that has one, by field name."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(request_type):
        if field.default is not dataclasses.MISSING:
            out[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            out[field.name] = field.default_factory()
    return out


def _at_least(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidOptionError(f"{name}({value!r}) must be an integer >= {low}")


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InvalidOptionError(f"{name}({value!r}) is not one of {', '.join(allowed)}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class MeasureSettings:
    """The measurement protocol's settings (:mod:`ddlsim.executor.protocol`) for the runs a
    use case makes: at least ``iters`` measured steps a turn and ``warmup`` warm-up steps, then
    more until the median's 95 % interval is within ``±ci_target`` or ``budget_s`` seconds a
    strategy are spent beyond the minimums (0: exactly the minimums)."""

    iters: int = 10
    warmup: int = 2
    ci_target: float = 0.01
    budget_s: float = 30.0

    def __post_init__(self) -> None:
        _at_least("iters", self.iters, 1)
        _at_least("warmup", self.warmup, 0)
        if not 0 < self.ci_target < 1:
            raise InvalidOptionError(f"ci_target({self.ci_target}) must be in (0, 1), e.g. 0.01")
        if not self.budget_s >= 0:
            raise InvalidOptionError(f"measure_budget_s({self.budget_s}) must be >= 0 seconds")

    def run_options(self) -> dict[str, Any]:
        """:class:`~ddlsim.executor.run.RunOptions` keywords (the same names)."""
        return dataclasses.asdict(self)


SEARCH_MEASURE = MeasureSettings(iters=6)
"""A search's verifying runs (and autotune's) take turns of 6 steps."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PredictRequest:
    """Predict ``strategy``'s iteration time for ``model`` (its global batch) on
    ``world_size`` ranks over ``bandwidth`` (``None``: an unshaped link), with the cost model
    ``simulator`` (``None``: the trained, else the shipped one; ``"replay"``: the replay alone;
    else a checkpoint path). A missing kernel profile of the rank's micro-batch is taken
    (``profile_iters`` iterations) unless ``profile_missing`` is false."""

    model: ModelSpec
    strategy: Strategy = dataclasses.field(default_factory=Strategy)
    world_size: int = 1
    bandwidth: str | None = None
    optimizer: str = "adamw"
    profile_iters: int = 10
    profile_missing: bool = True
    simulator: str | None = None

    def __post_init__(self) -> None:
        _at_least("world_size", self.world_size, 1)
        _at_least("profile_iters", self.profile_iters, 1)
        _one_of("optimizer", self.optimizer, OPTIMIZERS)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SearchRequest:
    """Search the fastest strategy for ``model`` on ``world_size`` ranks over ``bandwidth``.

    ``algo`` and ``space`` choose the search (:data:`SEARCH_ALGORITHMS`, :data:`SEARCH_SPACES`);
    it prices at most ``budget`` strategies (autotune: live runs) within ``time_limit_s``.
    Plans predicted over ``memory_gb`` a device are pruned (``None``: this machine's memory
    over the ranks). ``confidence`` scores each candidate at that quantile of its kind's
    held-out speed-up errors (``None``: the predicted time alone). Optuna samplers keep their
    study in ``storage`` (``None``: in memory, or a temporary journal with ``workers`` > 1).
    ``verify`` runs the first ``verify_top`` candidates (at most ``top``) beside DDP's defaults on
    the executor, ``verify_rounds`` turns each, under ``measure``, and answers with what was
    measured (:func:`ddlsim.workflows.verify.verify`). ``prior`` (:data:`SEARCH_PRIORS`)
    orders and prunes the grid plans by the analytical model before any is scored
    (``search/prior.py``).
    """

    model: ModelSpec
    world_size: int
    bandwidth: str | None = None
    algo: str = "backtrack"
    space: str = "all"
    budget: int = 2000
    time_limit_s: float = 60.0
    memory_gb: float | None = None
    top: int = 5
    confidence: float | None = DEFAULT_CONFIDENCE
    seed: int = 0
    storage: str | None = None
    study_name: str | None = None
    workers: int = 1
    profile_iters: int = 10
    simulator: str | None = None
    verify: bool = False
    verify_rounds: int = 3
    verify_top: int = 3
    measure: MeasureSettings = SEARCH_MEASURE
    prior: str = "analytic"

    def __post_init__(self) -> None:
        _one_of("prior", self.prior, SEARCH_PRIORS)
        if self.world_size < 2:
            raise InvalidOptionError(
                f"world_size({self.world_size}) must be >= 2: a search splits work between ranks"
            )
        _one_of("algo", self.algo, SEARCH_ALGORITHMS)
        _one_of("space", self.space, SEARCH_SPACES)
        for name in ("budget", "top", "workers", "profile_iters", "verify_rounds", "verify_top"):
            _at_least(name, getattr(self, name), 1)
        if not self.time_limit_s > 0:
            raise InvalidOptionError(f"time_limit({self.time_limit_s}) must be > 0 seconds")
        if self.confidence is not None:
            check_confidence(self.confidence)
        if self.memory_gb is not None and not self.memory_gb > 0:
            raise InvalidOptionError(f"memory_gb({self.memory_gb}) must be > 0")
        if self.verify_top > MAX_SIDE_BY_SIDE - 1:
            raise InvalidOptionError(
                f"verify_top({self.verify_top}) must be <= {MAX_SIDE_BY_SIDE - 1} (the "
                "candidates and DDP's defaults run in one launch)"
            )
        # The baseline, DDP's defaults, splits the batch over every rank.
        ParallelPlan().rank_batch_size(self.model.inputs.batch_size, self.world_size)
        if self.workers > 1 and self.algo not in OPTUNA_SAMPLERS:
            raise InvalidOptionError(
                f"workers({self.workers}) > 1 needs an Optuna sampler (--algo "
                f"{'|'.join(OPTUNA_SAMPLERS)}); {self.algo} runs in one process"
            )

    def to_json(self) -> dict[str, Any]:
        """The request as the job queue stores it (the REST API's field names)."""
        out = {
            "model": self.model.to_dict(),
            "world_size": self.world_size,
            "bandwidth": self.bandwidth,
            "algo": self.algo,
            "space": self.space,
            "budget": self.budget,
            "time_limit": self.time_limit_s,
            "memory_gb": self.memory_gb,
            "top": self.top,
            "confidence": self.confidence,
            "seed": self.seed,
            "verify": self.verify,
            "verify_rounds": self.verify_rounds,
            "verify_top": self.verify_top,
            "profile_iters": self.profile_iters,
        }
        return {**out, **_measure_json(self.measure)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "SearchRequest":
        """A request stored by :meth:`to_json` (or by the REST API, which uses its keys).

        Raises:
            InvalidOptionError: a value out of range, a key that is not a search option.
            InvalidModelSpecError: a bad model spec.
        """
        given = dict(raw)
        measure = _measure_of(given, SEARCH_MEASURE)
        model = ModelSpec.from_dict(given.pop("model"))
        if "time_limit" in given:
            given["time_limit_s"] = given.pop("time_limit")
        # Set by whoever runs a queued search, never by its requester.
        local = {"model", "measure", "storage", "study_name", "workers", "simulator"}
        _known(given, cls, exclude=local)
        return cls(model=model, measure=measure, **given)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ExecuteRequest:
    """Run ``strategy`` for real on ``model`` under ``options`` (ranks, link, protocol,
    limits), store the measurement and, on more than one rank, the simulator's prediction of
    the same strategy beside it (``predict``; cost model ``simulator`` as in
    :class:`PredictRequest`)."""

    model: ModelSpec
    strategy: Strategy = dataclasses.field(default_factory=Strategy)
    options: RunOptions = dataclasses.field(default_factory=RunOptions)
    predict: bool = False
    simulator: str | None = None

    def __post_init__(self) -> None:
        plan = self.strategy.parallel
        plan.rank_batch_size(self.model.inputs.batch_size, self.options.world_size)
        if plan.tp > 1 and not plan.grid:
            check_tensor_parallel(self.model, plan.tp)

    def to_json(self) -> dict[str, Any]:
        """The request as the job queue stores it (the REST API's field names)."""
        o = self.options
        return {
            "model": self.model.to_dict(),
            "strategy": self.strategy.to_dict(),
            "world_size": o.world_size,
            "bandwidth": o.bandwidth,
            "seed": o.seed,
            "trace": o.trace,
            **_measure_json(
                MeasureSettings(
                    iters=o.iters, warmup=o.warmup, ci_target=o.ci_target, budget_s=o.budget_s
                )
            ),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], *, predict: bool = True) -> "ExecuteRequest":
        """A request stored by :meth:`to_json` (or by the REST API, which uses its keys).

        Raises:
            InvalidOptionError: a value out of range, a key that is not an execution option.
        """
        given = dict(raw)
        measure = _measure_of(given, MeasureSettings())
        model = ModelSpec.from_dict(given.pop("model"))
        strategy = Strategy.from_dict(given.pop("strategy") or {})
        allowed = {"world_size", "bandwidth", "seed", "trace"}
        unknown = sorted(set(given) - allowed)
        if unknown:
            raise InvalidOptionError(
                f"unknown execution option(s) {unknown}; allowed: {sorted(allowed)}"
            )
        options = RunOptions(**given, **measure.run_options())
        return cls(model=model, strategy=strategy, options=options, predict=predict)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ValidateRequest:
    """Predict and run the first ``strategies`` of a diverse list of strategies for ``model``
    on ``world_size`` ranks over ``bandwidth``, under ``measure``, and compare; the link and the
    rank's micro-batch are profiled first when the store lacks them."""

    model: ModelSpec
    world_size: int = 2
    bandwidth: str | None = "1gbit"
    strategies: int = 6
    profile_iters: int = 10
    simulator: str | None = None
    measure: MeasureSettings = SEARCH_MEASURE

    def __post_init__(self) -> None:
        for name in ("world_size", "strategies", "profile_iters"):
            _at_least(name, getattr(self, name), 1)


# ----- helpers -----------------------------------------------------------------------------------


def _measure_json(measure: MeasureSettings) -> dict[str, Any]:
    """The protocol's settings under the REST API's names."""
    named = measure.run_options()
    named["measure_budget_s"] = named.pop("budget_s")
    return named


def _measure_of(given: dict[str, Any], default: MeasureSettings) -> MeasureSettings:
    """Pops the protocol's keys (REST names) from ``given``."""
    return MeasureSettings(
        iters=given.pop("iters", default.iters),
        warmup=given.pop("warmup", default.warmup),
        ci_target=given.pop("ci_target", default.ci_target),
        budget_s=given.pop("measure_budget_s", default.budget_s),
    )


def _known(given: Mapping[str, Any], request_type: type, *, exclude: set[str]) -> None:
    allowed = {f.name for f in dataclasses.fields(request_type)} - exclude
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise InvalidOptionError(
            f"unknown option(s) {unknown} for {request_type.__name__}; allowed: {sorted(allowed)}"
        )
