"""A queue that spans hosts: what a task needs of its worker (CUDA GPUs, a named cluster), a
profiling run's jobs as tasks of their own under it, kernel profiles keyed by host, and named
cluster profiles measured on users' own clusters.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ddlsim_cluster_profiles",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("measured", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_ddlsim_cluster_profiles"),
    )
    with op.batch_alter_table("ddlsim_tasks") as batch:
        batch.add_column(sa.Column("gpus", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("cluster", sa.String(255), nullable=True))
        batch.add_column(sa.Column("parent_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("children", sa.Integer(), nullable=False, server_default="0"))
        batch.create_index("ix_ddlsim_tasks_parent_id", ["parent_id"])
    with op.batch_alter_table("ddlsim_kernel_profiles") as batch:
        batch.add_column(sa.Column("host", sa.String(255), nullable=False, server_default=""))
        batch.create_index("ix_ddlsim_kernel_profiles_host", ["host"])


def downgrade() -> None:
    with op.batch_alter_table("ddlsim_kernel_profiles") as batch:
        batch.drop_index("ix_ddlsim_kernel_profiles_host")
        batch.drop_column("host")
    with op.batch_alter_table("ddlsim_tasks") as batch:
        batch.drop_index("ix_ddlsim_tasks_parent_id")
        batch.drop_column("children")
        batch.drop_column("parent_id")
        batch.drop_column("cluster")
        batch.drop_column("gpus")
    op.drop_table("ddlsim_cluster_profiles")
