"""What the API is sent: request bodies, checked before a route runs.

Their defaults are the use cases' (:mod:`ddlsim.workflows.requests`), the same as the command
line's; where the API's range forbids one (a prediction or a search on one rank), the API keeps
its own and a test lists the exception.
"""

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from ddlsim.data.specs.cluster import parse_bandwidth_gbps
from ddlsim.executor.run import MAX_SIDE_BY_SIDE, RunOptions
from ddlsim.workflows.profile import MAX_MEASURE_BUDGET_S
from ddlsim.workflows.requests import SEARCH_MEASURE, PredictRequest, SearchRequest, defaults
from ddlsim.workflows.scale_jobs import MAX_TOP, LayoutSearchRequest

_PREDICT = defaults(PredictRequest)
_SEARCH = defaults(SearchRequest)
_RUN = defaults(RunOptions)
_LAYOUTS = defaults(LayoutSearchRequest)
MIN_WORLD_SIZE = 2
"""Predictions and searches are of several ranks (a search splits work between them)."""

ModelRef = Annotated[
    str | dict[str, Any],
    Field(description="a zoo or registered model's name, or a model spec object"),
]
PositiveInt = Annotated[int, Field(ge=1, le=1 << 20)]


def _rate(text: str | None) -> str | None:
    """A link rate the worker will accept, checked now (``parse_bandwidth_gbps`` raises a
    ``ValueError`` naming the value and the forms allowed: a 422)."""
    if text is not None:
        parse_bandwidth_gbps(text)
    return text


Bandwidth = Annotated[
    str | None,
    Field(max_length=32, description="link rate per host (1gbit, 100mbit, none); null: unshaped"),
    AfterValidator(_rate),
]
MAX_RUN_WORLD_SIZE = 64
"""Ranks a queued run may start on this machine (executions, verification runs, profiling)."""

# The measurement protocol's settings (executor.protocol), as the command line takes them.
CiTarget = Annotated[
    float,
    Field(
        gt=0,
        lt=1,
        description="measure until the median's 95 % interval is within +- this fraction of it",
    ),
]
MeasureBudget = Annotated[
    float,
    Field(
        ge=0,
        le=MAX_MEASURE_BUDGET_S,
        description="seconds a strategy may measure beyond its minimum steps (0: the minimums)",
    ),
]


class Body(BaseModel):
    """A request body: unknown fields and non-finite numbers are refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Inputs(Body):
    """A model and the inputs it trains on (the model's own when left out)."""

    model: ModelRef
    batch_size: PositiveInt | None = None
    seq_len: PositiveInt | None = None
    image_size: PositiveInt | None = None


INPUT_FIELDS = frozenset(Inputs.model_fields)


class ModelRegistration(Body):
    """``POST /v1/models``: a spec to register under its name."""

    spec: dict[str, Any] = Field(description="a model spec: source, class, config, inputs, name")


class GraphRequest(Inputs):
    """``POST /v1/graphs``: capture a rank's graph under a strategy."""

    strategy: dict[str, Any] | None = None
    world_size: Annotated[int, Field(ge=1, le=4096)] = 1


class PredictionRequest(Inputs):
    """``POST /v1/predictions``: a strategy's predicted iteration time (DDP's defaults when
    ``strategy`` is left out)."""

    strategy: dict[str, Any] | None = None
    world_size: Annotated[int, Field(ge=MIN_WORLD_SIZE, le=4096)] = MIN_WORLD_SIZE
    bandwidth: Bandwidth = _PREDICT["bandwidth"]


class StrategyRequest(Inputs):
    """``POST /v1/strategy-requests``: a search, queued (:class:`SearchRequest`)."""

    world_size: Annotated[int, Field(ge=MIN_WORLD_SIZE, le=4096)] = MIN_WORLD_SIZE
    bandwidth: Bandwidth = _SEARCH["bandwidth"]
    algo: Literal["backtrack", "tpe", "cmaes", "nsga2", "random"] = _SEARCH["algo"]
    space: Literal["all", "fusion"] = _SEARCH["space"]
    budget: Annotated[int, Field(ge=1, le=1_000_000)] = _SEARCH["budget"]
    time_limit: Annotated[float, Field(gt=0, le=86_400, description="seconds")] = _SEARCH[
        "time_limit_s"
    ]
    memory_gb: Annotated[float, Field(gt=0, le=1 << 20)] | None = _SEARCH["memory_gb"]
    top: Annotated[int, Field(ge=1, le=100)] = _SEARCH["top"]
    confidence: Annotated[
        float | None,
        Field(
            ge=0.5,
            le=0.99,
            description="the quantile of each kind's held-out speed-up errors strategies are "
            "scored at; null ranks by the predicted time alone",
        ),
    ] = _SEARCH["confidence"]
    seed: int = _SEARCH["seed"]
    verify: bool = _SEARCH["verify"]
    iters: Annotated[int, Field(ge=1, le=1000)] = SEARCH_MEASURE.iters
    warmup: Annotated[int, Field(ge=1, le=100)] = SEARCH_MEASURE.warmup
    ci_target: CiTarget = SEARCH_MEASURE.ci_target
    measure_budget_s: MeasureBudget = SEARCH_MEASURE.budget_s
    verify_rounds: Annotated[
        int,
        Field(
            ge=1,
            le=100,
            description="verify: the strategies run side by side, taking turns of iters steps "
            "this many times each",
        ),
    ] = _SEARCH["verify_rounds"]
    verify_top: Annotated[
        int,
        Field(
            ge=1,
            le=MAX_SIDE_BY_SIDE - 1,
            description="verify: how many of top's candidates run beside DDP's defaults (at "
            "most top); the answer is the measured fastest if it beat DDP's defaults beyond the "
            "noise, else DDP's defaults",
        ),
    ] = _SEARCH["verify_top"]

    @model_validator(mode="after")
    def _runs_fit(self) -> "StrategyRequest":
        if self.verify and self.world_size > MAX_RUN_WORLD_SIZE:
            raise ValueError(
                f"world_size({self.world_size}) with verify: the verifying runs start one rank "
                f"a process, at most {MAX_RUN_WORLD_SIZE}; search without verify, or on fewer"
            )
        return self


class ProfilingRun(Body):
    """``POST /v1/profiling-runs``: a profiling batch, queued (jobs, and products of options
    expanded into jobs)."""

    jobs: list[dict[str, Any]] = Field(default_factory=list, max_length=10_000)
    product: list[dict[str, Any]] = Field(default_factory=list, max_length=1000)


class ExecutionRequest(Inputs):
    """``POST /v1/executions``: a strategy run for real and predicted beside it, queued
    (:class:`~ddlsim.workflows.requests.ExecuteRequest`)."""

    strategy: dict[str, Any] | None = None
    world_size: Annotated[int, Field(ge=1, le=MAX_RUN_WORLD_SIZE)] = _RUN["world_size"]
    bandwidth: Annotated[
        str | None,
        Field(
            max_length=32,
            description="run on an emulated cluster with this link rate per host (1gbit, "
            "100mbit, none); null: the ranks share loopback",
        ),
        AfterValidator(_rate),
    ] = _RUN["bandwidth"]
    iters: Annotated[int, Field(ge=1, le=1000)] = _RUN["iters"]
    warmup: Annotated[int, Field(ge=0, le=100)] = _RUN["warmup"]
    ci_target: CiTarget = _RUN["ci_target"]
    measure_budget_s: MeasureBudget = _RUN["budget_s"]
    seed: int = _RUN["seed"]
    trace: bool = Field(True, description="profile one more step on rank 0, for the dashboard")


# ----- GPU clusters on paper ---------------------------------------------------------------------

ClusterRef = Annotated[
    str | dict[str, Any],
    Field(
        description="a GPU cluster by name, NAME[:NODES]: a preset (dgx-h100:128) or a stored "
        "cluster profile (GET /v1/clusters lists both), or a GPU cluster spec object "
        '({"preset": "dgx-h100", "nodes": 4} overrides a preset\'s fields)'
    ),
]
GlobalBatch = Annotated[
    int | None,
    Field(ge=1, le=1 << 24, description="sequences per iteration; null: the model's batch size"),
]
SeqLen = Annotated[
    int | None,
    Field(ge=1, le=1 << 20, description="tokens per sequence; null: the model's sequence length"),
]


class ClusterPredictionRequest(Body):
    """``POST /v1/cluster-predictions``: one layout of a large model on a GPU cluster, priced
    on paper and stored."""

    model: ModelRef
    cluster: ClusterRef
    strategy: dict[str, Any] = Field(
        description="the layout, a strategy as `ddlsim run` takes it: parallel.dp, tp, pp, "
        "micro_batches, pp_schedule, virtual_stages, recompute, sequence_parallel, fsdp, "
        "distributed_optimizer, async_tp, precision, compile; dp defaults to what the cluster "
        "leaves, precision to bf16"
    )
    global_batch: GlobalBatch = None
    seq_len: SeqLen = None


class SearchSpace(Body):
    """The layouts a job's framework offers (``ddlsim.search.scale_plans.SpaceLimits``); a key
    left out offers everything."""

    recompute: list[Literal["none", "selective", "selective_op", "full"]] | None = None
    sharding: list[Literal["none", "distributed_optimizer", "fsdp"]] | None = None
    cp: list[Literal[1, 2, 4, 8]] | None = None
    sequence_parallel: bool | None = None
    interleaved: bool | None = None


class ClusterSearchRequest(Body):
    """``POST /v1/cluster-searches``: the fastest layouts of a large model on a GPU cluster,
    searched as a job (:class:`~ddlsim.workflows.scale_jobs.LayoutSearchRequest`)."""

    model: ModelRef
    cluster: ClusterRef
    global_batch: GlobalBatch = None
    seq_len: SeqLen = None
    precision: Literal["fp16", "bf16", "fp8"] = _LAYOUTS["precision"]
    compile: bool = Field(_LAYOUTS["compile"], description="blocks compiled")
    allow_fsdp: bool = Field(_LAYOUTS["allow_fsdp"], description="layouts with FSDP too")
    allow_async_tp: bool = Field(
        _LAYOUTS["allow_async_tp"],
        description="async tensor parallelism with tp > 1 (it needs compiled blocks)",
    )
    kernels: Literal["pytorch", "transformer_engine"] = Field(
        _LAYOUTS["kernels"], description="the kernels the job runs (Transformer Engine's fused)"
    )
    top: Annotated[int, Field(ge=1, le=MAX_TOP, description="layouts kept, each priced")] = (
        _LAYOUTS["top"]
    )
    search_space: SearchSpace | None = Field(
        None, description="what the job's framework offers the search, where less than all"
    )
    memory_margin_gib: float = Field(
        0.0,
        ge=0,
        description="GiB a layout must leave free on each GPU to be offered (predicted peak "
        "+ margin <= the GPU's memory)",
    )
    target: Literal["paper", "cuda"] = Field(
        "paper",
        description="paper: every layout the GPU path prices; cuda: only what the executor "
        "runs on those GPUs (a search for a run)",
    )
