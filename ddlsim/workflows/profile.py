"""Run a batch of profiling jobs (kernels, fusion, collectives, executor runs and side-by-side
comparisons) against the store, resuming where an earlier batch stopped."""

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.limits import SpecLimits, check_limits, check_run
from ddlsim.data.specs.cluster import parse_bandwidth_gbps
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.data.zoo import resolve_model
from ddlsim.executor.run import RunOptions, compare_training, run_training
from ddlsim.profiler.batch import BatchOutcome, Job, JobRunner, run_batch
from ddlsim.profiler.batch_jobs import check_job as check_batch_job
from ddlsim.profiler.batch_jobs import (
    of_their_types,
    run_collective_job,
    run_fusion_job,
    run_kernel_job,
)
from ddlsim.workflows.execute import add_result
from ddlsim.workflows.requests import Progress, no_progress

MAX_MEASURE_BUDGET_S = 3600.0
"""Seconds a queued strategy may measure beyond its minimum steps."""


def profile_batch(
    jobs: Sequence[Job],
    store: Store,
    progress: Progress = no_progress,
    *,
    trace_dir: Path | None = None,
) -> BatchOutcome:
    """Run ``jobs`` (parsed by :func:`ddlsim.profiler.batch.parse_batch_data`) against
    ``store``; a job already done there is skipped, a failing one is recorded and the batch
    goes on. ``progress`` hears the position in the batch and each job's label as it starts; it
    may raise to stop the batch (the running job is left unfinished, to be redone)."""

    def running(runner: JobRunner) -> JobRunner:
        @functools.wraps(runner)
        def run(job: Job) -> Callable[[Any], None]:
            progress(None, f"running {job.label}"[:500])
            return runner(job)

        return run

    runners = {kind: running(runner) for kind, runner in batch_runners(trace_dir).items()}

    def show(position: int, total: int, label: str) -> None:
        progress(position / total if total else 1.0, label)

    return run_batch(jobs, store=store, runners=runners, progress=show)


def batch_runners(trace_dir: Path | None = None) -> dict[str, JobRunner]:
    """What runs each kind of batch job."""
    return {
        "kernels": functools.partial(run_kernel_job, trace_dir=trace_dir),
        "fusion": run_fusion_job,
        "collectives": run_collective_job,
        "run": run_executor_job,
        "compare": run_compare_job,
    }


def run_executor_job(job: Job) -> Callable[[Any], None]:
    """One ``kind: run`` batch job; the callback stores graph, strategy and measurement."""
    settings = dict(job.settings)
    strategy = _job_strategy(settings.pop("strategy", None))
    spec, options = _job_spec_and_options(settings)
    result = run_training(spec, strategy, options)

    def write(session: Any) -> None:
        add_result(session, result)

    return write


def run_compare_job(job: Job) -> Callable[[Any], None]:
    """One ``kind: compare`` batch job: DDP's defaults and the job's strategies side by side in
    one launch (a strategy equal to DDP's defaults is the reference itself, run once); the
    callback stores every measurement, all with the launch's id."""
    settings = dict(job.settings)
    strategies = [Strategy()]
    for raw in settings.pop("strategies"):
        strategy = _job_strategy(raw)
        if strategy not in strategies:
            strategies.append(strategy)
    rounds = int(settings.pop("rounds", 3))
    spec, options = _job_spec_and_options(settings)
    results = compare_training(spec, strategies, options, rounds=rounds)

    def write(session: Any) -> None:
        for result in results:
            add_result(session, result)

    return write


def check_job(job: Job, limits: SpecLimits | None = None) -> None:
    """Refuse, before it is queued, a job the worker would refuse or one over the service's
    limits (``limits``, else :meth:`SpecLimits.from_env`): its settings and work
    (:func:`ddlsim.profiler.batch_jobs.check_job`), an executor job's strategies and run options,
    and its model at the job's inputs (:func:`ddlsim.data.limits.check_limits`).

    Raises:
        DdlsimError: naming the setting, its value and what is allowed.
    """
    limits = limits or SpecLimits.from_env()
    spec = check_batch_job(job, limits)
    if spec is not None and job.kind in ("kernels", "fusion"):
        check_run(spec, 1, limits)
    if job.kind in ("run", "compare"):
        settings = dict(job.settings)
        raws = [settings.pop("strategy", None)] if job.kind == "run" else settings["strategies"]
        settings.pop("strategies", None)
        settings.pop("rounds", None)
        strategies = [Strategy(), *(_job_strategy(raw) for raw in raws)]
        with of_their_types():
            spec, options = _job_spec_and_options(settings)
        parse_bandwidth_gbps(options.bandwidth or "none")
        if not options.budget_s <= MAX_MEASURE_BUDGET_S:
            raise InvalidOptionError(
                f"measure_budget_s({options.budget_s:g}) is out of range; allowed: 0 to "
                f"{MAX_MEASURE_BUDGET_S:g}"
            )
        ranks = options.world_size
        chosen = strategies if job.kind == "compare" else strategies[1:]
        batch = max(s.parallel.rank_batch_size(spec.inputs.batch_size, ranks) for s in chosen)
        check_run(spec.with_inputs(batch_size=batch), ranks, limits)
    if spec is not None:
        check_limits(spec, limits)


def _job_spec_and_options(settings: dict[str, Any]) -> tuple[ModelSpec, RunOptions]:
    """An executor job's model at its inputs and its run options (the keys are taken out of
    ``settings``)."""
    model = settings.pop("model")
    spec = resolve_model(json.dumps(model) if isinstance(model, Mapping) else str(model))
    spec = spec.with_inputs(
        batch_size=settings.pop("batch_size", None),
        seq_len=settings.pop("seq_len", None),
        image_size=settings.pop("image_size", None),
    )
    bandwidth = settings.pop("bandwidth", None)
    options = RunOptions(
        world_size=int(settings.pop("world_size", 1)),
        bandwidth=None if bandwidth is None else str(bandwidth),
        iters=int(settings.pop("iters", 10)),
        warmup=int(settings.pop("warmup", 2)),
        ci_target=float(settings.pop("ci_target", 0.01)),
        budget_s=float(settings.pop("measure_budget_s", 30.0)),
        seed=int(settings.pop("seed", 0)),
        optimizer=str(settings.pop("optimizer", "adamw")),
        device=str(settings.pop("device", "cpu")),
        backend=None if (backend := settings.pop("backend", None)) is None else str(backend),
    )
    return spec, options


def _job_strategy(raw: Any) -> Strategy:
    if isinstance(raw, Mapping):
        return Strategy.from_dict(raw)
    return Strategy.parse(str(raw)) if raw else Strategy()
