"""The experts' part of a strategy: its vocabulary checked on its own, its split checked against
the model, and what this executor runs of it."""

import re

import pytest

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.parallel import ParallelPlan
from ddlsim.data.specs.strategy import Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.plans.feasibility import Target, check_priceable, refusals

MIXTRAL = ZOO["mixtral-tiny"]  # 4 experts, 2 a token, experts 128 wide, batch 8


@pytest.mark.parametrize(
    ("parallel", "message"),
    [
        ({"ep": 0}, "parallel.ep must be"),
        ({"dispatcher": "broadcast"}, "'broadcast' is not one of all_to_all, all_gather"),
        ({"capacity_factor": 0}, "capacity_factor must be a number > 0"),
        ({"ep": 2, "grid": [1, 2, 1], "tp": 2}, "fold onto Megatron's 1-D layouts"),
    ],
)
def test_the_vocabulary_names_the_bad_value(parallel: dict, message: str) -> None:
    with pytest.raises(InvalidStrategyError, match=message):
        ParallelPlan(**parallel)


def test_the_experts_fold_onto_attentions_ranks() -> None:
    plan = ParallelPlan(ep=4, etp=2, tp=2)
    assert plan.resolve_dp(8) == 4  # tp 2 x dp 4 = 8 ranks a stage; ep 4 x etp 2 x edp 1
    with pytest.raises(InvalidStrategyError, match=r"ep\(4\) \* etp\(1\) = 4 does not divide"):
        ParallelPlan(ep=4).resolve_dp(2)
    labels = ParallelPlan(ep=2, dispatcher="all_gather", capacity_factor=1.25).label
    assert labels == "ep2 all_gather cf1.25"
    # the defaults leave a strategy's JSON (and so its hash) as it was
    assert "ep" not in Strategy().to_dict()["parallel"]
    assert Strategy.from_dict({"parallel": {"ep": 2}}).to_dict()["parallel"]["ep"] == 2


@pytest.mark.parametrize(
    ("model", "parallel", "message"),
    [
        ("llama-tiny", {"ep": 2}, "has none \\(a dense model\\)"),
        ("mixtral-tiny", {"ep": 8, "dp": 8}, "ep\\(8\\) does not divide the 4 experts"),
        ("mixtral-tiny", {"ep": 2, "etp": 2, "dp": 4}, "priced by the simulator but not run"),
        ("mixtral-tiny", {"ep": 1, "etp": 3, "dp": 3}, "etp\\(3\\) does not divide"),
        ("mixtral-tiny", {"ep": 2, "capacity_factor": 1.0}, "dropless experts"),
        (
            "mixtral-tiny",
            {"ep": 2, "distributed_optimizer": True},
            "with parallel.distributed_optimizer it is priced",
        ),
    ],
)
def test_refusals_name_the_experts_rule(model: str, parallel: dict, message: str) -> None:
    strategy = Strategy.from_dict({"parallel": parallel})
    ranks = 4 if "dp" not in parallel else parallel["dp"] * parallel.get("tp", 1)
    found = refusals(ZOO[model], strategy, Target(world_size=ranks))
    assert found, parallel
    assert any(re.search(message, text) for text in found), found


def test_expert_parallelism_runs_beside_dp_and_fsdp() -> None:
    for parallel in (
        {"ep": 2},
        {"ep": 4},
        {"ep": 2, "fsdp": True},
        {"ep": 2, "dispatcher": "all_gather"},
    ):
        strategy = Strategy.from_dict({"parallel": parallel})
        assert refusals(MIXTRAL, strategy, Target(world_size=4)) == [], parallel


def test_the_gpu_path_prices_experts_of_a_family_it_can_split() -> None:
    check_priceable(MIXTRAL)  # attention split, the experts left whole on every rank
    with pytest.raises(InvalidStrategyError, match="has no tensor-parallel plan"):
        check_priceable(ZOO["deepseek-v3-tiny"])  # multi-latent attention
