"""The store's GPU-cluster predictions, on every backend: stored with the model spec and the
layout they priced, read back newest first, refused without them."""

import dataclasses

import pytest

from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.store import ClusterPredictionRecord, Store, StoreError
from ddlsim.data.zoo import ZOO


def _record(spec_hash: str, strategy_hash: str, iteration_s: float) -> ClusterPredictionRecord:
    return ClusterPredictionRecord(
        model="gpt2-tiny",
        model_spec_hash=spec_hash,
        strategy_hash=strategy_hash,
        strategy={"parallel": {"dp": 8}, "precision": "bf16"},
        cluster={"name": "dgx-h100", "nodes": 1, "gpus_per_node": 8},
        global_batch=8,
        seq_len=128,
        iteration_s=iteration_s,
        prediction={"fits": True, "breakdown_ms": {"compute": 1.5, "optimizer": 0.25}},
        simulator_version="test",
    )


def test_cluster_predictions_round_trip_newest_first(store: Store) -> None:
    spec: ModelSpec = ZOO["gpt2-tiny"]
    spec_hash = store.save_model_spec(spec=spec)
    key = store.save_strategy(strategy=Strategy.from_dict({"parallel": {"dp": 8}}))
    first = _record(spec_hash, key, 1.0)
    ids = [
        store.save_cluster_prediction(prediction=r) for r in (first, _record(spec_hash, key, 2.0))
    ]
    loaded = store.cluster_predictions()
    assert [r.id for r in loaded] == ids[::-1]
    assert [r.id for r in store.cluster_predictions(limit=1)] == ids[1:]
    one = store.cluster_prediction(prediction_id=ids[0])
    assert one.created_at is not None and one.created_at.utcoffset() is not None
    assert dataclasses.replace(one, id=None, created_at=None) == first
    with pytest.raises(StoreError, match="cluster prediction 999 is not in the store"):
        store.cluster_prediction(prediction_id=999)


def test_a_cluster_prediction_needs_its_spec_and_strategy(store: Store) -> None:
    with pytest.raises(StoreError, match="model spec abc is not in the store"):
        store.save_cluster_prediction(prediction=_record("abc", "def", 1.0))
    assert store.cluster_predictions() == []
