"""What the API answers: one model a response, so that ``/openapi.json`` describes each.

The known top-level fields are typed; open-ended parts (a job's request and result, a graph's
summary, the dashboard's series) stay JSON objects. A route builds these from the records'
``to_dict()`` and ``to_json()``, and the JSON is theirs, key for key.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ddlsim.data.store.records import TaskStatus


class Public(BaseModel):
    """A response body."""

    model_config = ConfigDict(populate_by_name=True)


class Health(Public):
    """``GET /healthz``: the database answers."""

    status: Literal["ok"]
    version: str


# ----- models and graphs -------------------------------------------------------------------------


class InputsPublic(Public):
    """A model's inputs; only the sizes it has are given."""

    batch_size: int
    seq_len: int | None = None
    image_size: int | None = None


class ModelPublic(Public):
    """A model spec (``ModelSpec.to_dict()``); ``name`` and ``family`` only where set."""

    source: str
    class_: str = Field(alias="class")
    config: dict[str, Any]
    inputs: InputsPublic
    name: str | None = None
    family: str | None = None


class ModelListed(ModelPublic):
    """A model in the listing: a zoo model, or the newest spec registered under a name."""

    origin: Literal["zoo", "registered"]
    spec_hash: str | None = Field(None, description="registered models only")


class ModelList(Public):
    """``GET /v1/models``: the zoo, then registered models by name."""

    models: list[ModelListed]


class Registered(Public):
    """``POST /v1/models``: the name and the stored spec's hash."""

    name: str
    spec_hash: str


class GraphPublic(Public):
    """A captured iteration graph, by its headline numbers."""

    graph_hash: str
    model: str
    num_nodes: int
    summary: dict[str, Any] = Field(description="IterationGraph.summary()")


# ----- predictions and the simulator -------------------------------------------------------------


class FusedBlock(Public):
    """A compiled block: its eager time in the kernel profile and its predicted fused time."""

    block: str
    eager_ms: float
    compiled_ms: float


class PredictionPublic(Public):
    """``POST /v1/predictions``: the predicted iteration and what it was computed from."""

    model: str
    world_size: int
    bandwidth: str
    strategy: dict[str, Any]
    kernel_profile_id: int | None
    backend: str
    iteration_time_ms: float
    breakdown: dict[str, float] = Field(description="compute, communication, exposed, replay")
    predictor: str
    compute_scale: float
    collective_models: dict[str, str]
    simulator_version: str
    fused_blocks: list[FusedBlock]


class SimulatorVersions(Public):
    """``GET /v1/simulator/versions``: the replay's and the cost model's versions, and the
    loaded checkpoint's scalar metadata (``null``: the replay alone)."""

    simulator: str
    cost_model: str
    checkpoint: dict[str, str | int | float | bool] | None


# ----- jobs --------------------------------------------------------------------------------------


class JobPublic(Public):
    """A job (``TaskRecord.to_dict()``): status, progress and, once done, the result."""

    id: int
    kind: str = Field(description="search, profile (a profiling run), profile-job or execution")
    status: TaskStatus
    request: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    progress: float = Field(description="the fraction done, 0 to 1")
    message: str | None
    cancel_requested: bool
    attempts: int
    worker: str | None
    created_at: str = Field(description="ISO 8601")
    started_at: str | None
    updated_at: str
    finished_at: str | None
    gpus: int = Field(0, description="CUDA GPUs its worker must offer on one host")
    cluster: str | None = Field(None, description="the cluster its worker must belong to")
    parent_id: int | None = Field(None, description="the profiling run a job task is part of")
    children: int = Field(0, description="a profiling run's job tasks (0 for any other)")


class ProfilingRunPublic(JobPublic):
    """``POST /v1/profiling-runs``: the queued job and how many profiling jobs it holds."""

    jobs: int


class JobList(Public):
    """Jobs, newest first."""

    jobs: list[JobPublic]


# ----- the dashboard -----------------------------------------------------------------------------


class DashboardErrors(Public):
    """The prediction error of the dashboard's points, by model family and strategy kind."""

    by_family: list[dict[str, Any]]
    by_kind: list[dict[str, Any]]


class Dashboard(Public):
    """``GET /v1/dashboard``: predicted against measured points, their errors, finished
    searches' convergence and executions with both timelines."""

    points: list[dict[str, Any]]
    errors: DashboardErrors
    searches: list[dict[str, Any]]
    timelines: list[dict[str, Any]]
