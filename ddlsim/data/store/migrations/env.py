"""Alembic's entry point, run by ``alembic.command.upgrade`` when a store is opened.

``Store.open`` hands over an open connection (``config.attributes["connection"]``), already in
the transaction it will commit, so the whole upgrade is one transaction; without one (a
developer's ``alembic.command.revision(alembic_config(url), autogenerate=True)``) this connects
to ``sqlalchemy.url``; offline ``--sql`` mode renders the DDL for that URL. Alembic keeps its
revision in ``ddlsim_alembic_version`` and only ever compares our ``ddlsim_`` tables, because
Optuna keeps its own tables (and its own ``alembic_version``) in the same database.
"""

from alembic import context
from alembic.runtime.environment import NameFilterParentNames, NameFilterType
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

from ddlsim.data.store.schema import TABLE_PREFIX, VERSION_TABLE, Base


def include_name(
    name: str | None, type_: NameFilterType, parent_names: NameFilterParentNames
) -> bool:
    """Autogenerate and comparisons look at our tables only."""
    if type_ == "table":
        return name is not None and name.startswith(TABLE_PREFIX)
    return True


def run_online(connection: Connection) -> None:
    """Run the migrations on ``connection``: the store's own (already locked) or a developer's."""
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    """Write the migrations' SQL for the configured URL instead of running them."""
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url"),
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    given = context.config.attributes.get("connection")
    if given is not None:
        run_online(given)
    else:
        # A developer's ``alembic.command.revision(alembic_config(url), autogenerate=True)``.
        engine = create_engine(context.config.get_main_option("sqlalchemy.url", ""))
        with engine.connect() as connection:
            run_online(connection)
            connection.commit()
        engine.dispose()
