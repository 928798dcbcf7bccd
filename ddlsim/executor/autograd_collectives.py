"""Collectives that autograd differentiates, along dim 0 of equal-shaped tensors: an
all-gather whose backward reduce-scatters, and a reduce-scatter whose backward all-gathers
(gloo runs both; its reduce-scatter is an all-reduce in disguise)."""

from typing import Any

import torch
import torch.distributed as dist


class AllGather(torch.autograd.Function):
    """The group's tensors stacked along dim 0 (every rank's the same shape); the backward
    reduce-scatters the gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return gather_rows(tensor, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        size = dist.get_world_size(ctx.group)
        shard = grad.new_empty((grad.shape[0] // size, *grad.shape[1:]))
        dist.reduce_scatter_tensor(shard, grad.contiguous(), group=ctx.group)
        return shard, None


def gather_rows(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """The group's tensors stacked along dim 0, without autograd."""
    size = dist.get_world_size(group)
    out = tensor.new_empty((size * tensor.shape[0], *tensor.shape[1:]))
    dist.all_gather_into_tensor(out, tensor.contiguous(), group=group)
    return out


class ReduceScatter(torch.autograd.Function):
    """The group's sum of a ``[size T, ...]`` tensor, this rank's ``T`` rows; the backward
    all-gathers the gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        size = dist.get_world_size(group)
        shard = tensor.new_empty((tensor.shape[0] // size, *tensor.shape[1:]))
        dist.reduce_scatter_tensor(shard, tensor.contiguous(), group=group)
        return shard

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        size = dist.get_world_size(ctx.group)
        out = grad.new_empty((size * grad.shape[0], *grad.shape[1:]))
        dist.all_gather_into_tensor(out, grad.contiguous(), group=ctx.group)
        return out, None
