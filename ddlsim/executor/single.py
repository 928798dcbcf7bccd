"""Plain single-process training on the whole global batch: the reference every plan matches."""

from typing import Any

import torch
from torch import nn

from ddlsim.executor.context import RankContext, SynchronousTrainer, local_loss, split_batch


class SingleTrainer(SynchronousTrainer):
    """One process, no communication; micro-batches accumulate gradients."""

    def __init__(self, ctx: RankContext, model: nn.Module) -> None:
        self.model = model
        self.device = ctx.device
        self.batches = split_batch(ctx.global_batch, ctx.strategy.parallel.micro_batches)
        self.optimizer = ctx.make_optimizer(model.parameters())

    def step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for batch in self.batches:
            loss = local_loss(self.model, batch) / len(self.batches)
            loss.backward()
            total += loss.detach()
        self.optimizer.step()
        return total

    def applied(self) -> dict[str, Any]:
        return {"plan": "single", "buckets": [], "collectives": []}
