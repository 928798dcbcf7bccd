"""Optuna samplers over the strategy space: TPE, CMA-ES, NSGA-II and random sampling.

A trial draws a point of the :class:`search.space.Space` (a plan by name; under a data-parallel
plan a bucket cap, the first bucket's share of it and DeAR; how many blocks are compiled). The
objective is the simulator's price; NSGA-II minimises the price and the predicted peak memory
per device together and keeps their Pareto front. A plan whose predicted peak exceeds the
device's capacity, or that the simulator cannot schedule, is pruned (``TrialPruned``), never
scored. CMA-ES adapts a Gaussian over the continuous parameters (the categorical ones are drawn
independently).

The study lives in ``storage`` when one is given, in memory otherwise: an RDB URL (SQLite or
PostgreSQL), or ``journal:///PATH``, Optuna's append-only journal file, which several processes
share through a file lock (on one machine, or many over a shared file system) at a fraction of an
RDB's cost a trial: the samplers read every trial each time, and an RDB answers that with a
query where the journal replays only what it has not seen. Processes share a study by name and
each sees the others' trials. Results are read back from the study, so a search reports what
every worker found. :class:`OptunaSearch` runs a search; given ``helpers``, it hands the open
study (:class:`SharedStudy`) to the caller, who starts extra worker processes that each call
:meth:`OptunaSearch.work` on it.
"""

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Literal

import optuna
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.study import MaxTrialsCallback, StudyDirection
from optuna.trial import TrialState
from sqlalchemy.exc import SQLAlchemyError

from ddlsim.data.errors import DdlsimError, InvalidOptionError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store.database import mask_url, redact
from ddlsim.search.algorithm import (
    ParetoPoint,
    Progress,
    SearchAlgorithm,
    SearchBudget,
    SearchOutcome,
    SearchProblem,
    SearchStart,
    SpaceEvaluator,
    begin,
    finish,
    reporting,
)
from ddlsim.search.space import Space

Sampler = Literal["tpe", "cmaes", "nsga2", "random"]
SAMPLERS: tuple[Sampler, ...] = ("tpe", "cmaes", "nsga2", "random")
JOURNAL = "journal://"
OVER_CAPACITY = "predicted peak memory over the device's capacity"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StudyOptions:
    """Where the study lives, its name, and the sampler's seed."""

    storage: str | None = None
    study_name: str = "ddlsim-search"
    seed: int = 0


def sampler_for(
    name: Sampler, seed: int, *, startup_trials: int = 10
) -> optuna.samplers.BaseSampler:
    """The Optuna sampler called ``name``.

    Raises:
        InvalidOptionError: an unknown name.
    """
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(
            seed=seed, n_startup_trials=startup_trials, warn_independent_sampling=False
        )
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(8, startup_trials))
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise InvalidOptionError(f"sampler {name!r} is not one of {', '.join(SAMPLERS)}")


def open_study(sampler: Sampler, study: StudyOptions, *, worker: int = 0) -> optuna.Study:
    """Create or load the study (worker ``k`` seeds its sampler with ``seed + k``).

    Raises:
        InvalidOptionError: a storage URL Optuna cannot open.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    directions: list[StudyDirection] = [StudyDirection.MINIMIZE] * (2 if sampler == "nsga2" else 1)
    storage: str | optuna.storages.BaseStorage | None = study.storage
    try:
        if study.storage is not None and study.storage.startswith(JOURNAL):
            path = Path(study.storage.removeprefix(JOURNAL))
            if not path.parent.is_dir():
                raise ValueError(f"no directory {str(path.parent)!r} for the journal file")
            storage = JournalStorage(JournalFileBackend(str(path)))
        elif study.storage is not None and study.storage.startswith("sqlite"):
            # Workers write one SQLite file at once: wait for its lock rather than fail.
            storage = optuna.storages.RDBStorage(
                study.storage, engine_kwargs={"connect_args": {"timeout": 60}}
            )
        return optuna.create_study(
            storage=storage,
            study_name=study.study_name,
            sampler=sampler_for(sampler, study.seed + worker),
            directions=directions,
            load_if_exists=True,
        )
    except (
        ValueError,
        ImportError,
        RuntimeError,
        OSError,
        SQLAlchemyError,
    ) as exc:  # bad URL or driver
        url = str(study.storage)
        raise InvalidOptionError(
            f"storage {mask_url(url)!r} cannot hold an Optuna study: {redact(str(exc), url)}"
        ) from None


def optimize(
    trials: optuna.Study,
    evaluator: SpaceEvaluator,
    space: Space,
    *,
    budget: int,
    deadline: float,
) -> None:
    """Run trials until the study holds ``budget`` finished trials in all (this worker's and
    any other's: see :func:`finished_trials`) or the clock (``time.perf_counter``) passes
    ``deadline``."""
    multi = len(trials.directions) > 1

    def objective(trial: optuna.Trial) -> float | tuple[float, float]:
        strategy = space.strategy(space.sample(trial))
        trial.set_user_attr("strategy", strategy.to_json())
        try:
            feasible = evaluator.feasible(strategy)
            if not feasible:
                trial.set_user_attr("peak_memory_gib", evaluator.memory(strategy).total_gib)
                trial.set_user_attr("pruned", OVER_CAPACITY)
                raise optuna.TrialPruned()
            (ms,) = evaluator.price([strategy])
        except DdlsimError as exc:  # a plan the simulator cannot schedule for this model
            trial.set_user_attr("pruned", str(exc))
            raise optuna.TrialPruned() from None
        if multi:
            return ms, evaluator.memory(strategy).total_gib
        return ms

    states = (TrialState.COMPLETE, TrialState.PRUNED)
    trials.optimize(
        objective,
        timeout=max(0.0, deadline - time.perf_counter()),
        callbacks=[MaxTrialsCallback(budget, states=states)],
    )


def finished_trials(trials: optuna.Study) -> int:
    """Trials of the study that are complete or pruned (a search adds its budget to these)."""
    return len(trials.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def outcome_from_study(
    trials: optuna.Study,
    space: Space,
    begun: SearchStart,
    *,
    top: int,
    baseline_fits: bool = True,
) -> SearchOutcome:
    """The search's outcome from every finished trial of the study: the ``top`` fastest, for a
    two-objective study its Pareto front of (time, peak memory), fastest first, and the pruned
    trials by reason."""
    done = sorted(
        (t for t in trials.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE),
        key=lambda t: t.number,
    )
    curve = [begun.baseline_ms]
    priced: dict[str, tuple[Strategy, float]] = {}
    for t in done:
        strategy = space.strategy(t.params)
        ms = float(t.values[0])
        priced.setdefault(strategy.to_json(), (strategy, ms))
        curve.append(min(curve[-1], ms))
    pareto: list[ParetoPoint] = []
    if len(trials.directions) > 1 and done:
        front = {
            space.strategy(t.params).to_json(): (space.strategy(t.params), t.values)
            for t in trials.best_trials
        }
        pareto = [
            ParetoPoint(strategy=s, scored_ms=v[0], peak_memory_gib=v[1])
            for s, v in sorted(front.values(), key=lambda item: item[1][0])
        ]
    return finish(
        begun,
        priced.values(),
        evaluations=len(priced),
        curve=curve,
        top=top,
        baseline_fits=baseline_fits,
        pruned=pruned_reasons(trials),
        pareto=pareto,
    )


def pruned_reasons(trials: optuna.Study) -> dict[str, int]:
    """How many trials were pruned, by reason."""
    out: dict[str, int] = {}
    for t in trials.get_trials(deepcopy=False, states=(TrialState.PRUNED,)):
        reason = str(t.user_attrs.get("pruned", "pruned"))
        out[reason] = out.get(reason, 0) + 1
    return out


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SharedStudy:
    """An open search's study, as extra worker processes join it (picklable: it crosses a
    process spawn): its sampler, where it lives, its name and seed, the finished trials that end
    the search (``target_trials``: those before it plus its budget), and the seconds left to it
    when it was handed over."""

    sampler: Sampler
    storage: str
    study_name: str
    seed: int
    target_trials: int
    seconds_left: float


Helpers = Callable[[SharedStudy], AbstractContextManager[object]]
"""Given the open study, a context in which extra workers run on it: started on entry, all
finished (joined) on exit, which raises if one failed."""


class OptunaSearch(SearchAlgorithm):
    """An Optuna sampler over the problem's space (:attr:`sampler`), its study in ``storage``
    (``None``: in memory) under ``study_name``.

    A search prices DDP's defaults first (the baseline), then runs trials until the study holds
    ``budget.evaluations`` more finished (complete or pruned) trials than when it opened, or the
    time limit passes; its outcome is read back from every trial of the study, so it includes
    what other workers found. The sampler is seeded with ``budget.seed``; with ``helpers``, the
    search calls them once the study is open and runs its own trials inside the context they
    return, where the caller's extra processes each call :meth:`work` (worker ``k`` seeds its
    sampler with ``seed + k``). Without a ``storage``, helpers share a temporary journal file.
    """

    sampler: Sampler

    def __init__(
        self,
        *,
        storage: str | None = None,
        study_name: str = "ddlsim-search",
        helpers: Helpers | None = None,
    ) -> None:
        self.storage = storage
        self.study_name = study_name
        self.helpers = helpers

    def search(
        self, problem: SearchProblem, budget: SearchBudget, progress: Progress | None = None
    ) -> SearchOutcome:
        evaluator = problem.evaluator
        with reporting(evaluator, progress):
            begun = begin(evaluator, problem.order, fusion=problem.space.tensor_fusion)
            with tempfile.TemporaryDirectory(prefix="ddlsim-study-") as scratch:
                storage = self.storage
                if storage is None and self.helpers is not None:
                    storage = f"{JOURNAL}{Path(scratch) / 'study.log'}"
                study = StudyOptions(storage=storage, study_name=self.study_name, seed=budget.seed)
                trials = open_study(self.sampler, study)
                # The budget is this search's: trials already in a shared study do not count.
                target = finished_trials(trials) + budget.evaluations
                deadline = begun.start + budget.time_limit_s
                with self._helping(study, target, deadline):
                    optimize(trials, evaluator, problem.space, budget=target, deadline=deadline)
                return outcome_from_study(
                    trials,
                    problem.space,
                    begun,
                    top=budget.top,
                    baseline_fits=evaluator.feasible(begun.baseline),
                )

    def work(
        self, study: SharedStudy, problem: Callable[[], SearchProblem], *, worker: int
    ) -> None:
        """Run as extra worker ``worker`` (>= 1) on ``study``, in this process: trials priced
        with the evaluator of ``problem()`` (built after the clock starts, as the search's own
        time runs) until the study holds ``study.target_trials`` finished trials or
        ``study.seconds_left`` have passed since this call. Its sampler is seeded
        ``study.seed + worker``. It reports nothing: the search reads the trials back.

        Raises:
            InvalidOptionError: a study of another sampler, or a storage Optuna cannot open.
        """
        deadline = time.perf_counter() + study.seconds_left
        if study.sampler != self.sampler:
            raise InvalidOptionError(
                f"a {self.sampler} worker cannot join a {study.sampler} study "
                f"({study.study_name!r})"
            )
        built = problem()
        options = StudyOptions(storage=study.storage, study_name=study.study_name, seed=study.seed)
        trials = open_study(self.sampler, options, worker=worker)
        optimize(
            trials, built.evaluator, built.space, budget=study.target_trials, deadline=deadline
        )

    def _helping(
        self, study: StudyOptions, target: int, deadline: float
    ) -> AbstractContextManager[object]:
        if self.helpers is None or study.storage is None:
            return contextlib.nullcontext()
        shared = SharedStudy(
            sampler=self.sampler,
            storage=study.storage,
            study_name=study.study_name,
            seed=study.seed,
            target_trials=target,
            seconds_left=deadline - time.perf_counter(),
        )
        return self.helpers(shared)


class TpeSearch(OptunaSearch):
    """Optuna's tree-structured Parzen estimator over the space."""

    name = "tpe"
    sampler = "tpe"


class CmaEsSearch(OptunaSearch):
    """Optuna's CMA-ES over the continuous parameters (categorical ones drawn independently)."""

    name = "cmaes"
    sampler = "cmaes"


class Nsga2Search(OptunaSearch):
    """NSGA-II over price and predicted peak memory together: the outcome keeps their Pareto
    front."""

    name = "nsga2"
    sampler = "nsga2"
