"""Replay of a tensor-parallel iteration (Megatron-style, as the executor splits the model).

A family's plan (:mod:`data.tp_plans`) makes some linear layers column-parallel and others
row-parallel. Everything a forward pass runs from a column-parallel layer up to the next
row-parallel one works on a ``1 / tp`` slice (whole heads of the attention, a slice of the MLP's
width), and so does each split layer and its backward: those ops take ``1 / tp`` of their
profiled time. Norms, residual additions and replicated heads keep theirs. The split costs
blocking collectives over the ``tp`` ranks: the output of every row-parallel layer (and of a
vocabulary-split embedding) is all-reduced in forward; the input gradient of every
column-parallel layer (and of the vocabulary-split LM head) is all-reduced in backward; the LM
head's logits are all-gathered in forward. Hidden states are the size of a row-parallel
layer's output, read from the graph. With ``dp > 1`` each rank's gradient shard (``1 / tp``)
is then all-reduced over its data-parallel group in one flat collective, and the optimizer
steps the shard.
"""

from collections.abc import Mapping

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import GraphNode, IterationGraph
from ddlsim.data.tp_plans import TensorParallelPlan, matches
from ddlsim.simulator.replay import Event, ReplayResult
from ddlsim.simulator.runtime import RuntimeCosts


def _style(plan: TensorParallelPlan, module: str) -> tuple[str, str] | None:
    """The split module ``module`` lies in (its path and style), or ``None``."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        path = ".".join(parts[:end])
        for pattern, style in plan.modules.items():
            if matches(pattern, path):
                return path, style
    return None


def _bytes(node: GraphNode) -> int:
    return sum(t.nbytes for t in node.outputs[:1])


def sharded_nodes(graph: IterationGraph, plan: TensorParallelPlan) -> set[int]:
    """Compute nodes that run on a ``1 / tp`` slice: the split layers' own ops and, in forward
    program order, everything from a column-parallel layer to the next row-parallel one
    (backward nodes follow their forward node)."""
    sharded: set[int] = set()
    inside = False
    for node in graph.nodes:
        if node.kind != "compute" or node.phase != "forward":
            continue
        found = _style(plan, node.module)
        style = found[1] if found else None
        if style in ("colwise", "head_embedding"):
            inside = True
        if style is not None or inside:
            sharded.add(node.id)
        if style == "rowwise":
            inside = False
    for node in graph.nodes:
        if node.kind == "compute" and node.phase == "backward" and node.forward_id in sharded:
            sharded.add(node.id)
    return sharded


def replay_tensor_parallel(
    graph: IterationGraph,
    node_ms: Mapping[int, float],
    plan: TensorParallelPlan,
    *,
    tp: int,
    dp: int,
    tp_all_reduce: AlphaBeta,
    tp_all_gather: AlphaBeta,
    dp_all_reduce: AlphaBeta,
    micro_batches: int = 1,
    runtime: RuntimeCosts | None = None,
) -> ReplayResult:
    """One iteration of ``graph`` (the rank's micro-batch, unsplit) split ``tp`` ways;
    ``runtime``'s DTensor costs are charged per split module each micro-batch (half as its
    forward ends, half as its backward does) and per split parameter to the optimizer."""
    costs = runtime or RuntimeCosts()
    module_ms = costs.tp_us_per_module / 2 / 1e3
    sharded = sharded_nodes(graph, plan)
    module_of: dict[int, tuple[str, str]] = {}
    for node in graph.nodes:
        if node.kind == "compute" and (found := _style(plan, node.module)) is not None:
            module_of[node.id] = found
    # Each split module's last forward node carries its output; its last backward node ends the
    # computation of its input gradient.
    last_forward: dict[str, GraphNode] = {}
    last_backward: dict[str, int] = {}
    for node in graph.nodes:
        if node.kind != "compute":
            continue
        if node.phase == "forward" and node.id in module_of:
            last_forward[module_of[node.id][0]] = node
        elif node.forward_id is not None and node.forward_id in module_of:
            last_backward[module_of[node.forward_id][0]] = node.id
    style_of = {path: style for path, style in module_of.values()}
    hidden = max(
        (_bytes(n) for path, n in last_forward.items() if style_of[path] == "rowwise"),
        default=0,
    )
    after: dict[int, list[tuple[str, float]]] = {}  # node id -> collectives it is followed by
    for path, node in last_forward.items():
        style = style_of[path]
        if style in ("rowwise", "vocab_embedding"):
            after.setdefault(node.id, []).append(
                (f"all_reduce {path}", tp_all_reduce.time_us(_bytes(node)) / 1e3)
            )
        elif style == "vocab_head":
            after.setdefault(node.id, []).append(
                (f"all_gather {path}", tp_all_gather.time_us(_bytes(node)) / 1e3)
            )
    for path, node_id in last_backward.items():
        if style_of[path] in ("colwise", "vocab_head"):
            after.setdefault(node_id, []).append(
                (f"all_reduce grad {path}", tp_all_reduce.time_us(hidden) / 1e3)
            )
    ends_module = {n.id for n in last_forward.values()} | set(last_backward.values())
    events: list[Event] = []
    clock = compute = comm = 0.0
    for _ in range(micro_batches):
        for node in graph.nodes:
            if node.kind != "compute":
                continue
            ms = float(node_ms.get(node.id, 0.0)) / (tp if node.id in sharded else 1)
            if node.id in ends_module:
                ms += module_ms
            events.append(Event.span("compute", node.op, clock, clock + ms))
            clock += ms
            compute += ms
            for label, comm_ms in after.get(node.id, []):
                events.append(Event.span("comm", label, clock, clock + comm_ms))
                clock += comm_ms
                comm += comm_ms
    sync = dp_all_reduce.time_us(graph.grad_bytes // tp) / 1e3 if dp > 1 else 0.0
    if sync:
        events.append(Event.span("comm", "data-parallel all_reduce", clock, clock + sync))
    clock += sync
    split_params = sum(1 for p in graph.params if p.module in style_of)
    optimizer = (
        sum(float(node_ms.get(n.id, 0.0)) for n in graph.nodes if n.kind == "optimizer") / tp
        + costs.tp_step_us_per_param * split_params / 1e3
    )
    events.append(Event.span("compute", "optimizer (shard)", clock, clock + optimizer))
    return ReplayResult(
        iteration_time_ms=clock + optimizer,
        compute_ms=compute + optimizer,
        exposed_comm_ms=comm + sync,
        comm_ms=comm + sync,
        bubble_ms=0.0,
        timeline=tuple(events),
    )
