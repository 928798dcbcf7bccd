"""Run a strategy for real, store the measurement, and predict the same strategy beside it."""

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import (
    MeasurementRecord,
    Store,
    add_graph,
    add_measurement,
    add_strategy,
    strategy_hash,
)
from ddlsim.executor.launchers import (
    SlurmSettings,
    compare_env,
    compare_slurm,
    run_env,
    run_slurm,
)
from ddlsim.executor.run import RunResult, compare_training, run_training
from ddlsim.profiler.cluster import remove_stale_namespaces
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
) -> Executed:
    """Run ``request``'s strategy under its options and (``request.predict``, more than one
    rank) predict the same strategy; store graph, strategy, measurement and prediction in one
    transaction, with whatever ``commit(session, executed)`` writes (a queued task's end): after
    a crash, all of it is stored or none, so a task run again stores its measurement once.

    Raises:
        ClusterRunError: a rank failed or hung (nothing is stored).
        DdlsimError: a model, strategy or option the executor cannot handle.
    """
    options = request.options
    remove_stale_namespaces()  # left by runs whose process was killed outright
    progress(0.0, f"running {request.model.label} on {options.world_size} ranks")
    result = run_training(
        request.model, request.strategy, options, progress=lambda m: progress(None, m)
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


def execute_launched(
    request: ExecuteRequest,
    *,
    launcher: str,
    db: str | None,
    slurm: SlurmSettings | None = None,
    progress: Progress = no_progress,
    on_submit: Callable[[str], None] | None = None,
) -> Executed | None:
    """Run ``request`` under an external launcher (``env``: this process is one rank of a
    group torchrun, srun or a PyTorchJob made; ``slurm``: a job submitit submits and waits for)
    and store rank 0's result in the store ``db`` (``$DDLSIM_DB`` or the default when
    ``None``); ``None`` on the other ranks of ``env``, which store nothing.

    Raises:
        InvalidOptionError: no launcher environment, bad Slurm settings or a world size that
            differs from the launcher's.
        ClusterRunError: the Slurm job failed.
    """
    if launcher == "env":
        result = run_env(
            request.model, request.strategy, request.options, progress=lambda m: progress(None, m)
        )
    elif launcher == "slurm":
        result = run_slurm(
            request.model,
            request.strategy,
            request.options,
            slurm or SlurmSettings(),
            progress=lambda m: progress(None, m),
            on_submit=on_submit,
        )
    else:
        raise InvalidOptionError(
            f"launcher {launcher!r} is not external; allowed: env, slurm (local runs through "
            "execute)"
        )
    if result is None:
        return None
    with Store.open(db) as store, store.transaction() as session:
        measurement_id = add_result(session, result)
        url = store.url
    return Executed(result=result, measurement_id=measurement_id, store_url=url)


def execute_side_by_side(
    request: ExecuteRequest,
    strategies: list[Strategy],
    *,
    rounds: int,
    launcher: str,
    db: str | None,
    slurm: SlurmSettings | None = None,
    progress: Progress = no_progress,
    on_submit: Callable[[str], None] | None = None,
) -> list[Executed] | None:
    """Run ``strategies`` on ``request.model`` side by side in one launch (the measurement
    protocol's comparison: each takes ``rounds`` turns or more, in a shuffled order), on this
    machine's emulated cluster (``local``), as this process's rank of an external group
    (``env``) or as a Slurm job (``slurm``); store every result in the store ``db``, in one
    transaction. One ``Executed`` a strategy, in the order given; ``None`` on the ranks of
    ``env`` other than 0, which store nothing. ``request.strategy`` is not used.

    Raises:
        InvalidOptionError: as :func:`execute_launched`, or no strategies, too many, or
            ``rounds`` < 1.
        ClusterRunError: a rank failed or hung, or the Slurm job failed (nothing is stored).
    """
    say = lambda message: progress(None, message)  # noqa: E731
    model, options = request.model, request.options
    progress(
        0.0, f"running {len(strategies)} strategies side by side on {options.world_size} ranks"
    )
    results: list[RunResult] | None
    if launcher == "local":
        remove_stale_namespaces()
        results = compare_training(model, strategies, options, rounds=rounds, progress=say)
    elif launcher == "env":
        results = compare_env(model, strategies, options, rounds=rounds, progress=say)
    elif launcher == "slurm":
        results = compare_slurm(
            model,
            strategies,
            options,
            slurm or SlurmSettings(),
            rounds=rounds,
            progress=say,
            on_submit=on_submit,
        )
    else:
        raise InvalidOptionError(f"launcher {launcher!r} is unknown; allowed: local, env, slurm")
    if results is None:
        return None
    with Store.open(db) as store, store.transaction() as session:
        ids = [add_result(session, result) for result in results]
        url = store.url
    return [
        Executed(result=result, measurement_id=measurement_id, store_url=url)
        for result, measurement_id in zip(results, ids, strict=True)
    ]
