"""The runtimes' gradient copies and plan costs the replay charges."""

import dataclasses

import pytest

from ddlsim.data.specs.strategy import Strategy
from ddlsim.simulator.runtime import RuntimeCosts, runtime_costs_of, shipped_runtime_costs

MIB = 1024 * 1024


def test_each_runtime_copies_its_buckets_three_times() -> None:
    costs = RuntimeCosts(copy_alpha_us=10.0, copy_us_per_byte=1e-3)
    one_pass = (10.0 + 1e-3 * MIB) / 1e3
    ddp = Strategy().tensor_fusion
    hooks = Strategy.from_dict({"tensor_fusion": {"implementation": "hooks"}}).tensor_fusion
    dear = Strategy.from_dict({"tensor_fusion": {"dear": True}}).tensor_fusion
    # DDP copies into its bucket and divides it before the all-reduce, copies back after.
    assert costs.launch_ms(ddp, MIB) == pytest.approx(2 * one_pass)
    assert costs.land_ms(ddp, MIB) == pytest.approx(one_pass)
    # The executor's buckets and DeAR concatenate first, divide and copy back after.
    for fusion in (hooks, dear):
        assert costs.launch_ms(fusion, MIB) == pytest.approx(one_pass)
        assert costs.land_ms(fusion, MIB) == pytest.approx(2 * one_pass)
    assert costs.launch_ms(ddp, 0) == 0.0
    assert RuntimeCosts().launch_ms(ddp, MIB) == 0.0


def test_each_bucket_costs_its_runtime_a_fixed_time_at_launch() -> None:
    costs = RuntimeCosts(copy_us_per_byte=1e-3, hooks_us_per_bucket=300.0, ddp_us_per_bucket=100.0)
    copies = RuntimeCosts(copy_us_per_byte=1e-3)
    ddp = Strategy().tensor_fusion
    hooks = Strategy.from_dict({"tensor_fusion": {"implementation": "hooks"}}).tensor_fusion
    dear = Strategy.from_dict({"tensor_fusion": {"dear": True}}).tensor_fusion
    assert costs.launch_ms(ddp, MIB) == pytest.approx(copies.launch_ms(ddp, MIB) + 0.1)
    for fusion in (hooks, dear):  # DeAR launches from the same hooks
        assert costs.launch_ms(fusion, MIB) == pytest.approx(copies.launch_ms(fusion, MIB) + 0.3)
        assert costs.land_ms(fusion, MIB) == copies.land_ms(fusion, MIB)


def test_scaled_multiplies_every_cost() -> None:
    costs = RuntimeCosts(
        copy_alpha_us=1.0,
        copy_us_per_byte=2.0,
        fsdp_us_per_group=3.0,
        fsdp_us_per_byte=3.5,
        fsdp_step_us_per_param=4.0,
        tp_us_per_module=5.0,
        tp_step_us_per_param=6.0,
        hooks_us_per_bucket=7.0,
        ddp_us_per_bucket=8.0,
    )
    doubled = dataclasses.asdict(costs.scaled(2.0))
    assert doubled == {k: 2 * v for k, v in dataclasses.asdict(costs).items()}


def test_a_dataset_meta_overrides_the_shipped_costs() -> None:
    shipped = shipped_runtime_costs()
    assert runtime_costs_of({}) == shipped
    assert runtime_costs_of({"runtime_costs": {}}) == RuntimeCosts()
    recorded = {"runtime_costs": {"copy_us_per_byte": 0.5, "date": "2026-11-25"}}
    assert runtime_costs_of(recorded) == RuntimeCosts(copy_us_per_byte=0.5)
    # what is shipped was measured: copies cost something
    assert shipped.copy_us_per_byte > 0
