"""The persistent store: SQLite by default, PostgreSQL by URL, migrated on open.

>>> store = Store.open()  # $DDLSIM_DB, else ddlsim.db in the user's data directory
>>> graph_hash = store.save_graph(graph=graph)
"""

from ddlsim.data.store.database import DB_ENV_VAR, alembic_config, default_url, mask_url
from ddlsim.data.store.errors import StoreError
from ddlsim.data.store.records import (
    JOB_STATUSES,
    ClusterPredictionRecord,
    CollectiveProfileRecord,
    FusionProfileRecord,
    JobRecord,
    JobStatus,
    KernelProfileRecord,
    MeasurementRecord,
    PredictionRecord,
)
from ddlsim.data.store.store import Store
from ddlsim.data.store.writers import (
    add_cluster_prediction,
    add_collective_profile,
    add_fusion_profile,
    add_graph,
    add_kernel_profile,
    add_measurement,
    add_model_spec,
    add_prediction,
    add_strategy,
    strategy_hash,
)

__all__ = [
    "DB_ENV_VAR",
    "JOB_STATUSES",
    "ClusterPredictionRecord",
    "CollectiveProfileRecord",
    "FusionProfileRecord",
    "JobRecord",
    "JobStatus",
    "KernelProfileRecord",
    "MeasurementRecord",
    "PredictionRecord",
    "Store",
    "StoreError",
    "add_cluster_prediction",
    "add_collective_profile",
    "add_fusion_profile",
    "add_graph",
    "add_kernel_profile",
    "add_measurement",
    "add_model_spec",
    "add_prediction",
    "add_strategy",
    "alembic_config",
    "default_url",
    "mask_url",
    "strategy_hash",
]
