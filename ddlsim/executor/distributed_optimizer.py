"""Megatron-LM's distributed optimizer over the data-parallel ranks.

Every rank keeps the whole model for its forward and backward, as with DDP. After backward the
gradients are laid out in one flat buffer (padded to a multiple of ``dp``) and reduce-scattered:
rank ``r`` receives the mean of slice ``r`` only. Its optimizer holds that slice's fp32 master
weights and their optimizer states (Adam's two moments), a ``1 / dp`` share of what DDP keeps on
every rank, and steps it; the updated slices are then all-gathered into the flat buffer and
copied back into the model's parameters. AdamW and SGD are elementwise, so stepping one flat
slice computes exactly what stepping the parameters one by one does.

The gradients' reduce-scatter and the parameters' all-gather move what one all-reduce moves.
Megatron-LM overlaps both with computation (bucket by bucket); here they run after backward
and after the step, which is what the iteration's graph and the simulator price.
"""

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddlsim.executor.context import RankContext, SynchronousTrainer, split_batch
from ddlsim.plans.runnable import check_distributed_optimizer


class DistributedOptimizerTrainer(SynchronousTrainer):
    """The model whole on every rank; optimizer states and master weights in ``dp`` shards."""

    def __init__(self, ctx: RankContext, model: nn.Module) -> None:
        check_distributed_optimizer(ctx.strategy.parallel)
        self.ctx = ctx
        self.model = model
        self.group = ctx.mesh["dp"].get_group() if ctx.mesh is not None else None
        self.params = [p for p in model.parameters() if p.requires_grad]
        total = sum(p.numel() for p in self.params)
        self.shard = math.ceil(total / ctx.dp)
        padded = self.shard * ctx.dp
        self.flat_grads = torch.zeros(padded, device=ctx.device)
        self.flat_params = torch.zeros(padded, device=ctx.device)
        with torch.no_grad():
            torch.cat(
                [p.detach().reshape(-1).float() for p in self.params], out=self.flat_params[:total]
            )
        begin = ctx.dp_rank * self.shard
        self.master = nn.Parameter(self.flat_params[begin : begin + self.shard].clone())
        self.shard_grads = torch.zeros_like(self.master)
        self.master.grad = self.shard_grads
        self.optimizer = ctx.make_optimizer([self.master])
        self.batches = split_batch(ctx.dp_slice(), ctx.strategy.parallel.micro_batches)
        self.total = total

    def step(self) -> torch.Tensor:
        for param in self.params:
            param.grad = None
        total = torch.zeros((), device=self.ctx.device)
        for batch in self.batches:
            loss = self.ctx.loss(self.model, batch) / len(self.batches)
            self.ctx.backward(loss)
            total += loss.detach()
        with torch.no_grad():
            offset = 0
            for param in self.params:
                size = param.numel()
                target = self.flat_grads[offset : offset + size]
                if param.grad is None:
                    target.zero_()
                else:
                    target.copy_(param.grad.reshape(-1))
                offset += size
            dist.reduce_scatter_tensor(self.shard_grads, self.flat_grads, group=self.group)
            self.shard_grads.div_(self.ctx.dp)
            self.master.grad = self.shard_grads
        self.ctx.step(self.optimizer)
        with torch.no_grad():
            dist.all_gather_into_tensor(self.flat_params, self.master.detach(), group=self.group)
            offset = 0
            for param in self.params:
                size = param.numel()
                param.copy_(self.flat_params[offset : offset + size].view_as(param))
                offset += size
        return total / self.ctx.dp

    def applied(self) -> dict[str, Any]:
        return {
            "plan": "distributed_optimizer",
            "dp": self.ctx.dp,
            "shard_elements": self.shard,
            "buckets": [],
            "collectives": ["reduce_scatter", "all_gather"],
        }
