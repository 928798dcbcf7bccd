"""Writing rows into a caller's session: model specs, graphs, strategies, profiles, results.

Every ``add_*`` function writes through the session it is given and commits nothing, so that a
batch job can write all its results and mark itself done in one transaction
(:meth:`~ddlsim.data.store.store.Store.finish_job`). Specs, graphs and strategies are
content-addressed (SHA-256 of their canonical JSON) and written once, even by concurrent
writers; profiles and results are new rows that name the graph or strategy they belong to.
"""

import gzip
import hashlib
import json
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store.errors import StoreError
from ddlsim.data.store.records import (
    ClusterPredictionRecord,
    CollectiveProfileRecord,
    FusionProfileRecord,
    KernelProfileRecord,
    MeasurementRecord,
    PredictionRecord,
)
from ddlsim.data.store.schema import (
    Base,
    ClusterPredictionRow,
    CollectiveProfileRow,
    FusionProfileRow,
    GraphRow,
    KernelProfileRow,
    MeasurementRow,
    ModelSpecRow,
    PredictionRow,
    ResultRow,
    StrategyRow,
    utc_now,
)


def _sha256(text_: str) -> str:
    return hashlib.sha256(text_.encode()).hexdigest()


def strategy_hash(strategy: Strategy) -> str:
    """The key a strategy is stored under: SHA-256 of ``strategy.to_json()``."""
    return _sha256(strategy.to_json())


def dialect_insert(session: Session, row_type: type[Base]) -> postgresql.Insert | sqlite.Insert:
    """An INSERT that can say what to do on a conflict (both backends spell it alike)."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(row_type)
    return sqlite.insert(row_type)


def _insert_missing(session: Session, row_type: type[Base], values: dict[str, Any]) -> None:
    """Insert a content-addressed row unless a concurrent writer already has."""
    session.execute(dialect_insert(session, row_type).values(**values).on_conflict_do_nothing())


def _add_row(session: Session, row: ResultRow[Any]) -> int:
    session.add(row)
    session.flush()
    return row.id


def _require(session: Session, row_type: type[Base], key: str, what: str) -> None:
    if session.get(row_type, key) is None:
        raise StoreError(f"{what} {key} is not in the store; save it before rows that use it")


def add_model_spec(session: Session, *, spec: ModelSpec) -> str:
    """Add ``spec`` unless present; return the SHA-256 of its canonical JSON."""
    raw = spec.to_dict()
    spec_hash = _sha256(json.dumps(raw, sort_keys=True, separators=(",", ":")))
    if session.get(ModelSpecRow, spec_hash) is None:
        _insert_missing(
            session,
            ModelSpecRow,
            {"spec_hash": spec_hash, "label": spec.label, "spec": raw, "created_at": utc_now()},
        )
    return spec_hash


def add_graph(session: Session, *, graph: IterationGraph) -> str:
    """Add ``graph`` and its model spec unless present; return ``graph.graph_hash``."""
    spec_hash = add_model_spec(session, spec=graph.model)
    now = utc_now()
    if session.get(GraphRow, graph.graph_hash) is None:
        _insert_missing(
            session,
            GraphRow,
            {
                "graph_hash": graph.graph_hash,
                "model_spec_hash": spec_hash,
                "model": graph.model.label,
                "schema_version": graph.schema_version,
                "num_nodes": len(graph.nodes),
                "summary": graph.summary(),
                "graph_json_gz": gzip.compress(graph.to_json().encode(), mtime=0),
                "created_at": now,
            },
        )
    return graph.graph_hash


def add_strategy(session: Session, *, strategy: Strategy) -> str:
    """Add ``strategy`` unless present; return :func:`strategy_hash` of it."""
    key = strategy_hash(strategy)
    if session.get(StrategyRow, key) is None:
        _insert_missing(
            session,
            StrategyRow,
            {"strategy_hash": key, "strategy": strategy.to_dict(), "created_at": utc_now()},
        )
    return key


def add_kernel_profile(session: Session, *, profile: KernelProfileRecord) -> int:
    """Add a kernel profile of a stored graph; return its id.

    Raises:
        StoreError: when the profile's graph is not in the store.
    """
    _require(session, GraphRow, profile.graph_hash, "graph")
    return _add_row(session, KernelProfileRow.from_record(profile))


def add_fusion_profile(session: Session, *, profile: FusionProfileRecord) -> int:
    """Add a fusion profile of a stored graph's model; return its id.

    Raises:
        StoreError: when the profile's graph is not in the store.
    """
    _require(session, GraphRow, profile.graph_hash, "graph")
    return _add_row(session, FusionProfileRow.from_record(profile))


def add_collective_profile(session: Session, *, profile: CollectiveProfileRecord) -> int:
    """Add a collective profile; return its id."""
    return _add_row(session, CollectiveProfileRow.from_record(profile))


def add_measurement(session: Session, *, measurement: MeasurementRecord) -> int:
    """Add an executor measurement; return its id.

    Raises:
        StoreError: when its strategy (or its graph, when given) is not in the store.
    """
    if measurement.graph_hash is not None:
        _require(session, GraphRow, measurement.graph_hash, "graph")
    _require(session, StrategyRow, measurement.strategy_hash, "strategy")
    return _add_row(session, MeasurementRow.from_record(measurement))


def add_prediction(session: Session, *, prediction: PredictionRecord) -> int:
    """Add a simulator prediction; return its id.

    Raises:
        StoreError: when its graph or strategy is not in the store.
    """
    _require(session, GraphRow, prediction.graph_hash, "graph")
    _require(session, StrategyRow, prediction.strategy_hash, "strategy")
    return _add_row(session, PredictionRow.from_record(prediction))


def add_cluster_prediction(session: Session, *, prediction: ClusterPredictionRecord) -> int:
    """Add a GPU cluster's prediction; return its id.

    Raises:
        StoreError: when its model spec or strategy is not in the store.
    """
    _require(session, ModelSpecRow, prediction.model_spec_hash, "model spec")
    _require(session, StrategyRow, prediction.strategy_hash, "strategy")
    return _add_row(session, ClusterPredictionRow.from_record(prediction))
