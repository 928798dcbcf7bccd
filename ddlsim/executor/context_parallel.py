"""Context parallelism, the all-gather variant (Llama 3's): ``cp`` ranks split every sequence,
each gathers the whole sequence's keys and values before attention.

The split is load-balanced for causal attention: a sequence is cut into ``2 cp`` chunks and
rank ``r`` of the group holds chunks ``r`` and ``2 cp - 1 - r`` (an early and a late one, so
every rank attends to about as many keys). A rank runs its tokens with their global positions
(rotary embeddings see where each token is); in each attention it gathers the group's keys and
values (the all-gather's backward reduce-scatters their gradients) and masks each query to the
keys at or before its position. The labels are shifted over the whole sequence before the
split, so a chunk predicts the token after it even where that token is another rank's; each
rank's loss is its tokens' summed loss over the replica's token count, so the group's losses
add up to the replica's mean.

Gradients: every parameter is replicated over the ``dp x cp`` ranks; DDP averages over them,
and a rank's loss is scaled by ``cp`` before its backward, so the average is the global batch's
mean gradient.
"""

import functools
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddlsim.executor.autograd_collectives import AllGather
from ddlsim.executor.context import RankContext, SynchronousTrainer, split_batch
from ddlsim.executor.data_parallel import ddp_backward

ATTENTION_IMPLEMENTATION = "ddlsim_context_parallel"
IGNORE_INDEX = -100


def chunk_positions(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """The global positions of ``cp_rank``'s tokens: chunks ``cp_rank`` and ``2 cp - 1 -
    cp_rank`` of ``2 cp``, in that order."""
    chunk = seq_len // (2 * cp)
    early = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    late_start = (2 * cp - 1 - cp_rank) * chunk
    return torch.cat([early, torch.arange(late_start, late_start + chunk)])


def _gather_sequence(states: torch.Tensor, group: Any) -> torch.Tensor:
    """``[batch, heads, local, dim]`` states of the group, ``[batch, heads, cp x local, dim]``
    in rank order."""
    gathered = AllGather.apply(states.movedim(2, 0).contiguous(), group)
    return gathered.movedim(0, 2)


def _attention(  # noqa: PLR0917 (transformers' attention interface)
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    *,
    group: Any,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention of this rank's queries over the group's keys and values. Shapes:
    query ``[batch, heads, local, dim]``; key and value ``[batch, kv_heads, local, dim]``;
    returns ``[batch, local, heads, dim]``."""
    keys = _gather_sequence(key, group)
    values = _gather_sequence(value, group)
    repeat = query.shape[1] // keys.shape[1]
    if repeat > 1:
        keys = keys.repeat_interleave(repeat, dim=1)
        values = values.repeat_interleave(repeat, dim=1)
    visible = key_positions.unsqueeze(0) <= query_positions.unsqueeze(1)
    out = nn.functional.scaled_dot_product_attention(
        query, keys, values, attn_mask=visible, dropout_p=dropout, scale=scaling
    )
    return out.transpose(1, 2).contiguous(), None


class ContextParallelTrainer(SynchronousTrainer):
    """Each sequence split over ``parallel.cp`` ranks, the ``dp x cp`` ranks' gradients
    averaged by DDP; micro-batches accumulate as DDP's trainer does."""

    def __init__(self, ctx: RankContext, model: nn.Module) -> None:
        from transformers import AttentionInterface

        plan = ctx.strategy.parallel
        assert ctx.mesh is not None  # one rank trains alone (SingleTrainer)
        self.ctx = ctx
        self.cp = plan.cp
        group = ctx.mesh["cp"].get_group()
        seq_len = int(ctx.global_batch["input_ids"].shape[1])
        self.positions = chunk_positions(seq_len, plan.cp, ctx.cp_rank).to(ctx.device)
        every = [chunk_positions(seq_len, plan.cp, r) for r in range(plan.cp)]
        attention = functools.partial(
            _attention,
            group=group,
            query_positions=self.positions,
            key_positions=torch.cat(every).to(ctx.device),
        )
        AttentionInterface.register(ATTENTION_IMPLEMENTATION, attention)
        config: Any = model.config
        config._attn_implementation = ATTENTION_IMPLEMENTATION
        self.batches = [self._local(b) for b in split_batch(ctx.dp_slice(), plan.micro_batches)]
        replicas = ctx.mesh["dp", "cp"]._flatten().get_group()
        self.model = DistributedDataParallel(model, process_group=replicas)
        self.optimizer = ctx.make_optimizer(self.model.parameters())

    def _local(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """This rank's chunks of ``batch``: its tokens, their positions, the labels shifted over
        the whole sequence, and the replica's count of labelled tokens."""
        ids = batch["input_ids"]
        labels = batch["labels"]
        shifted = nn.functional.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
        mine = self.positions
        return {
            "input_ids": ids[:, mine],
            "position_ids": mine.unsqueeze(0).expand(ids.shape[0], -1),
            "labels": labels[:, mine],
            "shift_labels": shifted[:, mine].contiguous(),
            "num_items_in_batch": (shifted != IGNORE_INDEX).sum(),
        }

    def step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        total = ddp_backward(self.ctx, self.model, self.batches, scale=self.cp)
        self.ctx.step(self.optimizer)
        return total / self.ctx.dp

    def applied(self) -> dict[str, Any]:
        return {
            "plan": "context_parallel",
            "cp": self.cp,
            "cp_comm": "all_gather",
            "positions": self.positions.tolist(),
            "collectives": ["all_gather", "all_reduce"],
        }
