"""A strategy's gradient collectives and optimizer steps, placed on an iteration's nodes.

Capture records forward, backward and gradient-ready nodes; where the collectives go and how
the optimizer steps group depends only on the strategy's buckets. This module places them, both
for a fresh capture and for :func:`with_strategy`, which moves an existing graph to another
strategy without capturing the model again (what the simulator and search do for every
candidate).
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ddlsim.data.graph.format import GraphNode, IterationGraph, ParamInfo
from ddlsim.data.models import build_config
from ddlsim.data.moe import expert_param_names
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Bucket, Strategy

Optimizer = Literal["sgd", "adamw"]
OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")

# Per parameter element, fp32: FLOPs of one step and how many parameter-sized tensors it reads
# and writes (SGD with momentum: p, grad, buffer; AdamW: p, grad, exp_avg, exp_avg_sq).
_OPTIMIZER_COST: dict[str, tuple[int, int, int]] = {"sgd": (3, 3, 2), "adamw": (12, 4, 3)}


@dataclasses.dataclass(slots=True)
class PendingNode:
    """A node before final numbering: its id is still -1, and ``deps`` and ``forward_ref`` are
    indices into the list it is in, renumbered once collectives are placed."""

    node: GraphNode
    deps: list[int]
    forward_ref: int | None = None


def pending(deps: list[int], forward_ref: int | None = None, **fields: Any) -> PendingNode:
    return PendingNode(node=GraphNode(id=-1, **fields), deps=deps, forward_ref=forward_ref)


def assemble(
    *,
    model: ModelSpec,
    strategy: Strategy,
    optimizer: Optimizer,
    params: Sequence[ParamInfo],
    recorded: list[PendingNode],
    ready: Mapping[str, int],
    env: Mapping[str, str],
) -> IterationGraph:
    """The graph of ``recorded`` forward, backward and gradient-ready nodes under ``strategy``.

    ``ready`` maps each parameter to the index of its gradient-ready node, in the order the
    gradients became ready.

    Raises:
        InvalidStrategyError: when the strategy's buckets do not partition the gradients.
    """
    sizes = {p.name: p.nbytes for p in params}
    ep = strategy.parallel.ep
    experts = expert_param_names(params, build_config(model)) if ep > 1 else frozenset()
    bucketed = [name for name in ready if name not in experts]
    buckets = strategy.tensor_fusion.assign([(name, sizes[name]) for name in bucketed])
    nodes = _place_collectives(recorded, ready, buckets, strategy)
    _append_optimizer(nodes, buckets, sizes, optimizer)
    _append_expert_optimizer(nodes, ready, experts, sizes=sizes, optimizer=optimizer, ep=ep)
    out: list[GraphNode] = []
    edges: list[tuple[int, int]] = []
    for index, rec in enumerate(nodes):
        edges.extend((dep, index) for dep in sorted(set(rec.deps)))
        out.append(dataclasses.replace(rec.node, id=index, forward_id=rec.forward_ref))
    return IterationGraph(
        model=model,
        strategy=strategy,
        optimizer=optimizer,
        params=tuple(params),
        nodes=tuple(out),
        edges=tuple(edges),
        env=dict(env),
    )


def with_strategy(
    graph: IterationGraph, strategy: Strategy, *, optimizer: Optimizer | None = None
) -> IterationGraph:
    """``graph`` under another strategy, without capturing again.

    Forward, backward and gradient-ready nodes are kept; collectives and optimizer steps are
    placed anew exactly as a capture places them, so the result equals a capture of the same
    model with ``strategy``, hash included. Micro-batches change the rank's inputs, not the
    graph: for those, start from a capture of the rank's micro-batch.

    Raises:
        InvalidStrategyError: when the strategy's buckets do not partition the gradients.
    """
    keep = [n for n in graph.nodes if n.kind in ("compute", "grad_ready")]
    position = {n.id: i for i, n in enumerate(keep)}
    preds = graph.predecessors()
    recorded = [
        PendingNode(
            node=dataclasses.replace(node, id=-1, forward_id=None),
            deps=[position[p] for p in preds[node.id]],
            forward_ref=None if node.forward_id is None else position[node.forward_id],
        )
        for node in keep
    ]
    ready = {n.param: position[n.id] for n in keep if n.kind == "grad_ready" and n.param}
    chosen: Optimizer = optimizer or ("sgd" if graph.optimizer == "sgd" else "adamw")
    return assemble(
        model=graph.model,
        strategy=strategy,
        optimizer=chosen,
        params=graph.params,
        recorded=recorded,
        ready=ready,
        env=graph.env,
    )


def _place_collectives(
    recorded: list[PendingNode],
    ready_node: Mapping[str, int],
    buckets: list[Bucket],
    strategy: Strategy,
) -> list[PendingNode]:
    """Insert each bucket's collective right after its last gradient becomes ready.

    DeAR splits it into a reduce-scatter there and an all-gather after backward (it overlaps
    with the next iteration's forward); FSDP reduce-scatters gradients. Returns nodes in the new
    order with dependencies renumbered (the ``PendingNode`` objects are updated in place).
    """
    plan = strategy.tensor_fusion
    first_op = "reduce_scatter" if plan.dear or strategy.parallel.fsdp else "all_reduce"
    launch_after: dict[int, list[PendingNode]] = {}
    for bucket in buckets:
        deps = sorted(ready_node[name] for name in bucket.params)
        launch_after.setdefault(deps[-1], []).append(_collective(first_op, bucket, deps))
    order: list[PendingNode] = []
    new_index: dict[int, int] = {}
    for old, rec in enumerate(recorded):
        new_index[old] = len(order)
        order.append(rec)
        order.extend(launch_after.get(old, []))
    for rec in order:
        rec.deps = [new_index[d] for d in rec.deps]
        if rec.forward_ref is not None:
            rec.forward_ref = new_index[rec.forward_ref]
    if plan.dear:
        scatter_index = {
            rec.node.bucket: i for i, rec in enumerate(order) if rec.node.kind == "comm"
        }
        order.extend(
            _collective("all_gather", bucket, [scatter_index[bucket.index]]) for bucket in buckets
        )
    return order


def _collective(op: str, bucket: Bucket, deps: list[int]) -> PendingNode:
    return pending(
        deps,
        kind="comm",
        phase="comm",
        op=op,
        module="",
        params=bucket.params,
        grad_bytes=bucket.grad_bytes,
        bucket=bucket.index,
    )


def _append_expert_optimizer(
    recorded: list[PendingNode],
    ready: Mapping[str, int],
    experts: frozenset[str],
    *,
    sizes: dict[str, int],
    optimizer: str,
    ep: int,
) -> None:
    """Expert parallelism: each routed-experts parameter's step over this rank's ``1 / ep`` of
    it, after backward (no data-parallel bucket carries it: the expert-data-parallel group
    reduces these gradients once backward ends)."""
    if not experts:
        return
    last_ready = max(
        i
        for i, rec in enumerate(recorded)
        if rec.node.kind == "grad_ready" and rec.node.param in experts
    )
    for name in (n for n in ready if n in experts):
        recorded.append(_optimizer_node(name, sizes[name] // ep, optimizer, [last_ready], None))


def _append_optimizer(
    recorded: list[PendingNode], buckets: list[Bucket], sizes: dict[str, int], optimizer: str
) -> None:
    """One optimizer-step node per parameter, after the collective that delivers its gradient."""
    delivering: dict[int, int] = {}
    for index, rec in enumerate(recorded):
        if rec.node.kind == "comm" and rec.node.bucket is not None:
            delivering[rec.node.bucket] = index  # the last collective of a bucket wins
    for bucket in buckets:
        for name in bucket.params:
            deps = [delivering[bucket.index]]
            recorded.append(_optimizer_node(name, sizes[name], optimizer, deps, bucket.index))


def _optimizer_node(
    name: str, nbytes: int, optimizer: str, deps: list[int], bucket: int | None
) -> PendingNode:
    flops_per_elem, reads, writes = _OPTIMIZER_COST[optimizer]
    return pending(
        deps,
        kind="optimizer",
        phase="optimizer",
        op=f"optimizer.{optimizer}",
        module=name.rpartition(".")[0],
        flops=flops_per_elem * (nbytes // 4),
        bytes_read=reads * nbytes,
        bytes_written=writes * nbytes,
        param=name,
        params=(name,),
        param_bytes=nbytes,
        grad_bytes=nbytes,
        bucket=bucket,
    )
