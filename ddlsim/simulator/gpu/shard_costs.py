"""What one tensor-parallel shard costs on a GPU, split the way a pipeline needs it: one
repeated block forward and backward, the model's first ops (embeddings) and its last (final
norm, head, loss), and the parameters of each.

Input: the graph of a one-block shard (:func:`ddlsim.profiler.shard.capture_shard`) and the
family's block pattern; a node belongs to the block when its module (or, for a backward op,
its forward op's module) lies under the block.
"""

import dataclasses
import re

from ddlsim.data.graph.format import GraphNode, IterationGraph
from ddlsim.simulator.gpu.experts import ExpertsCost, experts_cost
from ddlsim.simulator.gpu.roofline import ATTENTION_OPS, FREE_OPS, GEMM_OPS, GpuOpCosts


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PartCost:
    """Forward and backward compute of one part, in ms, and its parameter count."""

    forward_ms: float
    backward_ms: float
    params: int
    forward_flops: int = 0
    backward_flops: int = 0
    forward_matmul_ms: float = 0.0
    backward_matmul_ms: float = 0.0
    forward_gemm_ms: float = 0.0
    forward_kernels: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ShardCosts:
    """``block``: one repeated block; ``first``: what runs before the first block (embeddings);
    ``last``: what runs after the last one (final norm, head, loss)."""

    block: PartCost
    first: PartCost
    last: PartCost
    attention_forward_ms: float
    op_policy_saved_bytes: float = 0.0
    attention_backward_ms: float = 0.0
    attention_flops: int = 0
    # A mixture of experts' routed experts, priced per layout (:mod:`.experts`); the block's
    # own times and parameters leave them out.
    experts: ExpertsCost | None = None


def _in_block(pattern: str, module: str) -> bool:
    return re.search(rf"(^|\.)(?:{pattern})(\.|$)", module) is not None


def shard_costs(
    graph: IterationGraph, block: str, costs: GpuOpCosts, *, compiled: bool = False
) -> ShardCosts:
    """Price every compute node of ``graph`` with ``costs`` and sum them per part;
    ``compiled``: the block's memory-bound ops between two matmuls run as one fused kernel
    each (:func:`fused_groups`), as ``torch.compile`` of each block (or hand-fused kernels)
    runs them; embeddings, head and loss stay eager.

    Shapes:
        graph: one shard with exactly one block matched by ``block``.

    Long: one pass over the shard's nodes that prices, fuses and sums them per part as it goes.
    """
    nodes = graph.nodes
    part_of: dict[int, str] = {}
    seen_block = False
    for node in nodes:
        if node.phase != "forward":
            continue
        if _in_block(block, node.module):
            seen_block = True
            part_of[node.id] = "block"
        else:
            part_of[node.id] = "last" if seen_block else "first"
    times = {(part, phase): 0.0 for part in ("block", "first", "last") for phase in "fb"}
    kernels = {"block": 0, "first": 0, "last": 0}
    flops = {(part, phase): 0 for part in ("block", "first", "last") for phase in "fb"}
    matmul = {(part, phase): 0.0 for part in ("block", "first", "last") for phase in "fb"}
    gemm_forward = {"block": 0.0, "first": 0.0, "last": 0.0}
    saved_mm: list[int] = []
    saved_other = 0
    attention = attention_backward = 0.0
    attention_flops = 0
    attention_ids: set[int] = set()
    parts = {node.id: _part(node, part_of, block) for node in nodes if node.kind == "compute"}
    experts, expert_ids, expert_params = experts_cost(graph, costs)
    for index in expert_ids:
        parts[index] = "experts"  # fused with nothing of the block's
    fused = fused_groups(graph, parts, costs) if compiled else {}
    for node in nodes:
        if node.kind != "compute" or node.id in expert_ids:
            continue
        part = parts[node.id]
        if compiled and part == "block" and not _is_heavy(node):
            ms = fused.get(node.id, 0.0)
        else:
            ms = costs.node_ms(node, in_block=part == "block")
        times[(part, "f" if node.phase == "forward" else "b")] += ms
        flops[(part, "f" if node.phase == "forward" else "b")] += node.flops
        if _is_heavy(node):
            matmul[(part, "f" if node.phase == "forward" else "b")] += ms
            if node.phase == "forward" and node.op.startswith(GEMM_OPS):
                gemm_forward[part] += ms
                if part == "block":
                    saved_mm.append(sum(t.nbytes for t in node.outputs))
            elif node.phase == "forward" and part == "block":
                saved_other += sum(t.nbytes for t in node.outputs)
        if node.phase == "forward" and ms > 0:
            kernels[part] += 1
            if part == "block" and _is_attention(node):
                attention += ms
                attention_flops += node.flops
                attention_ids.add(node.id)
        elif part == "block" and (
            node.forward_id in attention_ids or any(op in node.op for op in ATTENTION_OPS)
        ):
            attention_backward += ms
            attention_flops += node.flops
    params = {"block": 0, "first": 0, "last": 0}
    last_modules = {n.module for n in nodes if part_of.get(n.id) == "last"}
    for info in graph.params:
        if info.name in expert_params:
            continue
        if _in_block(block, info.module):
            params["block"] += info.numel
        elif info.module in last_modules:
            params["last"] += info.numel
        else:
            params["first"] += info.numel
    return ShardCosts(
        **{
            part: PartCost(
                forward_ms=times[(part, "f")],
                backward_ms=times[(part, "b")],
                params=params[part],
                forward_flops=flops[(part, "f")],
                backward_flops=flops[(part, "b")],
                forward_matmul_ms=matmul[(part, "f")],
                backward_matmul_ms=matmul[(part, "b")],
                forward_gemm_ms=gemm_forward[part],
                forward_kernels=kernels[part],
            )
            for part in ("block", "first", "last")
        },
        attention_forward_ms=attention,
        attention_backward_ms=attention_backward,
        attention_flops=attention_flops,
        experts=experts,
        # torchtitan's op-level policy keeps every other matmul's output (the first, third,
        # ...) and the attention's, plus the block's input.
        op_policy_saved_bytes=sum(saved_mm[0::2])
        + saved_other
        + _block_input_bytes(nodes, part_of),
    )


def _block_input_bytes(nodes: tuple[GraphNode, ...], part_of: dict[int, str]) -> int:
    """Bytes of the tensor entering the block: the largest input of its first forward op."""
    for node in nodes:
        if part_of.get(node.id) == "block" and node.inputs:
            return max(t.nbytes for t in node.inputs)
    return 0


def _is_heavy(node: GraphNode) -> bool:
    """A matrix multiply or fused attention: what a compiler leaves as its own kernel."""
    return bool(node.flops) and (
        node.op.startswith(GEMM_OPS) or any(part in node.op for part in ATTENTION_OPS)
    )


def fused_groups(
    graph: IterationGraph, parts: dict[int, str], costs: GpuOpCosts
) -> dict[int, float]:
    """The ms of each fused kernel, keyed by its first node: the memory-bound ops that run
    between two matmuls (or attentions) in one part and phase form one kernel, which reads the
    tensors that come from outside it and writes those used outside it (by later ops or by the
    backward pass); what stays inside never touches memory. Views pass tensors through."""
    nodes = graph.nodes
    successors: list[list[int]] = [[] for _ in nodes]
    predecessors: list[list[int]] = [[] for _ in nodes]
    for src, dst in graph.edges:
        successors[src].append(dst)
        predecessors[dst].append(src)
    groups: list[list[int]] = []
    current: list[int] = []
    key: tuple[str, str] | None = None
    for node in nodes:
        if node.kind != "compute":
            continue
        if _is_heavy(node) or (parts[node.id], node.phase) != key:
            if current:
                groups.append(current)
            current = []
            key = None if _is_heavy(node) else (parts[node.id], node.phase)
            if _is_heavy(node):
                continue
        current.append(node.id)
    if current:
        groups.append(current)

    def users(index: int, members: set[int]) -> list[int]:
        """Consumers of ``index``'s output, looking through views inside the group."""
        found: list[int] = []
        for succ in successors[index]:
            if succ in members and nodes[succ].is_view:
                found.extend(users(succ, members))
            else:
                found.append(succ)
        return found

    out: dict[int, float] = {}
    for group in groups:
        members = set(group)
        nbytes = 0
        for index in group:
            node = nodes[index]
            if node.is_view or node.op.startswith(FREE_OPS):
                continue
            inside = {
                (tuple(t.shape), t.dtype)
                for pred in predecessors[index]
                if pred in members
                for t in nodes[pred].outputs
            }
            nbytes += sum(t.nbytes for t in node.inputs if (tuple(t.shape), t.dtype) not in inside)
            consumers = users(index, members)
            if not consumers or any(c not in members for c in consumers):
                nbytes += sum(t.nbytes for t in node.outputs)
        if nbytes:
            out[group[0]] = costs.memory_ms("copy", nbytes)
    return out


def _part(node: GraphNode, part_of: dict[int, str], block: str) -> str:
    if node.phase == "forward":
        return part_of[node.id]
    if node.forward_id is not None and node.forward_id in part_of:
        return part_of[node.forward_id]
    if _in_block(block, node.module):
        return "block"
    # The loss gradient's seed and ops whose autograd node has no forward op: the head's end.
    return "last" if not node.module or "head" in node.module else "first"


def _is_attention(node: GraphNode) -> bool:
    """The ops selective recomputation repeats: the attention core (scores, softmax, dropout
    on them, fused attention)."""
    if "scaled_dot_product" in node.op or "flash_attention" in node.op or "bmm" in node.op:
        return True
    return ("softmax" in node.op or "dropout" in node.op or "bernoulli" in node.op) and any(
        len(t.shape) >= 3 and t.shape[-1] == t.shape[-2] for t in node.outputs
    )
