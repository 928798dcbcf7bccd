"""A Horovod-autotune-style baseline: Bayesian optimisation of the fusion cap on live runs.

Horovod's autotuner samples its tensor-fusion threshold while training, scores each sample by
the throughput it measured, and proposes the next one by the expected improvement of a Gaussian
process over the samples. Here each sample is a short executor run (``measure``) of DDP with
that bucket cap (log-uniform from 10 KB to all gradients in one bucket); the first sample is
DDP's default cap, a few more are drawn at random, then Optuna's Gaussian-process sampler
(log expected improvement) proposes the rest. No simulator is involved: this is what tuning
costs without one, measured in run time. :class:`Autotune` runs it on a problem's ``measure``.
"""

import math
import time
from collections.abc import Callable

import optuna

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import DEFAULT_BUCKET_CAP_MB, Strategy, TensorFusionPlan
from ddlsim.search.algorithm import (
    Progress,
    SearchAlgorithm,
    SearchBudget,
    SearchOutcome,
    SearchProblem,
)
from ddlsim.search.space import MIN_CAP_MB

STARTUP_SAMPLES = 3
MAX_RUNS = 10
"""Autotune measures live runs: at most this many a search, whatever its budget."""


class Autotune(SearchAlgorithm):
    """Horovod-style tuning of DDP's bucket cap on live runs (:func:`autotune_fusion`): it
    measures ``problem.measure`` (never the evaluator) under caps up to the space's gradients,
    at most ``max_runs`` runs; ``progress(1)`` after each. Times in the outcome are measured.

    Args:
        max_runs: the runs a search makes at most, whatever ``budget.evaluations`` says.
    """

    name = "autotune"

    def __init__(self, *, max_runs: int = MAX_RUNS) -> None:
        self.max_runs = max_runs

    def search(
        self, problem: SearchProblem, budget: SearchBudget, progress: Progress | None = None
    ) -> SearchOutcome:
        if problem.measure is None:
            raise InvalidOptionError(
                "autotune measures live runs: the search problem has no measure"
            )

        def sampled(strategy: Strategy, ms: float) -> None:
            if progress is not None:
                progress(1)

        return autotune_fusion(
            problem.measure,
            total_grad_mb=problem.space.total_grad_mb,
            budget=min(budget.evaluations, self.max_runs),
            time_limit_s=budget.time_limit_s,
            seed=budget.seed,
            top=budget.top,
            on_sample=sampled,
        )


def autotune_fusion(
    measure: Callable[[Strategy], float],
    *,
    total_grad_mb: float,
    budget: int,
    time_limit_s: float,
    seed: int = 0,
    top: int = 5,
    on_sample: Callable[[Strategy, float], None] | None = None,
) -> SearchOutcome:
    """Tune DDP's bucket cap by measuring ``budget`` runs (``measure`` returns a strategy's
    measured iteration time, ms). ``predicted_ms`` in the result are measured times.

    Raises:
        InvalidOptionError: a budget below 1.
    """
    if budget < 1:
        raise InvalidOptionError(f"budget({budget}) must be >= 1 live runs")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.perf_counter()
    top_mb = max(total_grad_mb, MIN_CAP_MB * 2)
    sampler = optuna.samplers.GPSampler(seed=seed, n_startup_trials=min(STARTUP_SAMPLES, budget))
    study = optuna.create_study(sampler=sampler, direction="minimize")
    default_cap = min(DEFAULT_BUCKET_CAP_MB, top_mb)
    study.enqueue_trial({"log_cap_mb": math.log(default_cap)})
    measured: dict[str, tuple[Strategy, float]] = {}
    curve: list[float] = []

    def objective(trial: optuna.Trial) -> float:
        cap = math.exp(trial.suggest_float("log_cap_mb", math.log(MIN_CAP_MB), math.log(top_mb)))
        strategy = Strategy(tensor_fusion=TensorFusionPlan(bucket_cap_mb=cap))
        ms = measure(strategy)
        measured.setdefault(strategy.to_json(), (strategy, ms))
        curve.append(min([*curve, ms]))
        if on_sample is not None:
            on_sample(strategy, ms)
        return ms

    study.optimize(objective, n_trials=budget, timeout=time_limit_s)
    ranked = sorted(measured.values(), key=lambda item: item[1])
    first = study.trials[0]
    baseline = Strategy(tensor_fusion=TensorFusionPlan(bucket_cap_mb=default_cap))
    baseline_ms = float(first.value) if first.value is not None else math.inf
    return SearchOutcome(
        best=ranked[0][0],
        best_ms=ranked[0][1],
        baseline=baseline,
        baseline_ms=baseline_ms,
        top=tuple(ranked[:top]),
        evaluations=len(measured),
        elapsed_s=time.perf_counter() - start,
        curve=tuple(curve),
    )
