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

import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sqlalchemy.orm import Session

from ddlsim.cluster.launcher import Launcher, LocalLauncher
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.data.store import Store
from ddlsim.executor.jobs import RunJob
from ddlsim.executor.run import RunResult
from ddlsim.plans.feasibility import model_supports
from ddlsim.plans.tp_plans import check_layouts, tp_plan
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.profiler.saved import saved_bytes
from ddlsim.search import (
    STUDY_ALGORITHMS,
    ParetoPoint,
    SearchAlgorithm,
    SearchBudget,
    SearchOutcome,
    SearchProblem,
    Space,
    search_algorithm,
)
from ddlsim.search.autotune import MAX_RUNS
from ddlsim.search.optuna_search import Helpers, OptunaSearch, SharedStudy
from ddlsim.search.plans import candidate_plans
from ddlsim.search.prior import grid_prior
from ddlsim.search.strategy_evaluator import Cluster, Profiles, StrategyEvaluator
from ddlsim.simulator.calibration import DEFAULT_CONFIDENCE
from ddlsim.simulator.cost_model import load_cost_model
from ddlsim.simulator.costs import rank_spec
from ddlsim.simulator.memory import GIB
from ddlsim.workflows.profiles import (
    LINK_COLLECTIVES,
    PLAN_COLLECTIVES,
    RING_COLLECTIVES,
    kernel_profile_for,
    link_fits,
    machine_scale,
    normalized_bandwidth,
    profile_link,
)
from ddlsim.workflows.requests import Progress, SearchRequest, no_progress
from ddlsim.workflows.verify import (
    predict_verified,
    store_verified,
    verify,
    verify_options,
)

AUTOTUNE_RUNS = MAX_RUNS
"""Autotune measures live runs: at most this many, whatever the budget."""


def search(
    request: SearchRequest,
    store: Store,
    progress: Progress = no_progress,
    *,
    commit: Callable[[Session, dict[str, Any]], None] | None = None,
    launcher: Launcher | None = None,
    on_submit: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The search ``request`` describes, as its JSON payload: the pick (``best``), DDP's
    defaults (``baseline``) and the ``top`` candidates, each with its predicted and scored time,
    peak memory and whether it fits; the calibration it scored with, the evaluations, the
    convergence curve, the Pareto front (``nsga2``), the pruned plans and, with ``verify``,
    what the executor measured (:func:`ddlsim.workflows.verify.verify`).

    ``progress(fraction, message)`` hears the strategies priced against the budget, then the
    verifying runs. It may raise to stop the search. The verifying runs are stored in one
    transaction with whatever ``commit(session, payload)`` writes (a queued task's end): after a
    crash, either both are stored or neither is. ``launcher`` runs them (default: this
    machine's emulated cluster; ``on_submit`` hears a Slurm job's id); a rank that follows
    goes through :func:`search_launched`.

    Raises:
        DdlsimError: a model or plan the tools cannot handle, a study storage Optuna cannot
            open, a search worker that failed.
    """
    spec = request.model
    launcher = launcher or LocalLauncher()
    if request.verify and launcher.emulated and request.world_size > 1:
        # The candidates are about to run on this machine's emulated cluster: price them on
        # its link as measured now, not on another day's fit of it.
        profile_link(
            store,
            world_size=request.world_size,
            bandwidth=normalized_bandwidth(request.bandwidth),
            collectives=(*LINK_COLLECTIVES, *PLAN_COLLECTIVES, *RING_COLLECTIVES),
            progress=progress,
        )
    evaluator = build_evaluator(request, store, progress)
    problem = _problem(request, evaluator)
    progress(None, f"searching {spec.label} ({request.algo}, {request.space} space)")
    # The hook stays on after the search: the payload's pricing counts too.
    evaluator.on_priced = advance = _counter(_total(request), progress)
    budget = SearchBudget(
        evaluations=request.budget,
        time_limit_s=request.time_limit_s,
        top=request.top,
        seed=request.seed,
    )
    outcome = _algorithm(request, store.url).search(problem, budget, advance)
    payload = _payload(request, evaluator, outcome)
    if request.algo == "nsga2":
        payload["pareto"] = [_pareto_row(evaluator, point) for point in outcome.pareto]
    payload["pruned"] = dict(outcome.pruned)
    runs: list[RunResult] = []
    if request.verify:
        progress(None, "running the candidates and the baseline for real")
        verified, runs = verify(request, payload, progress, launcher=launcher, on_submit=on_submit)
        payload.update(verified)
    # Each run is stored beside a prediction of its strategy, so the dashboard pairs them.
    predictions = [predict_verified(request, store, run.strategy) for run in runs]
    if runs or commit is not None:
        with store.transaction() as session:
            store_verified(session, payload, runs, predictions)
            if commit is not None:
                commit(session, payload)
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

    cost_model = load_cost_model(request.simulator)
    return StrategyEvaluator(
        request.model,
        Cluster(
            world_size=request.world_size,
            bandwidth=bandwidth,
            fits=link_fits(store),
            capacity_bytes=int(capacity_gb * GIB),
            compute_scale=machine_scale(request.world_size),
        ),
        _cached(profiles),
        capture_plan,
        cost_model=cost_model,
        # ``confidence`` None: ranked by the prediction alone.
        calibration=cost_model.calibration if request.confidence is not None else None,
        confidence=request.confidence or DEFAULT_CONFIDENCE,
        saved=saved_bytes,
    )


def default_capacity_gb(world_size: int) -> float:
    """Each rank's share of this machine's memory: every rank of the emulated cluster runs
    here."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total / GIB / world_size


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


def _problem(request: SearchRequest, evaluator: StrategyEvaluator) -> SearchProblem:
    """What ``request`` searches, priced by ``evaluator``: the gradients of the rank's graph in
    ready order, the space of ``request.space``, and for autotune the live runs."""
    graph, _ = evaluator.profiles(_rank(request.model, request.world_size))
    order = [name for name, _ in graph.gradient_sizes]
    sizes = [size for _, size in graph.gradient_sizes]
    return SearchProblem(
        evaluator=evaluator,
        space=_space(request, request.model, evaluator, sum(sizes) / 2**20),
        order=order,
        sizes=sizes,
        fusion_only=request.space == "fusion",
        measure=_measure(request) if request.algo == "autotune" else None,
    )


def _space(
    request: SearchRequest, spec: ModelSpec, evaluator: StrategyEvaluator, grad_mb: float
) -> Space:
    plans = (
        candidate_plans(spec, request.world_size, model_supports)
        if request.space == "all"
        else [ParallelPlan()]
    )
    if request.prior == "analytic":
        plans = grid_prior(plans, evaluator.analytic)
    blocks = evaluator.blocks if request.space == "all" else ()
    layer_blocks: list[str] = []
    layer_stacks: tuple[int, ...] = ()
    # Per-layer placements live under the tensor-parallel plans (a grid splits every block
    # alike): their blocks are those plans' (a model whose heads tp does not divide has none,
    # and may still have grids).
    split = [plan for plan in plans if plan.tp > 1 and not plan.grid]
    if split:
        layer_blocks = check_layouts(spec, ParallelPlan(tp=split[0].tp), rank_batch=None)
        if tp_plan(spec).shared_bias:  # a stack's blocks share one layout
            names = [path.rsplit(".", 1)[0] for path in layer_blocks]
            index = {name: i for i, name in enumerate(dict.fromkeys(names))}
            layer_stacks = tuple(index[name] for name in names)
    return Space(
        plans=tuple(plans),
        total_grad_mb=grad_mb,
        blocks=blocks,
        layer_blocks=len(layer_blocks),
        layer_stacks=layer_stacks,
        batch_size=spec.inputs.batch_size,
        world_size=request.world_size,
    )


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


def _algorithm(request: SearchRequest, db: str) -> SearchAlgorithm:
    """The algorithm ``request.algo`` names; an Optuna one on its study, with
    ``request.workers - 1`` more worker processes on it (a temporary journal file when no
    ``storage`` is given)."""
    if request.algo not in STUDY_ALGORITHMS:
        return search_algorithm(request.algo)
    return search_algorithm(
        request.algo,
        storage=request.storage,
        study_name=request.study_name
        or f"{request.model.label}-{request.world_size}-"
        f"{normalized_bandwidth(request.bandwidth)}-{request.algo}-{request.space}",
        helpers=_helpers(request, db) if request.workers > 1 else None,
    )


def _helpers(request: SearchRequest, db: str) -> Helpers:
    """Worker processes on an open study, joined when the search's own trials end."""

    @contextlib.contextmanager
    def helping(study: SharedStudy) -> Iterator[None]:
        workers = _start_workers(request, db, study)
        try:
            yield
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

    return helping


def _start_workers(
    request: SearchRequest, db: str, study: SharedStudy
) -> list[multiprocessing.process.BaseProcess]:
    """Worker processes on the study; each gets the store's URL through the pipe that spawns
    it, never on a command line."""
    context = multiprocessing.get_context("spawn")
    workers: list[multiprocessing.process.BaseProcess] = []
    for index in range(1, request.workers):
        worker = context.Process(
            target=_worker,
            args=(request,),
            kwargs={"db": db, "study": study, "index": index},
            name=f"ddlsim-search-worker-{index}",
            daemon=True,
        )
        worker.start()
        workers.append(worker)
    return workers


def _worker(request: SearchRequest, *, db: str, study: SharedStudy, index: int) -> None:
    """One more worker on the study: its own evaluator (profiles from the store), its own
    sampler seed."""
    algorithm = search_algorithm(request.algo)
    if not isinstance(algorithm, OptunaSearch):
        raise InvalidOptionError(f"{request.algo} keeps no study for workers to share")
    with Store.open(db) as store:
        algorithm.work(
            study, lambda: _problem(request, build_evaluator(request, store)), worker=index
        )


def _measure(request: SearchRequest) -> Callable[[Strategy], float]:
    """A strategy's measured median iteration time (ms), from a live run on the emulated
    cluster."""
    launcher = LocalLauncher()
    options = verify_options(request, launcher)

    def measure(strategy: Strategy) -> float:
        job = RunJob(spec=request.model, strategy=strategy, options=options)
        result: RunResult = launcher.launch(job)
        return result.median_ms

    return measure


def _payload(
    request: SearchRequest, evaluator: StrategyEvaluator, result: SearchOutcome
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


def _pareto_row(evaluator: StrategyEvaluator, point: ParetoPoint) -> dict[str, Any]:
    """A point of the Pareto front, its prediction and its score (the search's objective)
    apart."""
    (predicted,) = evaluator.predicted([point.strategy])
    return {
        "strategy": point.strategy.to_dict(),
        "predicted_ms": predicted,
        "peak_memory_gib": point.peak_memory_gib,
        "scored_ms": point.scored_ms,
    }


def _calibration_json(evaluator: StrategyEvaluator) -> dict[str, Any] | None:
    """How the search scored strategies: the confidence and each kind's factor on its
    predicted time; ``None`` when it ranked by the prediction alone."""
    calibration = evaluator.calibration
    if calibration is None:
        return None
    summary = calibration.summary(evaluator.confidence, evaluator.cluster.world_size)
    return {
        "predictor": calibration.predictor,
        "confidence": evaluator.confidence,
        "factors": {kind: row["factor"] for kind, row in summary.items()},
        "runs": {kind: row["runs"] for kind, row in summary.items()},
    }
