"""Replay of a tensor-parallel iteration (Megatron-style, as the executor splits the model).

A family's plan (:mod:`plans.tp_plans`) makes some linear layers column-parallel and others
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

Per-layer placements (``parallel.layers``, ``parallel.vocab``; ``executor/tensor_parallel.py``
says how they run) change what each block costs. A ``tp`` block is split as above; a
``replicate`` block keeps its profiled time and issues nothing; a ``batch`` block takes ``1 / tp``
of its profiled time (forward and backward), and its boundaries with other layouts are boxing
conversions priced with the fitted collective model: the hidden states are all-gathered after
the last block of a run of ``batch`` blocks in forward, and their gradient before its first
block's backward ends (the slices the other way are local and free); after backward the
``batch`` blocks' gradients (partial sums over each rank's samples) are all-reduced over the
``tp`` ranks. The optimizer steps ``1 / tp`` of the split parameters and the whole of the rest
(norms, position embeddings, whatever no split module holds), and the data-parallel all-reduce
carries as much.
"""

import dataclasses
from collections.abc import Callable, Mapping

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import GraphNode, IterationGraph
from ddlsim.plans.tp_plans import TensorParallelPlan, block_of, block_paths, matches
from ddlsim.simulator.runtime import RuntimeCosts
from ddlsim.simulator.timeline import Event, ReplayResult


class Layouts:
    """Which graph nodes lie in which repeated block, and each block's layout: ``layers`` in
    block order (empty: every block ``tp``), or, given ``split_blocks``, ``tp`` for those block
    paths and ``replicate`` for the others."""

    def __init__(
        self,
        graph: IterationGraph,
        plan: TensorParallelPlan,
        layers: tuple[str, ...],
        vocab: str,
        *,
        split_blocks: set[str] | None = None,
    ) -> None:
        prefixes: dict[str, None] = {}
        for node in graph.nodes:
            parts = node.module.split(".") if node.module else []
            for end in range(1, len(parts) + 1):
                prefixes.setdefault(".".join(parts[:end]))
        self.blocks = block_paths(plan, prefixes)
        if split_blocks is not None:
            layers = tuple("tp" if b in split_blocks else "replicate" for b in self.blocks)
        self.layers = layers or ("tp",) * len(self.blocks)
        self.vocab = vocab
        self._block: dict[str, int | None] = {}

    def block(self, module: str) -> int | None:
        if module not in self._block:
            self._block[module] = block_of(self.blocks, module)
        return self._block[module]

    def layout(self, module: str) -> str | None:
        """The layout of the block that holds ``module``; ``None`` outside the blocks."""
        index = self.block(module)
        return None if index is None or index >= len(self.layers) else self.layers[index]

    def split(self, module: str, style: str) -> bool:
        """Whether a module the family's plan gives ``style`` is split."""
        if style.startswith("vocab_"):
            return self.vocab == "split"
        return self.layout(module) in (None, "tp")


def _style(
    plan: TensorParallelPlan, module: str, layouts: Layouts | None = None
) -> tuple[str, str] | None:
    """The split module ``module`` lies in (its path and style), or ``None``."""
    if layouts is not None and (found := _style(plan, module)) is not None:
        return found if layouts.split(*found) else None
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        path = ".".join(parts[:end])
        for pattern, style in plan.modules.items():
            if matches(pattern, path):
                return path, style
    return None


def _bytes(node: GraphNode) -> int:
    return sum(t.nbytes for t in node.outputs[:1])


def sharded_nodes(
    graph: IterationGraph, plan: TensorParallelPlan, layouts: Layouts | None = None
) -> set[int]:
    """Compute nodes that run on a ``1 / tp`` slice: the split layers' own ops and, in forward
    program order, everything from a column-parallel layer to the next row-parallel one, and
    every op of a ``batch`` block (backward nodes follow their forward node)."""
    sharded: set[int] = set()
    inside = False
    for node in graph.nodes:
        if node.kind != "compute" or node.phase != "forward":
            continue
        if layouts is not None and layouts.layout(node.module) == "batch":
            sharded.add(node.id)
            continue
        found = _style(plan, node.module, layouts)
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
    layers: tuple[str, ...] = (),
    vocab: str = "split",
    compute_scale: float = 1.0,
) -> ReplayResult:
    """One iteration of ``graph`` (the rank's micro-batch, unsplit) split ``tp`` ways, each
    block placed as ``layers`` says (empty: every block ``tp``); ``runtime``'s DTensor costs are
    charged per split module each micro-batch (half as its forward ends, half as its backward
    does) and per split parameter to the optimizer.

    ``compute_scale`` above 1 (ranks sharing cores, :func:`simulator.costs.compute_scale`):
    every collective here blocks its rank, and while it runs the rank's core-mates compute (the
    tensor-parallel groups drift apart between their own collectives), so the compute the
    collective needs (its fit's ``cpu_us``, measured beside it) gets ``1 / compute_scale`` of
    a core and takes ``compute_scale - 1`` times its CPU time longer than the fit, which was
    measured with a core to itself."""
    costs = runtime or RuntimeCosts()
    stretch = max(0.0, compute_scale - 1.0)

    def blocking_ms(model: AlphaBeta, nbytes: int) -> float:
        return (model.time_us(nbytes) + stretch * model.cpu_us(nbytes)) / 1e3

    layouts = Layouts(graph, plan, layers, vocab)
    ends = _ModuleEnds.of(graph, plan, layouts)
    after = _collectives_after(
        graph, layouts, ends, all_reduce_ms=lambda n: blocking_ms(tp_all_reduce, n),
        all_gather_ms=lambda n: blocking_ms(tp_all_gather, n),
    )  # fmt: skip
    line = _Line()
    sharded = sharded_nodes(graph, plan, layouts)
    ends_module = {n.id for n in ends.last_forward.values()} | set(ends.last_backward.values())
    for _ in range(micro_batches):
        line.micro_batch(
            graph,
            node_ms,
            after=after,
            ends=ends_module,
            sharded=sharded,
            tp=tp,
            module_ms=costs.tp_us_per_module / 2 / 1e3,
        )
    batch_bytes = sum(p.nbytes for p in graph.params if layouts.layout(p.module) == "batch")
    if batch_bytes:
        line.add(
            "comm", "batch blocks' gradients all_reduce", blocking_ms(tp_all_reduce, batch_bytes)
        )
    # Each rank holds 1 / tp of the split modules' parameters and the whole of the others.
    whole = sum(p.nbytes for p in graph.params if p.module not in ends.style_of)
    share = (graph.grad_bytes - whole) / tp + whole
    sync = blocking_ms(dp_all_reduce, int(share)) if dp > 1 else 0.0
    clock = line.clock
    if sync:
        line.events.append(Event.span("comm", "data-parallel all_reduce", clock, clock + sync))
    clock += sync
    split_params = sum(1 for p in graph.params if p.module in ends.style_of)
    step_ms = sum(float(node_ms.get(n.id, 0.0)) for n in graph.nodes if n.kind == "optimizer")
    optimizer = (
        step_ms * share / max(graph.grad_bytes, 1)
        + costs.tp_step_us_per_param * split_params / 1e3
    )
    line.events.append(Event.span("compute", "optimizer (shard)", clock, clock + optimizer))
    return ReplayResult(
        iteration_time_ms=clock + optimizer,
        compute_ms=line.compute + optimizer,
        exposed_comm_ms=line.comm + sync,
        comm_ms=line.comm + sync,
        bubble_ms=0.0,
        timeline=tuple(line.events),
    )


@dataclasses.dataclass
class _Line:
    """One rank's ops and blocking collectives one after the other: the events and the sums."""

    events: list[Event] = dataclasses.field(default_factory=list)
    clock: float = 0.0
    compute: float = 0.0
    comm: float = 0.0

    def micro_batch(
        self,
        graph: IterationGraph,
        node_ms: Mapping[int, float],
        *,
        after: dict[int, list[tuple[str, float]]],
        ends: set[int],
        sharded: set[int] | frozenset[int],
        tp: int,
        module_ms: float,
    ) -> None:
        """One micro-batch's compute nodes, each followed by its blocking collectives; a split
        module's DTensor cost (``module_ms``) charged to the node that ends it (``ends``)."""
        for node in graph.nodes:
            if node.kind != "compute":
                continue
            ms = float(node_ms.get(node.id, 0.0)) / (tp if node.id in sharded else 1)
            if node.id in ends:
                ms += module_ms
            self.add("compute", node.op, ms)
            for label, comm_ms in after.get(node.id, []):
                self.add("comm", label, comm_ms)

    def add(self, lane: str, label: str, ms: float) -> None:
        self.events.append(Event.span(lane, label, self.clock, self.clock + ms))
        self.clock += ms
        if lane == "compute":
            self.compute += ms
        else:
            self.comm += ms


@dataclasses.dataclass(frozen=True)
class _ModuleEnds:
    """Each split module's style, its last forward node (which carries its output) and its
    last backward node (which ends the computation of its input gradient)."""

    style_of: dict[str, str]
    last_forward: dict[str, GraphNode]
    last_backward: dict[str, int]

    @classmethod
    def of(
        cls, graph: IterationGraph, plan: TensorParallelPlan, layouts: Layouts
    ) -> "_ModuleEnds":
        module_of: dict[int, tuple[str, str]] = {}
        for node in graph.nodes:
            if (
                node.kind == "compute"
                and (found := _style(plan, node.module, layouts)) is not None
            ):
                module_of[node.id] = found
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
        return cls(style_of, last_forward, last_backward)


def _collectives_after(
    graph: IterationGraph,
    layouts: Layouts,
    ends: _ModuleEnds,
    *,
    all_reduce_ms: Callable[[int], float],
    all_gather_ms: Callable[[int], float],
) -> dict[int, list[tuple[str, float]]]:
    """The blocking collectives each node is followed by: a rowwise module's (and the split
    embedding's) all-reduce of its output, the split head's all-gather; in backward, a
    colwise module's all-reduce of its input gradient; the all-gathers where a run of batch
    blocks ends."""
    style_of = ends.style_of
    hidden = max(
        (_bytes(n) for path, n in ends.last_forward.items() if style_of[path] == "rowwise"),
        default=0,
    )
    after: dict[int, list[tuple[str, float]]] = {}
    for path, node in ends.last_forward.items():
        style = style_of[path]
        if style in ("rowwise", "vocab_embedding"):
            after.setdefault(node.id, []).append(
                (f"all_reduce {path}", all_reduce_ms(_bytes(node)))
            )
        elif style == "vocab_head":
            after.setdefault(node.id, []).append(
                (f"all_gather {path}", all_gather_ms(_bytes(node)))
            )
    for path, node_id in ends.last_backward.items():
        if style_of[path] in ("colwise", "vocab_head"):
            after.setdefault(node_id, []).append(
                (f"all_reduce grad {path}", all_reduce_ms(hidden))
            )
    for label, node_id, nbytes in _boxing(graph, layouts):
        after.setdefault(node_id, []).append((label, all_gather_ms(nbytes)))
    return after


def _boxing(graph: IterationGraph, layouts: Layouts) -> list[tuple[str, int, int]]:
    """The all-gathers at the boundaries of runs of ``batch`` blocks: ``(label, node id it
    follows, bytes)``. The hidden states leave a run after its last block's last forward node;
    their gradient enters it after its first block's last backward node."""
    last_forward: dict[int, GraphNode] = {}
    last_backward: dict[int, int] = {}
    phase_of = {n.id: n for n in graph.nodes if n.kind == "compute"}
    for node in graph.nodes:
        if node.kind != "compute":
            continue
        index = layouts.block(node.module)
        if node.phase == "forward" and index is not None:
            last_forward[index] = node
        elif node.forward_id is not None and (forward := phase_of.get(node.forward_id)):
            index = layouts.block(forward.module)
            if index is not None:
                last_backward[index] = node.id
    out: list[tuple[str, int, int]] = []
    layers = layouts.layers
    for index, layout in enumerate(layers):
        if layout != "batch":
            continue
        hidden = _bytes(last_forward[index]) if index in last_forward else 0
        if (index + 1 == len(layers) or layers[index + 1] != "batch") and index in last_forward:
            block = layouts.blocks[index]
            out.append((f"all_gather samples after {block}", last_forward[index].id, hidden))
        if (index == 0 or layers[index - 1] != "batch") and index in last_backward:
            block = layouts.blocks[index]
            out.append((f"all_gather grad samples into {block}", last_backward[index], hidden))
    return out


def split_stage(
    graph: IterationGraph,
    plan: TensorParallelPlan,
    blocks: set[str],
    *,
    ranks: int,
    tp_all_reduce: AlphaBeta,
    runtime: RuntimeCosts | None = None,
) -> tuple[frozenset[int], frozenset[str], float, float]:
    """A pipeline stage whose ``blocks`` are split over its ``ranks`` ranks, which together run
    ``ranks`` times the graph's micro-batch (``ParallelPlan.stages``): the sharded forward
    nodes, the split modules' parameter names, and the forward and backward milliseconds a
    micro-batch adds to its compute: the blocks' all-reduces (row-parallel outputs in forward,
    column-parallel input gradients in backward) on ``ranks`` times the graph's bytes, and the
    runtime's DTensor cost per split module (half as its forward ends, half as its backward
    does)."""
    costs = runtime or RuntimeCosts()
    layouts = Layouts(graph, plan, (), "replicate", split_blocks=blocks)
    sharded = frozenset(
        n for n in sharded_nodes(graph, plan, layouts) if graph.nodes[n].phase == "forward"
    )
    style_of: dict[str, str] = {}
    last_output: dict[str, GraphNode] = {}
    for node in graph.nodes:
        if node.kind == "compute" and node.phase == "forward":
            found = _style(plan, node.module, layouts)
            if found is not None:
                style_of[found[0]] = found[1]
                last_output[found[0]] = node
    hidden = max(
        (_bytes(n) for path, n in last_output.items() if style_of[path] == "rowwise"), default=0
    )
    forward = sum(
        tp_all_reduce.time_us(_bytes(last_output[path]) * ranks) / 1e3
        for path, style in style_of.items()
        if style == "rowwise"
    )
    backward = sum(
        tp_all_reduce.time_us(hidden * ranks) / 1e3
        for style in style_of.values()
        if style == "colwise"
    )
    module_ms = costs.tp_us_per_module / 2 / 1e3 * len(style_of)
    params = frozenset(p.name for p in graph.params if p.module in style_of)
    return sharded, params, forward + module_ms, backward + module_ms
