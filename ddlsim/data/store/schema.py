"""The store's tables as SQLAlchemy 2 typed models.

Every table and constraint name starts with ``ddlsim_`` (or carries it after a ``pk_``/``fk_``
/``ix_``/``ck_`` prefix) because Optuna keeps its own tables in the same database. The
migration in ``migrations/versions`` creates exactly these tables; a test compares the two.

Content-addressed rows (model specs, graphs, strategies) are keyed by their SHA-256; results
(profiles, measurements, predictions) by an integer id and point at what they were taken on.
"""

import dataclasses
from datetime import UTC, datetime
from typing import Any, Self

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
    CollectiveProfileRecord,
    FusionProfileRecord,
    JobRecord,
    KernelProfileRecord,
    MeasurementRecord,
    PredictionRecord,
    TaskRecord,
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


def _values_of(record: Any) -> dict[str, Any]:
    """A result record's fields as columns: ``id`` left to the database, ``created_at`` now."""
    values = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    del values["id"]
    values["created_at"] = values["created_at"] or utc_now()
    return values


def _fields_of(row: Base, record_type: Any) -> dict[str, Any]:
    """The columns of ``row`` that ``record_type`` has fields for."""
    return {f.name: getattr(row, f.name) for f in dataclasses.fields(record_type)}


class ModelSpecRow(Base):
    """A ``ModelSpec`` (its ``to_dict()``), keyed by the SHA-256 of its canonical JSON."""

    __tablename__ = "ddlsim_model_specs"

    spec_hash: Mapped[str] = mapped_column(String(HASH_LENGTH), primary_key=True)
    label: Mapped[str] = mapped_column(String(NAME_LENGTH))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
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


class KernelProfileRow(Base):
    """Per-node durations of one graph on one device (``node_ms`` keys are node ids as text)."""

    __tablename__ = "ddlsim_kernel_profiles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
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
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)

    @classmethod
    def from_record(cls, record: KernelProfileRecord) -> Self:
        """The row that stores ``record``."""
        values = _values_of(record)
        values["node_ms"] = {str(node): ms for node, ms in record.node_ms.items()}
        return cls(**values)

    def to_record(self) -> KernelProfileRecord:
        """The row as the record it stores."""
        values = _fields_of(self, KernelProfileRecord)
        values["node_ms"] = {int(node): ms for node, ms in self.node_ms.items()}
        return KernelProfileRecord(**values)


class FusionProfileRow(Base):
    """Blocks of one graph's model timed eager and compiled (``blocks``: one entry a block)."""

    __tablename__ = "ddlsim_fusion_profiles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    graph_hash: Mapped[str] = mapped_column(ForeignKey("ddlsim_graphs.graph_hash"), index=True)
    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    device: Mapped[str] = mapped_column(String(NAME_LENGTH))
    backend: Mapped[str] = mapped_column(String(NAME_LENGTH))
    iters: Mapped[int] = mapped_column(Integer)
    blocks: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    env: Mapped[dict[str, str]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)

    @classmethod
    def from_record(cls, record: FusionProfileRecord) -> Self:
        """The row that stores ``record``."""
        return cls(**_values_of(record))

    def to_record(self) -> FusionProfileRecord:
        """The row as the record it stores."""
        return FusionProfileRecord(**_fields_of(self, FusionProfileRecord))


class CollectiveProfileRow(Base):
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

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
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
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)

    @classmethod
    def from_record(cls, record: CollectiveProfileRecord) -> Self:
        """The row that stores ``record``."""
        values = _values_of(record)
        values["rank_cores"] = {str(rank): cores for rank, cores in record.rank_cores.items()}
        return cls(**values)

    def to_record(self) -> CollectiveProfileRecord:
        """The row as the record it stores."""
        values = _fields_of(self, CollectiveProfileRecord)
        values["rank_cores"] = {int(rank): cores for rank, cores in self.rank_cores.items()}
        return CollectiveProfileRecord(**values)


class MeasurementRow(Base):
    """One executor run of a strategy on an emulated cluster."""

    __tablename__ = "ddlsim_measurements"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
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
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)

    @classmethod
    def from_record(cls, record: MeasurementRecord) -> Self:
        """The row that stores ``record``."""
        return cls(**_values_of(record))

    def to_record(self) -> MeasurementRecord:
        """The row as the record it stores."""
        return MeasurementRecord(**_fields_of(self, MeasurementRecord))


class PredictionRow(Base):
    """A simulator's prediction for a graph, a strategy and a cluster."""

    __tablename__ = "ddlsim_predictions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    graph_hash: Mapped[str] = mapped_column(ForeignKey("ddlsim_graphs.graph_hash"), index=True)
    strategy_hash: Mapped[str] = mapped_column(
        ForeignKey("ddlsim_strategies.strategy_hash"), index=True
    )
    cluster: Mapped[dict[str, Any]] = mapped_column(JSON)
    iteration_time_ms: Mapped[float] = mapped_column(Float)
    breakdown: Mapped[dict[str, float]] = mapped_column(JSON)
    simulator_version: Mapped[str] = mapped_column(String(NAME_LENGTH))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)

    @classmethod
    def from_record(cls, record: PredictionRecord) -> Self:
        """The row that stores ``record``."""
        return cls(**_values_of(record))

    def to_record(self) -> PredictionRecord:
        """The row as the record it stores."""
        return PredictionRecord(**_fields_of(self, PredictionRecord))


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
        return JobRecord(**_fields_of(self, JobRecord))


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
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    def to_record(self) -> TaskRecord:
        """The row as the record it stores."""
        # The check constraint holds status to TASK_STATUSES.
        return TaskRecord(**_fields_of(self, TaskRecord))
