"""``/v1/simulator-trainings`` and ``/v1/dataset-exports``: training the simulator's cost model
and exporting the store's dataset, as queued jobs (:mod:`ddlsim.workflows.simulator_jobs`).

A job names no path of the worker's machine: it trains on the service's store or the shipped
dataset, and writes its checkpoint or file under the worker's data directory, named by a token
the route draws (:func:`ddlsim.workflows.simulator_jobs.job_file`); an export's file is
downloaded from ``/v1/dataset-exports/{id}/file`` where the worker shares the service's host.
"""

import secrets
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter
from fastapi.responses import FileResponse
from pydantic import Field

from ddlsim.data.store.tasks import TaskNotFoundError
from ddlsim.service.api.cluster_inputs import refused
from ddlsim.service.api.deps import WRITE, QueueDep
from ddlsim.service.api.routes.jobs import TaskId, public_job, routes_of_kind
from ddlsim.service.api.schemas import JobPublic
from ddlsim.service.api.schemas.requests import Body
from ddlsim.simulator.cost_model import PREDICTORS
from ddlsim.simulator.dataset import models_of
from ddlsim.workflows.simulator_jobs import (
    EXPORT_KIND,
    MAX_EPOCHS,
    TRAINING_KIND,
    ExportJob,
    TrainingJob,
    job_file,
)

router = APIRouter(prefix="/v1", tags=["simulator"])


class SimulatorTraining(Body):
    """``POST /v1/simulator-trainings``: train the cost model on the service's store (its
    runs and profiles) or on the shipped dataset."""

    source: Literal["store", "shipped"] = "shipped"
    epochs: Annotated[int, Field(ge=1, le=MAX_EPOCHS)] = 60
    hidden: Annotated[int, Field(ge=1, le=1024)] = 64
    layers: Annotated[int, Field(ge=1, le=16)] = 3
    seed: Annotated[int, Field(ge=0)] = 0
    predictor: Literal["auto", "replay", "gnn", "blend"] = "auto"


class DatasetExport(Body):
    """``POST /v1/dataset-exports``: the service's store written as a dataset file."""

    version: str = Field(description="the dataset version whose models are kept")
    all_models: bool = Field(False, description="keep every run of the store")
    note: Annotated[str, Field(max_length=2000)] = ""


@router.post("/simulator-trainings", status_code=202, dependencies=WRITE)
def simulator_training(body: SimulatorTraining, queue: QueueDep) -> JobPublic:
    """Queue a training of the simulator; the job's result is the checkpoint's meta and
    where the worker wrote it (``--simulator PATH`` serves it)."""
    assert body.predictor in ("auto", *PREDICTORS)
    job = refused(
        lambda: TrainingJob(**body.model_dump(), token=secrets.token_hex(8)), field="body"
    )
    return public_job(queue.submit(TRAINING_KIND, job.to_json()).to_dict())


@router.post("/dataset-exports", status_code=202, dependencies=WRITE)
def dataset_export(body: DatasetExport, queue: QueueDep) -> JobPublic:
    """Queue an export of the store's runs and profiles; the job's result counts them."""
    refused(lambda: models_of(body.version), field="body.version")
    job = ExportJob(**body.model_dump(), token=secrets.token_hex(8))
    return public_job(queue.submit(EXPORT_KIND, job.to_json()).to_dict())


@router.get(
    "/dataset-exports/{task_id}/file",
    response_class=FileResponse,
    responses={200: {"content": {"application/gzip": {}}, "description": "the dataset file"}},
)
def dataset_file(task_id: TaskId, queue: QueueDep) -> FileResponse:
    """A finished export's file (gzip JSON), where the worker wrote it on this host."""
    task = queue.get(task_id)
    if task.kind != EXPORT_KIND:
        raise TaskNotFoundError(f"no dataset-exports job {task_id} (it is a {task.kind})")
    token = ExportJob.from_json(task.request).token
    path = job_file(EXPORT_KIND, token, ".json.gz")
    if task.status != "done" or not Path(path).is_file():
        raise TaskNotFoundError(
            f"dataset-exports job {task_id} has no file here (status {task.status}; a worker on "
            "another host keeps it in its own data directory)"
        )
    return FileResponse(path, media_type="application/gzip", filename=path.name)


routes_of_kind(TRAINING_KIND, "simulator-trainings", on=router)
routes_of_kind(EXPORT_KIND, "dataset-exports", on=router)
