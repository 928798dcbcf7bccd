"""Pipeline parallelism with ``torch.distributed.pipelining`` (GPipe, 1F1B, eager 1F1B,
interleaved 1F1B).

A model is cut into stages along its one stack of repeated blocks (the outermost
``nn.ModuleList``, such as GPT-2's ``transformer.h``; for a model without one, its longest
``nn.Sequential``). The cut points balance the blocks' forward FLOPs (counted with
``FlopCounterMode`` on one micro-batch at start-up), each stage keeping at least one block.

Stage modules are not rewritten models: each stage keeps the whole model but only its own
blocks, and runs the model's own forward. The first stage runs it from the inputs and stops
after its last block; a later stage receives the previous stage's activation, which replaces the
hidden state entering its first block, and either stops after its last block or, on the last
stage, runs on through the head to the model's own loss. This keeps every family's masks,
rotary embeddings and heads exactly as the model computes them, at the price of a later stage
recomputing the model's prefix before its blocks (embedding lookups and masks, whose output it
discards: no gradient flows through it). Models whose blocks pass more than the hidden state
from one block to the next (T5's position bias) or that have two stacks (encoder and decoder)
are refused.

Parameters outside the blocks exist on every stage. A parameter used on more than one stage (an
input embedding tied to the LM head) gets gradients on each, which are summed over the pipeline
group after backward, as Megatron-LM sums its tied embeddings; the others are used on one stage
only and need no communication. With ``dp > 1`` every stage is replicated over its
data-parallel group, whose gradients are averaged in one flat all-reduce.

Every rank holds the whole global batch (see ``RankContext``), so only the first stage is fed
by the schedule, with micro-batch indices: later stages take the same micro-batch's inputs
(labels, token ids for masks) from their own copy, in the order the schedule runs its forwards,
and the last stage checks that order against the index the schedule hands its loss function.
"""

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining.schedules import (
    _Action,
    _ComputationType,
    _PipelineScheduleRuntime,
)
from torch.distributed.tensor import DTensor

from ddlsim.data.specs.strategy import ParallelPlan
from ddlsim.executor.context import (
    RankContext,
    SynchronousTrainer,
    average_over_group,
    split_batch,
)
from ddlsim.executor.pipeline_stage import StageModule, inner_block, probe_blocks
from ddlsim.plans.runnable import check_pipeline, check_stage_layouts
from ddlsim.plans.stages import (
    BlockStack,
    balanced_cuts,
    block_stack,
    stage_count,
    stage_order,
)
from ddlsim.plans.tp_plans import block_paths, tp_plan


class _OneStageOrder(_PipelineScheduleRuntime):
    """A one-stage-a-rank schedule run in :func:`plans.stages.stage_order`'s order (eager 1F1B)
    on ``torch.distributed.pipelining``'s runtime, which adds the sends and receives: a
    forward's activation is sent as soon as it is computed and waited on only by its
    receiver."""

    def __init__(self, stage: PipelineStage, micro_batches: int, schedule: str, loss_fn: Any):
        super().__init__([stage], micro_batches, loss_fn=loss_fn, scale_grads=False)
        stages = stage.num_stages
        kinds = {"F": _ComputationType.FORWARD, "B": _ComputationType.FULL_BACKWARD}
        self._prepare_schedule_with_comms(
            {
                rank: [
                    _Action(rank, kinds[kind], m)
                    for kind, m in stage_order(schedule, rank, stages, micro_batches)
                ]
                for rank in range(stages)
            }
        )


class PipelineTrainer(SynchronousTrainer):
    """This rank's stages of the pipeline, run by the plan's schedule.

    ``step`` returns, on the last stage, the mean micro-batch loss divided by ``dp``, and zero
    on the other stages, so that the sum over ranks is the global-batch loss.
    """

    def __init__(self, ctx: RankContext, model: nn.Module) -> None:
        plan = ctx.strategy.parallel
        check_pipeline(ctx.spec, plan)
        stack = block_stack(model)
        assert stack is not None  # check_pipeline refused the others
        self.ctx = ctx
        self.stack = stack
        self.micro_batches = plan.micro_batches
        batches = split_batch(ctx.dp_slice(), plan.micro_batches)
        flops, hidden = probe_blocks(model, stack, batches[0])
        stages = stage_count(plan)
        self.spans = balanced_cuts(flops, stages)
        self.stage_flops = [sum(flops[a:b]) for a, b in self.spans]
        indices = [ctx.pp_rank + k * ctx.pp for k in range(stages // ctx.pp)]
        self.pp_group = ctx.mesh["pp"].get_group()
        self.dp_group = ctx.mesh["dp"].get_group() if ctx.dp > 1 else None
        self.layouts = plan.stages or ("batch",) * stages
        self.split_modules: list[str] = []
        tensor_stage = self.layouts[indices[0]] == "tp"
        if tensor_stage:
            # The stage runs every data-parallel rank's micro-batch, split tensor-parallel.
            check_stage_layouts(ctx.spec, plan, ctx.dp)
            batches = _joined_micro_batches(ctx, plan.micro_batches)
            self._split_stage(model, stack, self.spans[indices[0]])
        self.modules = [
            StageModule(model, stack, span=self.spans[i], index=i, stages=stages, batches=batches)
            for i in indices
        ]
        if tensor_stage and self.layouts[indices[0] + 1] == "batch":
            self.modules[0].share = (self.dp_group, ctx.dp, ctx.mesh["dp"].get_local_rank())
        # Blocks of other stages are dropped with the full stack (the model keeps this one).
        parent, _, attribute = stack.path.rpartition(".")
        setattr(
            model.get_submodule(parent) if parent else model, attribute, self.modules[0].blocks
        )
        self.fsdp = plan.fsdp
        if plan.fsdp:
            self._shard_stage(model)
        self.stages: list[Any] = []
        for module in self.modules:
            start, end = module.span
            received = hidden[start - 1].clone().requires_grad_(True) if start else None
            first_input = torch.zeros(1, dtype=torch.long, device=ctx.device)
            output = (
                torch.zeros((), device=ctx.device, requires_grad=True)
                if module.last
                else hidden[end - 1].clone().requires_grad_(True)
            )
            self.stages.append(
                PipelineStage(
                    module,
                    module.index,
                    stages,
                    ctx.device,
                    input_args=first_input if module.first else received,
                    output_args=output,
                    group=self.pp_group,
                )
            )
        self.schedule = self._schedule(plan.pp_schedule)
        # Parameters outside the blocks (shared by this rank's stages) and each stage's blocks.
        block_ids = {id(p) for m in self.modules for p in m.blocks.parameters()}
        self.shared = [
            (name, p) for name, p in _all_named_parameters(model) if id(p) not in block_ids
        ]
        self.shared = [(n, p) for n, p in self.shared if not _in_stack(n, stack)]
        params = [p for _, p in self.shared]
        params += [p for m in self.modules for p in m.blocks.parameters()]
        self.params = list({id(p): p for p in params}.values())
        self.optimizer = ctx.make_optimizer(self.params)
        self.tied: list[str] | None = None
        self.last_rank = any(m.last for m in self.modules)

    def _shard_stage(self, model: nn.Module) -> None:
        """FSDP over the stage's data-parallel ranks, as the frameworks run it beside a pipeline
        (ZeRO-2 style): each block a ``fully_shard`` group, the rest of the model the root's;
        nothing resharded after a forward, so the weights stay gathered through every
        micro-batch of the step, and the pipeline schedule reduce-scatters the gradients once,
        after the last micro-batch's backward (``torch.distributed.pipelining`` runs FSDP's
        post-backward then)."""
        module = self.modules[0]
        # The stage's forward runs the whole model: its parameters are the stage's to shard.
        module.add_module("whole", model)
        mesh = self.ctx.mesh["dp"]
        policy = self.ctx.precision.fsdp_policy()
        for block in module.blocks:
            # A stage's last block stops the forward with an exception after it ran: shard the
            # block inside it, whose forward returns.
            fully_shard(
                inner_block(block), mesh=mesh, mp_policy=policy, reshard_after_forward=False
            )
        fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=False)

    def _split_stage(self, model: nn.Module, stack: BlockStack, span: tuple[int, int]) -> None:
        """Split this rank's stage's blocks over the stage's ranks (``ctx.mesh["dp"]``), as a
        tensor-parallel plan splits its blocks; everything else stays whole."""
        from ddlsim.executor.tensor_parallel import apply_tensor_parallel

        plan = tp_plan(self.ctx.spec)  # check_stage_layouts refused models without one
        mine = set(stack.blocks[span[0] : span[1]])
        paths = block_paths(plan, (n for n, _ in model.named_modules() if n))
        placed = ParallelPlan(
            tp=self.ctx.dp,
            layers=tuple("tp" if path in mine else "replicate" for path in paths),
            vocab="replicate",
        )
        self.split_modules = sorted(
            apply_tensor_parallel(model, plan, self.ctx.mesh["dp"], self.ctx.dp, placed)
        )

    def _schedule(self, name: str) -> Any:
        n = self.micro_batches

        def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            last = self.modules[-1]
            index = int(target.reshape(-1)[0])
            used = last.order[len(self.losses_seen)]
            self.losses_seen.append(index)
            if used != index:
                raise RuntimeError(
                    f"the last stage ran micro-batch {used} where the schedule computes the "
                    f"loss of micro-batch {index}"
                )
            return output / n

        self.losses_seen: list[int] = []
        if name == "gpipe":
            return ScheduleGPipe(self.stages[0], n, loss_fn=loss_fn, scale_grads=False)
        if name == "1f1b":
            return Schedule1F1B(self.stages[0], n, loss_fn=loss_fn, scale_grads=False)
        if name == "eager_1f1b":
            return _OneStageOrder(self.stages[0], n, name, loss_fn)
        return ScheduleInterleaved1F1B(self.stages, n, loss_fn=loss_fn, scale_grads=False)

    def step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        for module in self.modules:
            module.order.clear()
        self.losses_seen.clear()
        indices = torch.arange(self.micro_batches, device=self.ctx.device)
        losses: list[torch.Tensor] = []
        # The strategy's precision: every stage's forward under autocast (weights stay fp32,
        # the hidden states between stages come out of residual additions in fp32).
        with self.ctx.precision.autocast():
            if self.modules[0].first:
                self.schedule.step(indices, target=indices, losses=losses, return_outputs=False)
            else:
                self.schedule.step(target=indices, losses=losses, return_outputs=False)
        for module in self.modules:
            if module.order != list(range(self.micro_batches)):
                raise RuntimeError(
                    f"stage {module.index} ran micro-batches {module.order}; expected "
                    f"0..{self.micro_batches - 1} in order"
                )
        self._sum_tied_gradients()
        if self.dp_group is not None:
            self._average_gradients_over_dp()
        self.optimizer.step()
        if self.last_rank:
            return torch.stack([loss.detach() for loss in losses]).sum() / self.ctx.dp
        return torch.zeros((), device=self.ctx.device)

    @torch.no_grad()
    def _sum_tied_gradients(self) -> None:
        """Sum over the pipeline group the gradients of parameters used on several stages."""
        if self.tied is None:
            # Which shared parameters got gradients on more than one stage (decided once).
            used = torch.tensor(
                [float(p.grad is not None) for _, p in self.shared], device=self.ctx.device
            )
            dist.all_reduce(used, group=self.pp_group)
            self.tied = [
                name for (name, _), n in zip(self.shared, used.tolist(), strict=True) if n > 1
            ]
        tied = [p for name, p in self.shared if name in self.tied]
        if not tied:
            return
        # Under FSDP the gradients are this rank's shards, the same shard on every stage.
        grads = [_local(p.grad) if p.grad is not None else _local(p).new_zeros(()) for p in tied]
        grads = [
            g if g.dim() else torch.zeros_like(_local(p)) for g, p in zip(grads, tied, strict=True)
        ]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.pp_group)
        offset = 0
        for param, grad in zip(tied, grads, strict=True):
            summed = flat[offset : offset + grad.numel()].view_as(grad).clone()
            if param.grad is None:
                param.grad = (
                    DTensor.from_local(summed, param.device_mesh, param.placements)
                    if isinstance(param, DTensor)
                    else summed
                )
            elif isinstance(param.grad, DTensor):
                param.grad.to_local().copy_(summed)
            else:
                param.grad = summed
            offset += grad.numel()

    def _average_gradients_over_dp(self) -> None:
        # A tp stage's split parameters are shards, not replicas: never averaged.
        grads = [p.grad for p in self.params if p.grad is not None and not isinstance(p, DTensor)]
        average_over_group(grads, self.dp_group, self.ctx.dp)

    def applied(self) -> dict[str, Any]:
        collectives = ["send/recv:pp"]
        if self.tied:
            collectives.append("all_reduce:pp")
        if self.fsdp:
            collectives += ["all_gather:dp", "reduce_scatter:dp"]
        elif self.dp_group is not None:
            collectives.append("all_reduce:dp")
        if "tp" in self.layouts:
            collectives += ["all_reduce:stage", "all_gather:stage"]
        return {
            "plan": "pipeline",
            "stage_layouts": list(self.layouts),
            "split_modules": self.split_modules,
            "pp": self.ctx.pp,
            "dp": self.ctx.dp,
            **({"fsdp": True} if self.fsdp else {}),
            "schedule": self.ctx.strategy.parallel.pp_schedule,
            "micro_batches": self.micro_batches,
            "stack": self.stack.path,
            "stages": [
                {
                    "stage": i,
                    "rank_in_pp": i % self.ctx.pp,
                    "blocks": list(self.stack.blocks[a:b]),
                    "forward_flops": int(self.stage_flops[i]),
                }
                for i, (a, b) in enumerate(self.spans)
            ],
            "tied": list(self.tied or []),
            "buckets": [],
            "collectives": collectives,
        }


def _joined_micro_batches(ctx: RankContext, micro_batches: int) -> list[dict[str, torch.Tensor]]:
    """Micro-batch ``k`` of every data-parallel rank, joined in rank order: what a tp stage
    computes, so that sample share ``j`` of its output is rank ``j``'s micro-batch ``k``."""
    per_rank = [split_batch(part, micro_batches) for part in split_batch(ctx.global_batch, ctx.dp)]
    return [
        {key: torch.cat([rank[k][key] for rank in per_rank]) for key in per_rank[0][k]}
        for k in range(micro_batches)
    ]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _all_named_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return list(model.named_parameters(remove_duplicate=True))


def _in_stack(name: str, stack: BlockStack) -> bool:
    return name.startswith(f"{stack.path}.")
