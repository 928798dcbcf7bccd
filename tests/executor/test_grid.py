"""Tensor parallelism over a 3-D grid (executor/grid.py): losses match single-process training."""

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.data.zoo import ZOO
from ddlsim.executor.context import RankContext
from ddlsim.executor.grid import GridLinear, GridTrainer
from ddlsim.plans.grid import grid_families, grid_layers
from tests.executor.harness import Losses, assert_matches_reference, run_trainer

# Widths every grid of 4 ranks divides (llama-tiny's 4 heads, 2 key/value heads: cols <= 2).
SPECS: dict[str, ModelSpec] = {
    name: ZOO[name].with_inputs(batch_size=8, seq_len=16)
    for name in ("gpt2-tiny", "bert-tiny", "llama-tiny")
}


def _build(ctx: RankContext) -> GridTrainer:
    return GridTrainer(ctx, ctx.build_model())


def _run(spec: ModelSpec, world_size: int, parallel: dict[str, Any]) -> list[Losses]:
    return run_trainer(world_size, _build, spec, Strategy.from_dict({"parallel": parallel}))


@pytest.mark.parametrize(
    ("name", "grid", "overlap"),
    [
        ("gpt2-tiny", [2, 2, 1], True),  # 2-D
        ("gpt2-tiny", [2, 1, 2], False),  # 3-D without overlap
        ("llama-tiny", [1, 2, 2], True),  # 3-D with overlap
        ("bert-tiny", [2, 2, 1], False),  # 2-D without overlap
    ],
)
def test_grid_losses_match_single_process(name: str, grid: list[int], overlap: bool) -> None:
    spec = SPECS[name]
    results = _run(spec, 4, {"grid": grid, "grid_overlap": overlap})
    assert_matches_reference(results, spec)
    applied = results[0].applied
    assert applied["plan"] == "grid"
    assert applied["grid"] == dict(zip(("rows", "cols", "depth"), grid, strict=True))
    assert applied["overlap"] is overlap
    assert set(applied["styles"].values()) == {"colwise", "rowwise"}
    assert len(applied["styles"]) == len(grid_layers(spec, applied["grid"]))
    rows, cols, depth = grid
    assert ("all_reduce:rows" in applied["collectives"]) == (rows > 1)
    assert ("all_reduce:cols" in applied["collectives"]) == (cols > 1)
    assert ("reduce_scatter:depth" in applied["collectives"]) == (depth > 1)


def test_grid_with_data_parallelism_and_micro_batches_matches_single_process() -> None:
    spec = SPECS["gpt2-tiny"]
    results = _run(spec, 4, {"dp": 2, "grid": [1, 1, 2], "micro_batches": 2})
    assert_matches_reference(results, spec)
    assert results[0].applied["dp"] == 2
    assert results[0].applied["collectives"][-2:] == ["all_reduce:dp_depth", "all_reduce:dp"]


def _shards(ctx: RankContext) -> Losses:
    trainer = GridTrainer(ctx, ctx.build_model())
    sizes = {
        path: module.weight_shard.numel()
        for path, module in trainer.model.named_modules()
        if isinstance(module, GridLinear)
    }
    return Losses(losses=[], applied=sizes)


def test_each_rank_holds_one_shard_of_each_block() -> None:
    from tests.executor.harness import run_ranks

    spec = SPECS["llama-tiny"]
    strategy = Strategy.from_dict({"parallel": {"grid": [2, 1, 2]}})
    results = run_ranks(4, _shards, spec, strategy)
    layers = {layer.path: layer for layer in grid_layers(spec, strategy.parallel.grid_axes)}
    for result in results:
        assert set(result.applied) == set(layers)
        for path, numel in result.applied.items():
            layer = layers[path]
            assert numel == layer.in_features * layer.out_features // 4


def test_grid_plan_sets_tp_and_refuses_what_it_does_not_combine_with() -> None:
    plan = ParallelPlan(grid=(2, 1, 2))
    assert plan.tp == 4 and plan.label == "tp4 grid 2x1x2"
    assert Strategy(parallel=plan).kind == "grid"
    assert Strategy.from_dict(Strategy(parallel=plan).to_dict()) == Strategy(parallel=plan)
    assert "grid" not in Strategy().to_dict()["parallel"]
    with pytest.raises(InvalidStrategyError, match=r"= 4 != tp\(2\)"):
        ParallelPlan(tp=2, grid=(2, 1, 2))
    with pytest.raises(InvalidStrategyError, match="combines with data parallelism only"):
        ParallelPlan(grid=(1, 2, 1), pp=2, micro_batches=2)
    with pytest.raises(InvalidStrategyError, match=r"\[rows, cols, depth\] of 3"):
        ParallelPlan(grid=(2, 2))
    with pytest.raises(InvalidStrategyError, match="splits nothing"):
        ParallelPlan(grid=(1, 1, 1))
    with pytest.raises(InvalidStrategyError, match="depth"):
        ParallelPlan(grid=(1, 1, 4)).rank_batch_size(batch_size=4, world_size=8)


def test_indivisible_grids_are_refused_naming_the_value() -> None:
    spec = SPECS["llama-tiny"]
    with pytest.raises(InvalidStrategyError, match=r"num_key_value_heads\(2\).*cols\(4\)"):
        grid_layers(spec, {"rows": 1, "cols": 4, "depth": 1})
    odd = dataclasses.replace(spec, config={**spec.config, "intermediate_size": 197})
    with pytest.raises(InvalidStrategyError, match=r"intermediate_size\(197\).*cols\(2\)"):
        grid_layers(odd, {"rows": 1, "cols": 2, "depth": 1})
    with pytest.raises(InvalidStrategyError, match=r"features, not divisible by the grid's rows"):
        grid_layers(spec, {"rows": 3, "cols": 1, "depth": 1})
    with pytest.raises(InvalidStrategyError, match="cannot be split over a grid"):
        grid_layers(ZOO["t5-tiny"], {"rows": 2, "cols": 1, "depth": 1})
    assert "t5" not in grid_families() and "gpt2" in grid_families()


def test_grid_linear_block_is_the_right_slice() -> None:
    # One rank's view: the block a colwise layer multiplies (no process group needed for
    # axes of size 1 except the slice itself).
    from ddlsim.executor.grid import GridAxes, _Pending

    linear = nn.Linear(6, 4)
    axes = GridAxes(
        rows=2, cols=2, depth=1, row=1, col=0, depth_index=0,
        row_group=None, col_group=None, depth_group=None,
    )  # fmt: skip
    layer = GridLinear(linear, "colwise", axes, overlap=False, pending=_Pending())
    torch.testing.assert_close(layer.weight_shard.view(2, 3), linear.weight[0:2, 3:6])
    assert layer.bias is not None
    torch.testing.assert_close(layer.bias, linear.bias[0:2])
    row = GridLinear(linear, "rowwise", axes, overlap=False, pending=_Pending())
    torch.testing.assert_close(row.weight_shard.view(2, 3), linear.weight[2:4, 0:3])
