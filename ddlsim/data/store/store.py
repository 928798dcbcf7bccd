"""``Store``: open a database, migrate it, read and write ddlsim's records.

Two backends: a SQLite file (the default, in the user's data directory) and PostgreSQL. Opening
a store runs the Alembic migrations up to head. Every ``save_*`` method is one transaction; the
``add_*`` functions write the same rows into a caller's session, so a batch job can write all its
results and mark itself done in one transaction (:meth:`Store.finish_job`): after a crash a job
is either done with all its rows or still ``running`` with none of them.

Thread safety: a ``Store`` may be shared between threads (each call takes its own session);
several processes may open the same database.
"""

import gzip
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import platformdirs
from alembic import command
from alembic.config import Config
from alembic.util import CommandError
from sqlalchemy import Engine, create_engine, event, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from ddlsim.data.errors import DdlsimError, one_line
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store.records import (
    CollectiveProfileRecord,
    FusionProfileRecord,
    JobRecord,
    JobStatus,
    KernelProfileRecord,
    MeasurementRecord,
    PredictionRecord,
)
from ddlsim.data.store.schema import (
    Base,
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

URL_FORMS = '"sqlite:///PATH" or "postgresql+psycopg://USER:PASS@HOST/DB"'
DB_ENV_VAR = "DDLSIM_DB"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_S = 30.0
POSTGRES_CONNECT_TIMEOUT_S = 10
# pg_advisory_xact_lock key: processes opening a fresh database migrate it one at a time.
_MIGRATION_LOCK_KEY = int.from_bytes(hashlib.sha256(b"ddlsim-migrate").digest()[:7], "big")


class StoreError(DdlsimError, LookupError):
    """A store cannot be opened, or a row asked for (graph, strategy, job) is not in it."""


# ----- URLs --------------------------------------------------------------------------------------


def default_url() -> str:
    """``$DDLSIM_DB`` when set, else the SQLite file ``ddlsim.db`` in the user's data directory."""
    from_env = os.environ.get(DB_ENV_VAR, "").strip()
    if from_env:
        return from_env
    path = Path(platformdirs.user_data_dir("ddlsim")) / "ddlsim.db"
    return f"sqlite:///{path}"


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (also when it does not parse)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def alembic_config(url: str) -> Config:
    """An Alembic config for the store's migrations, no ``alembic.ini`` needed.

    For developers writing a new revision:
    ``alembic.command.revision(alembic_config(url), message=..., autogenerate=True)``.
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    # ConfigParser interpolates "%"; URL-encoded passwords contain it.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def _parse_url(url: str) -> URL:
    """The URL with its driver made explicit; anything but SQLite or psycopg is refused."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(
            f"cannot open store {mask_url(url)}: not a database URL; allowed: {URL_FORMS}"
        ) from None
    if parsed.drivername in ("sqlite", "sqlite+pysqlite"):
        return parsed
    if parsed.drivername in ("postgresql", "postgresql+psycopg"):
        return parsed.set(drivername="postgresql+psycopg")
    raise StoreError(
        f"cannot open store {mask_url(url)}: unsupported database {parsed.drivername!r}; "
        f"allowed: {URL_FORMS}"
    )


def _open_error(url: str, parsed: URL, exc: BaseException) -> StoreError:
    reason = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    message = one_line(reason, limit=200)
    if parsed.password:
        message = message.replace(str(parsed.password), "***")
    return StoreError(f"cannot open store {mask_url(url)}: {message}; allowed: {URL_FORMS}")


def _sqlite_engine(parsed: URL) -> Engine:
    database = parsed.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, connection_record: Any) -> None:
        cursor = dbapi_connection.cursor()
        # SQLite leaves foreign keys unchecked unless asked, per connection; WAL lets readers
        # (the dashboard) run while a job writes.
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    return engine


def _upgrade(engine: Engine, url: str) -> None:
    """Run the migrations up to head in one transaction, one process at a time.

    SQLite answers "database is locked" at once, without waiting, where waiting could deadlock
    (two connections that both read the schema and then both want to write it, or one switching
    a new file to WAL while another migrates it): such an open is retried until the busy timeout.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            _upgrade_once(engine, url)
            return
        except OperationalError as exc:
            locked = engine.dialect.name == "sqlite" and "locked" in str(exc.orig)
            if not locked or time.monotonic() > deadline:
                raise
            engine.dispose()
            time.sleep(0.05)


def _upgrade_once(engine: Engine, url: str) -> None:
    config = alembic_config(url)
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            # pysqlite would run DDL outside any transaction; take the write lock up front.
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY}
            )
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        connection.commit()


# ----- hashing and inserts -----------------------------------------------------------------------


def _sha256(text_: str) -> str:
    return hashlib.sha256(text_.encode()).hexdigest()


def strategy_hash(strategy: Strategy) -> str:
    """The key a strategy is stored under: SHA-256 of ``strategy.to_json()``."""
    return _sha256(strategy.to_json())


def _insert(session: Session, row_type: type[Base]) -> postgresql.Insert | sqlite.Insert:
    """An INSERT that can say what to do on a conflict (both backends spell it alike)."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(row_type)
    return sqlite.insert(row_type)


def _insert_missing(session: Session, row_type: type[Base], values: dict[str, Any]) -> None:
    """Insert a content-addressed row unless a concurrent writer already has."""
    session.execute(_insert(session, row_type).values(**values).on_conflict_do_nothing())


def _add_row(
    session: Session,
    row: KernelProfileRow
    | FusionProfileRow
    | CollectiveProfileRow
    | MeasurementRow
    | PredictionRow,
) -> int:
    session.add(row)
    session.flush()
    return row.id


def _require(session: Session, row_type: type[Base], key: str, what: str) -> None:
    if session.get(row_type, key) is None:
        raise StoreError(f"{what} {key} is not in the store; save it before rows that use it")


# ----- session-level writers (usable inside Store.finish_job's callback) -------------------------


def add_model_spec(session: Session, *, spec: ModelSpec) -> str:
    """Add ``spec`` unless present; return the SHA-256 of its canonical JSON."""
    raw = spec.to_dict()
    spec_hash = _sha256(json.dumps(raw, sort_keys=True, separators=(",", ":")))
    if session.get(ModelSpecRow, spec_hash) is None:
        _insert_missing(
            session,
            ModelSpecRow,
            {"spec_hash": spec_hash, "label": spec.label, "spec": raw, "created_at": utc_now()},
        )
    return spec_hash


def add_graph(session: Session, *, graph: IterationGraph) -> str:
    """Add ``graph`` and its model spec unless present; return ``graph.graph_hash``."""
    spec_hash = add_model_spec(session, spec=graph.model)
    now = utc_now()
    if session.get(GraphRow, graph.graph_hash) is None:
        _insert_missing(
            session,
            GraphRow,
            {
                "graph_hash": graph.graph_hash,
                "model_spec_hash": spec_hash,
                "model": graph.model.label,
                "schema_version": graph.schema_version,
                "num_nodes": len(graph.nodes),
                "summary": graph.summary(),
                "graph_json_gz": gzip.compress(graph.to_json().encode(), mtime=0),
                "created_at": now,
            },
        )
    return graph.graph_hash


def add_strategy(session: Session, *, strategy: Strategy) -> str:
    """Add ``strategy`` unless present; return :func:`strategy_hash` of it."""
    key = strategy_hash(strategy)
    if session.get(StrategyRow, key) is None:
        _insert_missing(
            session,
            StrategyRow,
            {"strategy_hash": key, "strategy": strategy.to_dict(), "created_at": utc_now()},
        )
    return key


def add_kernel_profile(session: Session, *, profile: KernelProfileRecord) -> int:
    """Add a kernel profile of a stored graph; return its id.

    Raises:
        StoreError: when the profile's graph is not in the store.
    """
    _require(session, GraphRow, profile.graph_hash, "graph")
    return _add_row(session, KernelProfileRow.from_record(profile))


def add_fusion_profile(session: Session, *, profile: FusionProfileRecord) -> int:
    """Add a fusion profile of a stored graph's model; return its id.

    Raises:
        StoreError: when the profile's graph is not in the store.
    """
    _require(session, GraphRow, profile.graph_hash, "graph")
    return _add_row(session, FusionProfileRow.from_record(profile))


def add_collective_profile(session: Session, *, profile: CollectiveProfileRecord) -> int:
    """Add a collective profile; return its id."""
    return _add_row(session, CollectiveProfileRow.from_record(profile))


def add_measurement(session: Session, *, measurement: MeasurementRecord) -> int:
    """Add an executor measurement; return its id.

    Raises:
        StoreError: when its strategy (or its graph, when given) is not in the store.
    """
    if measurement.graph_hash is not None:
        _require(session, GraphRow, measurement.graph_hash, "graph")
    _require(session, StrategyRow, measurement.strategy_hash, "strategy")
    return _add_row(session, MeasurementRow.from_record(measurement))


def add_prediction(session: Session, *, prediction: PredictionRecord) -> int:
    """Add a simulator prediction; return its id.

    Raises:
        StoreError: when its graph or strategy is not in the store.
    """
    _require(session, GraphRow, prediction.graph_hash, "graph")
    _require(session, StrategyRow, prediction.strategy_hash, "strategy")
    return _add_row(session, PredictionRow.from_record(prediction))


# ----- the store ---------------------------------------------------------------------------------


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
        parsed = _parse_url(url)
        try:
            if parsed.get_backend_name() == "sqlite":
                engine = _sqlite_engine(parsed)
            else:
                engine = create_engine(
                    parsed,
                    pool_pre_ping=True,
                    connect_args={"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S},
                )
        except (ArgumentError, ImportError, OSError) as exc:
            raise _open_error(url, parsed, exc) from None
        try:
            _upgrade(engine, url)
        except CommandError as exc:
            engine.dispose()
            raise StoreError(
                f"cannot open store {mask_url(url)}: {one_line(exc)}; a newer ddlsim migrated "
                "it, so upgrade ddlsim"
            ) from None
        except (DBAPIError, OSError) as exc:
            engine.dispose()
            raise _open_error(url, parsed, exc) from None
        return cls(url=url, engine=engine)

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

    # ----- graphs and strategies -----------------------------------------------------------------

    def save_graph(self, *, graph: IterationGraph) -> str:
        """Store ``graph`` (once per hash) and its model spec; return its ``graph_hash``."""
        with self.transaction() as session:
            return add_graph(session, graph=graph)

    def load_graph(self, *, graph_hash: str) -> IterationGraph:
        """The stored graph with ``graph_hash``.

        Raises:
            StoreError: when no graph has that hash.
        """
        with self.transaction() as session:
            row = session.get(GraphRow, graph_hash)
            if row is None:
                raise StoreError(f"graph {graph_hash} is not in the store")
            payload = row.graph_json_gz
        return IterationGraph.from_json(gzip.decompress(payload).decode())

    def save_model_spec(self, *, spec: ModelSpec) -> str:
        """Store ``spec`` (once per hash); return its hash."""
        with self.transaction() as session:
            return add_model_spec(session, spec=spec)

    def model_specs(self, *, label: str | None = None) -> list[tuple[str, ModelSpec]]:
        """Stored model specs as (hash, spec), oldest first; only those labelled ``label``
        when given."""
        query = select(ModelSpecRow).order_by(ModelSpecRow.created_at, ModelSpecRow.spec_hash)
        if label is not None:
            query = query.where(ModelSpecRow.label == label)
        with self.transaction() as session:
            rows = [(row.spec_hash, row.spec) for row in session.scalars(query)]
        return [(spec_hash, ModelSpec.from_dict(raw)) for spec_hash, raw in rows]

    def save_strategy(self, *, strategy: Strategy) -> str:
        """Store ``strategy`` (once per hash); return :func:`strategy_hash` of it."""
        with self.transaction() as session:
            return add_strategy(session, strategy=strategy)

    def load_strategy(self, *, strategy_hash: str) -> Strategy:
        """The stored strategy with ``strategy_hash``.

        Raises:
            StoreError: when no strategy has that hash.
        """
        with self.transaction() as session:
            row = session.get(StrategyRow, strategy_hash)
            if row is None:
                raise StoreError(f"strategy {strategy_hash} is not in the store")
            return Strategy.from_dict(row.strategy)

    # ----- profiles, measurements, predictions ---------------------------------------------------

    def save_kernel_profile(self, *, profile: KernelProfileRecord) -> int:
        """Store a profile of a stored graph; return its id (see :func:`add_kernel_profile`)."""
        with self.transaction() as session:
            return add_kernel_profile(session, profile=profile)

    def kernel_profiles(self, *, graph_hash: str | None = None) -> list[KernelProfileRecord]:
        """Kernel profiles, oldest first, of one graph or of all."""
        return self._records(KernelProfileRow, graph_hash=graph_hash)

    def save_fusion_profile(self, *, profile: FusionProfileRecord) -> int:
        """Store a fusion profile of a stored graph; return its id."""
        with self.transaction() as session:
            return add_fusion_profile(session, profile=profile)

    def fusion_profiles(self, *, graph_hash: str | None = None) -> list[FusionProfileRecord]:
        """Fusion profiles, oldest first, of one graph or of all."""
        return self._records(FusionProfileRow, graph_hash=graph_hash)

    def save_collective_profile(self, *, profile: CollectiveProfileRecord) -> int:
        """Store a collective profile; return its id."""
        with self.transaction() as session:
            return add_collective_profile(session, profile=profile)

    def collective_profiles(
        self,
        *,
        collective: str | None = None,
        backend: str | None = None,
        world_size: int | None = None,
        bandwidth: str | None = None,
    ) -> list[CollectiveProfileRecord]:
        """Collective profiles, oldest first, matching every filter given."""
        return self._records(
            CollectiveProfileRow,
            collective=collective,
            backend=backend,
            world_size=world_size,
            bandwidth=bandwidth,
        )

    def save_measurement(self, *, measurement: MeasurementRecord) -> int:
        """Store an executor measurement; return its id (see :func:`add_measurement`)."""
        with self.transaction() as session:
            return add_measurement(session, measurement=measurement)

    def measurements(
        self, *, graph_hash: str | None = None, strategy_hash: str | None = None
    ) -> list[MeasurementRecord]:
        """Measurements, oldest first, matching every filter given."""
        return self._records(MeasurementRow, graph_hash=graph_hash, strategy_hash=strategy_hash)

    def save_prediction(self, *, prediction: PredictionRecord) -> int:
        """Store a simulator prediction; return its id (see :func:`add_prediction`)."""
        with self.transaction() as session:
            return add_prediction(session, prediction=prediction)

    def predictions(
        self, *, graph_hash: str | None = None, strategy_hash: str | None = None
    ) -> list[PredictionRecord]:
        """Predictions, oldest first, matching every filter given."""
        return self._records(PredictionRow, graph_hash=graph_hash, strategy_hash=strategy_hash)

    # ----- batch jobs ----------------------------------------------------------------------------

    def job_status(self, *, key: str) -> JobStatus | None:
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
            insert = _insert(session, JobRow).values(**values)
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
            row = session.get(JobRow, key, with_for_update=True)
            if row is None:
                raise StoreError(f"job {key!r} was never started; call start_job first")
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
            row = session.get(JobRow, key, with_for_update=True)
            if row is None:
                raise StoreError(f"job {key!r} was never started; call start_job first")
            row.status = "failed"
            row.error = error
            row.finished_at = utc_now()

    def jobs(self) -> list[JobRecord]:
        """Every job, oldest first."""
        query = select(JobRow).order_by(JobRow.created_at, JobRow.key)
        with self.transaction() as session:
            return [row.to_record() for row in session.scalars(query)]
