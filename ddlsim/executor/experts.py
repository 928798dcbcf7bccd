"""Expert parallelism on ``torch.distributed``: each rank keeps ``num_experts / ep`` of every
layer's routed experts and exchanges tokens with the other ranks of its expert-parallel group.

The ``dp`` data-parallel ranks fold into ``edp`` groups of ``ep`` consecutive ranks (the
expert-parallel groups); rank ``j`` of a group holds experts ``[j L, (j + 1) L)``, ``L =
num_experts / ep``, and the ranks holding the same experts form an expert-data-parallel group.
A layer's forward, by ``parallel.dispatcher``:

- ``all_to_all``: each token's copies sorted by expert, so by the rank holding it; the counts a
  rank sends each expert exchanged first, then the tokens with an uneven all-to-all; the
  received tokens regrouped by local expert, run (:func:`ddlsim.data.moe.run_experts`), put
  back in arrival order and returned by the reverse all-to-all, then weighted and summed onto
  their tokens. The all-to-all's backward is the reverse exchange.
- ``all_gather``: the group's tokens and routing gathered on every rank; each runs its own
  experts' share of every token copy, and the partial outputs are reduce-scattered back to the
  ranks the tokens came from.

Gradients: the router, attention and every other replicated parameter are averaged over the
data-parallel ranks by DDP (the experts' parameters are kept out of it); an expert's gradient
on a rank sums what every token it served contributed, so it is summed over the
expert-data-parallel group and divided by ``dp``, which is the global batch's mean gradient.
"""

import dataclasses
import functools
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddlsim.cluster import groups as process_groups
from ddlsim.data.moe import combine, experts_modules, run_experts
from ddlsim.executor.autograd_collectives import AllGather, ReduceScatter, gather_rows
from ddlsim.executor.context import (
    RankContext,
    SynchronousTrainer,
    average_over_group,
    split_batch,
)
from ddlsim.executor.data_parallel import ddp_backward, ddp_options
from ddlsim.executor.fsdp import fsdp_backward
from ddlsim.plans.stages import default_groups


@dataclasses.dataclass(frozen=True)
class ExpertGroups:
    """This rank's place among the experts: its expert-parallel group (``ep`` ranks, this one
    ``ep_rank``), and its expert-data-parallel group (``edp`` ranks; ``None`` when alone)."""

    ep: int
    ep_rank: int
    ep_group: Any
    edp: int
    edp_group: Any


def expert_groups(dp_ranks: list[int], rank: int, ep: int) -> ExpertGroups:
    """The groups of ``dp_ranks`` (global ranks, in data-parallel order) for ``ep``; every rank
    of the job makes every group, in the same order."""
    edp = len(dp_ranks) // ep
    position = dp_ranks.index(rank)
    ep_groups = [process_groups.subgroup(dp_ranks[g * ep : (g + 1) * ep]) for g in range(edp)]
    edp_groups = [process_groups.subgroup(dp_ranks[j::ep]) for j in range(ep)] if edp > 1 else []
    return ExpertGroups(
        ep=ep,
        ep_rank=position % ep,
        ep_group=ep_groups[position // ep],
        edp=edp,
        edp_group=edp_groups[position % ep] if edp_groups else None,
    )


def shard_experts(model: nn.Module, groups: ExpertGroups, dispatcher: str) -> list[str]:
    """Keep this rank's experts of every layer of ``model`` and route its tokens through the
    group (in place); the names of the experts' parameters."""
    names = []
    found: dict[str, Any] = experts_modules(model)
    for path, module in found.items():
        experts = int(module.num_experts)
        local = experts // groups.ep
        first = groups.ep_rank * local
        for name, param in list(module.named_parameters(recurse=False)):
            if param.dim() >= 2 and param.shape[0] == experts:
                kept = nn.Parameter(param.detach()[first : first + local].clone())
                kept.requires_grad_(param.requires_grad)
                setattr(module, name, kept)
                names.append(f"{path}.{name}")
        forward = _all_to_all_forward if dispatcher == "all_to_all" else _all_gather_forward
        module.forward = functools.partial(forward, module, groups, first, local)
    return names


def _all_to_all_forward(  # noqa: PLR0917 (bound by functools.partial)
    module: Any,
    groups: ExpertGroups,
    first: int,
    local: int,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """Shapes: hidden_states ``[T, hidden]``; top_k_index, top_k_weights ``[T, k]``."""
    ep, group = groups.ep, groups.ep_group
    top_k = top_k_index.shape[-1]
    pair_expert = top_k_index.reshape(-1)
    order = torch.argsort(pair_expert, stable=True)
    token_of = order // top_k
    counts = torch.bincount(pair_expert, minlength=local * ep)
    received_counts = torch.empty_like(counts)
    dist.all_to_all_single(received_counts, counts, group=group)
    by_source = received_counts.view(ep, local)  # [source rank, local expert]
    sent = counts.view(ep, local).sum(1).tolist()
    arrived = by_source.sum(1).tolist()
    tokens = hidden_states[token_of]
    received = dist_fn.all_to_all_single(
        tokens.new_empty((sum(arrived), tokens.shape[-1])), tokens, arrived, sent, group=group
    )
    # Arrival order is by source, then by expert: regroup by expert to run them.
    local_ids = torch.arange(local, device=counts.device).repeat(ep)
    expert_of = torch.repeat_interleave(local_ids, by_source.reshape(-1))
    regroup = torch.argsort(expert_of, stable=True)
    out = run_experts(module, received[regroup], expert_of[regroup], by_source.sum(0))
    back = torch.empty_like(out).index_copy(0, regroup, out)
    returned = dist_fn.all_to_all_single(
        back.new_empty((sum(sent), back.shape[-1])), back, sent, arrived, group=group
    )
    return combine(returned, top_k_weights.reshape(-1)[order], token_of, hidden_states)


def _all_gather_forward(  # noqa: PLR0917 (bound by functools.partial)
    module: Any,
    groups: ExpertGroups,
    first: int,
    local: int,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """Shapes: hidden_states ``[T, hidden]``; top_k_index, top_k_weights ``[T, k]`` (every
    rank of the group the same ``T``: equal micro-batches)."""
    group = groups.ep_group
    every = AllGather.apply(hidden_states, group)  # [ep T, hidden]
    indices = gather_rows(top_k_index, group)
    weights = AllGather.apply(top_k_weights, group)
    top_k = indices.shape[-1]
    pair_expert = indices.reshape(-1)
    mine = ((pair_expert >= first) & (pair_expert < first + local)).nonzero().squeeze(-1)
    local_expert = pair_expert[mine] - first
    order = torch.argsort(local_expert, stable=True)
    chosen = mine[order]
    token_of = chosen // top_k
    counts = torch.bincount(local_expert, minlength=local)
    out = run_experts(module, every[token_of], local_expert[order], counts)
    partial = combine(out, weights.reshape(-1)[chosen], token_of, every)
    return ReduceScatter.apply(partial, group)


@torch.no_grad()
def reduce_expert_grads(params: list[nn.Parameter], groups: ExpertGroups, dp: int) -> None:
    """Each expert parameter's gradient as the global batch's mean: summed over the ranks that
    hold the same experts, over ``dp`` (a parameter no token reached gets a zero gradient)."""
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    grads = [p.grad for p in params if p.grad is not None]
    if groups.edp_group is not None:
        average_over_group(grads, groups.edp_group, dp)
    else:
        for grad in grads:
            grad.div_(dp)


def _applied(parallel: Any, experts: ExpertGroups, **extra: Any) -> dict[str, Any]:
    """What an expert-parallel trainer ran: the experts' groups, the dispatcher, ``extra``."""
    return {"ep": experts.ep, "edp": experts.edp, "dispatcher": parallel.dispatcher, **extra}


class ExpertParallelTrainer(SynchronousTrainer):
    """Experts split over ``parallel.ep`` of the data-parallel ranks (the dispatcher the plan
    names), the rest of the model under ``DistributedDataParallel`` with the strategy's
    bucket caps; micro-batches accumulate as DDP's trainer does."""

    def __init__(self, ctx: RankContext, model: nn.Module) -> None:
        plan = ctx.strategy.parallel
        self.ctx = ctx
        self.batches = split_batch(ctx.dp_slice(), plan.micro_batches)
        group = ctx.mesh["dp"].get_group() if ctx.mesh is not None else None
        ranks = dist.get_process_group_ranks(group) if group is not None else [ctx.rank]
        self.groups = expert_groups(ranks, dist.get_rank(), plan.ep)
        names = shard_experts(model, self.groups, plan.dispatcher)
        params = dict(model.named_parameters())
        self.expert_params = [params[name] for name in names if params[name].requires_grad]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
        self.model = DistributedDataParallel(model, **ddp_options(ctx))
        self.optimizer = ctx.make_optimizer(self.model.parameters())

    def step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        total = ddp_backward(self.ctx, self.model, self.batches)
        reduce_expert_grads(self.expert_params, self.groups, self.ctx.dp)
        self.ctx.step(self.optimizer)
        return total / self.ctx.dp

    def applied(self) -> dict[str, Any]:
        plan = self.ctx.strategy.parallel
        return _applied(
            plan, self.groups, plan="expert_parallel", collectives=["all_reduce", plan.dispatcher]
        )


class ExpertFSDPTrainer(SynchronousTrainer):
    """Experts split over ``parallel.ep`` as :class:`ExpertParallelTrainer` splits them, the
    model's blocks and root sharded with FSDP2 over the data-parallel ranks. Each layer's
    experts are sharded over their expert-data-parallel group (their own ``fully_shard``, its
    reduce-scatter's mean over the group scaled by ``edp / dp``: the sum over ``dp``); where
    every rank holds experts of its own (``ep == dp``) they stay whole, left out of FSDP, their
    gradients divided by ``dp``."""

    def __init__(self, ctx: RankContext, model: nn.Module) -> None:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        plan = ctx.strategy.parallel
        self.ctx = ctx
        self.batches = split_batch(ctx.dp_slice(), plan.micro_batches)
        mesh = ctx.mesh["dp"] if ctx.mesh is not None else None
        assert mesh is not None  # one rank trains alone (SingleTrainer)
        self.groups = expert_groups(
            dist.get_process_group_ranks(mesh.get_group()), dist.get_rank(), plan.ep
        )
        names = shard_experts(model, self.groups, plan.dispatcher)
        policy = ctx.precision.fsdp_policy()
        params = dict(model.named_parameters())
        ignored: set[nn.Parameter] = set()
        experts = [params[name] for name in names if params[name].requires_grad]
        self.whole: list[nn.Parameter] = []
        self.sharded: list[nn.Parameter] = []
        if self.groups.edp_group is None:
            ignored = {params[name] for name in names}
            self.whole = experts
        else:
            # FSDP averages over the group it shards on: scaled after backward (gloo has no
            # pre-multiplied sum to divide by dp in the reduce-scatter itself).
            self.sharded = experts
            edp_mesh = DeviceMesh.from_group(self.groups.edp_group, ctx.device.type)
            for module in experts_modules(model).values():
                fully_shard(module, mesh=edp_mesh, mp_policy=policy)
        self.fsdp_groups = default_groups(model)
        for group in self.fsdp_groups:
            fully_shard(
                [model.get_submodule(path) for path in group],
                mesh=mesh,
                mp_policy=policy,
                ignored_params=ignored or None,
            )
        fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params=ignored or None)
        self.model = model
        self.optimizer = ctx.make_optimizer(model.parameters())

    def step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        total = fsdp_backward(self.ctx, self.model, self.batches)
        reduce_expert_grads(self.whole, self.groups, self.ctx.dp)
        with torch.no_grad():
            for param in self.sharded:
                if param.grad is not None:
                    param.grad.mul_(self.groups.edp / self.ctx.dp)
        self.ctx.step(self.optimizer)
        return total / self.ctx.dp

    def applied(self) -> dict[str, Any]:
        plan = self.ctx.strategy.parallel
        collectives = ["all_gather", "reduce_scatter", plan.dispatcher]
        return _applied(
            plan,
            self.groups,
            plan="expert_parallel_fsdp",
            groups=self.fsdp_groups,
            collectives=collectives,
        )
