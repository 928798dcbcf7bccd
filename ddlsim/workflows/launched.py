"""The use cases through a :class:`ddlsim.cluster.launcher.Launcher`: a run, runs side by
side, a search whose verifying runs it launches. The rank that reports opens the store; the
ranks that follow (``env``, not rank 0) run what rank 0 launches and return ``None``."""

from collections.abc import Callable
from typing import Any

from ddlsim.cluster.launcher import Launcher
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import Store
from ddlsim.executor.jobs import CompareJob, RunJob
from ddlsim.executor.run import RunResult
from ddlsim.workflows.execute import Executed, add_result, execute
from ddlsim.workflows.requests import ExecuteRequest, Progress, SearchRequest, no_progress
from ddlsim.workflows.search import search
from ddlsim.workflows.verify import verify_job


def execute_launched(
    request: ExecuteRequest,
    *,
    launcher: Launcher,
    db: str | None,
    progress: Progress = no_progress,
    on_submit: Callable[[str], None] | None = None,
) -> Executed | None:
    """:func:`execute` through ``launcher``, with the store ``db`` (``$DDLSIM_DB`` or the
    default when ``None``) opened by the rank that reports only; ``None`` on the ranks that
    follow, which store nothing.

    Raises:
        InvalidOptionError: no launcher environment, or a world size that differs from the
            launcher's.
        ClusterRunError: a rank or the Slurm job failed (nothing is stored).
    """
    if launcher.follows:
        launcher.launch(
            RunJob(spec=request.model, strategy=request.strategy, options=request.options),
            progress=lambda m: progress(None, m),
        )
        return None
    with Store.open(db) as store:
        return execute(request, store, progress, launcher=launcher, on_submit=on_submit)


def execute_side_by_side(
    request: ExecuteRequest,
    strategies: list[Strategy],
    *,
    rounds: int,
    launcher: Launcher,
    db: str | None,
    progress: Progress = no_progress,
    on_submit: Callable[[str], None] | None = None,
) -> list[Executed] | None:
    """Run ``strategies`` on ``request.model`` side by side in one launch through ``launcher``
    (the measurement protocol's comparison: each takes ``rounds`` turns or more, in a shuffled
    order) and store every result in the store ``db``, in one transaction. One ``Executed`` a
    strategy, in the order given; ``None`` on the ranks that follow, which store nothing.
    ``request.strategy`` is not used.

    Raises:
        InvalidOptionError: as :func:`execute_launched`, or no strategies, too many, or
            ``rounds`` < 1.
        ClusterRunError: a rank failed or hung, or the Slurm job failed (nothing is stored).
    """
    model, options = request.model, request.options
    progress(
        0.0, f"running {len(strategies)} strategies side by side on {options.world_size} ranks"
    )
    job = CompareJob(spec=model, strategies=tuple(strategies), options=options, rounds=rounds)
    results: list[RunResult] | None = launcher.launch(
        job, progress=lambda m: progress(None, m), on_submit=on_submit
    )
    if results is None:
        return None
    with Store.open(db) as store, store.transaction() as session:
        ids = [add_result(session, result) for result in results]
        url = store.url
    return [
        Executed(result=result, measurement_id=measurement_id, store_url=url)
        for result, measurement_id in zip(results, ids, strict=True)
    ]


def search_launched(
    request: SearchRequest,
    *,
    launcher: Launcher,
    db: str | None,
    progress: Progress = no_progress,
    on_submit: Callable[[str], None] | None = None,
) -> dict[str, Any] | None:
    """:func:`search` whose ``verify`` runs go through ``launcher``, with the store ``db``
    opened by the rank that reports only. A rank that follows (``env``, not rank 0) runs the
    verifying runs rank 0 chose and returns ``None``; rank 0 lets them go when it runs none.

    Raises:
        InvalidOptionError: a launcher that runs ranks elsewhere without ``verify``, with
            ``autotune`` (it measures on this machine), or of another world size.
        DdlsimError: as :func:`search`.
    """
    if not launcher.emulated and not request.verify:
        raise InvalidOptionError(
            f"--launcher {launcher.name} runs the --verify runs; add --verify"
        )
    if not launcher.emulated and request.algo == "autotune":
        raise InvalidOptionError(
            f"--algo autotune measures live runs on this machine; it does not run under "
            f"--launcher {launcher.name}"
        )
    launcher.ranks(request.world_size)
    if launcher.follows:
        launcher.launch(verify_job(request, launcher, None))
        return None
    try:
        with Store.open(db) as store:
            return search(request, store, progress, launcher=launcher, on_submit=on_submit)
    finally:
        launcher.release()
