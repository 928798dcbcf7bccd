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
    kind: str = Field(
        description="search, profile (a profiling run), profile-job, execution, cluster-search, "
        "simulator-training or dataset-export"
    )
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


# ----- GPU clusters on paper ---------------------------------------------------------------------


class GpuPublic(Public):
    """A GPU: dense peak TFLOP/s by dtype, HBM bandwidth (GB/s) and capacity."""

    name: str
    peak_tflops: dict[str, float]
    hbm_gbps: float
    memory_gib: float
    measured: str | None = Field(None, description="the measured GPU its op costs come from")


class GpuClusterPublic(Public):
    """A GPU cluster (``GpuClusterSpec.to_dict()``): NVLink per GPU and direction (GB/s), NICs
    across nodes (Gbit/s each)."""

    name: str
    nodes: int
    gpus_per_node: int
    gpu: GpuPublic
    nvlink_gbps: float
    nics_per_node: int
    nic_gbits: float
    nvlink_latency_us: float
    net_latency_us: float


class ClusterListed(Public):
    """A cluster a request may name: a preset or a measured cluster profile."""

    name: str
    origin: Literal["preset", "measured"]
    usage: str = Field(description="how to name it with a node count")
    nodes: int = Field(description="nodes when named alone (a preset: 1; a profile: measured)")
    gpu: str
    gpu_memory_gib: float
    gpus_per_node: int
    nvlink_gbps: float = Field(description="NVLink per GPU and direction, GB/s")
    nics_per_node: int
    nic_gbits: float = Field(description="one NIC's rate, Gbit/s")
    network_gbps_per_gpu: float = Field(description="across nodes, per GPU, GB/s")
    spec: GpuClusterPublic


class ClusterList(Public):
    """``GET /v1/clusters``: the presets, then the stored cluster profiles."""

    clusters: list[ClusterListed]


class GpuMemoryPublic(Public):
    """The busiest GPU's memory: its total and parts (weights and optimizer, activations,
    logits, reserved), GiB."""

    total_gib: float
    parts_gib: dict[str, float]


class ScaleFigures(Public):
    """One iteration of a layout on a GPU cluster, on paper."""

    iteration_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float = Field(description="recomputed FLOPs counted (Megatron-LM's count)")
    model_tflops_per_gpu: float = Field(description="the model's FLOPs only")
    mfu: float = Field(description="model FLOPs utilisation of the GPU's dense 16-bit peak")
    memory: GpuMemoryPublic
    fits: bool = Field(description="the busiest GPU's memory fits the GPU's")
    micro_batch_size: int
    breakdown_ms: dict[str, float] = Field(
        description="where the iteration goes: compute, recompute, exposed_comm_node (NVLink), "
        "exposed_comm_network, pipeline_bubble, optimizer; for a mixture of experts also "
        "expert_dispatch (the dispatch and combine left exposed) and host_bound (its blocks "
        "paced by the host); then any other part"
    )


class ClusterPredictionPublic(ScaleFigures):
    """``POST /v1/cluster-predictions`` and ``GET /v1/cluster-predictions/{id}``: a stored
    prediction and what it priced."""

    id: int
    created_at: str = Field(description="ISO 8601")
    model: str
    model_spec_hash: str
    cluster: GpuClusterPublic
    world_size: int
    strategy: dict[str, Any] = Field(description="the layout as a strategy (`ddlsim run`)")
    layout: str
    global_batch: int
    seq_len: int
    simulator_version: str


class ClusterPredictionList(Public):
    """``GET /v1/cluster-predictions``: newest first."""

    predictions: list[ClusterPredictionPublic]


class ClusterLayout(ScaleFigures):
    """A searched layout, ranked."""

    rank: int
    layout: str
    strategy: dict[str, Any] = Field(description="the layout as a strategy (`ddlsim run`)")
    replayed: bool = Field(description="priced with the pipeline schedule replayed")


class ClusterSearchResult(Public):
    """A finished cluster search: what was searched and the fastest layouts that fit."""

    model: str
    cluster: GpuClusterPublic
    world_size: int
    global_batch: int
    seq_len: int
    precision: str
    compile: bool
    evaluated: int = Field(description="layouts priced")
    refused_memory: int = Field(description="layouts over the GPUs' memory")
    failed: int = Field(description="layouts the model or batch refused")
    search_s: float
    simulator_version: str
    layouts: list[ClusterLayout] = Field(description="fastest first")


class ClusterSearchPublic(JobPublic):
    """``POST /v1/cluster-searches`` and ``GET /v1/cluster-searches/{id}``: the job, and its
    ranked layouts once done."""

    result: ClusterSearchResult | None  # type: ignore[assignment]


class ClusterSearchList(Public):
    """``GET /v1/cluster-searches``: newest first."""

    searches: list[ClusterSearchPublic]


class PublishedFile(Public):
    """A shipped file of published training runs."""

    name: str
    about: str | None
    rows: int


class PublishedFiles(Public):
    """``GET /v1/published``: the shipped files (``ddlsim/data/published``)."""

    files: list[PublishedFile]


class PublishedRow(Public):
    """A published run, predicted: its figure (``metric``) as published and as predicted, and
    the absolute percentage error; a row that could not be predicted has ``error`` only."""

    name: str
    source: str | None = None
    metric: str | None = None
    published: float | None = None
    predicted: float | None = None
    ape: float | None = None
    layout: str | None = None
    iteration_s: float | None = None
    memory_gib: float | None = None
    fits: bool | None = None
    error: str | None = None


class PublishedPredictions(Public):
    """``GET /v1/published/{name}``: every row of the file predicted, and their mean APE."""

    name: str
    about: str | None
    rows: list[PublishedRow]
    mape: float | None
