"""The plain records the store reads and writes: JSON-friendly data, no database types.

``id`` and ``created_at`` are filled by the store: leave them ``None`` when saving (a given
``created_at`` is kept, e.g. when importing older results). Times are timezone-aware UTC.
"""

import dataclasses
import statistics
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, get_args

from ddlsim.data.comm_model import fit_cpu_cost
from ddlsim.data.errors import InvalidOptionError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

RecordT = TypeVar("RecordT", bound="DataclassInstance")

JobStatus = Literal["running", "done", "failed"]
JOB_STATUSES: tuple[str, ...] = get_args(JobStatus)
TaskStatus = Literal["queued", "running", "done", "failed", "cancelled"]
TASK_STATUSES: tuple[str, ...] = get_args(TaskStatus)


def record_of(record_type: type[RecordT], source: object, **fields: Any) -> RecordT:
    """A ``record_type`` dataclass whose fields are ``source``'s attributes of the same names,
    each of ``fields`` given in place of ``source``'s; a field ``source`` lacks keeps its default
    (``id`` and ``created_at`` of a new result).

    Raises:
        TypeError: a field that neither ``fields`` nor ``source`` gives and has no default, or
            a name in ``fields`` that is no field of ``record_type``.
    """
    for field in dataclasses.fields(record_type):
        if field.init and field.name not in fields and hasattr(source, field.name):
            fields[field.name] = getattr(source, field.name)
    return record_type(**fields)


class _Result:
    """A result record (a profile, a measurement, a prediction), named :attr:`what` in messages.

    Raises:
        InvalidOptionError: on construction, a naive ``created_at``.
    """

    __slots__ = ()
    created_at: datetime | None
    what: ClassVar[str]

    def __post_init__(self) -> None:
        value = self.created_at
        if value is not None and value.utcoffset() is None:
            raise InvalidOptionError(
                f"{self.what} created_at must be timezone-aware, got naive {value.isoformat()}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class KernelTimes:
    """Measured per-node durations of one iteration graph on one device: what the profiler's
    ``KernelProfile`` measures and its record keeps.

    ``node_ms`` maps a graph node id to its median duration; ``coverage`` is
    ``attributed_ms / iteration_time_ms``.
    """

    graph_hash: str
    model: str
    device: str
    device_name: str
    iters: int
    iteration_time_ms: float
    attributed_ms: float
    coverage: float
    node_ms: dict[int, float]
    trace_path: str | None
    env: dict[str, str]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class KernelProfileRecord(KernelTimes, _Result):
    """A stored kernel profile (:class:`KernelTimes`)."""

    what = "kernel profile"

    # The machine that measured it (its host name).
    host: str = ""
    created_at: datetime | None = None
    id: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FusionProfileRecord(_Result):
    """Blocks of one graph's model timed alone, eager and compiled (``torch.compile``).

    ``blocks`` holds one entry a block: ``block`` (module path), ``eager_ms`` and
    ``compiled_ms`` (median forward and backward), ``compile_s`` (the first compiled call).
    """

    what = "fusion profile"

    graph_hash: str
    model: str
    device: str
    backend: str
    iters: int
    blocks: list[dict[str, Any]]
    env: dict[str, str]
    created_at: datetime | None = None
    id: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveProfileRecord(_Result):
    """Samples of one collective and the latency-bandwidth model fitted to them.

    ``bandwidth`` is the link limit (``"1gbit"``, ``"none"``); ``network`` how ranks were
    connected (``"netns"``, ``"loopback"``); ``rank_cores`` the CPU cores each rank ran on.
    """

    what = "collective profile"

    collective: str
    backend: str
    world_size: int
    bandwidth: str
    network: str
    alpha_us: float
    busbw_gbps: float
    r2: float
    samples: list[dict[str, Any]]
    rank_cores: dict[int, list[int]]
    env: dict[str, str]
    created_at: datetime | None = None
    id: int | None = None

    @property
    def cpu_cost(self) -> tuple[float, float]:
        """``(cpu_alpha_us, cpu_us_per_byte)`` fitted to the samples' CPU repeats (0, 0 for a
        profile taken without them)."""
        return fit_cpu_cost(
            (float(s["size_bytes"]), statistics.median(float(t) for t in stolen))
            for s in self.samples
            if isinstance(stolen := s.get("stolen_us"), list) and stolen
        )

    @property
    def cpu_alpha_us(self) -> float:
        return self.cpu_cost[0]

    @property
    def cpu_us_per_byte(self) -> float:
        return self.cpu_cost[1]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class MeasurementRecord(_Result):
    """One executor run: iteration-time samples, peak memory per rank, what was applied, and
    the loss of the whole global batch at each step (warm-up steps first)."""

    what = "measurement"

    model: str
    graph_hash: str | None
    strategy_hash: str
    world_size: int
    bandwidth: str
    network: str
    iteration_time_ms: list[float]
    peak_memory_bytes: list[int]
    applied: dict[str, Any]
    env: dict[str, Any]
    losses: list[float] | None = None
    created_at: datetime | None = None
    id: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PredictionRecord(_Result):
    """A simulator's prediction for a graph, a strategy and a cluster (``ClusterSpec`` dict)."""

    what = "prediction"

    model: str
    graph_hash: str
    strategy_hash: str
    cluster: dict[str, Any]
    iteration_time_ms: float
    breakdown: dict[str, float]
    simulator_version: str
    created_at: datetime | None = None
    id: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ClusterPredictionRecord(_Result):
    """A GPU cluster's iteration priced on paper: ``model`` (its label; the spec is stored
    under ``model_spec_hash``) trained with a layout (``strategy``, the ``ScalePlan``'s strategy
    JSON, also stored under ``strategy_hash``) on ``cluster`` (``GpuClusterSpec`` dict), with
    ``global_batch`` sequences of ``seq_len`` tokens; ``prediction`` is what was predicted
    (``iteration_s``, throughput, memory, breakdown, ...), ``iteration_s`` its headline."""

    what = "cluster prediction"

    model: str
    model_spec_hash: str
    strategy_hash: str
    strategy: dict[str, Any]
    cluster: dict[str, Any]
    global_batch: int
    seq_len: int
    iteration_s: float
    prediction: dict[str, Any]
    simulator_version: str
    created_at: datetime | None = None
    id: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class JobRecord:
    """One batch job; ``key`` names it, so a restarted batch skips the jobs already done."""

    key: str
    kind: str
    status: JobStatus
    spec: dict[str, Any]
    error: str | None
    created_at: datetime
    finished_at: datetime | None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TaskRecord:
    """One request the service's workers run: a search, a profiling batch or an execution.

    ``queued`` until a worker claims it, ``running`` while that worker's heartbeat
    (``updated_at``) is fresh, then ``done`` (``result``), ``failed`` (``error``) or
    ``cancelled``. ``progress`` is the fraction done (0 to 1), ``message`` what it is doing;
    ``attempts`` counts claims (a task whose worker died is queued again once).

    ``gpus`` and ``cluster`` say what its worker must offer (CUDA GPUs on one host, a named
    cluster profile); a profiling run is a parent of ``children`` tasks, one a job
    (``parent_id`` points back), which workers claim one by one; the parent is never claimed
    and ends when its last child does.
    """

    id: int
    kind: str
    status: TaskStatus
    request: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    progress: float
    message: str | None
    cancel_requested: bool
    attempts: int
    worker: str | None
    created_at: datetime
    started_at: datetime | None
    updated_at: datetime
    finished_at: datetime | None
    gpus: int = 0
    cluster: str | None = None
    parent_id: int | None = None
    children: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; times as ISO 8601 text (``None`` stays ``None``)."""
        out = dataclasses.asdict(self)
        for key in ("created_at", "started_at", "updated_at", "finished_at"):
            out[key] = out[key].isoformat() if out[key] is not None else None
        return out
