"""Search the fastest strategy for a model on a cluster with the simulator, and (``verify``)
check the pick against the executor.

``space`` ``all`` searches parallel plans (data, tensor and pipeline parallelism, FSDP,
micro-batches), tensor fusion (bucket partitions or caps, DeAR) and op fusion (compiled
blocks); ``fusion`` keeps DDP's plan and searches fusion only. Plans whose predicted peak memory
exceeds ``memory_gb`` per device are pruned. ``backtrack`` is the DisCo-style search; ``tpe``,
``cmaes``, ``nsga2`` (time and memory together) and ``random`` are Optuna samplers whose study
can live in a database or a journal file (``storage``) that several worker processes
(``workers``), on this machine or others, share; ``autotune`` is the Horovod-style baseline that
tunes DDP's bucket cap by Bayesian optimisation over live executor runs, without the simulator.

The rank's micro-batch is kernel-profiled unless the store has a profile; collectives are priced
from the store's fits of the link (the link's nominal rate where none is stored).
"""

import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.data.store import Store
from ddlsim.executor.plan import model_supports
from ddlsim.executor.run import RunOptions, run_training
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.profiler.cluster import remove_stale_namespaces
from ddlsim.search.autotune import autotune_fusion
from ddlsim.search.backtrack import BacktrackOptions, SearchResult, backtrack_fusion, begin
from ddlsim.search.joint import backtrack_all
from ddlsim.search.optuna_search import (
    JOURNAL,
    Sampler,
    Space,
    StudyOptions,
    finished_trials,
    open_study,
    optimize,
    pruned_reasons,
    result_from_study,
)
from ddlsim.search.plans import candidate_plans
from ddlsim.search.random_search import random_fusion
from ddlsim.search.strategy_evaluator import Cluster, Profiles, StrategyEvaluator
from ddlsim.simulator.calibration import DEFAULT_CONFIDENCE, Calibration
from ddlsim.simulator.costs import rank_spec
from ddlsim.simulator.memory import GIB
from ddlsim.workflows.profiles import (
    cost_model_for,
    kernel_profile_for,
    machine_scale,
    normalized_bandwidth,
)
from ddlsim.workflows.requests import Progress, SearchRequest, no_progress
from ddlsim.workflows.verify import verify

AUTOTUNE_RUNS = 10
"""Autotune measures live runs: at most this many, whatever the budget."""


def search(
    request: SearchRequest, store: Store, progress: Progress = no_progress
) -> dict[str, Any]:
    """The search ``request`` describes, as its JSON payload: the pick (``best``), DDP's
    defaults (``baseline``) and the ``top`` candidates, each with its predicted and scored time,
    peak memory and whether it fits; the calibration it scored with, the evaluations, the
    convergence curve, the Pareto front (``nsga2``), the pruned plans and, with ``verify``,
    what the executor measured (:func:`ddlsim.workflows.verify.verify`).

    ``progress(fraction, message)`` hears the strategies priced against the budget, then the
    verifying runs. It may raise to stop the search.

    Raises:
        DdlsimError: a model or plan the tools cannot handle, a study storage Optuna cannot
            open, a search worker that failed.
    """
    spec = request.model
    evaluator = build_evaluator(request, store, progress)
    graph, _ = evaluator.profiles(_rank(spec, request.world_size))
    order = [name for name, _ in graph.gradient_sizes]
    sizes = [size for _, size in graph.gradient_sizes]
    space = _space(request, spec, evaluator, sum(sizes) / 2**20)
    progress(None, f"searching {spec.label} ({request.algo}, {request.space} space)")
    pareto: list[dict[str, Any]] = []
    pruned: dict[str, int] = {}
    evaluator.on_priced = advance = _counter(_total(request), progress)
    options = BacktrackOptions(
        budget=request.budget, time_limit_s=request.time_limit_s, top=request.top
    )
    if request.algo == "backtrack" and request.space == "fusion":
        result = backtrack_fusion(evaluator, order, sizes, options)
    elif request.algo == "backtrack":
        joint = backtrack_all(evaluator, space.plans, order, sizes, options)
        result = joint.result
        for _, reason in joint.pruned:
            pruned[reason] = pruned.get(reason, 0) + 1
    elif request.algo == "random" and request.space == "fusion":
        result = random_fusion(evaluator, order, options, seed=request.seed)
    elif request.algo == "autotune":
        result = _autotune(request, sum(sizes) / 2**20, advance)
    else:
        result, pareto, pruned = _sample(request, store.url, evaluator, space, order)
    payload = _payload(request, evaluator, result)
    if request.algo == "nsga2":
        payload["pareto"] = [_rescored(evaluator, row) for row in pareto]
    payload["pruned"] = pruned
    if request.verify:
        progress(None, "running the pick and the baseline for real")
        payload.update(verify(request, payload, store, progress))
    return payload


def build_evaluator(
    request: SearchRequest, store: Store, progress: Progress = no_progress
) -> StrategyEvaluator:
    """The evaluator of ``request``'s cluster, its profiles read from (or taken into)
    ``store``."""
    bandwidth = normalized_bandwidth(request.bandwidth)
    capacity_gb = request.memory_gb or default_capacity_gb(request.world_size)

    def profiles(rank: ModelSpec) -> tuple[IterationGraph, Mapping[int, float]]:
        graph, profile, _ = kernel_profile_for(
            store, rank, optimizer="adamw", iters=request.profile_iters, progress=progress
        )
        return graph, profile.node_ms

    cost_model = cost_model_for(request.simulator)
    return StrategyEvaluator(
        request.model,
        Cluster(
            world_size=request.world_size,
            bandwidth=bandwidth,
            fits=store.collective_profiles(backend="gloo"),
            capacity_bytes=int(capacity_gb * GIB),
            compute_scale=machine_scale(request.world_size),
        ),
        _cached(profiles),
        capture_plan,
        cost_model=cost_model,
        calibration=calibration_of(cost_model, request.confidence),
        confidence=request.confidence or DEFAULT_CONFIDENCE,
    )


def default_capacity_gb(world_size: int) -> float:
    """Each rank's share of this machine's memory: every rank of the emulated cluster runs
    here."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total / GIB / world_size


def calibration_of(
    cost_model: tuple[Any, Mapping[str, Any]] | None, confidence: float | None
) -> Calibration | None:
    """The checkpoint's calibration of its own predictor, unless ``confidence`` is ``None``
    (ranking by the prediction alone) or the checkpoint has none (trained without
    cross-validation)."""
    if cost_model is None or confidence is None:
        return None
    _, meta = cost_model
    raw = (meta.get("calibration") or {}).get(str(meta.get("predictor", "")))
    return Calibration.from_json(raw) if raw else None


def capture_plan(rank: ModelSpec, strategy: Strategy) -> IterationGraph:
    """The graph of a rank's micro-batch under ``strategy`` (AdamW, as profiles are taken)."""
    return capture_graph(rank, CaptureOptions(strategy=strategy))


def _rank(spec: ModelSpec, world_size: int) -> ModelSpec:
    return rank_spec(spec, Strategy(), world_size)


def _cached(profiles: Profiles) -> Profiles:
    memo: dict[str, tuple[IterationGraph, Mapping[int, float]]] = {}

    def cached(rank: ModelSpec) -> tuple[IterationGraph, Mapping[int, float]]:
        key = rank.label + str(rank.inputs.batch_size)
        if key not in memo:
            memo[key] = profiles(rank)
        return memo[key]

    return cached


def _space(
    request: SearchRequest, spec: ModelSpec, evaluator: StrategyEvaluator, grad_mb: float
) -> Space:
    plans = (
        candidate_plans(spec, request.world_size, model_supports)
        if request.space == "all"
        else [ParallelPlan()]
    )
    blocks = evaluator.blocks if request.space == "all" else ()
    return Space(plans=tuple(plans), total_grad_mb=grad_mb, blocks=blocks)


def _total(request: SearchRequest) -> int:
    """Evaluations the budget allows (autotune: live runs, at most :data:`AUTOTUNE_RUNS`)."""
    return min(request.budget, AUTOTUNE_RUNS) if request.algo == "autotune" else request.budget


def _counter(total: int, progress: Progress) -> Callable[[int], None]:
    """Counts priced strategies to ``progress``."""
    priced = 0

    def advance(count: int) -> None:
        nonlocal priced
        priced += count
        progress(min(1.0, priced / total), f"{priced} of {total} evaluations")

    return advance


def _sample(
    request: SearchRequest,
    db: str,
    evaluator: StrategyEvaluator,
    space: Space,
    order: list[str],
) -> tuple[SearchResult, list[dict[str, Any]], dict[str, int]]:
    """An Optuna search, with ``request.workers - 1`` more worker processes on the same study
    (a temporary journal file when no ``storage`` is given)."""
    options = BacktrackOptions(
        budget=request.budget, time_limit_s=request.time_limit_s, top=request.top
    )
    start, baseline, baseline_ms = begin(evaluator, order)
    with tempfile.TemporaryDirectory(prefix="ddlsim-study-") as scratch:
        storage = request.storage
        if storage is None and request.workers > 1:
            storage = f"{JOURNAL}{Path(scratch) / 'study.log'}"
        study = StudyOptions(
            storage=storage,
            study_name=request.study_name
            or f"{request.model.label}-{request.world_size}-"
            f"{normalized_bandwidth(request.bandwidth)}-{request.algo}-{request.space}",
            seed=request.seed,
        )
        trials = open_study(cast(Sampler, request.algo), study)
        # The budget is this search's: trials already in a shared study do not count.
        target = finished_trials(trials) + request.budget
        deadline = start + request.time_limit_s
        workers = _start_workers(request, db, study, target, deadline - time.perf_counter())
        try:
            optimize(trials, evaluator, space, budget=target, deadline=deadline)
            for worker in workers:
                worker.join()
        finally:
            for worker in workers:  # interrupted: end them by their id
                if worker.is_alive():
                    worker.terminate()
                    worker.join()
        failed = [w.exitcode for w in workers if w.exitcode not in (0, None)]
        if failed:
            raise InvalidOptionError(f"{len(failed)} search worker(s) failed (exit {failed})")
        result, pareto = result_from_study(
            trials,
            space,
            baseline=baseline,
            baseline_ms=baseline_ms,
            start=start,
            options=options,
            baseline_fits=evaluator.feasible(baseline),
        )
        return result, pareto, pruned_reasons(trials)


def _start_workers(
    request: SearchRequest, db: str, study: StudyOptions, target: int, seconds: float
) -> list[multiprocessing.process.BaseProcess]:
    """Worker processes on the study; each gets the store's URL through the pipe that spawns
    it, never on a command line."""
    context = multiprocessing.get_context("spawn")
    workers: list[multiprocessing.process.BaseProcess] = []
    for index in range(1, request.workers):
        worker = context.Process(
            target=_worker,
            args=(request,),
            kwargs={
                "db": db,
                "study": study,
                "index": index,
                "target": target,
                "seconds": seconds,
            },
            name=f"ddlsim-search-worker-{index}",
            daemon=True,
        )
        worker.start()
        workers.append(worker)
    return workers


def _worker(
    request: SearchRequest,
    *,
    db: str,
    study: StudyOptions,
    index: int,
    target: int,
    seconds: float,
) -> None:
    """One more worker on the study: its own evaluator (profiles from the store), its own
    sampler seed."""
    deadline = time.perf_counter() + seconds
    with Store.open(db) as store:
        evaluator = build_evaluator(request, store)
        graph, _ = evaluator.profiles(_rank(request.model, request.world_size))
        grad_mb = sum(p.nbytes for p in graph.params) / 2**20
        space = _space(request, request.model, evaluator, grad_mb)
        trials = open_study(cast(Sampler, request.algo), study, worker=index)
        optimize(trials, evaluator, space, budget=target, deadline=deadline)


def _autotune(
    request: SearchRequest, grad_mb: float, advance: Callable[[int], None]
) -> SearchResult:
    remove_stale_namespaces()
    options = RunOptions(
        world_size=request.world_size,
        bandwidth=normalized_bandwidth(request.bandwidth),
        **request.measure.run_options(),
    )

    def measure(strategy: Strategy) -> float:
        return run_training(request.model, strategy, options).median_ms

    return autotune_fusion(
        measure,
        total_grad_mb=grad_mb,
        budget=_total(request),
        time_limit_s=request.time_limit_s,
        seed=request.seed,
        top=request.top,
        on_sample=lambda strategy, ms: advance(1),
    )


def _payload(
    request: SearchRequest, evaluator: StrategyEvaluator, result: SearchResult
) -> dict[str, Any]:
    measured = request.algo == "autotune"

    def entry(strategy: Strategy, ms: float) -> dict[str, Any]:
        row: dict[str, Any] = {"strategy": strategy.to_dict()}
        if measured:
            row["measured_ms"] = ms
        (row["predicted_ms"],) = evaluator.predicted([strategy])
        (row["scored_ms"],) = evaluator.price([strategy])
        row["peak_memory_gib"] = evaluator.memory(strategy).total_gib
        row["fits"] = evaluator.feasible(strategy)
        return row

    capacity = evaluator.cluster.capacity_bytes
    return {
        "model": request.model.label,
        "world_size": request.world_size,
        "bandwidth": evaluator.cluster.bandwidth,
        "algo": request.algo,
        "space": request.space,
        "predictor": evaluator.predictor,
        "calibration": _calibration_json(evaluator),
        "memory_capacity_gib": capacity / GIB if capacity else None,
        "best": entry(result.best, result.best_ms),
        "baseline": entry(result.baseline, result.baseline_ms),
        "top": [entry(s, ms) for s, ms in result.top],
        "evaluations": result.evaluations,
        "elapsed_s": result.elapsed_s,
        "convergence": list(result.curve),
    }


def _rescored(evaluator: StrategyEvaluator, row: dict[str, Any]) -> dict[str, Any]:
    """A Pareto row (its time the search's score) with the prediction and the score apart."""
    strategy = Strategy.from_dict(row["strategy"])
    (predicted,) = evaluator.predicted([strategy])
    return {**row, "predicted_ms": predicted, "scored_ms": row["predicted_ms"]}


def _calibration_json(evaluator: StrategyEvaluator) -> dict[str, Any] | None:
    """How the search scored strategies: the confidence and each kind's factor on its
    predicted time; ``None`` when it ranked by the prediction alone."""
    calibration = evaluator.calibration
    if calibration is None:
        return None
    summary = calibration.summary(evaluator.confidence)
    return {
        "predictor": calibration.predictor,
        "confidence": evaluator.confidence,
        "factors": {kind: row["factor"] for kind, row in summary.items()},
        "runs": {kind: row["runs"] for kind, row in summary.items()},
    }
