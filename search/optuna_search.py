"""Optuna samplers over the tensor-fusion space: DDP-style bucket caps and DeAR.

A trial picks a bucket cap (log-uniform, from 10 KB to all gradients in one bucket), the first
bucket's cap as a share of it, and DeAR on or off; the objective is the simulator's price of
that strategy (memoised by the evaluator, so trials that land on the same buckets are priced
once). TPE models the good and the bad trials; CMA-ES adapts a Gaussian over the two continuous
parameters (DeAR is then drawn independently). With ``storage`` (an RDB URL: SQLite or
PostgreSQL) the study lives in a database under ``study_name``, so several processes, on one
machine or many, add trials to one study and each sees the others' results; ``workers`` runs
that many trials at once in this process.
"""

import dataclasses
import math
import threading
import time
from collections.abc import Sequence
from typing import Literal

import optuna
from sqlalchemy.exc import SQLAlchemyError

from data.errors import InvalidOptionError
from data.specs.strategy import Strategy
from search.backtrack import BacktrackOptions, SearchResult, begin, finish
from search.evaluator import FusionEvaluator

Sampler = Literal["tpe", "cmaes"]
SAMPLERS: tuple[Sampler, ...] = ("tpe", "cmaes")
MIN_CAP_MB = 0.01


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StudyOptions:
    """Where the study lives and how many trials run at once."""

    storage: str | None = None
    study_name: str = "ddlsim-search"
    workers: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise InvalidOptionError(f"workers({self.workers}) must be >= 1")


def optuna_fusion(
    evaluator: FusionEvaluator,
    order: Sequence[str],
    sizes: Sequence[int],
    sampler: Sampler,
    *,
    options: BacktrackOptions | None = None,
    study: StudyOptions | None = None,
) -> SearchResult:
    """Search bucket caps and DeAR with an Optuna ``sampler`` (``tpe`` or ``cmaes``).

    Raises:
        InvalidOptionError: an unknown sampler, a model without gradients, or a storage URL
            Optuna cannot open.
    """
    if sampler not in SAMPLERS:
        raise InvalidOptionError(f"sampler {sampler!r} is not one of {', '.join(SAMPLERS)}")
    options = options or BacktrackOptions()
    study = study or StudyOptions()
    start, baseline, baseline_ms = begin(evaluator, order)
    total_mb = max(sum(sizes) / 2**20, MIN_CAP_MB * 2)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    chosen = (
        optuna.samplers.TPESampler(seed=study.seed)
        if sampler == "tpe"
        else optuna.samplers.CmaEsSampler(seed=study.seed, warn_independent_sampling=False)
    )
    try:
        trials = optuna.create_study(
            storage=study.storage,
            study_name=study.study_name,
            sampler=chosen,
            direction="minimize",
            load_if_exists=True,
        )
    except (ValueError, ImportError, RuntimeError, SQLAlchemyError) as exc:  # bad URL or driver
        raise InvalidOptionError(
            f"storage {study.storage!r} cannot hold an Optuna study: {exc}"
        ) from None
    seen: dict[str, tuple[Strategy, float]] = {}
    curve = [baseline_ms]
    lock = threading.Lock()  # trials run in ``workers`` threads

    def objective(trial: optuna.Trial) -> float:
        cap = math.exp(trial.suggest_float("log_cap_mb", math.log(MIN_CAP_MB), math.log(total_mb)))
        first = cap * trial.suggest_float("first_share", 0.05, 1.0)
        dear = options.dear and trial.suggest_categorical("dear", [False, True])
        strategy = Strategy.from_dict(
            {
                "tensor_fusion": {
                    "bucket_cap_mb": cap,
                    "first_bucket_cap_mb": first,
                    "dear": bool(dear),
                }
            }
        )
        with lock:
            (ms,) = evaluator.price([strategy])
            seen.setdefault(strategy.to_json(), (strategy, ms))
            curve.append(min(curve[-1], ms))
        return ms

    def stop(study_: optuna.Study, _: optuna.trial.FrozenTrial) -> None:
        spent = time.perf_counter() - start > options.time_limit_s
        if spent or evaluator.evaluations >= options.budget:
            study_.stop()

    trials.optimize(
        objective,
        n_trials=options.budget,
        timeout=options.time_limit_s,
        n_jobs=study.workers,
        callbacks=[stop],
    )
    ranked = sorted(seen.values(), key=lambda item: item[1])
    return finish(
        evaluator,
        ranked,
        baseline=baseline,
        baseline_ms=baseline_ms,
        start=start,
        curve=curve,
        top=options.top,
    )
