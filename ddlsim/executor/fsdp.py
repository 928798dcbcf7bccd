"""FSDP2: parameters sharded over the data-parallel ranks with ``fully_shard``.

Each group of ``parallel.fsdp_groups`` (module paths) becomes one ``fully_shard`` call, so its
parameters are all-gathered before its forward and its gradients reduce-scattered after its
backward together; without groups every element of the model's repeated blocks (each entry of an
``nn.ModuleList``, as torchtitan shards transformer blocks) is a group. The root module gets the
remaining parameters (embeddings, heads). ``parallel.zero`` 2 runs here too, as PyTorch-native
code runs ZeRO-2: the same groups, their weights kept gathered from forward to backward
(``reshard_after_forward=False``), gradients reduce-scattered and optimizer states sharded.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

from ddlsim.executor.context import RankContext, SynchronousTrainer, split_batch
from ddlsim.plans.runnable import check_groups
from ddlsim.plans.stages import default_groups


def fsdp_backward(
    ctx: RankContext, root: nn.Module, batches: Sequence[Mapping[str, Any]]
) -> torch.Tensor:
    """Forward and backward of every micro-batch of an FSDP2 ``root``: gradients of all but
    the last accumulate unsharded, unsynchronised. Returns the micro-batches' mean loss,
    detached."""
    assert isinstance(root, FSDPModule)
    total = torch.zeros((), device=ctx.device)
    for index, batch in enumerate(batches):
        root.set_requires_gradient_sync(index == len(batches) - 1)
        loss = ctx.loss(root, batch) / len(batches)
        ctx.backward(loss)
        total += loss.detach()
    return total


class FSDPTrainer(SynchronousTrainer):
    """``fully_shard`` per group, then the root, over ``ctx.mesh["dp"]``."""

    def __init__(self, ctx: RankContext, model: nn.Module) -> None:
        plan = ctx.strategy.parallel
        groups = (
            [list(g) for g in plan.fsdp_groups]
            if plan.fsdp_groups is not None
            else default_groups(model)
        )
        check_groups(model, groups)
        mesh = ctx.mesh["dp"]
        policy = ctx.precision.fsdp_policy()
        # ZeRO-2: weights kept gathered from forward to backward (no second all-gather),
        # gradients reduce-scattered, optimizer states sharded.
        reshard = plan.zero != 2
        for group in groups:
            fully_shard(
                [model.get_submodule(path) for path in group],
                mesh=mesh,
                mp_policy=policy,
                reshard_after_forward=reshard,
            )
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        self.ctx = ctx
        self.groups = groups
        self.model = model
        self.batches = split_batch(ctx.dp_slice(), plan.micro_batches)
        self.optimizer = ctx.make_optimizer(model.parameters())

    def step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        total = fsdp_backward(self.ctx, self.model, self.batches)
        self.ctx.step(self.optimizer)
        return total / self.ctx.dp

    def applied(self) -> dict[str, Any]:
        return {
            "plan": "zero2" if self.ctx.strategy.parallel.zero == 2 else "fsdp",
            "dp": self.ctx.dp,
            "groups": self.groups,
            "buckets": [],
            "collectives": ["all_gather", "reduce_scatter"],
        }
