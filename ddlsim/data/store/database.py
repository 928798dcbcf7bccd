"""A store's database: its URL, the engine that opens it, and the migrations that bring it to head.

Two backends: a SQLite file (the default, in the user's data directory) and PostgreSQL. Opening
runs the Alembic migrations up to head, one process at a time. Messages name a URL with its
password masked.
"""

import hashlib
import os
import re
import time
from pathlib import Path
from typing import Any

import platformdirs
from alembic import command
from alembic.config import Config
from alembic.util import CommandError
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError

from ddlsim.data.errors import one_line
from ddlsim.data.store.errors import StoreError

URL_FORMS = '"sqlite:///PATH" or "postgresql+psycopg://USER:PASS@HOST/DB"'
DB_ENV_VAR = "DDLSIM_DB"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_S = 30.0
POSTGRES_CONNECT_TIMEOUT_S = 10
# pg_advisory_xact_lock key: processes opening a fresh database migrate it one at a time.
_MIGRATION_LOCK_KEY = int.from_bytes(hashlib.sha256(b"ddlsim-migrate").digest()[:7], "big")


def default_url() -> str:
    """``$DDLSIM_DB`` when set, else the SQLite file ``ddlsim.db`` in the user's data directory."""
    from_env = os.environ.get(DB_ENV_VAR, "").strip()
    if from_env:
        return from_env
    path = Path(platformdirs.user_data_dir("ddlsim")) / "ddlsim.db"
    return f"sqlite:///{path}"


_QUERY_SECRET = re.compile(r"(?i)([?&](?:password|passwd|pwd|secret|token)=)[^&]*")


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, for any text: the userinfo runs to the
    last ``@`` before the query (a password may hold ``@``, ``:`` or ``/`` unencoded), and
    password-like query parameters are masked too. Nothing is parsed by a URL library, so a
    URL that does not parse is masked the same way."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return url
    head, question, query = rest.partition("?")
    at = head.rfind("@")
    if at >= 0:
        user, colon, _ = head[:at].partition(":")
        head = f"{user}:***@{head[at + 1 :]}" if colon else head
    tail = _QUERY_SECRET.sub(r"\1***", question + query) if question else ""
    return f"{scheme}://{head}{tail}"


def redact(text: str, url: str) -> str:
    """``text`` with ``url`` and its password masked wherever they appear (an error message
    that repeats the URL it could not open)."""
    text = text.replace(url, mask_url(url))
    _, separator, rest = url.partition("://")
    head = rest.partition("?")[0]
    at = head.rfind("@")
    if separator and at >= 0:
        password = head[:at].partition(":")[2]
        if password:
            text = text.replace(password, "***")
    return text


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


def open_engine(url: str) -> Engine:
    """An engine on the database at ``url``, migrated to the newest revision.

    Creates a SQLite file's parent directory.

    Raises:
        StoreError: on a URL that is neither SQLite nor PostgreSQL (psycopg), a server that
            cannot be reached or refuses the login, or a schema newer than this ddlsim.
            The one-line message names the URL with its password masked.
    """
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
    return engine


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
