"""Check a strategy against a model and a world size, and pick the trainer that applies it.

Everything here runs before any rank starts: a strategy that cannot run is refused with the bad
field named, and the bucket partition every rank applies is fixed once, from the captured graph
(gradients in the order they become ready).
"""

import difflib
from typing import Any

import torch

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.models import build_model
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Bucket, Strategy
from ddlsim.executor.context import RankContext, Trainer


def check_strategy(
    spec: ModelSpec, strategy: Strategy, world_size: int, graph: IterationGraph
) -> list[Bucket]:
    """The buckets every data-parallel rank launches; raises on anything that cannot run.

    Raises:
        InvalidStrategyError: ``dp * tp * pp != world_size``, a batch that does not split
            evenly, buckets that miss or repeat a gradient or name an unknown one, a tensor or
            pipeline plan for a model that has none, or a combination not supported.
    """
    plan = strategy.parallel
    plan.rank_batch_size(spec.inputs.batch_size, world_size)
    fusion = strategy.tensor_fusion
    buckets = fusion.assign(graph.gradient_sizes)
    if plan.grid:
        from ddlsim.data.grid import grid_layers

        grid_layers(spec, plan.grid_axes)
    elif plan.tp > 1:
        from ddlsim.data.tp_plans import check_layouts, check_tensor_parallel

        check_tensor_parallel(spec, plan.tp)
        if plan.per_layer:
            check_layouts(
                spec, plan, rank_batch=plan.rank_batch_size(spec.inputs.batch_size, world_size)
            )
    if plan.pp > 1:
        from ddlsim.executor.pipeline import check_pipeline, check_stage_layouts

        check_pipeline(spec, plan)
        check_stage_layouts(spec, plan, plan.resolve_dp(world_size))
    _check_compiled_blocks(spec, strategy)
    _check_gpu_grade(spec, strategy)
    if plan.fsdp and plan.fsdp_groups is not None:
        from ddlsim.executor.fsdp import check_groups

        with torch.device("meta"):
            check_groups(build_model(spec), [list(g) for g in plan.fsdp_groups])
    model_parallel = plan.tp > 1 or plan.pp > 1 or plan.fsdp or plan.distributed_optimizer
    hooks = fusion.buckets is not None or fusion.dear or fusion.implementation == "hooks"
    if model_parallel and hooks:
        raise InvalidStrategyError(
            "tensor_fusion.buckets, dear and implementation 'hooks' apply to pure data "
            f"parallelism; this plan has tp({plan.tp}), pp({plan.pp}), fsdp({plan.fsdp}), "
            f"distributed_optimizer({plan.distributed_optimizer})"
        )
    return buckets


def check_device(strategy: Strategy, device: str) -> None:
    """Refuse what the device cannot run, before any rank starts.

    Raises:
        InvalidStrategyError: fp8 without a GPU that has it; async tensor parallelism,
            context parallelism and ZeRO stages 1-2 (the simulator prices them; this executor
            does not run them).
    """
    from ddlsim.executor.precision import check_precision

    check_precision(strategy, device)
    if strategy.parallel.async_tp:
        raise InvalidStrategyError(
            "parallel.async_tp is priced by the simulator but not run by this executor (it "
            "needs torch.compile's micro-pipelined TP over CUDA symmetric memory); run the "
            "plan without it to measure the rest"
        )
    if strategy.kernels != "pytorch":
        raise InvalidStrategyError(
            f"kernels {strategy.kernels!r} is priced by the GPU-cluster simulator but not run by "
            "this executor, which runs PyTorch's kernels (kernels 'pytorch'; compile for fused "
            "blocks)"
        )
    plan = strategy.parallel
    if plan.cp > 1 or plan.zero:
        named = "parallel.cp" if plan.cp > 1 else "parallel.zero"
        raise InvalidStrategyError(
            f"{named} is priced by the GPU-cluster simulator but not run by this executor; "
            "parallel.distributed_optimizer runs sharded optimizer states, and the plan "
            "without context parallelism measures the rest"
        )


def _check_gpu_grade(spec: ModelSpec, strategy: Strategy) -> None:
    plan = strategy.parallel
    if plan.sequence_parallel:
        from ddlsim.data.tp_plans import check_sequence_parallel

        check_sequence_parallel(spec, plan.tp)
    if plan.distributed_optimizer:
        from ddlsim.executor.distributed_optimizer import check_distributed_optimizer

        check_distributed_optimizer(plan)
    if plan.recompute != "none" or strategy.compile:
        from ddlsim.data.stages import block_stack
        from ddlsim.executor.recompute import check_recompute

        with torch.device("meta"):
            model = build_model(spec)
        check_recompute(model, plan.recompute)
        if strategy.compile and block_stack(model) is None:
            raise InvalidStrategyError(
                f"compile compiles every repeated block; {spec.label} has no single stack of "
                "them (list blocks in op_fusion.compiled instead)"
            )


def model_supports(spec: ModelSpec, strategy: Strategy) -> bool:
    """Whether the model has what the strategy's plan needs (a tensor-parallel plan for its
    family, a stack of blocks to pipeline), whatever the world size and batch."""
    plan = strategy.parallel
    try:
        if plan.grid:
            from ddlsim.data.grid import grid_layers

            grid_layers(spec, plan.grid_axes)
        elif plan.tp > 1:
            from ddlsim.data.tp_plans import check_layouts, check_tensor_parallel

            check_tensor_parallel(spec, plan.tp)
            if plan.per_layer:
                check_layouts(spec, plan, rank_batch=None)  # no batch without a world size
        if plan.pp > 1:
            from ddlsim.executor.pipeline import check_pipeline

            check_pipeline(spec, plan)
            if "tp" in plan.stages:
                from ddlsim.data.tp_plans import check_tensor_parallel

                check_tensor_parallel(spec, 2)  # a family with a plan (the ranks come later)
    except InvalidStrategyError:
        return False
    return True


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
    if plan.fsdp:
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
        from ddlsim.data.stages import block_stack

        stack = block_stack(model)
        assert stack is not None  # check_strategy refused the others
        paths += [path for path in stack.blocks if path not in paths]
    for path in paths:
        module = model.get_submodule(path)
        module.forward = torch.compile(
            module.forward, backend=ctx.strategy.op_fusion.backend, dynamic=False
        )


def _check_compiled_blocks(spec: ModelSpec, strategy: Strategy) -> None:
    if not strategy.op_fusion.compiled:
        return
    with torch.device("meta"):
        model = build_model(spec)
    blocks = {name for name, _ in model.named_modules() if name}
    for index, path in enumerate(strategy.op_fusion.compiled):
        if path not in blocks:
            close = difflib.get_close_matches(path, sorted(blocks), n=3)
            hint = f"; did you mean {', '.join(close)}" if close else ""
            raise InvalidStrategyError(
                f"op_fusion.compiled[{index}] {path!r} is not a module of {spec.label}{hint}"
            )
