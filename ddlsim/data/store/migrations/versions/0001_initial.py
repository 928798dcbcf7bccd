"""Create the store's tables.

Hand-written to match ``data/store/schema.py`` (a test compares the migrated database with the
models). Types are spelled out rather than imported from the schema so this revision stays fixed
when the models change later.

Revision ID: 0001
Revises:
Create Date: 2026-05-01
"""

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

HASH = sa.String(64)
NAME = sa.String(255)


def _created_at() -> sa.Column[datetime]:
    return sa.Column("created_at", sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    op.create_table(
        "ddlsim_model_specs",
        sa.Column("spec_hash", HASH, nullable=False),
        sa.Column("label", NAME, nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("spec_hash", name="pk_ddlsim_model_specs"),
    )
    op.create_table(
        "ddlsim_strategies",
        sa.Column("strategy_hash", HASH, nullable=False),
        sa.Column("strategy", sa.JSON(), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("strategy_hash", name="pk_ddlsim_strategies"),
    )
    op.create_table(
        "ddlsim_graphs",
        sa.Column("graph_hash", HASH, nullable=False),
        sa.Column("model_spec_hash", HASH, nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("schema_version", sa.Integer(), nullable=False),
        sa.Column("num_nodes", sa.Integer(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("graph_json_gz", sa.LargeBinary(), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("graph_hash", name="pk_ddlsim_graphs"),
        sa.ForeignKeyConstraint(
            ["model_spec_hash"],
            ["ddlsim_model_specs.spec_hash"],
            name="fk_ddlsim_graphs_model_spec_hash_ddlsim_model_specs",
        ),
    )
    op.create_index("ix_ddlsim_graphs_model_spec_hash", "ddlsim_graphs", ["model_spec_hash"])
    op.create_table(
        "ddlsim_kernel_profiles",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("graph_hash", HASH, nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("device", NAME, nullable=False),
        sa.Column("device_name", NAME, nullable=False),
        sa.Column("iters", sa.Integer(), nullable=False),
        sa.Column("iteration_time_ms", sa.Float(), nullable=False),
        sa.Column("attributed_ms", sa.Float(), nullable=False),
        sa.Column("coverage", sa.Float(), nullable=False),
        sa.Column("node_ms", sa.JSON(), nullable=False),
        sa.Column("trace_path", sa.Text(), nullable=True),
        sa.Column("env", sa.JSON(), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name="pk_ddlsim_kernel_profiles"),
        sa.ForeignKeyConstraint(
            ["graph_hash"],
            ["ddlsim_graphs.graph_hash"],
            name="fk_ddlsim_kernel_profiles_graph_hash_ddlsim_graphs",
        ),
    )
    op.create_index(
        "ix_ddlsim_kernel_profiles_graph_hash", "ddlsim_kernel_profiles", ["graph_hash"]
    )
    op.create_table(
        "ddlsim_collective_profiles",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("collective", NAME, nullable=False),
        sa.Column("backend", NAME, nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("bandwidth", NAME, nullable=False),
        sa.Column("network", NAME, nullable=False),
        sa.Column("alpha_us", sa.Float(), nullable=False),
        sa.Column("busbw_gbps", sa.Float(), nullable=False),
        sa.Column("r2", sa.Float(), nullable=False),
        sa.Column("samples", sa.JSON(), nullable=False),
        sa.Column("rank_cores", sa.JSON(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name="pk_ddlsim_collective_profiles"),
    )
    op.create_index(
        "ix_ddlsim_collective_profiles_lookup",
        "ddlsim_collective_profiles",
        ["collective", "backend", "world_size", "bandwidth"],
    )
    op.create_table(
        "ddlsim_measurements",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("graph_hash", HASH, nullable=True),
        sa.Column("strategy_hash", HASH, nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("bandwidth", NAME, nullable=False),
        sa.Column("network", NAME, nullable=False),
        sa.Column("iteration_time_ms", sa.JSON(), nullable=False),
        sa.Column("peak_memory_bytes", sa.JSON(), nullable=False),
        sa.Column("applied", sa.JSON(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name="pk_ddlsim_measurements"),
        sa.ForeignKeyConstraint(
            ["graph_hash"],
            ["ddlsim_graphs.graph_hash"],
            name="fk_ddlsim_measurements_graph_hash_ddlsim_graphs",
        ),
        sa.ForeignKeyConstraint(
            ["strategy_hash"],
            ["ddlsim_strategies.strategy_hash"],
            name="fk_ddlsim_measurements_strategy_hash_ddlsim_strategies",
        ),
    )
    op.create_index("ix_ddlsim_measurements_graph_hash", "ddlsim_measurements", ["graph_hash"])
    op.create_index(
        "ix_ddlsim_measurements_strategy_hash", "ddlsim_measurements", ["strategy_hash"]
    )
    op.create_table(
        "ddlsim_predictions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("graph_hash", HASH, nullable=False),
        sa.Column("strategy_hash", HASH, nullable=False),
        sa.Column("cluster", sa.JSON(), nullable=False),
        sa.Column("iteration_time_ms", sa.Float(), nullable=False),
        sa.Column("breakdown", sa.JSON(), nullable=False),
        sa.Column("simulator_version", NAME, nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name="pk_ddlsim_predictions"),
        sa.ForeignKeyConstraint(
            ["graph_hash"],
            ["ddlsim_graphs.graph_hash"],
            name="fk_ddlsim_predictions_graph_hash_ddlsim_graphs",
        ),
        sa.ForeignKeyConstraint(
            ["strategy_hash"],
            ["ddlsim_strategies.strategy_hash"],
            name="fk_ddlsim_predictions_strategy_hash_ddlsim_strategies",
        ),
    )
    op.create_index("ix_ddlsim_predictions_graph_hash", "ddlsim_predictions", ["graph_hash"])
    op.create_index("ix_ddlsim_predictions_strategy_hash", "ddlsim_predictions", ["strategy_hash"])
    op.create_table(
        "ddlsim_jobs",
        sa.Column("key", sa.String(512), nullable=False),
        sa.Column("kind", NAME, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        _created_at(),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("key", name="pk_ddlsim_jobs"),
        sa.CheckConstraint(
            "status IN ('running', 'done', 'failed')", name="ck_ddlsim_jobs_status"
        ),
    )
    op.create_index("ix_ddlsim_jobs_status", "ddlsim_jobs", ["status"])


def downgrade() -> None:
    for table in (
        "ddlsim_jobs",
        "ddlsim_predictions",
        "ddlsim_measurements",
        "ddlsim_collective_profiles",
        "ddlsim_kernel_profiles",
        "ddlsim_graphs",
        "ddlsim_strategies",
        "ddlsim_model_specs",
    ):
        op.drop_table(table)
