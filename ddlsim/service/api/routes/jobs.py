"""The jobs the workers run: strategy requests (searches), profiling runs and executions are
queued in the store (:mod:`ddlsim.data.store.tasks`); their ``GET`` gives status, progress and,
once done, the result. ``/v1/jobs`` lists every kind, and cancels.

A search or an execution is queued as its use case's request (:mod:`ddlsim.workflows.requests`,
``to_json()``), read from the body's fields by the request's ``from_json``, which checks it.
"""

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import Field

from ddlsim.data.errors import DdlsimError, one_line
from ddlsim.data.limits import SpecLimits
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store.tasks import TaskNotFoundError
from ddlsim.plans.feasibility import check, run_target
from ddlsim.profiler.batch import gpus_needed, parse_batch_data
from ddlsim.service.api.cluster_inputs import refused
from ddlsim.service.api.deps import WRITE, QueueDep, StoreDep
from ddlsim.service.api.errors import BadRequestError
from ddlsim.service.api.inputs import (
    built,
    finite,
    inputs_of,
    request_json,
    resolve_ref,
    runs_fit,
    strategy_object,
    strategy_of,
)
from ddlsim.service.api.schemas import (
    ExecutionRequest,
    JobList,
    JobPublic,
    ProfilingRun,
    ProfilingRunPublic,
    StrategyRequest,
)
from ddlsim.service.api.schemas.requests import MAX_RUN_WORLD_SIZE
from ddlsim.workflows.profile import check_job
from ddlsim.workflows.requests import ExecuteRequest, SearchRequest

router = APIRouter(prefix="/v1", tags=["jobs"])
TaskId = Annotated[int, Field(ge=1, le=2**62)]
Limit = Annotated[int, Field(ge=1, le=1000)]


@router.post("/strategy-requests", status_code=202, dependencies=WRITE)
def strategy_request(body: StrategyRequest, store: StoreDep, queue: QueueDep) -> JobPublic:
    """Queue a search for the fastest strategy (and, with ``verify``, runs of its pick)."""
    spec = inputs_of(store, body)
    request = built(lambda: SearchRequest.from_json(request_json(body, spec)), body=body)
    # The rank's micro-batch under DDP's defaults is profiled in one process; with verify,
    # every rank runs.
    rank_batch = Strategy().parallel.rank_batch_size(spec.inputs.batch_size, body.world_size)
    runs_fit(spec, rank_batch, body.world_size if body.verify else 1)
    return public_job(queue.submit("search", request.to_json()).to_dict())


@router.post("/profiling-runs", status_code=202, dependencies=WRITE)
def profiling_run(body: ProfilingRun, store: StoreDep, queue: QueueDep) -> ProfilingRunPublic:
    """Queue a profiling batch; models and strategies are resolved and checked now."""
    raw = body.model_dump()
    finite(raw, field="body")
    for section in ("jobs", "product"):
        for index, entry in enumerate(raw[section]):
            if "strategy" in entry:
                # Objects only: a string would be read as a path on the worker.
                where = f"body.{section}.{index}.strategy"
                given = entry["strategy"]
                if section == "product":
                    if not isinstance(given, list):
                        raise BadRequestError(
                            "a product's strategy must be a list", field=where, status=422
                        )
                    entry["strategy"] = [strategy_object(g, field=where) for g in given]
                else:
                    entry["strategy"] = strategy_object(given, field=where)
            if "model" in entry:
                where = f"body.{section}.{index}.model"
                models = entry["model"] if section == "product" else [entry["model"]]
                if not isinstance(models, list):
                    raise BadRequestError(
                        "a product's model must be a list", field=where, status=422
                    )
                resolved = [resolve_ref(store, m, field=where).to_dict() for m in models]
                entry["model"] = resolved if section == "product" else resolved[0]
    jobs = parse_batch_data({k: v for k, v in raw.items() if v})
    limits = SpecLimits.from_env()
    for index, job in enumerate(jobs):
        size = job.settings.get("world_size", 1)
        if isinstance(size, int) and size > MAX_RUN_WORLD_SIZE:
            raise BadRequestError(
                f"job {index} ({job.kind}): world_size({size}) is out of range; a queued run "
                f"starts at most {MAX_RUN_WORLD_SIZE} ranks",
                field="body.jobs",
                status=422,
            )
        try:  # everything the worker would refuse, and work over the service's limits
            check_job(job, limits)
        except DdlsimError as exc:
            raise BadRequestError(
                f"job {index} ({job.kind}): {one_line(exc)}", field="body.jobs", status=422
            ) from None
    # One task a job: workers on any number of hosts take them one by one.
    children = [
        ("profile-job", {"jobs": [{"kind": job.kind, **job.settings}]}, gpus_needed(job))
        for job in jobs
    ]
    task = queue.submit_run("profile", raw, children).to_dict()
    return ProfilingRunPublic.model_validate({**task, "jobs": len(jobs)})


@router.post("/executions", status_code=202, dependencies=WRITE)
def execution(body: ExecutionRequest, store: StoreDep, queue: QueueDep) -> JobPublic:
    """Queue a run of the strategy on real ranks, and its prediction beside it."""
    spec = inputs_of(store, body)
    strategy = strategy_of(body.strategy)
    request = built(
        lambda: ExecuteRequest.from_json(request_json(body, spec, strategy=strategy.to_dict())),
        body=body,
    )
    ranks = body.world_size
    options = request.options
    refused(
        lambda: check(spec, strategy, run_target(options.world_size, options.device)),
        field="body.strategy",
    )
    runs_fit(spec, strategy.parallel.rank_batch_size(spec.inputs.batch_size, ranks), ranks)
    return public_job(queue.submit("execution", request.to_json()).to_dict())


@router.get("/jobs")
def list_jobs(
    queue: QueueDep,
    status: Literal["queued", "running", "done", "failed", "cancelled"] | None = None,
    limit: Limit = 100,
) -> JobList:
    """Jobs of every kind, newest first."""
    return _listed(t.to_dict() for t in queue.list(status=status, limit=limit))


@router.get("/jobs/{task_id}")
def get_job(task_id: TaskId, queue: QueueDep) -> JobPublic:
    """A job of any kind."""
    return public_job(queue.get(task_id).to_dict())


@router.post("/jobs/{task_id}/cancel", dependencies=WRITE)
def cancel_job(task_id: TaskId, queue: QueueDep) -> JobPublic:
    """Cancel a job: a queued one at once, a running one at its next progress report."""
    return public_job(queue.cancel(task_id).to_dict())


def routes_of_kind(kind: str, path: str, on: APIRouter | None = None) -> None:
    """``GET /v1/PATH`` (the newest of this kind) and ``GET /v1/PATH/{id}``, on ``on``
    (default: this module's router)."""

    def listing(queue: QueueDep, limit: Limit = 100) -> JobList:
        return _listed(t.to_dict() for t in queue.list(kind=kind, limit=limit))

    def one(task_id: TaskId, queue: QueueDep) -> JobPublic:
        task = queue.get(task_id)
        if task.kind != kind:
            raise TaskNotFoundError(f"no {path} job {task_id} (task {task_id} is a {task.kind})")
        return public_job(task.to_dict())

    target = on or router
    target.add_api_route(f"/{path}", listing, methods=["GET"], name=f"list {path}")
    target.add_api_route(f"/{path}/{{task_id}}", one, methods=["GET"], name=f"get {path}")


for _kind, _path in (
    ("search", "strategy-requests"),
    ("profile", "profiling-runs"),
    ("execution", "executions"),
):
    routes_of_kind(_kind, _path)


def public_job(task: dict[str, Any]) -> JobPublic:
    return JobPublic.model_validate(task)


def _listed(tasks: Iterable[dict[str, Any]]) -> JobList:
    return JobList(jobs=[public_job(t) for t in tasks])
