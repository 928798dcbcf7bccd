"""Model surgery that tensor-parallel plans need around DTensor's split
(``executor/tensor_parallel.py`` applies them).

Before the split: GPT-2's ``Conv1D`` projections become ``nn.Linear`` and its fused ``c_attn``
rows are interleaved rank by rank (:func:`conv1d_to_linear`); a derived plan's fused
``[q | k | v]`` / ``[gate | up]`` projections are reordered alike (:func:`reorder_fused`).
After it, under a derived plan: row-parallel outputs get storage of their own
(:func:`own_storage`), and the parameters that split attention modules keep whole (a norm of
one head shared by every head) get each backward's gradient summed over the tensor-parallel
ranks (:func:`sum_head_shared_gradients`).
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from ddlsim.plans.tp_plans import TensorParallelPlan, matches


def conv1d_to_linear(
    model: nn.Module, tp: int, split: Callable[[str], bool] = lambda path: True
) -> None:
    """Replace every transformers ``Conv1D`` by an equal ``nn.Linear``; interleave fused QKV
    in the modules that ``split`` says are split.

    ``Conv1D(nf, nx)`` computes ``x @ W + b`` with ``W: [nx, nf]``; ``nn.Linear(nx, nf)`` with
    weight ``W.T`` computes the same. For ``attn.c_attn`` (output ``[q | k | v]``, each ``nf/3``
    wide) the output rows are reordered so that rank ``r``'s contiguous column shard holds
    ``[q_r | k_r | v_r]``.
    """
    from transformers.pytorch_utils import Conv1D

    for path, module in list(model.named_modules()):
        if not isinstance(module, Conv1D):
            continue
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        weight = module.weight.detach().t()
        bias = module.bias.detach()
        fused = isinstance(getattr(parent, "split_size", None), int)
        if name == "c_attn" and fused and split(path):
            order = interleaved_qkv_rows(weight.shape[0], tp)
            weight, bias = weight[order], bias[order]
        linear = nn.Linear(module.nx, module.nf, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(weight)
            linear.bias.copy_(bias)
        setattr(parent, name, linear)


def interleaved_qkv_rows(rows: int, tp: int) -> torch.Tensor:
    """Row order ``[q_0 k_0 v_0 | q_1 k_1 v_1 | ...]`` of a fused ``[q | k | v]`` projection."""
    return interleaved_rows((rows // 3,) * 3, tp)


def interleaved_rows(widths: tuple[int, ...], tp: int) -> torch.Tensor:
    """Row order ``[a_0 b_0 ... | a_1 b_1 ... | ...]`` of a projection whose output is the parts
    ``[a | b | ...]`` of ``widths`` rows: rank ``r``'s ``1 / tp`` of every part, rank by rank."""
    starts = [sum(widths[:index]) for index in range(len(widths))]
    order = [
        start + rank * (width // tp) + i
        for rank in range(tp)
        for start, width in zip(starts, widths, strict=True)
        for i in range(width // tp)
    ]
    return torch.tensor(order)


def reorder_fused(
    model: nn.Module, plan: TensorParallelPlan, tp: int, split: Callable[[str], bool]
) -> None:
    """Reorder the output rows (weight and bias) of the split modules that ``plan.fused`` lists
    so that each rank's contiguous column shard holds its slice of every part."""
    for path, module in model.named_modules():
        parts = next((p for pattern, p in plan.fused.items() if matches(pattern, path)), None)
        if parts is None or not split(path) or not isinstance(module, nn.Linear):
            continue
        order = interleaved_rows(parts, tp).to(module.weight.device)
        with torch.no_grad():
            module.weight.copy_(module.weight[order])
            if module.bias is not None:
                module.bias.copy_(module.bias[order])


# Model surgery a family needs before its plan applies (see the module docstring): the model,
# ``tp``, and which module paths are split.
PREPARE: dict[str, Callable[[nn.Module, int, Callable[[str], bool]], None]] = {
    "gpt2": conv1d_to_linear
}


def own_storage(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    """A forward hook: the module's output copied out of the view DTensor hands back."""
    return output.clone()


def head_shared_parameters(
    model: nn.Module, plan: TensorParallelPlan, split: Callable[[str], bool]
) -> list[nn.Parameter]:
    """Parameters that split attention modules keep whole (norms of one head shared by every
    head, as Qwen3's ``q_norm``): each rank's gradient of them covers its own heads only."""
    found: dict[int, nn.Parameter] = {}
    for path, module in model.named_modules():
        if path and split(path) and matches(plan.attention, path):
            for param in module.parameters():
                if param.requires_grad and not isinstance(param, DTensor):
                    found[id(param)] = param
    return list(found.values())


def sum_head_shared_gradients(
    model: nn.Module, plan: TensorParallelPlan, mesh: Any, split: Callable[[str], bool]
) -> None:
    """Sum over the tensor-parallel ranks each backward's gradient of the parameters that split
    attention modules keep whole, as it arrives (before accumulation, so that micro-batches
    add whole gradients)."""
    group = mesh.get_group()

    def summed(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad, group=group)
        return grad

    for param in head_shared_parameters(model, plan, split):
        param.register_hook(summed)
