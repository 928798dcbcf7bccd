"""Run a strategy for real, store the measurement, and predict the same strategy beside it."""

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from ddlsim.cluster.launcher import Launcher, LocalLauncher
from ddlsim.data.store import (
    MeasurementRecord,
    Store,
    add_graph,
    add_measurement,
    add_strategy,
    strategy_hash,
)
from ddlsim.executor.jobs import RunJob
from ddlsim.executor.run import RunResult
from ddlsim.workflows.requests import ExecuteRequest, PredictRequest, Progress, no_progress

if TYPE_CHECKING:
    from ddlsim.simulator.predict import Prediction


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Executed:
    """A stored run (``measurement_id``) and, when asked for on more than one rank, the stored
    prediction of the same strategy (``prediction_id``)."""

    result: RunResult
    measurement_id: int
    store_url: str
    prediction: "Prediction | None" = None
    prediction_id: int | None = None


def execute(
    request: ExecuteRequest,
    store: Store,
    progress: Progress = no_progress,
    *,
    commit: Callable[[Session, Executed], None] | None = None,
    launcher: Launcher | None = None,
    on_submit: Callable[[str], None] | None = None,
) -> Executed:
    """Run ``request``'s strategy under its options through ``launcher`` (default: this
    machine's emulated cluster; ``on_submit`` hears a Slurm job's id) and (``request.predict``,
    more than one rank) predict the same strategy; store graph, strategy, measurement and
    prediction in one transaction, with whatever ``commit(session, executed)`` writes (a
    queued task's end): after a crash, all of it is stored or none, so a task run again stores
    its measurement once.

    Raises:
        ClusterRunError: a rank failed or hung (nothing is stored).
        DdlsimError: a model, strategy or option the executor cannot handle.
    """
    options = request.options
    launcher = launcher or LocalLauncher()
    launcher.check_link(options.bandwidth)
    progress(0.0, f"running {request.model.label} on {options.world_size} ranks")
    result: RunResult = launcher.launch(
        _run_job(request), progress=lambda m: progress(None, m), on_submit=on_submit
    )
    prediction: Prediction | None = None
    if request.predict and options.world_size > 1:
        # Imported here: a rank under torchrun (``ddlsim run``) never predicts, and the
        # simulator's GNN takes seconds to import.
        from ddlsim.workflows.predict import add_predicted, predict_request

        progress(0.9, "predicting the same strategy")
        asked = PredictRequest(
            model=request.model,
            strategy=request.strategy,
            world_size=options.world_size,
            bandwidth=options.bandwidth,
            simulator=request.simulator,
        )
        prediction, _, _ = predict_request(asked, store, progress)
    with store.transaction() as session:
        measurement_id = add_result(session, result)
        prediction_id = None
        if prediction is not None:
            prediction_id = add_predicted(session, prediction, request.strategy)
        executed = Executed(
            result=result,
            measurement_id=measurement_id,
            store_url=store.url,
            prediction=prediction,
            prediction_id=prediction_id,
        )
        if commit is not None:
            commit(session, executed)
    return executed


def measurement_record(result: RunResult) -> MeasurementRecord:
    """The store's record of a run."""
    return MeasurementRecord(
        model=result.model,
        graph_hash=result.graph.graph_hash,
        strategy_hash=strategy_hash(result.strategy),
        world_size=result.options.world_size,
        bandwidth=result.options.bandwidth or "loopback",
        network=result.network,
        iteration_time_ms=result.samples_ms,
        peak_memory_bytes=result.peak_memory_bytes,
        applied=result.applied,
        env=result.env(),
        losses=result.losses,
    )


def add_result(session: Any, result: RunResult) -> int:
    """Add a run's graph, strategy and measurement to ``session``; the measurement's id."""
    add_graph(session, graph=result.graph)
    add_strategy(session, strategy=result.strategy)
    return add_measurement(session, measurement=measurement_record(result))


def _run_job(request: ExecuteRequest) -> RunJob:
    return RunJob(spec=request.model, strategy=request.strategy, options=request.options)
