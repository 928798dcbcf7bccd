"""A scratch schema of a PostgreSQL server: a store that starts empty and is dropped after,
for tests and benchmarks that need a real server without touching what it holds."""

import contextlib
import uuid
from collections.abc import Iterator

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


@contextlib.contextmanager
def scratch_schema(base_url: str, *, prefix: str = "ddlsim_scratch") -> Iterator[str]:
    """A URL whose connections see only a new, empty schema of the server at ``base_url``
    (``search_path``); the schema and all it holds are dropped when the block ends."""
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(base_url).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
