"""GPU clusters through the search registry: a cluster's layouts searched by backtracking, TPE,
CMA-ES, NSGA-II or random sampling (:mod:`ddlsim.search.registry`), the same algorithms and
Optuna studies that search the CPU loop.

The problem is the one every algorithm takes (:class:`ddlsim.search.algorithm.SearchProblem`):
its space holds the cluster's layouts as parallel plans (:func:`ddlsim.workflows.scale.
scale_space`; tensor fusion is not searched: the frameworks bucket as they do), and its
evaluator (:class:`LayoutEvaluator`) prices a strategy as the GPU path does, the job's
precision, compilation and kernels applied: memory from the closed form, the time with the
pipeline schedule replayed. A search for a run (``target`` ``cuda``) offers only the layouts
this executor runs there (:func:`ddlsim.plans.feasibility.refusals`). Without ``--algo`` the
GPU path's own bound-and-replay search answers (:func:`ddlsim.workflows.scale.search_at_scale`).
"""

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from ddlsim.data.errors import DdlsimError, InvalidOptionError
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.data.specs.strategy import Strategy
from ddlsim.search import SearchBudget, SearchProblem, Space, search_algorithm
from ddlsim.search.registry import STUDY_ALGORITHMS
from ddlsim.search.scale_plans import SpaceLimits, layouts
from ddlsim.simulator.gpu.cost import LayoutCost
from ddlsim.simulator.gpu.prediction import ScalePrediction
from ddlsim.workflows.scale import (
    ScaleRequest,
    check_memory_margin,
    predict_at_scale,
    runs_on,
    scale_space,
)

LAYOUT_ALGORITHMS: tuple[str, ...] = ("backtrack", "tpe", "cmaes", "nsga2", "random")
"""The registry's algorithms that search a GPU cluster's layouts (autotune measures live runs
on this machine)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LayoutJob:
    """One training job on a GPU cluster: ``global_batch`` sequences of ``seq_len`` tokens an
    iteration, in ``precision`` (``compile``: fused blocks; ``kernels``: the kernel library),
    each GPU keeping ``memory_margin_gib`` free; ``limits``: what its framework offers;
    ``target``: ``paper`` (price anything) or ``cuda`` (only what this executor runs)."""

    model: ModelSpec
    cluster: GpuClusterSpec
    global_batch: int
    seq_len: int
    precision: str = "bf16"
    compile: bool = False
    kernels: str = "pytorch"
    limits: SpaceLimits | None = None
    memory_margin_gib: float = 0.0
    target: str = "paper"


@dataclasses.dataclass(frozen=True, slots=True)
class _Unpriced:
    """The memory of a layout the GPU path cannot price: none fits."""

    total_gib: float = math.inf


class LayoutEvaluator:
    """Prices strategies as layouts of ``job`` (a search's :class:`SpaceEvaluator`): memoised
    by strategy, the job's precision, compilation and kernels applied; a layout the GPU path
    cannot price costs ``inf`` and fits nowhere. Not thread-safe."""

    def __init__(self, job: LayoutJob, cost: LayoutCost | None = None) -> None:
        self.job = job
        self.cost = cost
        self.on_priced: Callable[[int], None] | None = None
        self._closed: dict[str, ScalePrediction | None] = {}
        self._replayed: dict[str, float] = {}

    @property
    def evaluations(self) -> int:
        return len(self._replayed)

    def plan(self, strategy: Strategy) -> ScalePlan:
        """The layout ``strategy`` stands for, in the job's precision, compilation, kernels."""
        job = self.job
        applied = dataclasses.replace(
            strategy, precision=job.precision, compile=job.compile, kernels=job.kernels
        )
        return ScalePlan.from_strategy(applied, job.cluster.world_size)

    def _predict(self, strategy: Strategy, *, replay: bool) -> ScalePrediction | None:
        job = self.job
        try:
            request = ScaleRequest(
                model=job.model,
                cluster=job.cluster,
                plan=self.plan(strategy),
                global_batch=job.global_batch,
                seq_len=job.seq_len,
            )
            return predict_at_scale(request, replay=replay, cost=self.cost)
        except DdlsimError:  # a layout the GPU path cannot price (its batch, its stages)
            return None

    def _closed_form(self, strategy: Strategy) -> ScalePrediction | None:
        key = strategy.parallel.label
        if key not in self._closed:
            self._closed[key] = self._predict(strategy, replay=False)
        return self._closed[key]

    def price(self, strategies: Sequence[Strategy]) -> list[float]:
        out, fresh = [], 0
        for strategy in strategies:
            key = strategy.parallel.label
            if key not in self._replayed:
                prediction = self._predict(strategy, replay=True)
                self._replayed[key] = (
                    math.inf if prediction is None else prediction.iteration_s * 1000.0
                )
                fresh += 1
            out.append(self._replayed[key])
        if fresh and self.on_priced is not None:
            self.on_priced(fresh)
        return out

    def memory(self, strategy: Strategy) -> Any:
        prediction = self._closed_form(strategy)
        return _Unpriced() if prediction is None else prediction.memory

    def feasible(self, strategy: Strategy) -> bool:
        limit = self.job.cluster.gpu.memory_gib - self.job.memory_margin_gib
        return bool(self.memory(strategy).total_gib <= limit)


def layout_problem(
    job: LayoutJob, cost: LayoutCost | None = None
) -> tuple[SearchProblem, LayoutEvaluator, int]:
    """The search problem of ``job``'s layouts, its evaluator (pricing through ``cost``; the
    replay alone without), and how many layouts were left out as not running on
    ``job.target``.

    Raises:
        InvalidOptionError: a bad margin or target; InvalidModelSpecError: a model that
            cannot be captured.
    """
    check_memory_margin(job.memory_margin_gib, job.cluster)
    space = scale_space(
        job.model,
        job.cluster,
        global_batch=job.global_batch,
        seq_len=job.seq_len,
        precision=job.precision,
        compile=job.compile,
        allow_async_tp=job.kernels == "transformer_engine",
        kernels=job.kernels,
        limits=job.limits,
    )
    admit = runs_on(job.model, job.cluster, job.global_batch, job.seq_len, job.target)
    plans, left_out = [], 0
    for layout in layouts(space):
        if admit is not None and not admit(layout):
            left_out += 1
            continue
        plans.append(layout.to_strategy().parallel)
    # DDP's plan (all GPUs data-parallel) first, as every space starts.
    plans.sort(key=lambda plan: plan.label != Strategy().parallel.label)
    problem = SearchProblem(
        evaluator=(evaluator := LayoutEvaluator(job, cost)),
        space=Space(
            plans=tuple(dict.fromkeys(plans)),
            total_grad_mb=0.0,
            dear=False,
            tensor_fusion=False,
            batch_size=job.global_batch,
            world_size=job.cluster.world_size,
        ),
        order=(),
        sizes=(),
    )
    return problem, evaluator, left_out


def search_layouts_with(
    algo: str,
    job: LayoutJob,
    budget: SearchBudget,
    *,
    storage: str | None = None,
    study_name: str | None = None,
    progress: Callable[[int], None] | None = None,
    cost: LayoutCost | None = None,
) -> dict[str, Any]:
    """Search ``job``'s layouts (priced through ``cost``) with the registry's ``algo`` (an
    Optuna one on the study ``study_name`` in ``storage``, which other searches may share);
    the payload: the best
    layout and the ``budget.top`` fastest (``None`` when none fits), each with its time,
    throughput and memory, and what was searched.

    Raises:
        InvalidOptionError: an algorithm that does not search layouts, a bad margin or target.
    """
    if algo not in LAYOUT_ALGORITHMS:
        raise InvalidOptionError(
            f"--algo {algo} does not search a GPU cluster's layouts; allowed: "
            f"{', '.join(LAYOUT_ALGORITHMS)}"
        )
    problem, evaluator, left_out = layout_problem(job, cost)
    config: dict[str, Any] = {}
    if algo in STUDY_ALGORITHMS:
        cluster = job.cluster
        shape = f"{cluster.name}-{cluster.nodes}x{cluster.gpus_per_node}"
        config = {
            "storage": storage,
            "study_name": study_name or f"{job.model.label}-{shape}-{algo}",
        }
    outcome = search_algorithm(algo, **config).search(problem, budget, progress)
    rows = [
        _row(evaluator, strategy, ms)
        for strategy, ms in outcome.top
        if math.isfinite(ms) and evaluator.feasible(strategy)
    ]
    return {
        "model": job.model.label,
        "cluster": job.cluster.to_dict(),
        "global_batch": job.global_batch,
        "seq_len": job.seq_len,
        "algo": algo,
        "target": job.target,
        "layouts": len(problem.space.plans),
        "not_runnable": left_out,
        "evaluated": outcome.evaluations,
        "pruned": dict(outcome.pruned),
        "seconds": round(outcome.elapsed_s, 2),
        "best": rows[0] if rows else None,
        "top": rows,
    }


def _row(evaluator: LayoutEvaluator, strategy: Strategy, ms: float) -> dict[str, Any]:
    job = evaluator.job
    plan = evaluator.plan(strategy)
    seconds = ms / 1000.0
    return {
        "strategy": plan.to_dict(),
        "layout": plan.label(),
        "iteration_s": seconds,
        "tokens_per_s_per_gpu": job.global_batch * job.seq_len / seconds / job.cluster.world_size,
        "memory_gib": round(evaluator.memory(strategy).total_gib, 2),
        "replayed": True,
    }
