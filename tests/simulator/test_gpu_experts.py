"""Mixtures of experts on a GPU cluster, priced from one block's shard: the experts' grouped GEMMs
by the tokens each local expert gets, their dispatch and combine across NVLink and nodes, the
overlap and the host's pace, and the experts' memory."""

import dataclasses

import pytest

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.gpu_cluster import preset
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.data.zoo import ZOO
from ddlsim.search.scale_plans import SpaceLimits
from ddlsim.simulator.gpu import experts as gpu_experts
from ddlsim.workflows.scale import ScaleRequest, predict_at_scale, shard_pricing

SPEC = ZOO["qwen3-moe-tiny"]
CLUSTER = preset("dgx-h100", nodes=2)  # 16 GPUs
BATCH, SEQ = 64, 256


def _predict(**fields: object):  # type: ignore[no-untyped-def]
    plan = ScalePlan(**{"dp": 16, "micro_batches": 4, "precision": "bf16", **fields})  # type: ignore[arg-type]
    request = ScaleRequest(model=SPEC, cluster=CLUSTER, plan=plan, global_batch=BATCH, seq_len=SEQ)
    return predict_at_scale(request)


def _costs():  # type: ignore[no-untyped-def]
    costs, _, op_costs = shard_pricing(
        SPEC, CLUSTER, tp=1, micro_batch=1, seq_len=SEQ, precision="bf16", compiled=False
    )
    return costs, op_costs


def test_the_experts_are_priced_apart_from_the_block() -> None:
    costs, _ = _costs()
    experts = costs.experts
    assert experts is not None and experts.experts == 8 and experts.top_k == 2
    assert experts.pairs == SEQ * 2  # one sequence's tokens, two experts each
    assert {g.phase for g in experts.gemms} == {"forward", "backward"}
    assert sum(g.weight_grad for g in experts.gemms) == 2  # up and down's weights
    # the experts' parameters are theirs, not the block's
    assert experts.params > 0 and costs.block.params < experts.params
    # a dense model has none
    dense, _, _ = shard_pricing(
        ZOO["llama-tiny"], CLUSTER, tp=1, micro_batch=1, seq_len=SEQ, precision="bf16",
        compiled=False,
    )  # fmt: skip
    assert dense.experts is None


def test_exchanges_cross_the_fabric_the_group_spans() -> None:
    inside = _predict(ep=8)  # 8 ranks: one node, NVLink
    across = _predict(ep=16)  # 16 ranks over 2 nodes
    assert "expert_dispatch" in inside.breakdown_ms
    assert across.breakdown_ms["expert_dispatch"] > inside.breakdown_ms["expert_dispatch"]
    # flex sends a token once to each other node its experts are on: less than all-to-all's
    # copies across the NICs
    flex = _predict(ep=16, dispatcher="flex")
    assert flex.breakdown_ms["expert_dispatch"] < across.breakdown_ms["expert_dispatch"]
    # the plain data-parallel plan exchanges nothing
    assert _predict().breakdown_ms["expert_dispatch"] == 0.0


def test_the_overlap_hides_its_share_of_the_exchanges() -> None:
    time = gpu_experts.ExpertsTime(
        compute_f=1.0, compute_b=2.0, exchange_f=1.0, exchange_b=1.0, network=True
    )
    forward, backward = time.exposed(hide_f=5.0, hide_b=0.5)
    assert forward.network == pytest.approx(1.0 - gpu_experts.EP_OVERLAP_HIDDEN)
    assert backward.network == pytest.approx(1.0 - gpu_experts.EP_OVERLAP_HIDDEN * 0.5)
    plain = _predict(ep=16)
    overlapped = _predict(ep=16, ep_overlap=True)
    assert overlapped.iteration_s < plain.iteration_s


def test_a_block_of_short_kernels_is_paced_by_the_host_under_transformer_engine() -> None:
    eager = _predict(ep=8, kernels="transformer_engine")
    assert eager.breakdown_ms["host_bound"] > 0
    per_block = gpu_experts.MOE_BLOCK_HOST_MS
    layers = int(SPEC.config["num_hidden_layers"])
    # the tiny model's blocks take less than the floor: each micro-batch's block takes it
    assert eager.iteration_s * 1e3 >= 4 * layers * per_block
    assert _predict(ep=8).breakdown_ms["host_bound"] == 0.0  # PyTorch's kernels: no floor


def test_each_gpu_holds_its_share_of_the_experts() -> None:
    whole = _predict(distributed_optimizer=True)
    split = _predict(ep=8, distributed_optimizer=True)
    assert split.memory.weights_and_optimizer < whole.memory.weights_and_optimizer
    costs, _ = _costs()
    plan = ScalePlan(dp=16, ep=8, micro_batches=4)
    assert gpu_experts.expert_params_per_gpu(costs.experts, plan) == costs.experts.params / 8


def test_the_search_space_names_bad_expert_choices() -> None:
    with pytest.raises(InvalidStrategyError, match="search space ep 3 is not one of"):
        SpaceLimits(ep=(1, 3))
    with pytest.raises(InvalidStrategyError, match="search space dispatcher 'deepep'"):
        SpaceLimits(dispatcher=("deepep",))
    with pytest.raises(InvalidStrategyError, match="search space ep_overlap must be"):
        SpaceLimits(ep_overlap=True)  # type: ignore[arg-type]
    assert dataclasses.replace(SpaceLimits(), dispatcher=("flex",)).dispatcher == ("flex",)
