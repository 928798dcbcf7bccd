"""Pick the trainer that applies a strategy on a rank. Whether the strategy can run was
answered before any rank started (:func:`ddlsim.plans.feasibility.check`), and the bucket
partition every rank applies was fixed once, from the captured graph (gradients in the order
they become ready)."""

from typing import Any

import torch

from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Bucket, Strategy
from ddlsim.executor.context import RankContext, Trainer
from ddlsim.executor.precision import check_fp8_library, device_target
from ddlsim.plans.feasibility import check


def check_strategy(
    spec: ModelSpec,
    strategy: Strategy,
    world_size: int,
    graph: IterationGraph,
    *,
    device: str = "cpu",
) -> list[Bucket]:
    """The buckets every data-parallel rank launches, after the one feasibility check for this
    machine's ``device`` (:func:`ddlsim.plans.feasibility.check`).

    Raises:
        InvalidStrategyError: what :func:`ddlsim.plans.feasibility.refusals` refuses, or
            buckets that miss or repeat a gradient or name an unknown one.
    """
    check(spec, strategy, device_target(world_size, device))
    check_fp8_library(strategy)
    return strategy.tensor_fusion.assign(graph.gradient_sizes)


def build_trainer(ctx: RankContext, buckets: list[Bucket]) -> Trainer:
    """The trainer for ``ctx.strategy`` on this rank (the model is built here)."""
    plan = ctx.strategy.parallel
    model = ctx.build_model()
    if ctx.strategy.precision == "fp8":
        from ddlsim.executor.precision import to_fp8

        to_fp8(model)
    if plan.recompute != "none":
        from ddlsim.executor.recompute import apply_recompute

        apply_recompute(model, plan.recompute)
    _compile_blocks(ctx, model)
    if ctx.world_size == 1:
        from ddlsim.executor.single import SingleTrainer

        return SingleTrainer(ctx, model)
    if plan.pp > 1:
        from ddlsim.executor.pipeline import PipelineTrainer

        return PipelineTrainer(ctx, model)
    if plan.grid:
        from ddlsim.executor.grid import GridTrainer

        return GridTrainer(ctx, model)
    if plan.tp > 1:
        from ddlsim.executor.tensor_parallel import TensorParallelTrainer

        return TensorParallelTrainer(ctx, model)
    if plan.cp > 1:
        from ddlsim.executor.context_parallel import ContextParallelTrainer

        return ContextParallelTrainer(ctx, model)
    if plan.ep > 1:
        from ddlsim.executor.experts import ExpertFSDPTrainer, ExpertParallelTrainer

        if plan.fsdp:
            return ExpertFSDPTrainer(ctx, model)
        return ExpertParallelTrainer(ctx, model)
    if plan.fsdp or plan.zero == 2:
        from ddlsim.executor.fsdp import FSDPTrainer

        return FSDPTrainer(ctx, model)
    if plan.distributed_optimizer:
        from ddlsim.executor.distributed_optimizer import DistributedOptimizerTrainer

        return DistributedOptimizerTrainer(ctx, model)
    from ddlsim.executor.data_parallel import BucketTrainer, DDPTrainer

    if ctx.strategy.tensor_fusion.uses_ddp:
        return DDPTrainer(ctx, model)
    return BucketTrainer(ctx, model, buckets)


def _compile_blocks(ctx: RankContext, model: Any) -> None:
    """``torch.compile`` each chosen block's ``forward``, in place.

    The bound ``forward`` is compiled rather than the module (``Module.compile`` compiles
    ``_call_impl``, which dynamo skips for ``torch.nn``'s own modules such as ``nn.Linear``, so
    they would run eager; ``torch.compile(module)`` would rename every parameter under
    ``_orig_mod``). Module hooks stay outside the compiled region. Shapes are static: blocks of
    one class at several shapes (ConvNeXt's stages) would otherwise make dynamo recompile with
    dynamic shapes, which inductor (torch 2.13) fails to lower for ConvNeXt ("cannot determine
    truth value of Relational"); each shape gets a graph of its own instead.
    """
    paths = list(ctx.strategy.op_fusion.compiled)
    if ctx.strategy.compile:
        from ddlsim.plans.stages import block_stack

        stack = block_stack(model)
        assert stack is not None  # check_strategy refused the others
        paths += [path for path in stack.blocks if path not in paths]
    for path in paths:
        module = model.get_submodule(path)
        module.forward = torch.compile(
            module.forward, backend=ctx.strategy.op_fusion.backend, dynamic=False
        )
