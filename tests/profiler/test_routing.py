"""The routers' load on the expert-parallel ranks, as the executor's first iteration routes."""

import torch

from ddlsim.data.moe import experts_shape
from ddlsim.data.specs.strategy import ParallelPlan
from ddlsim.data.zoo import ZOO
from ddlsim.profiler.routing import _imbalance, routing_load


def test_the_busiest_rank_over_the_mean_is_counted_per_micro_batch_and_group() -> None:
    plan = ParallelPlan(ep=2, micro_batches=2)
    # 4 experts, 2 per ep rank; dp 2 (one group), rank-major (rank, micro-batch) choices
    found = [
        torch.tensor([0, 0, 1, 1]),  # rank 0, mb 0: all on ep rank 0
        torch.tensor([0, 2, 1, 3]),  # rank 0, mb 1
        torch.tensor([0, 1, 0, 1]),  # rank 1, mb 0: all on ep rank 0
        torch.tensor([2, 0, 3, 1]),  # rank 1, mb 1
    ]
    # mb 0: loads (8, 0) -> 2.0; mb 1: (4, 4) -> 1.0; mean 1.5
    assert _imbalance(found, experts=4, plan=plan, dp=2) == 1.5
    assert _imbalance(found, experts=4, plan=ParallelPlan(), dp=2) == 1.0


def test_a_model_s_routing_is_measured_for_every_experts_layer() -> None:
    spec = ZOO["mixtral-tiny"]
    shape = experts_shape(spec.config)
    assert shape is not None
    load = routing_load(spec, ParallelPlan(ep=2), world_size=2)
    layers = int(spec.config["num_hidden_layers"])
    assert sorted(load.imbalance) == [f"model.layers.{i}.mlp.experts" for i in range(layers)]
    # the busiest of 2 ranks holds at most all of them: between 1 and ep
    assert all(1.0 <= f <= 2.0 for f in load.imbalance.values())
    assert load.of("not.an.experts.module") == 1.0
    # the same seed, the same routing; each layer's own
    again = routing_load(spec, ParallelPlan(ep=2), world_size=2)
    assert again == load
    assert len(set(load.imbalance.values())) > 1
