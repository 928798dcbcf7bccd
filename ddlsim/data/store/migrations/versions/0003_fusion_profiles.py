"""Fusion profiles: blocks timed eager and compiled.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ddlsim_fusion_profiles",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("graph_hash", sa.String(64), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("device", sa.String(255), nullable=False),
        sa.Column("backend", sa.String(255), nullable=False),
        sa.Column("iters", sa.Integer(), nullable=False),
        sa.Column("blocks", sa.JSON(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_ddlsim_fusion_profiles"),
        sa.ForeignKeyConstraint(
            ["graph_hash"],
            ["ddlsim_graphs.graph_hash"],
            name="fk_ddlsim_fusion_profiles_graph_hash_ddlsim_graphs",
        ),
    )
    op.create_index(
        "ix_ddlsim_fusion_profiles_graph_hash", "ddlsim_fusion_profiles", ["graph_hash"]
    )


def downgrade() -> None:
    op.drop_index("ix_ddlsim_fusion_profiles_graph_hash", table_name="ddlsim_fusion_profiles")
    op.drop_table("ddlsim_fusion_profiles")
