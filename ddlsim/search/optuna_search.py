"""Optuna samplers over the strategy space: TPE, CMA-ES, NSGA-II and random sampling.

A trial picks a parallel plan (one of :func:`search.plans.candidate_plans`, by name), and under
a data-parallel plan a DDP-style bucket cap (log-uniform from 10 KB to all gradients in one
bucket), the first bucket's cap as a share of it and DeAR on or off, and how many blocks of the
model's stack are compiled (the first ``k``). The objective is the simulator's price; NSGA-II
minimises the price and the predicted peak memory per device together and keeps their Pareto
front. A plan whose predicted peak exceeds the device's capacity, or that the simulator cannot
schedule, is pruned (``TrialPruned``), never scored. CMA-ES adapts a Gaussian over the
continuous parameters (the categorical ones are drawn independently).

The study lives in ``storage`` when one is given, in memory otherwise: an RDB URL (SQLite or
PostgreSQL), or ``journal:///PATH``, Optuna's append-only journal file, which several processes
share through a file lock (on one machine, or many over a shared file system) at a fraction of an
RDB's cost a trial: the samplers read every trial each time, and an RDB answers that with a
query where the journal replays only what it has not seen. Processes share a study by name and
each sees the others' trials. Results are read back from the study, so a search reports what
every worker found.
"""

import dataclasses
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import optuna
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.study import MaxTrialsCallback, StudyDirection
from optuna.trial import TrialState
from sqlalchemy.exc import SQLAlchemyError

from ddlsim.data.errors import DdlsimError, InvalidOptionError
from ddlsim.data.specs.strategy import OpFusionPlan, ParallelPlan, Strategy, TensorFusionPlan
from ddlsim.search.backtrack import BacktrackOptions, SearchResult
from ddlsim.search.plans import plan_label
from ddlsim.search.strategy_evaluator import StrategyEvaluator
from ddlsim.simulator.plans import is_data_parallel

Sampler = Literal["tpe", "cmaes", "nsga2", "random"]
SAMPLERS: tuple[Sampler, ...] = ("tpe", "cmaes", "nsga2", "random")
MIN_CAP_MB = 0.01
JOURNAL = "journal://"
OVER_CAPACITY = "predicted peak memory over the device's capacity"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StudyOptions:
    """Where the study lives, its name, and the sampler's seed."""

    storage: str | None = None
    study_name: str = "ddlsim-search"
    seed: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Space:
    """What a trial chooses from: ``plans`` (the first is DDP's), DeAR, and the ``blocks`` whose
    first ``k`` may be compiled (none: op fusion is not searched)."""

    plans: tuple[ParallelPlan, ...]
    total_grad_mb: float
    blocks: tuple[str, ...] = ()
    dear: bool = True

    def __post_init__(self) -> None:
        if not self.plans:
            raise InvalidOptionError("the space has no parallel plan the model supports")

    @property
    def labels(self) -> dict[str, ParallelPlan]:
        return {plan_label(p): p for p in self.plans}

    def sample(self, trial: optuna.Trial) -> dict[str, Any]:
        """Draw a trial's parameters (conditional on the plan)."""
        params: dict[str, Any] = {}
        labels = list(self.labels)
        params["plan"] = (
            trial.suggest_categorical("plan", labels) if len(labels) > 1 else labels[0]
        )
        if is_data_parallel(self.labels[params["plan"]]):
            top = max(self.total_grad_mb, MIN_CAP_MB * 2)
            params["log_cap_mb"] = trial.suggest_float(
                "log_cap_mb", math.log(MIN_CAP_MB), math.log(top)
            )
            params["first_share"] = trial.suggest_float("first_share", 0.05, 1.0)
            if self.dear:
                params["dear"] = trial.suggest_categorical("dear", [False, True])
        if self.blocks:
            params["compiled_blocks"] = trial.suggest_int("compiled_blocks", 0, len(self.blocks))
        return params

    def strategy(self, params: Mapping[str, Any]) -> Strategy:
        """The strategy a trial's parameters stand for."""
        plan = self.labels[str(params.get("plan", plan_label(self.plans[0])))]
        fusion = TensorFusionPlan()
        if "log_cap_mb" in params:
            cap = math.exp(float(params["log_cap_mb"]))
            fusion = TensorFusionPlan(
                bucket_cap_mb=cap,
                first_bucket_cap_mb=cap * float(params["first_share"]),
                dear=bool(params.get("dear", False)),
            )
        compiled = self.blocks[: int(params.get("compiled_blocks", 0))]
        return Strategy(
            parallel=plan, tensor_fusion=fusion, op_fusion=OpFusionPlan(compiled=compiled)
        )


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
        raise InvalidOptionError(
            f"storage {study.storage!r} cannot hold an Optuna study: {exc}"
        ) from None


def optimize(
    trials: optuna.Study,
    evaluator: StrategyEvaluator,
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


def result_from_study(
    trials: optuna.Study,
    space: Space,
    *,
    baseline: Strategy,
    baseline_ms: float,
    start: float,
    options: BacktrackOptions,
    baseline_fits: bool = True,
) -> tuple[SearchResult, list[dict[str, Any]]]:
    """The search's result from every finished trial of the study, and for a two-objective
    study its Pareto front of (time, peak memory) as JSON rows, fastest first."""
    done = sorted(
        (t for t in trials.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE),
        key=lambda t: t.number,
    )
    curve = [baseline_ms]
    priced: dict[str, tuple[Strategy, float]] = {}
    for t in done:
        strategy = space.strategy(t.params)
        ms = float(t.values[0])
        priced.setdefault(strategy.to_json(), (strategy, ms))
        curve.append(min(curve[-1], ms))
    ranked = sorted(priced.values(), key=lambda item: item[1])
    bar = baseline_ms if baseline_fits else float("inf")
    best, best_ms = ranked[0] if ranked and ranked[0][1] < bar else (baseline, baseline_ms)
    pareto: list[dict[str, Any]] = []
    if len(trials.directions) > 1 and done:
        front = {
            space.strategy(t.params).to_json(): (space.strategy(t.params), t.values)
            for t in trials.best_trials
        }
        pareto = [
            {"strategy": s.to_dict(), "predicted_ms": v[0], "peak_memory_gib": v[1]}
            for s, v in sorted(front.values(), key=lambda item: item[1][0])
        ]
    result = SearchResult(
        best=best,
        best_ms=best_ms,
        baseline=baseline,
        baseline_ms=baseline_ms,
        top=tuple(ranked[: options.top]),
        evaluations=len(priced),
        elapsed_s=time.perf_counter() - start,
        curve=tuple(curve),
    )
    return result, pareto


def pruned_reasons(trials: optuna.Study) -> dict[str, int]:
    """How many trials were pruned, by reason."""
    out: dict[str, int] = {}
    for t in trials.get_trials(deepcopy=False, states=(TrialState.PRUNED,)):
        reason = str(t.user_attrs.get("pruned", "pruned"))
        out[reason] = out.get(reason, 0) + 1
    return out
