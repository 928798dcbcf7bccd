"""A block's routed experts on a GPU of a layout: their grouped GEMMs at the tokens each local
expert gets, and the dispatch and combine that bring the tokens to them and back.

The shard's graph holds one block's experts as captured: every expert on one GPU, fed the
micro-batch's token copies (tokens x top-k). A layout changes three things:

- **how many token copies a GPU computes**: ``1 / tp`` of the micro-batch's with sequence
  parallelism (Megatron-Core's experts see the sequence-parallel shard of the tokens; without
  it every tensor-parallel rank computes all of them), times the busiest rank's share
  (``imbalance``, capped by a capacity factor);
- **how many experts share them**: ``num_experts / ep`` local experts, so each gets ``ep``
  times the rows it would get alone, and expert tensor parallelism gathers ``etp`` ranks'
  tokens onto each expert's ``1 / etp`` slice. The grouped GEMMs are priced at those rows
  per expert (:meth:`GpuOpCosts.grouped_gemm_ms`: few tokens an expert waste their tiles);
- **what crosses the fabric**: with ``all_to_all``, each token copy is sent to its expert's rank
  (dispatch) and back (combine), forward and again backward (Megatron-Core's ``alltoall``
  dispatcher and DeepEP's kernels alike), over the ``ep`` ranks, NVLink inside a node and the
  NICs across; with ``all_gather``, every token is gathered over the group and the outputs
  reduce-scattered. ``etp`` adds an all-gather and reduce-scatter of the tokens over its ranks.
  The exchanges block the layer, unless ``ep_overlap`` runs them beside another micro-batch's
  compute (Megatron-Core's combined 1F1B: forward exchanges beside a backward, backward
  beside a forward), which hides them up to that compute.

Activations cross in 16 bits (the fp8 recipes dispatch bf16 through NCCL's all-to-all).
"""

import dataclasses

from ddlsim.data.graph.format import GraphNode, IterationGraph
from ddlsim.data.models import build_config
from ddlsim.data.moe import expert_param_names, experts_shape
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.simulator.gpu.grad_sync import gradient_sync
from ddlsim.simulator.gpu.nccl import Group, NcclModel, strided_group
from ddlsim.simulator.gpu.overlap import Exposed
from ddlsim.simulator.gpu.roofline import GpuOpCosts

EXCHANGE_BYTES = 2  # bf16 activations
# The share of the exchanges Megatron-Core's combined 1F1B overlap (parallel.ep_overlap) hides
# behind another micro-batch's compute. Not stated anywhere; fitted on one published pair, the
# same run with and without it (Megatron-MoE-ModelZoo, best_practice/qwen3/readme.md at
# e8650517: Qwen3-235B-A22B on 256 H100s, DeepEP, TP2 PP8 VPP4 EP32: 19.7 s a step, 17.6 s
# "+1f1b overlap"): the share that brings the first to the second
# (``benchmarks/moe_host_floor.py``). The comm kernels
# take SMs from the compute they overlap, and the schedule overlaps only where a forward and a
# backward chunk meet. ``benchmarks/published.py`` checks it on Megatron-Bridge's rows, which
# it was not fitted on.
EP_OVERLAP_HIDDEN = 0.236
# The least a Megatron-Core MoE block takes, forward and backward, per micro-batch (ms), run
# eagerly (no CUDA graphs) with Transformer Engine's layers: the host launches each expert's
# quantization and GEMM, the router's, permutation's and exchanges' kernels, and waits for the
# token counts before it can launch the layer's experts, so a block whose kernels are short is
# paced by the host ("CPU Overhead Bottleneck", Megatron-Core's MoE guide, megatron/core/
# transformer/moe/README.md at d98e8a64). Not stated anywhere; fitted on the one published run
# where it binds (Megatron-MoE-ModelZoo, best_practice/qwen3/readme.md at e8650517: Qwen3-235B-
# A22B on 256 H100s, TP4 PP8 VPP4 EP8, 29.0 s a step: ``benchmarks/moe_host_floor.py``);
# Megatron-Bridge's rows check it without having been fitted on.
MOE_BLOCK_HOST_MS = 9.28
# Transformer Engine's grouped linear layers run each expert's GEMM on one of its compute
# streams (transformer_engine/common/util/multi_stream.cpp, get_num_compute_streams: 4).
TE_GEMM_STREAMS = 4


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GroupedGemm:
    """One grouped GEMM of the captured experts: each expert's rows (token copies) by a ``k x
    n`` matrix; ``weight_grad``: the weights' gradient, ``k x rows`` by ``rows x n``."""

    phase: str
    k: int
    n: int
    flops: int
    weight_grad: bool = False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExpertsCost:
    """One block's routed experts as the shard captured them (every expert on one GPU)."""

    experts: int
    top_k: int
    pairs: int
    hidden: int
    gemms: tuple[GroupedGemm, ...]
    other_forward_ms: float
    other_backward_ms: float
    forward_flops: int
    backward_flops: int
    params: int
    intermediate: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExpertsTime:
    """The experts of one block, one micro-batch, on the busiest GPU of a layout (ms)."""

    compute_f: float
    compute_b: float
    exchange_f: float
    exchange_b: float
    network: bool
    # FSDP: the block's expert shard gathered (16-bit) and its gradients reduce-scattered (fp32)
    # over the expert-data-parallel ranks, beside the block's compute.
    fsdp_gather: float = 0.0
    fsdp_reduce: float = 0.0

    def exposed(self, *, hide_f: float = 0.0, hide_b: float = 0.0) -> tuple[Exposed, Exposed]:
        """The exchanges' exposed time, forward and backward, with ``hide_*`` ms of another
        micro-batch's compute beside them: :data:`EP_OVERLAP_HIDDEN` of what that compute
        covers is hidden."""
        forward = self.exchange_f - EP_OVERLAP_HIDDEN * min(self.exchange_f, hide_f)
        backward = self.exchange_b - EP_OVERLAP_HIDDEN * min(self.exchange_b, hide_b)
        return Exposed.at(self.network, forward), Exposed.at(self.network, backward)


def experts_cost(
    graph: IterationGraph, costs: GpuOpCosts
) -> tuple[ExpertsCost | None, set[int], frozenset[str]]:
    """The routed experts of a one-block shard's ``graph`` (``None`` for a dense model), the ids
    of their nodes and the names of their parameters (which the block's own times and
    parameters leave out)."""
    config = build_config(graph.model)
    shape = experts_shape(config)
    names = expert_param_names(graph.params, config)
    if shape is None or not names:
        return None, set(), frozenset()
    modules = {p.module for p in graph.params if p.name in names}
    ids: set[int] = set()
    gemms: list[GroupedGemm] = []
    other = {"forward": 0.0, "backward": 0.0}
    flops = {"forward": 0, "backward": 0}
    pairs = 0
    for node in graph.nodes:
        if node.kind != "compute" or not any(
            node.module == m or node.module.startswith(m + ".") for m in modules
        ):
            continue
        ids.add(node.id)
        phase = "forward" if node.phase == "forward" else "backward"
        flops[phase] += node.flops
        if "grouped_mm" in node.op and node.flops:
            gemm = _grouped_gemm(node, phase)
            gemms.append(gemm)
            if phase == "forward" and not pairs:
                pairs = int(node.inputs[0].shape[0])
        else:
            other[phase] += costs.node_ms(node)
    return (
        ExpertsCost(
            experts=shape.experts,
            top_k=shape.top_k,
            pairs=pairs,
            hidden=int(config.hidden_size),
            gemms=tuple(gemms),
            other_forward_ms=other["forward"],
            other_backward_ms=other["backward"],
            forward_flops=flops["forward"],
            backward_flops=flops["backward"],
            params=sum(p.numel for p in graph.params if p.name in names),
            intermediate=shape.intermediate,
        ),
        ids,
        names,
    )


def _grouped_gemm(node: GraphNode, phase: str) -> GroupedGemm:
    a, b = (tuple(t.shape) for t in node.inputs[:2])
    if len(a) == 2 and len(b) == 2:  # the weights' gradient: [k, rows] by [rows, n]
        return GroupedGemm(phase=phase, k=a[0], n=b[1], flops=node.flops, weight_grad=True)
    return GroupedGemm(phase=phase, k=b[-2], n=b[-1], flops=node.flops)


def expert_group(plan: ScalePlan, gpus_per_node: int) -> Group:
    """The ``ep`` ranks exchanging tokens: Megatron-Core orders the experts' ranks expert-tensor
    fastest, then expert-parallel, so an ``ep`` group strides ``etp`` ranks."""
    return strided_group(plan.ep, plan.etp, gpus_per_node)


def expert_data_group(plan: ScalePlan, gpus_per_node: int) -> Group:
    """The ``edp`` ranks holding the same expert shard (reducing its gradients)."""
    return strided_group(plan.edp, plan.ep * plan.etp, gpus_per_node)


def experts_time(
    cost: ExpertsCost,
    plan: ScalePlan,
    op_costs: GpuOpCosts,
    nccl: NcclModel,
    *,
    gpus_per_node: int,
    imbalance: float = 1.0,
) -> ExpertsTime:
    """Price ``cost`` on one GPU of ``plan``; ``imbalance``: the busiest rank's token copies
    over the mean (1.0: balanced, as the published runs force it)."""
    share = 1.0 / plan.tp if plan.sequence_parallel and plan.tp > 1 else 1.0
    load = imbalance if plan.capacity_factor is None else min(imbalance, plan.capacity_factor)
    pairs = cost.pairs * share * load  # token copies this GPU's tokens make
    local = max(1, cost.experts // plan.ep)
    rows = pairs * plan.ep * plan.etp / cost.experts  # rows each local expert gets
    dtype = "fp8" if plan.precision == "fp8" else "bf16"
    concurrent = min(local, TE_GEMM_STREAMS) if plan.kernels == "transformer_engine" else local
    compute = {"forward": 0.0, "backward": 0.0}
    for gemm in cost.gemms:
        k, n = _sliced(gemm.k, cost.hidden, plan.etp), _sliced(gemm.n, cost.hidden, plan.etp)
        flops = gemm.flops * share * load
        if gemm.weight_grad:  # [k, rows] by [rows, n] an expert: the rows are the reduction
            ms = op_costs.grouped_gemm_ms(
                flops, rows=k, k=max(1, round(rows)), n=n, concurrent=concurrent, dtype=dtype
            )
        else:
            ms = op_costs.grouped_gemm_ms(
                flops, rows=rows, k=k, n=n, concurrent=concurrent, dtype=dtype
            )
        compute[gemm.phase] += ms
    scale = share * load
    compute["forward"] += cost.other_forward_ms * scale
    compute["backward"] += cost.other_backward_ms * scale
    exchange_f, exchange_b, network = _exchange_ms(cost, plan, nccl, pairs, gpus_per_node)
    gather = reduce = 0.0
    if plan.fsdp and plan.edp > 1:
        held = expert_params_per_gpu(cost, plan)
        edp = expert_data_group(plan, gpus_per_node)
        gather = nccl.time_us("all_gather", held * 2, edp) / 1e3
        reduce = nccl.time_us("reduce_scatter", held * 4, edp) / 1e3
    return ExpertsTime(
        fsdp_gather=gather,
        fsdp_reduce=reduce,
        compute_f=compute["forward"],
        compute_b=compute["backward"],
        exchange_f=exchange_f,
        exchange_b=exchange_b,
        network=network,
    )


def _sliced(width: int, hidden: int, etp: int) -> int:
    """An expert matrix's dimension on one of ``etp`` ranks: the expert's own width is split,
    the model's hidden size is not."""
    return width if width == hidden or etp == 1 else max(1, width // etp)


def _exchange_ms(
    cost: ExpertsCost, plan: ScalePlan, nccl: NcclModel, pairs: float, gpus_per_node: int
) -> tuple[float, float, bool]:
    """The exchanges of a forward and of a backward, and whether they cross nodes. With fp8 the
    forward's dispatch sends fp8 tokens (Megatron-Core's MoE guide: half the dispatch volume),
    the combine and the backward's 16-bit ones."""
    group = expert_group(plan, gpus_per_node)
    row = cost.hidden * EXCHANGE_BYTES
    dispatch_row = cost.hidden * (1 if plan.precision == "fp8" else EXCHANGE_BYTES)
    forward = backward = 0.0
    if plan.ep > 1 and plan.dispatcher == "flex":
        forward = _flex_ms(cost, nccl, group, pairs, dispatch_row) + _flex_ms(
            cost, nccl, group, pairs, row
        )
        backward = 2 * _flex_ms(cost, nccl, group, pairs, row)
    elif plan.ep > 1 and plan.dispatcher == "all_to_all":
        forward = (
            nccl.time_us("all_to_all", pairs * dispatch_row, group)
            + nccl.time_us("all_to_all", pairs * row, group)
        ) / 1e3
        backward = 2 * nccl.time_us("all_to_all", pairs * row, group) / 1e3
    elif plan.ep > 1:
        gathered = plan.ep * pairs / cost.top_k * row
        forward = backward = (
            nccl.time_us("all_gather", gathered, group)
            + nccl.time_us("reduce_scatter", gathered, group)
        ) / 1e3
    network = group.nodes > 1
    if plan.etp > 1:
        etp_group = strided_group(plan.etp, 1, gpus_per_node)
        gathered = plan.etp * pairs * row
        etp_ms = (
            nccl.time_us("all_gather", gathered, etp_group)
            + nccl.time_us("reduce_scatter", gathered, etp_group)
        ) / 1e3
        forward += etp_ms
        backward += etp_ms
        network = network or etp_group.nodes > 1
    return forward, backward, network


def _flex_ms(cost: ExpertsCost, nccl: NcclModel, group: Group, pairs: float, row: int) -> float:
    """One exchange of the flex dispatcher: each token sent once to every other node holding
    one of its top-k experts (the expected count, experts spread evenly and picked at random,
    as forced balancing keeps them), then fanned out to the experts' GPUs over NVLink; the two
    legs pipelined, so the slower one sets the pace."""
    tokens = pairs / cost.top_k
    nodes = group.nodes
    node_ms = nccl.time_us("all_to_all", pairs * row, Group(group.per_node, group.per_node))
    if nodes == 1:
        return node_ms / 1e3
    reached = nodes * (1 - (1 - 1 / nodes) ** cost.top_k)  # distinct nodes a token's experts
    remote = reached * (nodes - 1) / nodes
    # Over the NIC of each GPU, as a send of that many rows to a peer on another node.
    net_ms = nccl.time_us("sendrecv", tokens * remote * row, Group(2, 1))
    return max(node_ms, net_ms) / 1e3


def experts_gradient_sync(
    plan: ScalePlan,
    nccl: NcclModel,
    *,
    params: float,
    gpus_per_node: int,
    dtype_bytes: int,
    last_backward_ms: float,
    first_forward_ms: float,
) -> Exposed:
    """The routed experts' gradients (``params`` a GPU holds) reduced over the
    expert-data-parallel ranks, as the rest's are over the data-parallel ones."""
    if params <= 0:
        return Exposed()
    return gradient_sync(
        plan,
        nccl,
        expert_data_group(plan, gpus_per_node),
        params=int(params),
        dtype_bytes=dtype_bytes,
        last_backward_ms=last_backward_ms,
        first_forward_ms=first_forward_ms,
    )


def experts_optimizer_ms(plan: ScalePlan, op_costs: GpuOpCosts, params: float) -> float:
    """The step over the routed-expert parameters a GPU holds, sharded over the
    expert-data-parallel ranks with the distributed optimizer (or ZeRO, FSDP)."""
    if params <= 0:
        return 0.0
    sharded = plan.fsdp or plan.distributed_optimizer or plan.zero
    return op_costs.optimizer_ms(int(-(-params // plan.edp) if sharded else params))


def experts_activation_bytes(cost: ExpertsCost | None, plan: ScalePlan) -> float:
    """What one block's experts keep for backward a micro-batch on one GPU: each token copy's
    dispatched input (fp8 where the dispatch is), its gated up-projection and activation, and
    its output before the combine (16-bit), at this GPU's share of the copies; under full
    recomputation only the block's input is kept (counted with the block's)."""
    if cost is None or plan.recompute == "full":
        return 0.0
    share = 1.0 / plan.tp if plan.sequence_parallel and plan.tp > 1 else 1.0
    pairs = cost.pairs * share
    width = cost.intermediate / plan.etp
    dispatched = cost.hidden * (1 if plan.precision == "fp8" else EXCHANGE_BYTES)
    return pairs * (dispatched + EXCHANGE_BYTES * (cost.hidden + 3 * width))


def expert_params_per_gpu(cost: ExpertsCost | None, plan: ScalePlan) -> float:
    """One block's routed-expert parameters a GPU holds: ``1 / (ep x etp)`` of them."""
    if cost is None:
        return 0.0
    return cost.params / (plan.ep * plan.etp)


def expert_layer_flops(cost: ExpertsCost | None) -> int:
    """One block's experts' FLOPs in a micro-batch, forward and backward (every token copy)."""
    return 0 if cost is None else cost.forward_flops + cost.backward_flops
