"""A training iteration of a large model on a GPU cluster, priced from one shard's graph.

The shard's graph (one block, :mod:`.shard_costs`) gives each block's forward and backward on
one GPU; :mod:`.block_time` adds the block's tensor- and context-parallel collectives, its
recomputation and FSDP's gathers; this module places the blocks on pipeline stages and adds
what the stages and replicas exchange:

- the embedding's all-reduce over the tensor-parallel group;
- pipeline: the schedule replayed over the stages (:mod:`.schedule`), activations sent between
  stages (one tensor-parallel slice each over the network, then all-gathered over NVLink);
  with FSDP the weights are gathered every micro-batch without pipelining and once (first
  forward, last backward) with it, where they stay gathered between micro-batches;
- gradients without FSDP: all-reduced over the ranks holding the same weights (data- and
  context-parallel), or reduce-scattered with the distributed optimizer and ZeRO-1/2 and the
  updated weights all-gathered, bucket by bucket beside the last micro-batch's backward (and
  the gather beside the next forward), as DDP and Megatron-Core overlap them
  (:mod:`.overlap`);
- the optimizer step over the stage's (sharded) parameters.

The breakdown splits the iteration into compute, recomputation, exposed communication inside a
node (NVLink) and across nodes, the pipeline's bubble (with the sends between stages) and the
optimizer step; its parts add up to the iteration.
"""

import dataclasses
from typing import Any

from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.data.specs.strategy import ParallelPlan
from ddlsim.plans.feasibility import check_batch, check_fp8, check_ranks, check_stage_count
from ddlsim.plans.feasibility import check_sequence as check_cp_sequence
from ddlsim.simulator.gpu.block_time import DTYPE_BYTES, block_time, place_groups
from ddlsim.simulator.gpu.experts import (
    expert_layer_flops,
    expert_params_per_gpu,
    experts_gradient_sync,
    experts_optimizer_ms,
    experts_time,
)
from ddlsim.simulator.gpu.grad_sync import gradient_sync
from ddlsim.simulator.gpu.memory import GIB, MemoryEstimate, estimate_memory, layer_parts
from ddlsim.simulator.gpu.nccl import Group, NcclModel
from ddlsim.simulator.gpu.overlap import Exposed
from ddlsim.simulator.gpu.prediction import ModelDims, ScalePrediction
from ddlsim.simulator.gpu.roofline import GpuOpCosts
from ddlsim.simulator.gpu.schedule import StageTimes, analytic_pipeline_ms, replay_pipeline
from ddlsim.simulator.gpu.shard_costs import ShardCosts

# Above this many ops the schedule is priced in closed form (equal stages make them agree).
REPLAY_LIMIT_OPS = 200_000


def micro_batch_size(plan: ScalePlan, global_batch: int) -> int:
    """Sequences per micro-batch.

    Raises:
        InvalidStrategyError: when ``dp * micro_batches`` does not divide the global batch.
    """
    return check_batch(global_batch, plan.dp, plan.micro_batches)


def check_world_size(plan: ScalePlan, cluster: GpuClusterSpec) -> None:
    """Raises:
    InvalidStrategyError: when ``dp * tp * pp * cp`` is not the cluster's GPU count.
    """
    # The degrees alone (micro-batches enough for any schedule): the message is the ranks'.
    degrees = ParallelPlan(dp=plan.dp, tp=plan.tp, pp=plan.pp, cp=plan.cp, micro_batches=plan.pp)
    check_ranks(degrees, cluster.world_size)


def check_sequence(plan: ScalePlan, seq_len: int) -> None:
    """Raises:
    InvalidStrategyError: when context parallelism cannot split ``seq_len`` into ``2 cp``
        equal chunks (the load-balanced causal split).
    """
    check_cp_sequence(plan.cp, seq_len)


def check_layout(plan: ScalePlan, cluster: GpuClusterSpec, dims: ModelDims) -> None:
    """Refuse a plan the cluster or the model cannot take (the messages of
    :mod:`ddlsim.plans.feasibility`).

    Raises:
        InvalidStrategyError: naming the mismatch.
    """
    check_world_size(plan, cluster)
    if plan.pp > 1:
        check_stage_count(
            dims.label,
            pp=plan.pp,
            schedule=plan.pp_schedule,
            stages=plan.pp * plan.virtual_stages,
            blocks=dims.layers,
            where=dims.stack,
        )
    check_fp8(plan.precision, has_fp8="fp8" in cluster.gpu.peak_tflops, device=cluster.gpu.name)


@dataclasses.dataclass(frozen=True, slots=True)
class _Stages:
    """The blocks placed on the pipeline's stages: each (stage, chunk)'s forward and backward
    per micro-batch (``forward``, ``backward``; FSDP's gathers in every one without
    pipelining), the same with FSDP's once-an-iteration gathers (``once_f``, ``once_b``), the
    blocks a part holds, and each stage's parameters and blocks."""

    forward: list[list[float]]
    backward: list[list[float]]
    once_f: list[list[float]]
    once_b: list[list[float]]
    per_part: list[int]
    params: list[int]
    layers: list[int]

    @property
    def busiest(self) -> int:
        return max(
            range(len(self.forward)), key=lambda s: sum(self.forward[s]) + sum(self.backward[s])
        )


def _place_stages(
    costs: ShardCosts, plan: ScalePlan, dims: ModelDims, one: Any, embed_ms: float
) -> _Stages:
    p, v = plan.pp, plan.virtual_stages
    per_part = layer_parts(dims.layers, p * v)
    first_f = costs.first.forward_ms + embed_ms
    first_b = costs.first.backward_ms
    last_f, last_b = costs.last.forward_ms, costs.last.backward_ms

    def table(f_block: float, b_block: float) -> tuple[list[list[float]], list[list[float]]]:
        forward = [[0.0] * v for _ in range(p)]
        backward = [[0.0] * v for _ in range(p)]
        for part, count in enumerate(per_part):
            chunk, stage = divmod(part, p)
            forward[stage][chunk] = count * f_block
            backward[stage][chunk] = count * b_block
        forward[0][0] += first_f
        backward[0][0] += first_b
        forward[(p * v - 1) % p][v - 1] += last_f
        backward[(p * v - 1) % p][v - 1] += last_b
        return forward, backward

    # Without pipelining FSDP gathers every micro-batch; with it, once an iteration.
    every = (one.sharded_forward, one.sharded_backward) if p == 1 else (one.forward, one.backward)
    forward, backward = table(*every)
    once_f, once_b = table(one.sharded_forward, one.sharded_backward)
    params = [0] * p
    layers = [0] * p
    for part, count in enumerate(per_part):
        params[part % p] += count * costs.block.params
        layers[part % p] += count
    params[0] += costs.first.params
    params[(p * v - 1) % p] += costs.last.params
    return _Stages(forward, backward, once_f, once_b, per_part, params, layers)


def _pipeline_ms(
    plan: ScalePlan,
    stages: _Stages,
    nccl: NcclModel,
    groups: Any,
    act_bytes: float,
    *,
    replay: bool,
) -> float:
    """The pipeline's span: the schedule replayed over the stages, or in closed form beyond
    ``REPLAY_LIMIT_OPS``; activations sent between stages."""
    p, v, m = plan.pp, plan.virtual_stages, plan.micro_batches
    send_ms = 0.0
    if p > 1:
        send_group = Group(2, 1) if groups.pp_across_nodes else Group(2, 2)
        send_ms = nccl.time_us("sendrecv", act_bytes / plan.tp, send_group) / 1e3
        if plan.tp > 1 and not plan.sequence_parallel:
            send_ms += nccl.time_us("all_gather", act_bytes, groups.tp) / 1e3
    if replay and 2 * p * v * m <= REPLAY_LIMIT_OPS:
        times = StageTimes(
            forward_ms=stages.forward,
            backward_ms=stages.backward,
            first_forward_ms=stages.once_f,
            last_backward_ms=stages.once_b,
        )
        return max(replay_pipeline(plan.schedule_kind, times, micro_batches=m, send_ms=send_ms))
    stage_f = max(sum(row) for row in stages.forward)
    stage_b = max(sum(row) for row in stages.backward)
    pipeline_ms = analytic_pipeline_ms(
        plan.schedule_kind,
        stage_f,
        stage_b,
        stages=p,
        chunks=v,
        micro_batches=m,
        send_ms=send_ms,
    )
    once_f = max(sum(r) for r in stages.once_f)
    once_b = max(sum(r) for r in stages.once_b)
    return pipeline_ms + (once_f - stage_f + once_b - stage_b)


def _experts_step(
    plan: ScalePlan,
    nccl: NcclModel,
    op_costs: GpuOpCosts,
    stages: _Stages,
    *,
    held: float,
    gpus_per_node: int,
) -> tuple[Exposed, float]:
    """The busiest stage's routed experts (``held`` parameters on a GPU): their gradients'
    exposed reduction over the expert-data-parallel ranks, and their optimizer step."""
    busiest = stages.busiest
    exposed = experts_gradient_sync(
        plan,
        nccl,
        params=held,
        gpus_per_node=gpus_per_node,
        dtype_bytes=DTYPE_BYTES[plan.precision],
        last_backward_ms=sum(stages.backward[busiest]),
        first_forward_ms=sum(stages.forward[busiest]),
    )
    return exposed, experts_optimizer_ms(plan, op_costs, held)


def _optimizer_ms(plan: ScalePlan, op_costs: GpuOpCosts, stage_params: int) -> float:
    """The step over the busiest stage's parameters (sharded with FSDP, ZeRO or the
    distributed optimizer)."""
    shards = plan.dp * plan.cp
    sharded_step = plan.fsdp or plan.distributed_optimizer or plan.zero
    # Without FSDP the step also writes the 16-bit copy of the master weights (34 bytes a
    # parameter: 4 read and 2 written on top of AdamW's 28).
    optimizer_ms = op_costs.optimizer_ms(
        -(-stage_params // shards) if sharded_step else stage_params,
        bytes_per_param=28 if plan.fsdp else 34,
    )
    if plan.kernels == "transformer_engine" and plan.precision == "fp8":
        # Transformer Engine keeps fp8 copies of the weights (and their transposes), cast once an
        # iteration after the step: 2 bytes read for the scale, 2 read and 2 written to cast.
        optimizer_ms += op_costs.memory_ms("copy", 6 * stage_params)
    return optimizer_ms


def _flops(costs: ShardCosts, dims: ModelDims, plan: ScalePlan) -> tuple[float, float]:
    """The iteration's model FLOPs, and the FLOPs run (recomputation included). Model FLOPs as
    Megatron-LM and MFU count them: attention's backward twice its forward (the flash kernels'
    backward also recomputes the scores: 2.5 times, as captured), and a context-parallel
    rank's attention over the whole sequence: cp times the captured shard's."""
    block = costs.block
    attention_units = 3.5 if dims.fused_attention else 3.0
    attention_model = costs.attention_flops * 3.0 / attention_units
    block_model_flops = (
        block.forward_flops
        + block.backward_flops
        - costs.attention_flops
        + plan.cp * attention_model
    )
    edge_flops = sum(
        part.forward_flops + part.backward_flops for part in (costs.first, costs.last)
    )
    replicas = plan.dp * plan.cp * plan.micro_batches * plan.tp
    # The experts' captured FLOPs are the whole micro-batch's, not one tensor-parallel shard's.
    expert_flops = expert_layer_flops(costs.experts) / plan.tp
    model_flops = replicas * (dims.layers * (block_model_flops + expert_flops) + edge_flops)
    flops = model_flops
    if plan.recompute == "full":
        forward_flops = block.forward_flops + (plan.cp - 1) * attention_model / 3
        if costs.experts is not None:
            forward_flops += costs.experts.forward_flops / plan.tp
        flops += replicas * dims.layers * forward_flops
    return model_flops, flops


def _breakdown(
    costs: ShardCosts,
    plan: ScalePlan,
    stages: _Stages,
    *,
    one: Any,
    groups: Any,
    embed_ms: float,
    pipeline_ms: float,
) -> dict[str, float]:
    """Where the pipeline's span goes: the busiest stage's blocks, micro-batch by micro-batch
    (compute, recomputation, exposed communication in a node and across), then the rest
    (bubble, sends, FSDP's once-an-iteration gathers)."""
    p, v, m = plan.pp, plan.virtual_stages, plan.micro_batches
    busiest = stages.busiest
    layers_b = stages.layers[busiest]
    block_parts = (one.sharded_exposed if p == 1 else one.exposed).scaled(layers_b * m)
    edges = 0.0
    if busiest == 0:
        edges += costs.first.forward_ms + costs.first.backward_ms
    if busiest == (p * v - 1) % p:
        edges += costs.last.forward_ms + costs.last.backward_ms
    compute_ms = m * (layers_b * one.compute + edges)
    recompute_ms = m * layers_b * one.recompute
    embed = Exposed.at(groups.tp.nodes > 1, m * embed_ms if busiest == 0 else 0.0)
    comm = block_parts + embed
    dispatch = one.dispatch.scaled(layers_b * m)
    host = one.host * layers_b * m
    return {
        "compute": compute_ms,
        "recompute": recompute_ms,
        "node": comm.node - dispatch.node,
        "network": comm.network - dispatch.network,
        "dispatch": dispatch.total,
        "host": host,
        "bubble": max(0.0, pipeline_ms - compute_ms - recompute_ms - comm.total - host),
    }


def _breakdown_ms(
    parts: dict[str, float], dp_exposed: Exposed, optimizer_ms: float, *, experts: object
) -> dict[str, float]:
    """The iteration's parts, in the breakdown's order (a mixture of experts' two after)."""
    out = {
        "compute": parts["compute"],
        "recompute": parts["recompute"],
        "exposed_comm_node": parts["node"] + dp_exposed.node,
        "exposed_comm_network": parts["network"] + dp_exposed.network,
        "pipeline_bubble": parts["bubble"],
        "optimizer": optimizer_ms,
    }
    if experts is not None:
        # The dispatch and combine left exposed, and the host's pacing.
        out.update(expert_dispatch=parts["dispatch"], host_bound=parts["host"])
    return out


def _memory(
    costs: ShardCosts,
    dims: ModelDims,
    plan: ScalePlan,
    *,
    mbs: int,
    seq_len: int,
    stage_params: list[int],
    expert_params: list[float] | None = None,
) -> MemoryEstimate:
    """The busiest GPU's memory (:func:`.memory.estimate_memory`) for the model's dimensions."""
    return estimate_memory(
        costs,
        plan,
        layers=dims.layers,
        hidden=dims.hidden,
        heads=dims.heads,
        vocab=dims.vocab,
        fused_attention=dims.fused_attention,
        dropout=dims.dropout,
        kv_share=(dims.kv_heads or dims.heads) / dims.heads,
        mbs=mbs,
        seq_len=seq_len,
        stage_params=stage_params,
        expert_params=expert_params,
    )


def predict_scale(
    costs: ShardCosts,
    dims: ModelDims,
    plan: ScalePlan,
    cluster: GpuClusterSpec,
    *,
    global_batch: int,
    seq_len: int,
    op_costs: GpuOpCosts,
    replay: bool = True,
) -> ScalePrediction:
    """Price one iteration of ``plan`` on ``cluster``; ``costs`` are of one micro-batch of
    ``micro_batch_size(plan, global_batch)`` sequences of ``seq_len / cp`` tokens on one
    ``plan.tp`` shard.

    Raises:
        InvalidStrategyError: when the plan does not fit the cluster, the model or the batch.
    """
    check_layout(plan, cluster, dims)
    check_sequence(plan, seq_len)
    mbs = micro_batch_size(plan, global_batch)
    nccl = NcclModel(cluster)
    groups = place_groups(plan, cluster.gpus_per_node)
    dtype_bytes = DTYPE_BYTES[plan.precision]
    tokens = mbs * seq_len // plan.cp
    act_bytes = tokens * dims.hidden * dtype_bytes
    kv_bytes = 2 * tokens * dims.kv_hidden * dtype_bytes / plan.tp
    experts = (
        experts_time(costs.experts, plan, op_costs, nccl, gpus_per_node=cluster.gpus_per_node)
        if costs.experts is not None
        else None
    )
    one = block_time(
        costs, plan, nccl, groups, act_bytes=act_bytes, kv_bytes=kv_bytes, experts=experts
    )
    embed_ms = nccl.time_us("all_reduce", act_bytes, groups.tp) / 1e3 if plan.tp > 1 else 0.0
    stages = _place_stages(costs, plan, dims, one, embed_ms)
    pipeline_ms = _pipeline_ms(plan, stages, nccl, groups, act_bytes, replay=replay)
    busiest = stages.busiest
    dp_exposed = gradient_sync(
        plan,
        nccl,
        groups.grads,
        params=max(stages.params),
        dtype_bytes=dtype_bytes,
        last_backward_ms=sum(stages.backward[busiest]),
        first_forward_ms=sum(stages.forward[busiest]),
    )
    held = [n * expert_params_per_gpu(costs.experts, plan) for n in stages.layers]
    experts_exposed, experts_step = _experts_step(
        plan, nccl, op_costs, stages, held=held[busiest], gpus_per_node=cluster.gpus_per_node
    )
    dp_exposed += experts_exposed
    optimizer_ms = _optimizer_ms(plan, op_costs, max(stages.params)) + experts_step
    iteration_ms = pipeline_ms + dp_exposed.total + optimizer_ms
    memory = _memory(
        costs, dims, plan, mbs=mbs, seq_len=seq_len, stage_params=stages.params,
        expert_params=held,
    )  # fmt: skip
    model_flops, flops = _flops(costs, dims, plan)
    iteration_s = iteration_ms / 1e3
    world = cluster.world_size
    parts = _breakdown(
        costs, plan, stages, one=one, groups=groups, embed_ms=embed_ms, pipeline_ms=pipeline_ms
    )
    return ScalePrediction(
        iteration_s=iteration_s,
        tokens_per_s_per_gpu=global_batch * seq_len / iteration_s / world,
        tflops_per_gpu=flops / iteration_s / world / 1e12,
        model_tflops_per_gpu=model_flops / iteration_s / world / 1e12,
        mfu=model_flops / iteration_s / world / (cluster.gpu.peak_tflops["bf16"] * 1e12),
        memory=memory,
        fits=memory.total <= cluster.gpu.memory_gib * GIB,
        breakdown_ms=_breakdown_ms(parts, dp_exposed, optimizer_ms, experts=costs.experts),
        micro_batch_size=mbs,
    )
