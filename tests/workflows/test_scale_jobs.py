"""The GPU-cluster path as the service runs it: figures in the API's shape, a prediction stored
with its model and layout, a search request that survives the queue."""

import dataclasses
from pathlib import Path

import pytest

from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.data.store import Store
from ddlsim.data.zoo import ZOO
from ddlsim.simulator.gpu.prediction import BREAKDOWN_KEYS
from ddlsim.workflows.scale import ScaleRequest
from ddlsim.workflows.scale_jobs import (
    LayoutSearchRequest,
    check_priceable,
    ordered_breakdown,
    predict_and_store,
    prediction_json,
    search_cluster,
)

GPT = ZOO["gpt2-tiny"]
CLUSTER = GpuClusterSpec.parse("dgx-h100:1")


def test_the_breakdown_puts_the_known_parts_first_in_their_order() -> None:
    given = {"extra": 1.0, "optimizer": 2.0, "compute": 3.0, "later": 4.0}
    assert list(ordered_breakdown(given)) == ["compute", "optimizer", "extra", "later"]
    assert ordered_breakdown({key: 1.0 for key in reversed(BREAKDOWN_KEYS)}) == dict.fromkeys(
        BREAKDOWN_KEYS, 1.0
    )


def test_a_prediction_is_stored_with_its_model_and_layout(tmp_path: Path) -> None:
    request = ScaleRequest(
        model=GPT,
        cluster=CLUSTER,
        plan=ScalePlan(dp=4, tp=2, sequence_parallel=True),
        global_batch=8,
        seq_len=128,
    )
    with Store.open(f"sqlite:///{tmp_path / 's.db'}") as store:
        record = predict_and_store(request, store)
        ((spec_hash, spec),) = store.model_specs()
        strategy = store.load_strategy(strategy_hash=record.strategy_hash)
    assert record.model_spec_hash == spec_hash and spec == GPT
    assert ScalePlan.from_strategy(strategy) == request.plan
    shown = prediction_json(record)
    assert shown["layout"] == "dp4 tp2 pp1 mb1 sp bf16" and shown["world_size"] == 8
    assert shown["iteration_s"] == record.iteration_s > 0
    assert set(shown["memory"]) == {"total_gib", "parts_gib"}
    assert list(shown["breakdown_ms"]) == list(BREAKDOWN_KEYS)


def test_a_model_without_a_tensor_parallel_plan_is_refused() -> None:
    with pytest.raises(InvalidStrategyError, match=r"mlp .* supported families: "):
        check_priceable(ZOO["mlp"])


def test_a_search_request_survives_the_queue_and_ranks_its_layouts() -> None:
    request = LayoutSearchRequest(
        model=ModelSpec.from_dict(GPT.to_dict()), cluster=CLUSTER, global_batch=8, seq_len=128
    )
    assert LayoutSearchRequest.from_json(request.to_json()) == request
    engine = dataclasses.replace(request, kernels="transformer_engine", precision="fp8")
    assert LayoutSearchRequest.from_json(engine.to_json()) == engine
    with pytest.raises(InvalidStrategyError, match="kernels\\('cudnn'\\) is not one of"):
        dataclasses.replace(request, kernels="cudnn")
    with pytest.raises(InvalidOptionError, match="unknown cluster search option"):
        LayoutSearchRequest.from_json({**request.to_json(), "budget": 3})
    with pytest.raises(InvalidOptionError, match=r"top\(0\) must be between 1 and 50"):
        LayoutSearchRequest(model=GPT, cluster=CLUSTER, global_batch=8, seq_len=128, top=0)
    said: list[str] = []
    result = search_cluster(request, lambda fraction, message: said.append(message))
    assert said[0].startswith("capturing") and said[-1] == "pricing layout 10 in full"
    layouts = result["layouts"]
    assert [layout["rank"] for layout in layouts] == list(range(1, 11))
    assert layouts[0]["replayed"] and result["evaluated"] >= len(layouts)
    assert all(
        ScalePlan.from_dict(layout["strategy"]).label() == layout["layout"] for layout in layouts
    )
