"""Alembic migrations of the store, configured in code (no ``alembic.ini``).

:func:`data.store.database.alembic_config` points Alembic here; ``env.py`` keeps Alembic to our
``ddlsim_`` tables and its own version table, so Optuna's tables in the same database are left
alone.
"""
