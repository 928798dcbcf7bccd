"""The batch that measures the simulator's dataset, as a use case (``ddlsim simulator dataset
plan``): for each model of a dataset version, the strategies its pool offers that the model
supports (:func:`ddlsim.plans.feasibility.model_supports`), over the version's settings, as
profiling jobs (:mod:`ddlsim.simulator.dataset`)."""

import dataclasses
from pathlib import Path
from typing import Any

from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.models import repeated_blocks
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.plans.feasibility import model_supports
from ddlsim.plans.tp_plans import check_layouts
from ddlsim.profiler.capture import capture_graph
from ddlsim.simulator.dataset import (
    LINK_COLLECTIVES,
    PARALLEL_COLLECTIVES,
    SETTINGS,
    SETTINGS_V3,
    PlanOptions,
    drop_done,
    grid_pool,
    interleaved_pool,
    layers_pool,
    load_dataset,
    mixed_pool,
    models_of,
    parallel_pool,
    plan_jobs,
    strategy_pool,
)
from ddlsim.simulator.dataset.gpu_plan import GPU_VERSIONS, gpu_plan
from ddlsim.workflows.requests import Progress, no_progress

SESSION_KINDS: tuple[str, ...] = ("dp", "parallel", "interleaved", "layers", "grid")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DatasetPlanRequest:
    """The jobs of dataset ``version``'s session of ``plans`` (cpu-v2: dp, parallel or
    interleaved; cpu-v3 mixes every kind, ``layers`` and ``grid`` are sessions of their own),
    ``per_group`` strategies per (model, world size, link), ``iters`` and ``warmup`` steps;
    ``done``: a dataset file whose jobs are left out.

    Raises:
        InvalidOptionError: an unknown session kind.
    """

    version: str
    plans: str = "dp"
    per_group: int | None = None
    iters: int = 5
    warmup: int = 2
    done: str | None = None

    def __post_init__(self) -> None:
        if self.plans not in SESSION_KINDS:
            raise InvalidOptionError(
                f"plans {self.plans!r} is unknown; allowed: {', '.join(SESSION_KINDS)}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DatasetPlan:
    """The jobs (``None`` planned: a GPU version's fixed plan), how many were planned before
    ``done`` took some out, and how many models some plan can split."""

    jobs: list[dict[str, Any]]
    planned: int | None
    models: int


def plan_dataset(request: DatasetPlanRequest, progress: Progress = no_progress) -> DatasetPlan:
    """The batch of profiling jobs that measures ``request.version`` (minus what
    ``request.done`` already holds).

    Raises:
        InvalidOptionError: a session kind the version has not, a bad ``done`` file.
    """
    args = request
    if args.version in GPU_VERSIONS:
        return DatasetPlan(jobs=gpu_plan(), planned=None, models=len(models_of(args.version)))
    models = models_of(args.version)
    done = load_dataset(Path(args.done)) if args.done else None  # a bad file fails first
    pools: dict[str, list[Strategy]] = {}
    for spec in models:
        if args.plans == "grid":
            if args.version == "cpu-v2":
                raise InvalidOptionError("--plans grid is a cpu-v3 session")
            pools[spec.label] = [s for s in grid_pool() if model_supports(spec, s)]
            continue
        if args.plans == "layers":
            if args.version == "cpu-v2":
                raise InvalidOptionError("--plans layers is a cpu-v3 session")
            try:
                blocks = check_layouts(spec, ParallelPlan(tp=2), rank_batch=None)
            except InvalidStrategyError:  # no tensor-parallel plan: nothing to place
                pools[spec.label] = []
                continue
            pool = layers_pool(len(blocks))
            pools[spec.label] = [s for s in pool if model_supports(spec, s)]
            continue
        if args.version == "cpu-v2" and args.plans in ("parallel", "interleaved"):
            pool = parallel_pool() if args.plans == "parallel" else interleaved_pool()
            pools[spec.label] = [s for s in pool if model_supports(spec, s)]
            continue
        progress(None, f"capturing {spec.label} for its gradient order and blocks")
        order = capture_graph(spec).grad_ready_order
        data_parallel = strategy_pool(order, repeated_blocks(spec), seed=len(pools))
        if args.version == "cpu-v2":
            pools[spec.label] = data_parallel
            continue
        # cpu-v3 mixes every kind in each model's pool: two data-parallel strategies, then a
        # parallel plan, in turn.
        parallel = [s for s in [*parallel_pool(), *interleaved_pool()] if model_supports(spec, s)]
        pools[spec.label] = mixed_pool(data_parallel, parallel)
    if args.version == "cpu-v2":
        options = PlanOptions(
            per_group=args.per_group or {"dp": 4, "parallel": 2, "interleaved": 1}[args.plans],
            iters=args.iters,
            warmup=args.warmup,
            collectives=LINK_COLLECTIVES if args.plans == "dp" else PARALLEL_COLLECTIVES,
        )
        settings = SETTINGS
    else:
        options = PlanOptions(
            per_group=args.per_group or 3,
            iters=args.iters,
            warmup=args.warmup,
            collectives=PARALLEL_COLLECTIVES,
            side_by_side=True,
        )
        settings = SETTINGS_V3
    models = [spec for spec in models if pools[spec.label]]  # those some plan can split
    jobs = plan_jobs(models, pools, settings, options=options)
    planned = len(jobs)
    if done is not None:
        jobs = drop_done(jobs, done)
    return DatasetPlan(jobs=jobs, planned=planned, models=len(models))
