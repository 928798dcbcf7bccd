"""Predictions of GPU clusters on paper (``POST /v1/cluster-predictions``): the model's spec and
the layout's strategy by their hashes, the cluster, the batch, what was predicted.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "ddlsim_cluster_predictions"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("model_spec_hash", sa.String(64), nullable=False),
        sa.Column("strategy_hash", sa.String(64), nullable=False),
        sa.Column("strategy", sa.JSON(), nullable=False),
        sa.Column("cluster", sa.JSON(), nullable=False),
        sa.Column("global_batch", sa.Integer(), nullable=False),
        sa.Column("seq_len", sa.Integer(), nullable=False),
        sa.Column("iteration_s", sa.Float(), nullable=False),
        sa.Column("prediction", sa.JSON(), nullable=False),
        sa.Column("simulator_version", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=f"pk_{TABLE}"),
        sa.ForeignKeyConstraint(
            ["model_spec_hash"],
            ["ddlsim_model_specs.spec_hash"],
            name=f"fk_{TABLE}_spec",
        ),
        sa.ForeignKeyConstraint(
            ["strategy_hash"],
            ["ddlsim_strategies.strategy_hash"],
            name=f"fk_{TABLE}_plan",
        ),
    )
    op.create_index(f"ix_{TABLE}_model_spec_hash", TABLE, ["model_spec_hash"])
    op.create_index(f"ix_{TABLE}_strategy_hash", TABLE, ["strategy_hash"])


def downgrade() -> None:
    op.drop_index(f"ix_{TABLE}_strategy_hash", table_name=TABLE)
    op.drop_index(f"ix_{TABLE}_model_spec_hash", table_name=TABLE)
    op.drop_table(TABLE)
