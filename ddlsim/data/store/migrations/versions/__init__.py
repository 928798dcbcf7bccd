"""Migration scripts, applied in order by ``alembic upgrade head`` when a store is opened."""
