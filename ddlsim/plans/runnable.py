"""What this executor runs (on CPU ranks and on GPUs alike), beyond the rules of every
target (:mod:`.feasibility`): the plans the GPU-cluster simulator prices but the executor does
not run ("paper" plans), the combinations its trainers do not support, and what a model must
have for a plan (a stack of blocks to pipeline or recompute, an attention module, named
modules). Each rule raises ``InvalidStrategyError`` naming the field and what is allowed; the
executor, the command line, the REST service and the search reach them through
:func:`feasibility.refusals` only.
"""

import difflib
import functools
import json

import torch
from torch import nn

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.models import build_model
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import ParallelPlan, Strategy
from ddlsim.plans.stages import block_stack
from ddlsim.plans.tp_plans import check_layouts, check_sequence_parallel, check_tensor_parallel


@functools.lru_cache(maxsize=32)
def _meta_model(spec_json: str) -> nn.Module:
    with torch.device("meta"):
        return build_model(ModelSpec.from_dict(json.loads(spec_json)))


def meta_model(spec: ModelSpec) -> nn.Module:
    """The model on the meta device (no memory), cached by spec: read it, never train it."""
    return _meta_model(json.dumps(spec.to_dict(), sort_keys=True))


def check_paper_only(strategy: Strategy) -> None:
    """Refuse what the GPU-cluster simulator prices but this executor does not run.

    Raises:
        InvalidStrategyError: async tensor parallelism, kernels other than PyTorch's, context
            parallelism, ZeRO stages 1-2 or the distributed optimizer beside tensor or
            pipeline parallelism.
    """
    plan = strategy.parallel
    if plan.async_tp:
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
    if plan.cp > 1 and plan.cp_comm != "all_gather":
        raise InvalidStrategyError(
            f"parallel.cp_comm {plan.cp_comm!r} (keys and values passed around a ring beside "
            "attention) is priced by the GPU-cluster simulator but not run by this executor, "
            "which runs cp_comm 'all_gather'"
        )
    beside = {"tp": plan.tp > 1, "pp": plan.pp > 1, "ep": plan.ep > 1, "fsdp": plan.fsdp}
    beside |= {"distributed_optimizer": plan.distributed_optimizer, "zero": bool(plan.zero)}
    named = [key for key, used in beside.items() if used]
    if plan.cp > 1 and named:
        raise InvalidStrategyError(
            f"parallel.cp({plan.cp}) runs beside data parallelism in this executor; with "
            f"parallel.{', '.join(named)} it is priced by the simulator only"
        )
    if plan.zero and (plan.tp > 1 or plan.pp > 1 or plan.grid):
        raise InvalidStrategyError(
            f"parallel.zero({plan.zero}) runs beside data parallelism in this executor; with "
            f"tp({plan.tp}), pp({plan.pp}) or a grid it is priced by the simulator only"
        )
    check_distributed_optimizer(plan)


def check_expert_plan(plan: ParallelPlan) -> None:
    """What this executor runs of a mixture of experts: whole experts split over ``ep``
    data-parallel ranks (DDP or FSDP beside them), every token computed.

    Raises:
        InvalidStrategyError: ``etp`` > 1, a capacity factor, or ``ep`` beside tensor,
            pipeline or context parallelism or the distributed optimizer (priced only).
    """
    if plan.etp > 1:
        raise InvalidStrategyError(
            f"parallel.etp({plan.etp}) is priced by the simulator but not run by this executor, "
            "which keeps each expert whole on its expert-parallel rank (etp 1)"
        )
    if plan.capacity_factor is not None:
        raise InvalidStrategyError(
            f"parallel.capacity_factor({plan.capacity_factor:g}) drops tokens over an "
            "expert's capacity; this executor runs dropless experts (capacity_factor null)"
        )
    if plan.dispatcher == "flex":
        raise InvalidStrategyError(
            "parallel.dispatcher 'flex' (DeepEP's or HybridEP's GPU kernels) is priced by the "
            "simulator but not run by this executor; allowed here: all_to_all, all_gather"
        )
    if plan.ep_overlap:
        raise InvalidStrategyError(
            "parallel.ep_overlap (one micro-batch's dispatch beside another's compute, "
            "Megatron-Core's combined 1F1B) is priced by the simulator but not run by this "
            "executor, whose exchanges block"
        )
    beside = {
        "tp": plan.tp > 1,
        "pp": plan.pp > 1,
        "cp": plan.cp > 1,
        "distributed_optimizer": plan.distributed_optimizer,
        "zero": bool(plan.zero),
    }
    named = [key for key, used in beside.items() if used]
    if plan.ep > 1 and named:
        raise InvalidStrategyError(
            f"parallel.ep({plan.ep}) runs beside data parallelism and FSDP in this executor; "
            f"with parallel.{', '.join(named)} it is priced by the simulator only"
        )


def check_expert_buckets(strategy: Strategy) -> None:
    """Raises:
    InvalidStrategyError: expert parallelism with DeAR or explicit buckets (its gradients go
        through DDP, at the plan's bucket caps).
    """
    fusion = strategy.tensor_fusion
    if strategy.parallel.ep > 1 and not strategy.parallel.fsdp and not fusion.uses_ddp:
        raise InvalidStrategyError(
            f"parallel.ep({strategy.parallel.ep}) reduces the other gradients with DDP at the "
            "plan's bucket caps; tensor_fusion's dear or explicit buckets are not run beside it "
            "(set tensor_fusion.bucket_cap_mb instead)"
        )


def check_context_parallel(spec: ModelSpec, cp: int) -> None:
    """Raises:
    InvalidStrategyError: a model that is not a causal language model (the split shifts its
        labels over the whole sequence), or a sequence that does not cut into ``2 cp``
        chunks.
    """
    if not spec.cls.endswith("ForCausalLM"):
        raise InvalidStrategyError(
            f"parallel.cp({cp}) splits the sequences of a causal language model (a "
            f"...ForCausalLM class); {spec.label} is a {spec.cls}"
        )
    seq_len = spec.inputs.seq_len or 0
    if seq_len % (2 * cp):
        raise InvalidStrategyError(
            f"inputs.seq_len({seq_len}) does not cut into 2 * cp({cp}) = {2 * cp} equal chunks: "
            "each context-parallel rank holds an early and a late one"
        )


def check_scaled_precision(strategy: Strategy) -> None:
    """Raises:
    InvalidStrategyError: fp16 with a plan whose steps the gradient scaler does not drive
        (FSDP, the distributed optimizer, pipelines, tensor parallelism, grids, DeAR).
    """
    plan = strategy.parallel
    if strategy.precision != "fp16":
        return
    unscaled = {
        "parallel.fsdp": plan.fsdp,
        "parallel.distributed_optimizer": plan.distributed_optimizer,
        "parallel.pp > 1": plan.pp > 1,
        "parallel.tp > 1": plan.tp > 1,
        "parallel.grid": bool(plan.grid),
        "tensor_fusion.dear": strategy.tensor_fusion.dear,
    }
    named = [key for key, used in unscaled.items() if used]
    if named:
        raise InvalidStrategyError(
            f"precision 'fp16' needs a gradient scaler, which this executor applies to "
            f"DDP and bucket plans only; {', '.join(named)} runs bf16 or fp32"
        )


def check_runnable(spec: ModelSpec, strategy: Strategy, world_size: int) -> None:
    """Every rule of this executor for ``strategy`` on ``world_size`` ranks (the rules of every
    target first: :func:`feasibility.refusals`).

    Raises:
        InvalidStrategyError: the first rule broken, naming the field.
    """
    check_paper_only(strategy)
    check_scaled_precision(strategy)
    check_expert_plan(strategy.parallel)
    check_expert_buckets(strategy)
    plan = strategy.parallel
    if plan.cp > 1:
        check_context_parallel(spec, plan.cp)
    rank_batch = plan.rank_batch_size(spec.inputs.batch_size, world_size)
    check_plan_shape(spec, strategy, rank_batch=rank_batch)
    if plan.pp > 1:
        check_stage_layouts(spec, plan, plan.resolve_dp(world_size))
    check_compiled_blocks(spec, strategy)
    if plan.sequence_parallel:
        check_sequence_parallel(spec, plan.tp)
    if plan.recompute != "none" or strategy.compile:
        model = meta_model(spec)
        check_recompute(model, plan.recompute)
        if strategy.compile and block_stack(model) is None:
            raise InvalidStrategyError(
                f"compile compiles every repeated block; {spec.label} has no single stack of "
                "them (list blocks in op_fusion.compiled instead)"
            )
    if plan.fsdp and plan.fsdp_groups is not None:
        check_groups(meta_model(spec), [list(g) for g in plan.fsdp_groups])
    fusion = strategy.tensor_fusion
    model_parallel = (
        plan.tp > 1 or plan.pp > 1 or plan.fsdp or plan.distributed_optimizer or bool(plan.zero)
    )
    hooks = fusion.buckets is not None or fusion.dear or fusion.implementation == "hooks"
    if model_parallel and hooks:
        raise InvalidStrategyError(
            "tensor_fusion.buckets, dear and implementation 'hooks' apply to pure data "
            f"parallelism; this plan has tp({plan.tp}), pp({plan.pp}), fsdp({plan.fsdp}), "
            f"distributed_optimizer({plan.distributed_optimizer}), zero({plan.zero})"
        )


def check_plan_shape(spec: ModelSpec, strategy: Strategy, *, rank_batch: int | None) -> None:
    """Whether the model has what the plan needs (a tensor-parallel plan for its family and
    layouts, a grid's layers, a stack of blocks to pipeline), whatever the world size
    (``rank_batch`` ``None``) or for one micro-batch of ``rank_batch`` samples.

    Raises:
        InvalidStrategyError: naming what the model lacks.
    """
    plan = strategy.parallel
    if plan.grid:
        from ddlsim.plans.grid import grid_layers

        grid_layers(spec, plan.grid_axes)
    elif plan.tp > 1:
        check_tensor_parallel(spec, plan.tp)
        if plan.per_layer:
            check_layouts(spec, plan, rank_batch=rank_batch)
    if plan.pp > 1:
        check_pipeline(spec, plan)
        if "tp" in plan.stages and rank_batch is None:
            # The ranks come later (check_stage_layouts): a family with a plan suffices.
            check_tensor_parallel(spec, 2)


def check_compiled_blocks(spec: ModelSpec, strategy: Strategy) -> None:
    """Raises:
    InvalidStrategyError: an ``op_fusion.compiled`` path that is not a module of the model.
    """
    if not strategy.op_fusion.compiled:
        return
    blocks = {name for name, _ in meta_model(spec).named_modules() if name}
    for index, path in enumerate(strategy.op_fusion.compiled):
        if path not in blocks:
            close = difflib.get_close_matches(path, sorted(blocks), n=3)
            hint = f"; did you mean {', '.join(close)}" if close else ""
            raise InvalidStrategyError(
                f"op_fusion.compiled[{index}] {path!r} is not a module of {spec.label}{hint}"
            )


# Module classes known to pass more than the hidden state between blocks; refused.
_UNSUPPORTED_MODEL_TYPES = {"t5": "its blocks pass the relative position bias along the stack"}


def check_pipeline(spec: ModelSpec, plan: ParallelPlan) -> None:
    """Refuse a model or plan that the executor's pipelines cannot run (config and meta model
    only; the stage count is a rule of every target, :func:`feasibility.check_stages`).

    Raises:
        InvalidStrategyError: the model has no single stack of blocks or passes more than the
            hidden state between blocks; or the plan combines pipeline with tensor parallelism,
            or FSDP with more than one stage a rank.
    """
    if plan.tp > 1:
        raise InvalidStrategyError(
            f"parallel.pp({plan.pp}) combines with data parallelism and FSDP; tp({plan.tp}) "
            "with a pipeline is not supported"
        )
    if plan.fsdp and (plan.chunks > 1 or "tp" in plan.stages):
        raise InvalidStrategyError(
            f"parallel.fsdp with a pipeline needs one stage a rank, each data-parallel: "
            f"pp_schedule {plan.pp_schedule!r} with {plan.chunks} stages a rank and stages "
            f"{list(plan.stages) or 'batch'} are not supported with it (use 1f1b, gpipe or "
            "eager_1f1b without tp stages)"
        )
    model = meta_model(spec)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in _UNSUPPORTED_MODEL_TYPES:
        raise InvalidStrategyError(
            f"{spec.label} cannot be pipelined, so parallel.pp({plan.pp}) cannot apply: "
            f"{_UNSUPPORTED_MODEL_TYPES[model_type]}"
        )
    stack = block_stack(model)
    if stack is None:
        raise InvalidStrategyError(
            f"{spec.label} has no single stack of repeated blocks to cut into stages, so "
            f"parallel.pp({plan.pp}) cannot apply"
        )


def check_stage_layouts(spec: ModelSpec, plan: ParallelPlan, dp: int) -> None:
    """Refuse ``tp`` stages the model or the ranks cannot take.

    Raises:
        InvalidStrategyError: a ``tp`` stage with one rank a stage (``dp`` 1), or on a model
            without a tensor-parallel plan or whose heads ``dp`` does not divide.
    """
    if "tp" not in plan.stages:
        return
    if dp < 2:
        raise InvalidStrategyError(
            f"parallel.stages {list(plan.stages)} has a tp stage but each stage runs on dp({dp}) "
            "rank: a tensor-parallel stage needs dp >= 2 ranks to split over"
        )
    check_tensor_parallel(spec, dp)


def attention_module(block: nn.Module) -> nn.Module | None:
    """The block's self-attention module: the first submodule whose class is an attention."""
    for _, module in block.named_modules():
        if module is not block and "attention" in type(module).__name__.lower():
            return module
    return None


def check_recompute(model: nn.Module, mode: str) -> None:
    """Raises:
    InvalidStrategyError: recomputation asked for a model without a stack of blocks, or
        ``selective`` for blocks without an attention module.
    """
    if mode == "none":
        return
    stack = block_stack(model)
    if stack is None:
        raise InvalidStrategyError(
            f"parallel.recompute {mode!r} recomputes repeated blocks; {type(model).__name__} "
            "has no single stack of them"
        )
    if mode == "selective" and attention_module(model.get_submodule(stack.blocks[0])) is None:
        raise InvalidStrategyError(
            "parallel.recompute 'selective' recomputes the attention core; the blocks of "
            f"{type(model).__name__} have no attention module (use 'full' or 'selective_op')"
        )


def check_groups(model: nn.Module, groups: list[list[str]]) -> None:
    """Every path names a module, and no module is in two groups.

    Raises:
        InvalidStrategyError: naming the bad path.
    """
    modules = dict(model.named_modules())
    seen: set[str] = set()
    for index, group in enumerate(groups):
        for path in group:
            if path not in modules or not path:
                raise InvalidStrategyError(
                    f"parallel.fsdp_groups[{index}] names {path!r}, which is not a submodule"
                )
            if path in seen:
                raise InvalidStrategyError(
                    f"parallel.fsdp_groups[{index}] repeats {path!r}: a module shards once"
                )
            seen.add(path)


def check_distributed_optimizer(plan: ParallelPlan) -> None:
    """Raises:
    InvalidStrategyError: the distributed optimizer with tensor, pipeline or grid
        parallelism (this executor shards it over plain data parallelism).
    """
    if plan.distributed_optimizer and (plan.tp > 1 or plan.pp > 1):
        raise InvalidStrategyError(
            "parallel.distributed_optimizer runs over data parallelism alone in this executor; "
            f"this plan has tp({plan.tp}), pp({plan.pp}) (the GPU-cluster simulator prices it "
            "with both)"
        )
