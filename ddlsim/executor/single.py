"""Plain single-process training on the whole global batch: the reference every plan matches."""

from typing import Any

import torch
from torch import nn

from ddlsim.executor.context import RankContext, SynchronousTrainer, split_batch


class SingleTrainer(SynchronousTrainer):
    """One process, no communication; micro-batches accumulate gradients."""

    def __init__(self, ctx: RankContext, model: nn.Module) -> None:
        self.ctx = ctx
        self.model = model
        self.device = ctx.device
        self.batches = split_batch(ctx.global_batch, ctx.strategy.parallel.micro_batches)
        self.optimizer = ctx.make_optimizer(model.parameters())

    def step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for batch in self.batches:
            loss = self.ctx.loss(self.model, batch) / len(self.batches)
            self.ctx.backward(loss)
            total += loss.detach()
        self.ctx.step(self.optimizer)
        return total

    def applied(self) -> dict[str, Any]:
        return {"plan": "single", "buckets": [], "collectives": []}
