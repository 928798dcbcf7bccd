"""The store's tables as SQLAlchemy 2 typed models.

Every table and constraint name starts with ``ddlsim_`` (or carries it after a ``pk_``/``fk_``
/``ix_``/``ck_`` prefix) because Optuna keeps its own tables in the same database. The
migration in ``migrations/versions`` creates exactly these tables; a test compares the two.

Content-addressed rows (model specs, graphs, strategies) are keyed by their SHA-256; results
(profiles, measurements, predictions) by an integer id and point at what they were taken on.
"""

import dataclasses
from datetime import UTC, datetime
from typing import Any, ClassVar, Generic, Self

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ddlsim.data.store.records import (
    JOB_STATUSES,
    TASK_STATUSES,
    ClusterPredictionRecord,
    CollectiveProfileRecord,
    FusionProfileRecord,
    JobRecord,
    KernelProfileRecord,
    MeasurementRecord,
    PredictionRecord,
    RecordT,
    TaskRecord,
    record_of,
)

TABLE_PREFIX = "ddlsim_"
VERSION_TABLE = "ddlsim_alembic_version"
HASH_LENGTH = 64
NAME_LENGTH = 255
JOB_KEY_LENGTH = 512

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend.

    SQLite keeps no offset, so values are converted to UTC before they are written and marked
    UTC when they are read back.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """``value`` in UTC, as written.

        Raises:
            ValueError: on a naive datetime.
        """
        if value is None:
            return None
        if value.utcoffset() is None:
            raise ValueError(f"naive datetime {value.isoformat()} given; use UTC-aware times")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """``value`` as read back, marked UTC (SQLite keeps no offset)."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def utc_now() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


class Base(DeclarativeBase):
    """The declarative base of ddlsim's tables, with named constraints (Alembic needs names)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class ResultRow(Base, Generic[RecordT]):
    """A result (a profile, a measurement, a prediction): an integer id, the time it was
    stored, and the fields of its record (:attr:`record_type`) as columns of the same names.

    JSON keys are text: the dict columns named in :attr:`int_keyed` (keyed by node id or rank)
    are stored with text keys and read back with integer ones.
    """

    __abstract__ = True

    record_type: ClassVar[type[Any]]
    int_keyed: ClassVar[tuple[str, ...]] = ()

    # First and last, as the migrations create the tables.
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True, sort_order=-1)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)

    @classmethod
    def from_record(cls, record: RecordT) -> Self:
        """The row that stores ``record``: ``id`` left to the database, ``created_at`` now
        unless the record has one."""
        values = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
        del values["id"]
        values["created_at"] = values["created_at"] or utc_now()
        for name in cls.int_keyed:
            values[name] = {str(key): value for key, value in values[name].items()}
        return cls(**values)

    def to_record(self) -> RecordT:
        """The row as the record it stores."""
        keyed = {
            name: {int(key): value for key, value in getattr(self, name).items()}
            for name in self.int_keyed
        }
        return record_of(self.record_type, self, **keyed)


class ModelSpecRow(Base):
    """A ``ModelSpec`` (its ``to_dict()``), keyed by the SHA-256 of its canonical JSON."""

    __tablename__ = "ddlsim_model_specs"

    spec_hash: Mapped[str] = mapped_column(String(HASH_LENGTH), primary_key=True)
    label: Mapped[str] = mapped_column(String(NAME_LENGTH))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)


class ClusterProfileRow(Base):
    """A named GPU cluster measured by its users (``ddlsim profile collectives --launcher env
    --name NAME``): the cluster spec fitted to its fabric, and what was measured."""

    __tablename__ = "ddlsim_cluster_profiles"

    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    measured: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)


class GraphRow(Base):
    """An ``IterationGraph``: gzip-compressed JSON plus its summary for listings."""

    __tablename__ = "ddlsim_graphs"

    graph_hash: Mapped[str] = mapped_column(String(HASH_LENGTH), primary_key=True)
    model_spec_hash: Mapped[str] = mapped_column(
        ForeignKey("ddlsim_model_specs.spec_hash"), index=True
    )
    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    schema_version: Mapped[int] = mapped_column(Integer)
    num_nodes: Mapped[int] = mapped_column(Integer)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON)
    graph_json_gz: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)


class StrategyRow(Base):
    """A ``Strategy`` (its ``to_dict()``), keyed by the SHA-256 of ``Strategy.to_json()``."""

    __tablename__ = "ddlsim_strategies"

    strategy_hash: Mapped[str] = mapped_column(String(HASH_LENGTH), primary_key=True)
    strategy: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)


class KernelProfileRow(ResultRow[KernelProfileRecord]):
    """Per-node durations of one graph on one device (``node_ms`` keys are node ids as text)."""

    __tablename__ = "ddlsim_kernel_profiles"
    record_type = KernelProfileRecord
    int_keyed = ("node_ms",)

    graph_hash: Mapped[str] = mapped_column(ForeignKey("ddlsim_graphs.graph_hash"), index=True)
    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    device: Mapped[str] = mapped_column(String(NAME_LENGTH))
    device_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    iters: Mapped[int] = mapped_column(Integer)
    iteration_time_ms: Mapped[float] = mapped_column(Float)
    attributed_ms: Mapped[float] = mapped_column(Float)
    coverage: Mapped[float] = mapped_column(Float)
    node_ms: Mapped[dict[str, float]] = mapped_column(JSON)
    trace_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    env: Mapped[dict[str, str]] = mapped_column(JSON)
    # The machine that measured it: an export never mixes machines.
    host: Mapped[str] = mapped_column(
        String(NAME_LENGTH), default="", server_default="", index=True
    )


class FusionProfileRow(ResultRow[FusionProfileRecord]):
    """Blocks of one graph's model timed eager and compiled (``blocks``: one entry a block)."""

    __tablename__ = "ddlsim_fusion_profiles"
    record_type = FusionProfileRecord

    graph_hash: Mapped[str] = mapped_column(ForeignKey("ddlsim_graphs.graph_hash"), index=True)
    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    device: Mapped[str] = mapped_column(String(NAME_LENGTH))
    backend: Mapped[str] = mapped_column(String(NAME_LENGTH))
    iters: Mapped[int] = mapped_column(Integer)
    blocks: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    env: Mapped[dict[str, str]] = mapped_column(JSON)


class CollectiveProfileRow(ResultRow[CollectiveProfileRecord]):
    """One collective's samples and fitted model (``rank_cores`` keys are ranks as text)."""

    __tablename__ = "ddlsim_collective_profiles"
    __table_args__ = (
        Index(
            "ix_ddlsim_collective_profiles_lookup",
            "collective",
            "backend",
            "world_size",
            "bandwidth",
        ),
    )
    record_type = CollectiveProfileRecord
    int_keyed = ("rank_cores",)

    collective: Mapped[str] = mapped_column(String(NAME_LENGTH))
    backend: Mapped[str] = mapped_column(String(NAME_LENGTH))
    world_size: Mapped[int] = mapped_column(Integer)
    bandwidth: Mapped[str] = mapped_column(String(NAME_LENGTH))
    network: Mapped[str] = mapped_column(String(NAME_LENGTH))
    alpha_us: Mapped[float] = mapped_column(Float)
    busbw_gbps: Mapped[float] = mapped_column(Float)
    r2: Mapped[float] = mapped_column(Float)
    samples: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    rank_cores: Mapped[dict[str, list[int]]] = mapped_column(JSON)
    env: Mapped[dict[str, str]] = mapped_column(JSON)


class MeasurementRow(ResultRow[MeasurementRecord]):
    """One executor run of a strategy on an emulated cluster."""

    __tablename__ = "ddlsim_measurements"
    record_type = MeasurementRecord

    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    graph_hash: Mapped[str | None] = mapped_column(
        ForeignKey("ddlsim_graphs.graph_hash"), nullable=True, index=True
    )
    strategy_hash: Mapped[str] = mapped_column(
        ForeignKey("ddlsim_strategies.strategy_hash"), index=True
    )
    world_size: Mapped[int] = mapped_column(Integer)
    bandwidth: Mapped[str] = mapped_column(String(NAME_LENGTH))
    network: Mapped[str] = mapped_column(String(NAME_LENGTH))
    iteration_time_ms: Mapped[list[float]] = mapped_column(JSON)
    peak_memory_bytes: Mapped[list[int]] = mapped_column(JSON)
    applied: Mapped[dict[str, Any]] = mapped_column(JSON)
    env: Mapped[dict[str, Any]] = mapped_column(JSON)
    losses: Mapped[list[float] | None] = mapped_column(JSON, nullable=True)


class PredictionRow(ResultRow[PredictionRecord]):
    """A simulator's prediction for a graph, a strategy and a cluster."""

    __tablename__ = "ddlsim_predictions"
    record_type = PredictionRecord

    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    graph_hash: Mapped[str] = mapped_column(ForeignKey("ddlsim_graphs.graph_hash"), index=True)
    strategy_hash: Mapped[str] = mapped_column(
        ForeignKey("ddlsim_strategies.strategy_hash"), index=True
    )
    cluster: Mapped[dict[str, Any]] = mapped_column(JSON)
    iteration_time_ms: Mapped[float] = mapped_column(Float)
    breakdown: Mapped[dict[str, float]] = mapped_column(JSON)
    simulator_version: Mapped[str] = mapped_column(String(NAME_LENGTH))


class ClusterPredictionRow(ResultRow[ClusterPredictionRecord]):
    """A GPU cluster's iteration priced on paper (see :class:`ClusterPredictionRecord`)."""

    __tablename__ = "ddlsim_cluster_predictions"
    record_type = ClusterPredictionRecord

    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    # Named here: the naming convention's names pass PostgreSQL's 63 characters.
    model_spec_hash: Mapped[str] = mapped_column(
        ForeignKey("ddlsim_model_specs.spec_hash", name="fk_ddlsim_cluster_predictions_spec"),
        index=True,
    )
    strategy_hash: Mapped[str] = mapped_column(
        ForeignKey("ddlsim_strategies.strategy_hash", name="fk_ddlsim_cluster_predictions_plan"),
        index=True,
    )
    strategy: Mapped[dict[str, Any]] = mapped_column(JSON)
    cluster: Mapped[dict[str, Any]] = mapped_column(JSON)
    global_batch: Mapped[int] = mapped_column(Integer)
    seq_len: Mapped[int] = mapped_column(Integer)
    iteration_s: Mapped[float] = mapped_column(Float)
    prediction: Mapped[dict[str, Any]] = mapped_column(JSON)
    simulator_version: Mapped[str] = mapped_column(String(NAME_LENGTH))


class JobRow(Base):
    """A batch job: ``running`` until its results commit with it as ``done``, or ``failed``."""

    __tablename__ = "ddlsim_jobs"
    __table_args__ = (
        CheckConstraint(
            "status IN ({})".format(", ".join(f"'{s}'" for s in JOB_STATUSES)), name="status"
        ),
    )

    key: Mapped[str] = mapped_column(String(JOB_KEY_LENGTH), primary_key=True)
    kind: Mapped[str] = mapped_column(String(NAME_LENGTH))
    status: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    def to_record(self) -> JobRecord:
        """The row as the record it stores."""
        # The check constraint holds status to JOB_STATUSES.
        return record_of(JobRecord, self)


class TaskRow(Base):
    """A request the service's workers run (see :class:`TaskRecord`)."""

    __tablename__ = "ddlsim_tasks"
    __table_args__ = (
        CheckConstraint(
            "status IN ({})".format(", ".join(f"'{s}'" for s in TASK_STATUSES)), name="status"
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(NAME_LENGTH))
    status: Mapped[str] = mapped_column(String(16), index=True)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(NAME_LENGTH), nullable=True)
    # What the task needs of its worker: CUDA GPUs on one host, a named cluster profile.
    gpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cluster: Mapped[str | None] = mapped_column(String(NAME_LENGTH), nullable=True)
    # A profiling run is a parent (``children`` > 0, never claimed) over one task a job.
    parent_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    children: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    def to_record(self) -> TaskRecord:
        """The row as the record it stores."""
        # The check constraint holds status to TASK_STATUSES.
        return record_of(TaskRecord, self)
