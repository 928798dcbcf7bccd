"""Predict a strategy's iteration time from the store's profiles, and store the prediction."""

import dataclasses

from sqlalchemy.orm import Session

from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import (
    KernelProfileRecord,
    Store,
    add_graph,
    add_prediction,
    add_strategy,
)
from ddlsim.executor.expert_overheads import measure_expert_overheads
from ddlsim.plans.feasibility import check, run_target
from ddlsim.plans.tp_plans import check_layouts, check_tensor_parallel
from ddlsim.profiler.capture import CaptureOptions, capture_graph
from ddlsim.profiler.routing import routing_load
from ddlsim.simulator.cost_model import CostModel, load_cost_model
from ddlsim.simulator.costs import rank_spec
from ddlsim.simulator.experts import ExpertMeasures
from ddlsim.simulator.predict import Prediction, check_replayed
from ddlsim.simulator.predict import predict as simulate
from ddlsim.workflows.profiles import (
    Capture,
    kernel_profile_for,
    link_fits,
    machine_scale,
    normalized_bandwidth,
)
from ddlsim.workflows.requests import PredictRequest, Progress, no_progress


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Predicted:
    """A stored prediction: the prediction, the kernel profile it used (taken now or not), and
    its id in the store at ``store_url``."""

    prediction: Prediction
    profile: KernelProfileRecord
    profiled_now: bool
    prediction_id: int
    store_url: str


def predict(request: PredictRequest, store: Store, progress: Progress = no_progress) -> Predicted:
    """Predict ``request``'s strategy and store the graph, the strategy and the prediction in
    one transaction.

    Raises:
        MissingProfileError: no kernel profile of the rank's micro-batch and
            ``request.profile_missing`` is false.
        DdlsimError: a model or strategy the tools cannot handle.
    """
    prediction, profile, profiled_now = predict_request(request, store, progress)
    with store.transaction() as session:
        prediction_id = add_predicted(session, prediction, request.strategy)
    return Predicted(
        prediction=prediction,
        profile=profile,
        profiled_now=profiled_now,
        prediction_id=prediction_id,
        store_url=store.url,
    )


def predict_request(
    request: PredictRequest, store: Store, progress: Progress = no_progress
) -> tuple[Prediction, KernelProfileRecord, bool]:
    """:func:`predict_on_store` with ``request``'s options; nothing is stored but a kernel
    profile taken now.

    Raises:
        InvalidStrategyError: a strategy that does not run on ``request.world_size`` CPU ranks
            (:func:`ddlsim.plans.feasibility.check`).
    """
    check(request.model, request.strategy, run_target(request.world_size, "cpu"))
    check_replayed(request.strategy.parallel)
    return predict_on_store(
        store,
        request.model,
        request.strategy,
        world_size=request.world_size,
        bandwidth=normalized_bandwidth(request.bandwidth),
        cost_model=load_cost_model(request.simulator),
        optimizer=request.optimizer,
        profile_iters=request.profile_iters,
        profile_missing=request.profile_missing,
        progress=progress,
    )


def add_predicted(session: Session, prediction: Prediction, strategy: Strategy) -> int:
    """Add a prediction's graph, its strategy and the prediction to ``session``; its id."""
    add_graph(session, graph=prediction.graph)
    add_strategy(session, strategy=strategy)
    return add_prediction(session, prediction=prediction.record())


def predict_on_store(
    store: Store,
    spec: ModelSpec,
    strategy: Strategy,
    *,
    world_size: int,
    bandwidth: str,
    cost_model: CostModel,
    optimizer: str = "adamw",
    profile_iters: int = 10,
    profile_missing: bool = True,
    capture: Capture = capture_graph,
    progress: Progress = no_progress,
) -> tuple[Prediction, KernelProfileRecord, bool]:
    """Predict ``strategy`` for ``spec`` with the store's kernel profile of the rank's
    micro-batch (taken now if there is none: the flag says so) and its gloo collective fits;
    compute is scaled for ranks sharing this machine's cores. Nothing is stored but a kernel
    profile taken now."""
    plan = strategy.parallel
    if plan.tp > 1 and plan.per_layer:  # refused before anything is profiled
        check_tensor_parallel(spec, plan.tp)
        check_layouts(
            spec, plan, rank_batch=plan.rank_batch_size(spec.inputs.batch_size, world_size)
        )
    rank = rank_spec(spec, strategy, world_size)
    profiled, profile, profiled_now = kernel_profile_for(
        store,
        rank,
        optimizer=optimizer,
        iters=profile_iters,
        profile_missing=profile_missing,
        capture=capture,
        progress=progress,
    )
    options = CaptureOptions(strategy=strategy, optimizer="sgd" if optimizer == "sgd" else "adamw")
    measured = None
    if plan.ep > 1:  # the routers' imbalance and the bookkeeping a layer, measured here
        overheads = measure_expert_overheads(rank, plan.dispatcher)
        measured = ExpertMeasures(
            imbalance=routing_load(spec, plan, world_size).imbalance,
            forward_ms=overheads.forward_ms,
            backward_ms=overheads.backward_ms,
        )
    prediction = simulate(
        capture(rank, options),
        profiled=profiled,
        node_ms=profile.node_ms,
        collective_profiles=link_fits(store),
        world_size=world_size,
        bandwidth=bandwidth,
        cost_model=cost_model,
        compute_scale=machine_scale(world_size),
        experts_measured=measured,
    )
    return prediction, profile, profiled_now
