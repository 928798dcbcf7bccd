"""GPU clusters on paper (:mod:`ddlsim.workflows.scale`): the clusters a request may name, a
layout's prediction (answered at once and stored), and searches for the fastest layouts, queued
as jobs (kind ``cluster-search``) that a worker runs.

A large model is captured one block at a time on fake tensors: the first prediction of a model
takes seconds, the next of the same model and split milliseconds.
"""

from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import Field

from ddlsim.data.store.errors import StoreError
from ddlsim.data.store.tasks import TaskNotFoundError
from ddlsim.service.api.cluster_inputs import (
    batch_of,
    cluster_model,
    cluster_of,
    plan_of,
    refused,
)
from ddlsim.service.api.deps import WRITE, PredictorDep, QueueDep, StoreDep
from ddlsim.service.api.errors import BadRequestError
from ddlsim.service.api.schemas import (
    ClusterList,
    ClusterPredictionList,
    ClusterPredictionPublic,
    ClusterPredictionRequest,
    ClusterSearchList,
    ClusterSearchPublic,
    ClusterSearchRequest,
)
from ddlsim.workflows.clusters import cluster_catalogue
from ddlsim.workflows.scale import ScaleRequest
from ddlsim.workflows.scale_jobs import (
    LayoutSearchRequest,
    predict_and_store,
    prediction_json,
    scale_request_checked,
)

router = APIRouter(prefix="/v1", tags=["clusters"])
SEARCH_KIND = "cluster-search"
Id = Annotated[int, Field(ge=1, le=2**62)]
Limit = Annotated[int, Field(ge=1, le=1000)]


@router.get("/clusters")
def clusters(store: StoreDep) -> ClusterList:
    """The GPU clusters a request may name: the presets and the stored cluster profiles."""
    return ClusterList.model_validate({"clusters": cluster_catalogue(store)})


@router.post("/cluster-predictions", status_code=201, dependencies=WRITE)
def cluster_prediction(
    body: ClusterPredictionRequest, store: StoreDep, predictor: PredictorDep
) -> ClusterPredictionPublic:
    """One layout of a model on a GPU cluster, priced on paper and stored (a layout over the
    GPUs' memory is priced too, ``fits`` false)."""
    spec = cluster_model(store, body.model)
    cluster = cluster_of(store, body.cluster)
    plan = plan_of(body.strategy, cluster)
    global_batch, seq_len = batch_of(spec, body.global_batch, body.seq_len)
    request = refused(
        lambda: scale_request_checked(
            ScaleRequest(
                model=spec,
                cluster=cluster,
                plan=plan,
                global_batch=global_batch,
                seq_len=seq_len,
            )
        ),
        field="body.strategy",
    )
    with predictor.slot():
        record = refused(lambda: predict_and_store(request, store), field="body.strategy")
    return ClusterPredictionPublic.model_validate(prediction_json(record))


@router.get("/cluster-predictions")
def list_cluster_predictions(store: StoreDep, limit: Limit = 100) -> ClusterPredictionList:
    """Stored cluster predictions, newest first."""
    records = store.cluster_predictions(limit=limit)
    return ClusterPredictionList.model_validate(
        {"predictions": [prediction_json(r) for r in records]}
    )


@router.get("/cluster-predictions/{prediction_id}")
def get_cluster_prediction(prediction_id: Id, store: StoreDep) -> ClusterPredictionPublic:
    """A stored cluster prediction."""
    try:
        record = store.cluster_prediction(prediction_id=prediction_id)
    except StoreError as exc:
        raise BadRequestError(str(exc), field="path.prediction_id", status=404) from None
    return ClusterPredictionPublic.model_validate(prediction_json(record))


@router.post("/cluster-searches", status_code=202, dependencies=WRITE)
def cluster_search(
    body: ClusterSearchRequest, store: StoreDep, queue: QueueDep
) -> ClusterSearchPublic:
    """Queue a search for the fastest layouts of a model on a GPU cluster; the job's result
    ranks them, each priced in full."""
    spec = cluster_model(store, body.model)
    cluster = cluster_of(store, body.cluster)
    global_batch, seq_len = batch_of(spec, body.global_batch, body.seq_len)
    request = refused(
        lambda: LayoutSearchRequest(
            model=spec,
            cluster=cluster,
            global_batch=global_batch,
            seq_len=seq_len,
            precision=body.precision,
            compile=body.compile,
            allow_fsdp=body.allow_fsdp,
            allow_async_tp=body.allow_async_tp,
            kernels=body.kernels,
            top=body.top,
            search_space=(
                body.search_space.model_dump(exclude_none=True) if body.search_space else None
            ),
            memory_margin_gib=body.memory_margin_gib,
            target=body.target,
        ),
        field="body",
    )
    return _search(queue.submit(SEARCH_KIND, request.to_json()).to_dict())


@router.get("/cluster-searches")
def list_cluster_searches(
    queue: QueueDep,
    status: Literal["queued", "running", "done", "failed", "cancelled"] | None = None,
    limit: Limit = 100,
) -> ClusterSearchList:
    """Cluster searches, newest first."""
    tasks = queue.list(kind=SEARCH_KIND, status=status, limit=limit)
    return ClusterSearchList(searches=[_search(t.to_dict()) for t in tasks])


@router.get("/cluster-searches/{task_id}")
def get_cluster_search(task_id: Id, queue: QueueDep) -> ClusterSearchPublic:
    """A cluster search: its status and progress and, once done, its ranked layouts."""
    task = queue.get(task_id)
    if task.kind != SEARCH_KIND:
        raise TaskNotFoundError(f"no cluster search {task_id} (task {task_id} is a {task.kind})")
    return _search(task.to_dict())


def _search(task: dict[str, Any]) -> ClusterSearchPublic:
    return ClusterSearchPublic.model_validate(task)
