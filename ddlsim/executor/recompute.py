"""Activation recomputation per repeated block (``parallel.recompute``), with
``torch.utils.checkpoint`` (non-reentrant), applied to the block's bound ``forward`` so that
module and parameter names stay as they are (FSDP groups, buckets and tensor-parallel plans
address them).

- ``full``: the whole block's forward runs again before its backward; only its inputs are kept.
- ``selective`` (Megatron-LM's): inside the block's attention module, the outputs of the
  projections (matrix multiplications) and of collectives are kept and the attention core
  (scores, softmax, their product with the values) is recomputed.
- ``selective_op`` (torchtitan's op-level policy): over the whole block, the outputs of every
  other matrix multiplication, of the attention kernels and of collectives are kept; the rest
  is recomputed.
"""

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from ddlsim.plans.runnable import attention_module, check_recompute
from ddlsim.plans.stages import block_stack

_aten = torch.ops.aten
_MATMULS = {_aten.mm.default, _aten.addmm.default}
_ATTENTION = {
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_cudnn_attention.default,
}


def _is_collective(op: Any) -> bool:
    return getattr(op, "namespace", "") == "_c10d_functional"


def _projection_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    if op in _MATMULS or _is_collective(op):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _every_other_matmul_policy() -> Callable[..., CheckpointPolicy]:
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if op in _ATTENTION or _is_collective(op):
            return CheckpointPolicy.MUST_SAVE
        if op in _MATMULS:
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] += 1
            # The same matmuls must be chosen when recomputing as when first run.
            if counts[key] % 2 == 1:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _checkpointed(forward: Callable[..., Any], contexts: Callable[[], Any] | None) -> Any:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if contexts is None:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=contexts, **kwargs)

    return run


def apply_recompute(model: nn.Module, mode: str) -> list[str]:
    """Checkpoint every block of ``model`` as ``mode`` says, in place; the module paths whose
    ``forward`` is now checkpointed.

    Raises:
        InvalidStrategyError: as :func:`check_recompute`.
    """
    check_recompute(model, mode)
    if mode == "none":
        return []
    stack = block_stack(model)
    assert stack is not None
    done = []
    for path in stack.blocks:
        block = model.get_submodule(path)
        target, target_path = block, path
        contexts: Callable[[], Any] | None = None
        if mode == "selective":
            target = attention_module(block)  # type: ignore[assignment]
            target_path = next(p for p, m in model.named_modules() if m is target)
            contexts = functools.partial(create_selective_checkpoint_contexts, _projection_policy)
        elif mode == "selective_op":

            def contexts() -> Any:
                return create_selective_checkpoint_contexts(_every_other_matmul_policy())

        target.forward = _checkpointed(target.forward, contexts)
        done.append(target_path)
    return done
