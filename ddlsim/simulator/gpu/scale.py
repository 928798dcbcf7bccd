"""A training iteration of a large model on a GPU cluster, priced from one shard's graph.

The shard's graph (one block, :mod:`.shard_costs`) gives each block's forward and backward on
one GPU; the plan places the blocks on pipeline stages and adds what the GPUs exchange:

- tensor parallelism: two all-reduces of the block's activations in its forward and two in its
  backward (all-gather + reduce-scatter pairs with sequence parallelism: the same bytes), over
  NVLink, not overlapped (Megatron-LM's layers wait for them); the embedding's all-reduce;
- recomputation: the block's forward again before its backward (full), its attention core
  (selective), or every other matmul and all memory-bound ops (selective_op, torchtitan's);
- pipeline: the schedule replayed over the stages (:mod:`.schedule`), activations sent between
  stages (one tensor-parallel slice each over the network, then all-gathered over NVLink);
- data parallelism: without sharding, the gradients all-reduced after the pipeline flushes;
  with FSDP, each block's weights all-gathered before its forward and backward and its
  gradients reduce-scattered after, on a second stream, so a block takes the longer of its
  compute and its collectives (every micro-batch without pipelining; the first forward and the
  last backward with it, where weights stay gathered between micro-batches);
- the optimizer step over the stage's (sharded) parameters.

Ranks are ordered tensor-parallel fastest, then data-parallel, then pipeline (Megatron-LM's and
torchtitan's order), which decides what crosses the network.
"""

import dataclasses
from typing import Any

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.simulator.gpu.memory import (
    GIB,
    RESERVED_GIB,
    MemoryEstimate,
    block_activation_bytes,
    in_flight,
)
from ddlsim.simulator.gpu.nccl import Group, NcclModel
from ddlsim.simulator.gpu.roofline import GpuOpCosts
from ddlsim.simulator.gpu.schedule import StageTimes, analytic_pipeline_ms, replay_pipeline
from ddlsim.simulator.gpu.shard_costs import ShardCosts

# Above this many ops the schedule is priced in closed form (equal stages make them agree).
REPLAY_LIMIT_OPS = 200_000
_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 2}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ModelDims:
    """What the memory model and the collectives need to know of the model."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    fused_attention: bool


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ScalePrediction:
    """One iteration: its time, throughput, FLOP rate and memory, and where the time goes."""

    iteration_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    memory: MemoryEstimate
    fits: bool
    breakdown_ms: dict[str, float]
    micro_batch_size: int

    def to_json(self) -> dict[str, Any]:
        return {
            "iteration_s": self.iteration_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "tflops_per_gpu": self.tflops_per_gpu,
            "memory": self.memory.to_json(),
            "fits": self.fits,
            "micro_batch_size": self.micro_batch_size,
            "breakdown_ms": {key: round(value, 3) for key, value in self.breakdown_ms.items()},
        }


def micro_batch_size(plan: ScalePlan, global_batch: int) -> int:
    """Sequences per micro-batch.

    Raises:
        InvalidStrategyError: when ``dp * micro_batches`` does not divide the global batch.
    """
    per_step = plan.dp * plan.micro_batches
    if global_batch % per_step:
        raise InvalidStrategyError(
            f"global_batch({global_batch}) is not divisible by dp({plan.dp}) * "
            f"micro_batches({plan.micro_batches})"
        )
    return global_batch // per_step


def check_world_size(plan: ScalePlan, cluster: GpuClusterSpec) -> None:
    """Raises:
    InvalidStrategyError: when ``dp * tp * pp`` is not the cluster's GPU count.
    """
    if plan.world_size != cluster.world_size:
        raise InvalidStrategyError(
            f"dp({plan.dp}) * tp({plan.tp}) * pp({plan.pp}) = {plan.world_size} != the "
            f"cluster's {cluster.world_size} GPUs ({cluster.nodes} nodes x "
            f"{cluster.gpus_per_node})"
        )


def check_layout(plan: ScalePlan, cluster: GpuClusterSpec, dims: ModelDims) -> None:
    """Refuse a plan the cluster or the model cannot take.

    Raises:
        InvalidStrategyError: naming the mismatch.
    """
    check_world_size(plan, cluster)
    if plan.pp * plan.virtual_stages > dims.layers:
        raise InvalidStrategyError(
            f"pp({plan.pp}) * virtual_stages({plan.virtual_stages}) > the model's "
            f"{dims.layers} layers"
        )
    if plan.precision == "fp8" and "fp8" not in cluster.gpu.peak_tflops:
        raise InvalidStrategyError(
            f"precision 'fp8' needs a GPU with fp8; {cluster.gpu.name} has none"
        )


def _groups(plan: ScalePlan, cluster: GpuClusterSpec) -> tuple[Group, Group, bool]:
    """The tensor- and data-parallel groups' placement, and whether pipeline neighbours sit in
    different nodes."""
    gpn = cluster.gpus_per_node
    tp_per_node = min(plan.tp, gpn)
    dp_per_node = max(1, min(plan.dp, gpn // plan.tp)) if plan.tp < gpn else 1
    while plan.dp % dp_per_node:
        dp_per_node -= 1
    return (
        Group(plan.tp, tp_per_node if plan.tp % tp_per_node == 0 else 1),
        Group(plan.dp, dp_per_node),
        plan.tp * plan.dp >= gpn,
    )


def _parts(layers: int, parts: int) -> list[int]:
    base, extra = divmod(layers, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


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
    ``micro_batch_size(plan, global_batch)`` sequences on one ``plan.tp`` shard.

    Raises:
        InvalidStrategyError: when the plan does not fit the cluster, the model or the batch.
    """
    check_layout(plan, cluster, dims)
    mbs = micro_batch_size(plan, global_batch)
    nccl = NcclModel(cluster)
    tp_group, dp_group, pp_across = _groups(plan, cluster)
    act_bytes = mbs * seq_len * dims.hidden * _DTYPE_BYTES[plan.precision]
    tp_ms = nccl.time_us("all_reduce", act_bytes, tp_group) / 1e3
    block = costs.block
    # Two collectives per pass; async TP hides them behind the matmuls they feed.
    tp_f = tp_b = 2 * tp_ms
    if plan.async_tp:
        tp_f = max(0.0, tp_f - block.forward_matmul_ms)
        tp_b = max(0.0, tp_b - block.backward_matmul_ms)
    block_f = block.forward_ms + tp_f
    recompute_ms = {
        "none": 0.0,
        "selective": costs.attention_forward_ms,
        # Every other matmul and every memory-bound op of the forward again.
        "selective_op": block.forward_gemm_ms / 2 + block.forward_ms - block.forward_matmul_ms,
        "full": block_f,
    }[plan.recompute]
    block_b = block.backward_ms + tp_b + recompute_ms
    # FSDP: the shard's weights gathered over dp (16-bit) and gradients reduce-scattered (fp32).
    ag_ms = rs_ms = 0.0
    if plan.fsdp and plan.dp > 1:
        ag_ms = nccl.time_us("all_gather", block.params * 2, dp_group) / 1e3
        rs_ms = nccl.time_us("reduce_scatter", block.params * 4, dp_group) / 1e3
    sharded_f = max(block_f, ag_ms)
    sharded_b = max(block_b, ag_ms + rs_ms)

    p, v, m = plan.pp, plan.virtual_stages, plan.micro_batches
    per_part = _parts(dims.layers, p * v)
    first_f = costs.first.forward_ms + (tp_ms if plan.tp > 1 else 0.0)
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

    every_f, every_b = (sharded_f, sharded_b) if p == 1 else (block_f, block_b)
    forward, backward = table(every_f, every_b)
    once_f, once_b = table(sharded_f, sharded_b)
    times = StageTimes(
        forward_ms=forward,
        backward_ms=backward,
        first_forward_ms=once_f,
        last_backward_ms=once_b,
    )
    send_ms = 0.0
    if p > 1:
        slice_bytes = act_bytes / plan.tp
        send_group = Group(2, 1) if pp_across else Group(2, 2)
        send_ms = nccl.time_us("sendrecv", slice_bytes, send_group) / 1e3
        if plan.tp > 1 and not plan.sequence_parallel:
            send_ms += nccl.time_us("all_gather", act_bytes, tp_group) / 1e3
    ops = 2 * p * v * m
    if replay and ops <= REPLAY_LIMIT_OPS:
        pipeline_ms = max(
            replay_pipeline(plan.schedule_kind, times, micro_batches=m, send_ms=send_ms)
        )
    else:
        stage_f = max(sum(row) for row in forward)
        stage_b = max(sum(row) for row in backward)
        pipeline_ms = analytic_pipeline_ms(
            plan.schedule_kind,
            stage_f,
            stage_b,
            stages=p,
            chunks=v,
            micro_batches=m,
            send_ms=send_ms,
        )
        pipeline_ms += (
            max(sum(r) for r in once_f) - stage_f + max(sum(r) for r in once_b) - stage_b
        )

    stage_params = [0] * p
    for part, count in enumerate(per_part):
        stage_params[part % p] += count * block.params
    stage_params[0] += costs.first.params
    stage_params[(p * v - 1) % p] += costs.last.params
    busiest = max(stage_params)
    dp_ms = 0.0
    if plan.dp > 1 and not plan.fsdp:
        dp_ms = nccl.time_us("all_reduce", busiest * _DTYPE_BYTES[plan.precision], dp_group) / 1e3
    if plan.fsdp:
        optimizer_ms = op_costs.optimizer_ms(-(-busiest // plan.dp))
    elif plan.distributed_optimizer:
        # Each rank steps its shard, then the updated 16-bit weights are all-gathered (the
        # gradients' reduce-scatter plus that all-gather move what one all-reduce does).
        optimizer_ms = op_costs.optimizer_ms(-(-busiest // plan.dp), bytes_per_param=34)
    else:
        # The master weights' 16-bit copy: 4 bytes read, 2 written per parameter.
        optimizer_ms = op_costs.optimizer_ms(busiest, bytes_per_param=34)
    iteration_ms = pipeline_ms + dp_ms + optimizer_ms

    memory = estimate_memory(
        costs, dims, plan, cluster, mbs=mbs, seq_len=seq_len, stage_params=stage_params
    )
    block_flops = block.forward_flops + block.backward_flops
    if plan.recompute == "full":
        block_flops += block.forward_flops
    edge_flops = sum(
        part.forward_flops + part.backward_flops for part in (costs.first, costs.last)
    )
    flops = plan.dp * m * plan.tp * (dims.layers * block_flops + edge_flops)
    iteration_s = iteration_ms / 1e3
    compute_ms = m * sum(sum(row) for row in forward) / p
    return ScalePrediction(
        iteration_s=iteration_s,
        tokens_per_s_per_gpu=global_batch * seq_len / iteration_s / cluster.world_size,
        tflops_per_gpu=flops / iteration_s / cluster.world_size / 1e12,
        memory=memory,
        fits=memory.total <= cluster.gpu.memory_gib * GIB,
        breakdown_ms={
            "pipeline": pipeline_ms,
            "per_stage_work": compute_ms + m * sum(sum(row) for row in backward) / p,
            "tp_comm_per_block": tp_f + tp_b,
            "send": send_ms,
            "dp_comm": dp_ms,
            "fsdp_gather_per_block": ag_ms,
            "fsdp_reduce_per_block": rs_ms,
            "optimizer": optimizer_ms,
        },
        micro_batch_size=mbs,
    )


def estimate_memory(
    costs: ShardCosts,
    dims: ModelDims,
    plan: ScalePlan,
    cluster: GpuClusterSpec,
    *,
    mbs: int,
    seq_len: int,
    stage_params: list[int],
) -> MemoryEstimate:
    """The busiest GPU's memory (:mod:`.memory`): the first stage's, or the last's where the
    logits outweigh it."""
    p, v = plan.pp, plan.virtual_stages
    if plan.fsdp:
        weights = [16 * n / plan.dp + 2 * 2 * costs.block.params for n in stage_params]
    elif plan.distributed_optimizer:
        # Megatron-LM's: 16-bit weights and fp32 gradients whole; the fp32 master weights and
        # Adam's two moments sharded over dp.
        weights = [(6.0 + 12.0 / plan.dp) * n for n in stage_params]
    else:
        weights = [18.0 * n for n in stage_params]
    per_block = (
        costs.op_policy_saved_bytes
        if plan.recompute == "selective_op"
        else block_activation_bytes(
            seq=seq_len,
            batch=mbs,
            hidden=dims.hidden,
            heads=dims.heads,
            tp=plan.tp,
            sequence_parallel=plan.sequence_parallel,
            recompute=plan.recompute,
            fused_attention=dims.fused_attention,
        )
    )
    layers_first = sum(_parts(dims.layers, p * v)[0::p])
    held = in_flight(plan.schedule_kind, stages=p, chunks=v, micro_batches=plan.micro_batches)
    activations = per_block * layers_first * held
    if plan.recompute == "full":
        # One block's activations live while it is recomputed and differentiated.
        activations += block_activation_bytes(
            seq=seq_len,
            batch=mbs,
            hidden=dims.hidden,
            heads=dims.heads,
            tp=plan.tp,
            sequence_parallel=plan.sequence_parallel,
            recompute="none",
            fused_attention=dims.fused_attention,
        )
    # fp32 logits and their gradient on the last stage, one micro-batch at a time.
    logits = 2 * 4.0 * mbs * seq_len * dims.vocab / plan.tp
    first = weights[0] + activations + (logits if p == 1 else 0.0)
    last = weights[-1] + (activations / max(held, 1) if p > 1 else activations) + logits
    if first >= last:
        return MemoryEstimate(
            weights_and_optimizer=weights[0],
            activations=activations,
            logits=logits if p == 1 else 0.0,
            reserved=RESERVED_GIB * GIB,
        )
    return MemoryEstimate(
        weights_and_optimizer=weights[-1],
        activations=last - weights[-1] - logits,
        logits=logits,
        reserved=RESERVED_GIB * GIB,
    )
