"""Measurements keep the per-step losses of the run.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("ddlsim_measurements", sa.Column("losses", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ddlsim_measurements") as batch:
        batch.drop_column("losses")
