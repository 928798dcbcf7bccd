"""The store's backends for the data tests: SQLite always, PostgreSQL when configured.

PostgreSQL runs when ``DDLSIM_TEST_POSTGRES_URL`` is set (``eval "$(bash scripts/postgres.sh)"``
as root sets it); each test gets a fresh schema. Without it the PostgreSQL cases skip, except
under ``CI=true``, where they fail: CI must test both backends.
"""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddlsim.data.store import Store
from ddlsim.data.store.scratch import scratch_schema

POSTGRES_ENV = "DDLSIM_TEST_POSTGRES_URL"


# ----- backends ----------------------------------------------------------------------------------


def _postgres_base_url() -> str:
    url = os.environ.get(POSTGRES_ENV, "").strip()
    if not url:
        message = f'{POSTGRES_ENV} is not set; as root run: eval "$(bash scripts/postgres.sh)"'
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message} (CI=true: the PostgreSQL store must be tested)")
        pytest.skip(message)
    return url


def _fresh_postgres_schema(base_url: str) -> Iterator[str]:
    """A URL whose connections see only a new, empty schema; the schema is dropped after."""
    with scratch_schema(base_url, prefix="ddlsim_test") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    else:
        yield from _fresh_postgres_schema(_postgres_base_url())


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with Store.open(store_url) as opened:
        yield opened
