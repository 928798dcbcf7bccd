"""``Store``: open a database, migrate it, read and write ddlsim's records.

Two backends: a SQLite file (the default, in the user's data directory) and PostgreSQL. Opening
a store runs the Alembic migrations up to head (:mod:`.database`). Every ``save_*`` method is one
transaction; the ``add_*`` functions (:mod:`.writers`) write the same rows into a caller's
session, so a batch job can write all its results and mark itself done in one transaction
(:meth:`Store.finish_job`): after a crash a job is either done with all its rows or still
``running`` with none of them.

Thread safety: a ``Store`` may be shared between threads (each call takes its own session);
several processes may open the same database.
"""

import gzip
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import records, writers
from ddlsim.data.store.database import default_url, mask_url, open_engine
from ddlsim.data.store.errors import StoreError
from ddlsim.data.store.schema import (
    ClusterPredictionRow,
    ClusterProfileRow,
    CollectiveProfileRow,
    FusionProfileRow,
    GraphRow,
    JobRow,
    KernelProfileRow,
    MeasurementRow,
    ModelSpecRow,
    PredictionRow,
    StrategyRow,
    utc_now,
)

# The content-addressed rows that are loaded by their key.
_StoredRow = TypeVar("_StoredRow", GraphRow, StrategyRow)
_Params = ParamSpec("_Params")
_Written = TypeVar("_Written")


class Store:
    """A migrated database holding graphs, profiles, measurements, predictions and jobs.

    Open with :meth:`open`; ``url`` is the URL as given (with any password: print
    :func:`mask_url` of it). Every method runs in its own transaction; :meth:`transaction`
    gives a session for several writes that must land together.
    """

    def __init__(self, *, url: str, engine: Engine) -> None:
        self.url = url
        self._engine = engine
        self._sessions = sessionmaker(bind=engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str | None = None) -> "Store":
        """Open (creating if needed) the store at ``url`` (default :func:`default_url`).

        Creates a SQLite file's parent directory and migrates the schema to the newest
        revision.

        Raises:
            StoreError: on a URL that is neither SQLite nor PostgreSQL (psycopg), a server that
                cannot be reached or refuses the login, or a schema newer than this ddlsim.
                The one-line message names the URL with its password masked.
        """
        url = url if url is not None else default_url()
        return cls(url=url, engine=open_engine(url))

    def close(self) -> None:
        """Close every pooled connection; the store must not be used afterwards."""
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({mask_url(self.url)!r})"

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine on the store's database."""
        return self._engine

    def _records(self, row_type: Any, **filters: object) -> list[Any]:
        """Records of ``row_type`` rows, oldest first, equal to every filter that is not None."""
        query = select(row_type).order_by(row_type.id)
        for column, value in filters.items():
            if value is not None:
                query = query.where(getattr(row_type, column) == value)
        with self.transaction() as session:
            return [row.to_record() for row in session.scalars(query)]

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session whose writes commit together when the block ends, or not at all."""
        with self._sessions.begin() as session:
            yield session

    def _write(
        self,
        add: Callable[Concatenate[Session, _Params], _Written],
        *args: _Params.args,
        **kwargs: _Params.kwargs,
    ) -> _Written:
        """``add(session, ...)`` (an ``add_*`` writer) in a transaction of its own."""
        with self.transaction() as session:
            return add(session, *args, **kwargs)

    # ----- graphs and strategies -----------------------------------------------------------------

    def save_graph(self, *, graph: IterationGraph) -> str:
        """Store ``graph`` (once per hash) and its model spec; return its ``graph_hash``."""
        return self._write(writers.add_graph, graph=graph)

    def load_graph(self, *, graph_hash: str) -> IterationGraph:
        """The stored graph with ``graph_hash``.

        Raises:
            StoreError: when no graph has that hash.
        """
        with self.transaction() as session:
            payload = _stored(session, GraphRow, graph_hash, "graph").graph_json_gz
        return IterationGraph.from_json(gzip.decompress(payload).decode())

    def save_model_spec(self, *, spec: ModelSpec) -> str:
        """Store ``spec`` (once per hash); return its hash."""
        return self._write(writers.add_model_spec, spec=spec)

    def model_specs(self, *, label: str | None = None) -> list[tuple[str, ModelSpec]]:
        """Stored model specs as (hash, spec), oldest first; only those labelled ``label``
        when given."""
        query = select(ModelSpecRow).order_by(ModelSpecRow.created_at, ModelSpecRow.spec_hash)
        if label is not None:
            query = query.where(ModelSpecRow.label == label)
        with self.transaction() as session:
            rows = [(row.spec_hash, row.spec) for row in session.scalars(query)]
        return [(spec_hash, ModelSpec.from_dict(raw)) for spec_hash, raw in rows]

    def save_cluster_profile(
        self, *, name: str, spec: Mapping[str, Any], measured: Mapping[str, Any]
    ) -> None:
        """Store the named cluster profile, replacing one of the same name."""
        with self.transaction() as session:
            row = session.get(ClusterProfileRow, name, with_for_update=True)
            if row is None:
                session.add(ClusterProfileRow(name=name, spec=dict(spec), measured=dict(measured)))
            else:
                row.spec, row.measured, row.created_at = dict(spec), dict(measured), utc_now()

    def cluster_profiles(self) -> dict[str, dict[str, Any]]:
        """The named cluster profiles: name -> ``{"spec": ..., "measured": ...}``."""
        with self.transaction() as session:
            rows = session.scalars(select(ClusterProfileRow).order_by(ClusterProfileRow.name))
            return {r.name: {"spec": r.spec, "measured": r.measured} for r in rows}

    def save_strategy(self, *, strategy: Strategy) -> str:
        """Store ``strategy`` (once per hash); return :func:`strategy_hash` of it."""
        return self._write(writers.add_strategy, strategy=strategy)

    def load_strategy(self, *, strategy_hash: str) -> Strategy:
        """The stored strategy with ``strategy_hash``.

        Raises:
            StoreError: when no strategy has that hash.
        """
        with self.transaction() as session:
            return Strategy.from_dict(
                _stored(session, StrategyRow, strategy_hash, "strategy").strategy
            )

    # ----- profiles, measurements, predictions ---------------------------------------------------

    def save_kernel_profile(self, *, profile: records.KernelProfileRecord) -> int:
        """Store a profile of a stored graph; return its id (see :func:`add_kernel_profile`)."""
        return self._write(writers.add_kernel_profile, profile=profile)

    def kernel_profiles(
        self, *, graph_hash: str | None = None, host: str | None = None
    ) -> list[records.KernelProfileRecord]:
        """Kernel profiles, oldest first, of one graph or of all, of one host or of all."""
        return self._records(KernelProfileRow, graph_hash=graph_hash, host=host)

    def save_fusion_profile(self, *, profile: records.FusionProfileRecord) -> int:
        """Store a fusion profile of a stored graph; return its id."""
        return self._write(writers.add_fusion_profile, profile=profile)

    def fusion_profiles(
        self, *, graph_hash: str | None = None
    ) -> list[records.FusionProfileRecord]:
        """Fusion profiles, oldest first, of one graph or of all."""
        return self._records(FusionProfileRow, graph_hash=graph_hash)

    def save_collective_profile(self, *, profile: records.CollectiveProfileRecord) -> int:
        """Store a collective profile; return its id."""
        return self._write(writers.add_collective_profile, profile=profile)

    def collective_profiles(
        self,
        *,
        collective: str | None = None,
        backend: str | None = None,
        world_size: int | None = None,
        bandwidth: str | None = None,
    ) -> list[records.CollectiveProfileRecord]:
        """Collective profiles, oldest first, matching every filter given."""
        return self._records(
            CollectiveProfileRow,
            collective=collective,
            backend=backend,
            world_size=world_size,
            bandwidth=bandwidth,
        )

    def save_measurement(self, *, measurement: records.MeasurementRecord) -> int:
        """Store an executor measurement; return its id (see :func:`add_measurement`)."""
        return self._write(writers.add_measurement, measurement=measurement)

    def measurements(
        self, *, graph_hash: str | None = None, strategy_hash: str | None = None
    ) -> list[records.MeasurementRecord]:
        """Measurements, oldest first, matching every filter given."""
        return self._records(MeasurementRow, graph_hash=graph_hash, strategy_hash=strategy_hash)

    def save_prediction(self, *, prediction: records.PredictionRecord) -> int:
        """Store a simulator prediction; return its id (see :func:`add_prediction`)."""
        return self._write(writers.add_prediction, prediction=prediction)

    def predictions(
        self, *, graph_hash: str | None = None, strategy_hash: str | None = None
    ) -> list[records.PredictionRecord]:
        """Predictions, oldest first, matching every filter given."""
        return self._records(PredictionRow, graph_hash=graph_hash, strategy_hash=strategy_hash)

    def save_cluster_prediction(self, *, prediction: records.ClusterPredictionRecord) -> int:
        """Store a GPU cluster's prediction; return its id (see
        :func:`~ddlsim.data.store.writers.add_cluster_prediction`)."""
        return self._write(writers.add_cluster_prediction, prediction=prediction)

    def cluster_predictions(self, *, limit: int = 100) -> list[records.ClusterPredictionRecord]:
        """GPU clusters' predictions, newest first, at most ``limit``."""
        query = select(ClusterPredictionRow).order_by(ClusterPredictionRow.id.desc()).limit(limit)
        with self.transaction() as session:
            return [row.to_record() for row in session.scalars(query)]

    def cluster_prediction(self, *, prediction_id: int) -> records.ClusterPredictionRecord:
        """The GPU cluster's prediction stored under ``prediction_id``.

        Raises:
            StoreError: when there is none.
        """
        with self.transaction() as session:
            row = session.get(ClusterPredictionRow, prediction_id)
            if row is None:
                raise StoreError(f"cluster prediction {prediction_id} is not in the store")
            return row.to_record()

    # ----- batch jobs ----------------------------------------------------------------------------

    def job_status(self, *, key: str) -> records.JobStatus | None:
        """``"done"``, ``"failed"``, ``"running"``, or ``None`` for a job never started."""
        with self.transaction() as session:
            row = session.get(JobRow, key)
            return None if row is None else row.to_record().status

    def start_job(self, *, key: str, kind: str, spec: dict[str, Any]) -> None:
        """Mark job ``key`` running (creating it, or restarting a failed or done one)."""
        values = {
            "key": key,
            "kind": kind,
            "status": "running",
            "spec": spec,
            "error": None,
            "created_at": utc_now(),
            "finished_at": None,
        }
        with self.transaction() as session:
            insert = writers.dialect_insert(session, JobRow).values(**values)
            session.execute(
                insert.on_conflict_do_update(
                    index_elements=[JobRow.key],
                    set_={
                        "kind": insert.excluded.kind,
                        "status": "running",
                        "spec": insert.excluded.spec,
                        "error": None,
                        "finished_at": None,
                    },
                )
            )

    def finish_job(self, *, key: str, results: Callable[[Session], None] | None = None) -> None:
        """Write the job's results with ``results(session)`` and mark it done, atomically.

        ``results`` writes through the session it is given (the ``add_*`` functions). If it or
        anything else raises, nothing it wrote is kept and the job stays ``running``; the
        exception propagates.

        Raises:
            StoreError: when job ``key`` was never started.
        """
        with self.transaction() as session:
            row = _started_job(session, key)
            if results is not None:
                results(session)
            row.status = "done"
            row.error = None
            row.finished_at = utc_now()

    def fail_job(self, *, key: str, error: str) -> None:
        """Mark job ``key`` failed with ``error`` (a one-line message).

        Raises:
            StoreError: when job ``key`` was never started.
        """
        with self.transaction() as session:
            row = _started_job(session, key)
            row.status = "failed"
            row.error = error
            row.finished_at = utc_now()

    def jobs(self) -> list[records.JobRecord]:
        """Every job, oldest first."""
        query = select(JobRow).order_by(JobRow.created_at, JobRow.key)
        with self.transaction() as session:
            return [row.to_record() for row in session.scalars(query)]


def _stored(session: Session, row_type: type[_StoredRow], key: str, what: str) -> _StoredRow:
    """The ``row_type`` row stored under ``key``.

    Raises:
        StoreError: when there is none, naming ``what`` it is.
    """
    row = session.get(row_type, key)
    if row is None:
        raise StoreError(f"{what} {key} is not in the store")
    return row


def _started_job(session: Session, key: str) -> JobRow:
    """Job ``key``'s row, locked for update.

    Raises:
        StoreError: when job ``key`` was never started.
    """
    row = session.get(JobRow, key, with_for_update=True)
    if row is None:
        raise StoreError(f"job {key!r} was never started; call start_job first")
    return row
