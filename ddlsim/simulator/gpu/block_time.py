"""One repeated block's forward and backward on one GPU of a layout, with what its
collectives add: the time a pipeline stage spends on it per micro-batch, split into compute,
recomputation and exposed communication per fabric level.

- tensor parallelism: two all-reduces of the block's activations in its forward and two in
  its backward (all-gather + reduce-scatter pairs with sequence parallelism: the same bytes,
  the gathers' halved with fp8 linears, whose inputs are cast before they are gathered),
  exposed (Megatron-LM's layers wait for them) or, with ``async_tp``, decomposed and overlapped
  with the matmuls they feed (:func:`.overlap.decomposed_tp_ms`);
- context parallelism: the block runs ``1 / cp`` of each sequence; its causal attention, load
  balanced over the ranks, does ``cp`` times the work of attention over its own tokens. The
  ring passes each rank's keys and values around the ``cp`` ranks in ``cp - 1`` steps, each
  overlapped with attention on the block that arrived before it (backward: keys, values and
  their gradients); the all-gather variant gathers the keys and values before attention and
  reduce-scatters their gradients after, exposed;
- recomputation: the block's forward again before its backward (full, its collectives
  included), its attention core (selective), or every other matmul and all memory-bound ops
  (selective_op, torchtitan's);
- FSDP: the block's weights all-gathered before its forward and backward and its gradients
  reduce-scattered after, overlapped with its compute (:mod:`.overlap`);
- a mixture of experts' routed experts: their grouped GEMMs and their dispatch and combine on
  the layout (:mod:`.experts`), in the block's compute and exposed communication.
"""

import dataclasses

from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.simulator.gpu import experts as gpu_experts
from ddlsim.simulator.gpu.experts import ExpertsTime
from ddlsim.simulator.gpu.nccl import Group, NcclModel, strided_group
from ddlsim.simulator.gpu.overlap import Exposed, decomposed_tp_ms, exposed_ms, overlapped_ms
from ddlsim.simulator.gpu.shard_costs import ShardCosts

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 2}


@dataclasses.dataclass(frozen=True, slots=True)
class Groups:
    """Where a layout's groups sit. Ranks are ordered tensor-parallel fastest, then context-,
    data- and pipeline-parallel (Megatron-LM's and torchtitan's order)."""

    tp: Group
    cp: Group
    dp: Group
    # The ranks holding the same weights: data- and context-parallel together.
    grads: Group
    pp_across_nodes: bool


def place_groups(plan: ScalePlan, gpus_per_node: int) -> Groups:
    tp_per_node = min(plan.tp, gpus_per_node)
    return Groups(
        tp=Group(plan.tp, tp_per_node if plan.tp % tp_per_node == 0 else 1),
        cp=strided_group(plan.cp, plan.tp, gpus_per_node),
        dp=strided_group(plan.dp, plan.tp * plan.cp, gpus_per_node),
        grads=strided_group(plan.dp * plan.cp, plan.tp, gpus_per_node),
        pp_across_nodes=plan.tp * plan.cp * plan.dp >= gpus_per_node,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class BlockTime:
    """One block, one micro-batch: ``forward``/``backward`` as a stage runs them (exposed
    collectives and recomputation included); ``first_forward``/``last_backward`` where FSDP
    gathers weights once per iteration under pipelining. The parts say where the time goes."""

    forward: float
    backward: float
    sharded_forward: float
    sharded_backward: float
    compute: float
    recompute: float
    exposed: Exposed
    sharded_exposed: Exposed
    # The experts' dispatch and combine exposed in it (part of ``exposed``), forward and backward.
    dispatch: Exposed = dataclasses.field(default_factory=Exposed)
    # A mixture of experts' block paced by the host: what it waits beyond its own work.
    host: float = 0.0


def block_time(
    costs: ShardCosts,
    plan: ScalePlan,
    nccl: NcclModel,
    groups: Groups,
    *,
    act_bytes: float,
    kv_bytes: float,
    experts: ExpertsTime | None = None,
) -> BlockTime:
    """Price one block; ``act_bytes`` is one micro-batch's activations at the block's border
    on one context-parallel rank (tokens x hidden x dtype), ``kv_bytes`` its keys and values on
    one tensor-parallel shard; ``experts``: its routed experts on this layout (:mod:`.experts`).
    """
    block = costs.block
    cp = plan.cp
    attention_f = costs.attention_forward_ms * cp
    attention_b = costs.attention_backward_ms * cp
    compute_f = block.forward_ms + costs.attention_forward_ms * (cp - 1)
    compute_b = block.backward_ms + costs.attention_backward_ms * (cp - 1)

    tp_network = groups.tp.nodes > 1
    tp_f, tp_b = _tensor_parallel_ms(plan, nccl, groups, costs, act_bytes)
    cp_f = cp_b = 0.0
    cp_network = groups.cp.nodes > 1
    if cp > 1 and plan.cp_comm == "ring":
        send = Group(2, 1) if cp_network else Group(2, 2)
        step_f = nccl.time_us("sendrecv", kv_bytes, send) / 1e3
        step_b = nccl.time_us("sendrecv", 2 * kv_bytes, send) / 1e3
        cp_f = (cp - 1) * exposed_ms(attention_f / cp, step_f)
        cp_b = (cp - 1) * exposed_ms(attention_b / cp, step_b)
    elif cp > 1:
        cp_f = nccl.time_us("all_gather", kv_bytes * cp, groups.cp) / 1e3
        cp_b = nccl.time_us("reduce_scatter", kv_bytes * cp, groups.cp) / 1e3
    exposed_f = Exposed.at(tp_network, tp_f) + Exposed.at(cp_network, cp_f)
    exposed_b = Exposed.at(tp_network, tp_b) + Exposed.at(cp_network, cp_b)
    dispatch_f = dispatch_b = Exposed()
    if experts is not None:
        compute_f += experts.compute_f
        compute_b += experts.compute_b
        # With ep_overlap a forward's exchanges run beside another micro-batch's backward, and
        # a backward's beside a forward.
        hide = (compute_b, compute_f) if plan.ep_overlap else (0.0, 0.0)
        dispatch_f, dispatch_b = experts.exposed(hide_f=hide[0], hide_b=hide[1])
        exposed_f += dispatch_f
        exposed_b += dispatch_b
    forward = compute_f + exposed_f.total
    recompute = {
        "none": 0.0,
        "selective": attention_f,
        # Every other matmul and every memory-bound op of the forward again.
        "selective_op": block.forward_gemm_ms / 2 + block.forward_ms - block.forward_matmul_ms,
        "full": compute_f,
    }[plan.recompute]
    recompute_exposed = exposed_f if plan.recompute == "full" else Exposed()
    busy = compute_f + compute_b + exposed_f.total + exposed_b.total + recompute
    host = _host_wait(plan, experts, busy + recompute_exposed.total)
    dispatch = dispatch_f + dispatch_b + (dispatch_f if plan.recompute == "full" else Exposed())
    backward = compute_b + exposed_b.total + recompute + recompute_exposed.total + host
    exposed = exposed_f + exposed_b + recompute_exposed

    sharded_f, sharded_b, sharded_exposed = _sharded(
        plan, nccl, groups, block.params, experts=experts, unsharded=(forward, backward, exposed)
    )
    return BlockTime(
        forward=forward,
        backward=backward,
        sharded_forward=sharded_f,
        sharded_backward=sharded_b,
        compute=compute_f + compute_b,
        recompute=recompute,
        exposed=exposed,
        sharded_exposed=sharded_exposed,
        dispatch=dispatch,
        host=host,
    )


def _host_wait(plan: ScalePlan, experts: ExpertsTime | None, busy: float) -> float:
    """What a mixture of experts' block waits for its host beyond ``busy`` ms of its own work,
    run eagerly with Transformer Engine's layers (:data:`.experts.MOE_BLOCK_HOST_MS`); full
    recomputation launches the forward's kernels again, a third more of them."""
    if experts is None or plan.kernels != "transformer_engine":
        return 0.0
    floor = gpu_experts.MOE_BLOCK_HOST_MS * (4 / 3 if plan.recompute == "full" else 1.0)
    return max(0.0, floor - busy)


def _sharded(
    plan: ScalePlan,
    nccl: NcclModel,
    groups: Groups,
    params: int,
    *,
    experts: ExpertsTime | None,
    unsharded: tuple[float, float, Exposed],
) -> tuple[float, float, Exposed]:
    """FSDP: the shard's weights gathered (16-bit) and gradients reduce-scattered (fp32) over the
    ranks that share them (the experts' over their expert-data-parallel ranks), beside the
    block's compute; ``unsharded``: the block's forward, backward and exposed time without."""
    forward, backward, exposed = unsharded
    if not plan.fsdp or groups.grads.size == 1:
        return unsharded
    ag_ms = nccl.time_us("all_gather", params * 2, groups.grads) / 1e3
    rs_ms = nccl.time_us("reduce_scatter", params * 4, groups.grads) / 1e3
    if experts is not None:
        ag_ms += experts.fsdp_gather
        rs_ms += experts.fsdp_reduce
    sharded_f = overlapped_ms(forward, ag_ms)
    sharded_b = overlapped_ms(backward, ag_ms + rs_ms)
    return (
        sharded_f,
        sharded_b,
        exposed + Exposed.at(groups.grads.nodes > 1, sharded_f - forward + sharded_b - backward),
    )


def _tensor_parallel_ms(
    plan: ScalePlan, nccl: NcclModel, groups: Groups, costs: ShardCosts, act_bytes: float
) -> tuple[float, float]:
    """The block's tensor-parallel collectives exposed in its forward and its backward."""
    if plan.sequence_parallel:
        # With fp8 linears the inputs are cast before they are gathered (torchao's float8
        # tensor parallelism, Transformer Engine's fp8 all-gather): half the bytes.
        gathered = act_bytes / 2 if plan.precision == "fp8" else act_bytes
        gather_ms = nccl.time_us("all_gather", gathered, groups.tp) / 1e3
        tp_ms = 2 * (gather_ms + nccl.time_us("reduce_scatter", act_bytes, groups.tp) / 1e3)
    else:
        tp_ms = 2 * nccl.time_us("all_reduce", act_bytes, groups.tp) / 1e3
    if not plan.async_tp:
        return tp_ms, tp_ms
    block = costs.block
    return (
        decomposed_tp_ms(tp_ms, block.forward_matmul_ms, plan.tp),
        decomposed_tp_ms(tp_ms, block.backward_matmul_ms, plan.tp),
    )
