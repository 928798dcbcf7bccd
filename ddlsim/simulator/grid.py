"""Grid tensor parallelism (``ParallelPlan.grid``, ``executor/grid.py``): its replay and its
analytical model.

Both price the same collectives, listed per linear layer from its shape by
:func:`layer_collectives` (the executor's module docstring says why each is there): sizes are
nccl-tests' (an all-gather's output, a reduce-scatter's input), activations those of one depth
slice's samples. Compute comes from the kernel profile of the data-parallel rank's micro-batch:
a grid layer's ops take ``1 / (rows * cols * depth)`` of their time, the ops between a
column-parallel layer and the next row-parallel one (attention on ``1 / cols`` of the heads)
``1 / (cols * depth)``, every other op ``1 / depth`` (its samples); backward ops follow their
forward op.

- :func:`replay_grid` schedules them on a compute and a communication stream. Blocking
  collectives stop the rank (and, on ranks sharing cores, take ``compute_scale - 1`` times
  their CPU work longer, as the 1-D replay's do). With overlap, a layer's input-gradient
  all-reduce hides behind its weight gradient (half the layer's backward) and its
  weight-gradient reduce-scatter runs on the communication stream until the micro-batch's
  backward ends; their CPU work is charged to the compute stream.
- :func:`analytic_grid` is AxoNN's kind of model: the closed-form sum of every collective's
  alpha-beta time (no overlap, no schedule) and the profile's compute shares. It needs no
  timeline, so the search ranks every grid with it before the simulator scores any
  (``search/space.py``).
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import GraphNode, IterationGraph
from ddlsim.plans.grid import GridLayer
from ddlsim.plans.tp_plans import TensorParallelPlan
from ddlsim.simulator.tensor_parallel import Layouts, _style, sharded_nodes
from ddlsim.simulator.timeline import Event, ReplayResult

Axis = Literal["rows", "cols", "depth"]
# How a collective meets the compute: ``None`` blocks where it is issued; ``weight_grad`` hides
# behind the layer's weight gradient; ``stream`` runs on the communication stream until the
# micro-batch's backward ends.
Overlap = Literal["weight_grad", "stream"] | None


@dataclasses.dataclass(frozen=True, slots=True)
class GridCollective:
    """One collective a grid layer issues each micro-batch."""

    layer: str
    phase: Literal["forward", "backward"]
    kind: Literal["all_reduce", "all_gather", "reduce_scatter"]
    axis: Axis
    nbytes: int
    # Forward: before the layer's first op (its weight block) or after its last; backward: after.
    before: bool = False
    overlap: Overlap = None

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.axis} {'grad ' if self.phase == 'backward' else ''}{self.layer}"


def layer_collectives(
    layer: GridLayer,
    axes: Mapping[str, int],
    feature_bytes: int,
    *,
    weight_elem_bytes: int = 4,
    overlap: bool = True,
) -> list[GridCollective]:
    """The collectives of ``layer`` on a grid of ``axes`` each micro-batch, in issue order.

    ``feature_bytes`` is one feature of the whole data-parallel micro-batch (its tokens times
    the activation's element size); a depth slice holds ``1 / depth`` of it.
    """
    rows, cols, depth = axes["rows"], axes["cols"], axes["depth"]
    block_out, block_in = layer.block(axes)
    block = block_out * block_in * weight_elem_bytes
    slice_bytes = feature_bytes // depth
    out: list[GridCollective] = []

    def add(
        phase: Literal["forward", "backward"],
        kind: Literal["all_reduce", "all_gather", "reduce_scatter"],
        axis: Axis,
        nbytes: int,
        *,
        before: bool = False,
        hides: Overlap = None,
    ) -> None:
        if axes[axis] > 1:
            out.append(
                GridCollective(
                    layer.path, phase, kind, axis, nbytes, before, hides if overlap else None
                )
            )

    add("forward", "all_gather", "depth", block, before=True)
    if layer.style == "colwise":
        add("forward", "all_reduce", "rows", slice_bytes * block_out)
        add("backward", "all_reduce", "cols", slice_bytes * block_in, hides="weight_grad")
        add("backward", "all_gather", "rows", slice_bytes * layer.in_features)
    else:
        add("forward", "all_reduce", "cols", slice_bytes * block_out)
        add("forward", "all_gather", "rows", slice_bytes * layer.out_features)
        add("backward", "all_reduce", "rows", slice_bytes * block_in, hides="weight_grad")
    add("backward", "reduce_scatter", "depth", block, hides="stream")
    del rows, cols, depth
    return out


@dataclasses.dataclass(frozen=True)
class GridCosts:
    """What the replay and the analytical model share: each compute node's divisor, the grid
    layers' first and last nodes, their collectives, and the bytes the final averages carry.
    """

    divisor: Mapping[int, int]
    first_forward: Mapping[str, int]
    last_forward: Mapping[str, int]
    last_backward: Mapping[str, int]
    backward_nodes: Mapping[str, tuple[int, ...]]
    collectives: Mapping[str, tuple[GridCollective, ...]]
    # Bytes averaged after backward: over dp x depth (everything whole), over dp (the shards).
    whole_grad_bytes: int
    shard_grad_bytes: int

    @classmethod
    def of(
        cls,
        graph: IterationGraph,
        plan: TensorParallelPlan,
        layers: Sequence[GridLayer],
        axes: Mapping[str, int],
        *,
        overlap: bool,
    ) -> "GridCosts":
        """The grid's costs of ``graph``: each layer's forward and backward nodes, its
        collectives on the grid's axes, and the gradient bytes averaged after backward.

        Long: one pass over the grid layers that places each one's collectives and sums the
        gradient bytes.
        """
        rows, cols, depth = axes["rows"], axes["cols"], axes["depth"]
        by_path = {layer.path: layer for layer in layers}
        layouts = Layouts(graph, plan, (), "replicate")
        inside = sharded_nodes(graph, plan, layouts)
        compute = [n for n in graph.nodes if n.kind == "compute"]
        forward_of = {n.id: n for n in compute if n.phase == "forward"}
        layer_of: dict[int, str] = {}
        for node in forward_of.values():
            found = _style(plan, node.module, layouts)
            if found is not None and found[0] in by_path:
                layer_of[node.id] = found[0]
        for node in compute:
            if node.phase != "forward" and node.forward_id in layer_of:
                layer_of[node.id] = layer_of[node.forward_id]
        divisor: dict[int, int] = {}
        first_forward: dict[str, int] = {}
        last_forward: dict[str, int] = {}
        last_backward: dict[str, int] = {}
        backward_nodes: dict[str, list[int]] = {}
        outputs: dict[str, GraphNode] = {}
        for node in compute:
            path = layer_of.get(node.id)
            source = node.id if node.phase == "forward" else node.forward_id
            if path is not None:
                divisor[node.id] = rows * cols * depth
            elif source in inside:
                divisor[node.id] = cols * depth
            else:
                divisor[node.id] = depth
            if path is None:
                continue
            if node.phase == "forward":
                first_forward.setdefault(path, node.id)
                last_forward[path] = node.id
                outputs[path] = node
            else:
                last_backward[path] = node.id
                backward_nodes.setdefault(path, []).append(node.id)
        collectives: dict[str, tuple[GridCollective, ...]] = {}
        for path, node in outputs.items():
            layer = by_path[path]
            out_bytes = sum(t.nbytes for t in node.outputs[:1])
            # The node's output holds the layer's whole output features for the micro-batch.
            feature_bytes = out_bytes // max(layer.out_features, 1)
            collectives[path] = tuple(
                layer_collectives(layer, axes, feature_bytes, overlap=overlap)
            )
        weight_bytes = {
            p.name: p.nbytes
            for p in graph.params
            if p.module in by_path and p.name.endswith("weight")
        }
        shard = sum(weight_bytes.values())
        bias_bytes = sum(
            p.nbytes for p in graph.params if p.module in by_path and p.name.endswith("bias")
        )
        whole = graph.grad_bytes - shard - bias_bytes
        # A column-parallel bias holds the cols' slice, a row-parallel one the rows'.
        for p in graph.params:
            if p.module in by_path and p.name.endswith("bias"):
                split = cols if by_path[p.module].style == "colwise" else rows
                whole += p.nbytes // split
        return cls(
            divisor=divisor,
            first_forward=first_forward,
            last_forward=last_forward,
            last_backward=last_backward,
            backward_nodes={k: tuple(v) for k, v in backward_nodes.items()},
            collectives=collectives,
            whole_grad_bytes=max(whole, 0),
            shard_grad_bytes=shard // (rows * cols * depth),
        )

    def optimizer_share(self, graph: IterationGraph) -> float:
        """The fraction of the parameters' bytes one rank's optimizer steps."""
        return (self.whole_grad_bytes + self.shard_grad_bytes) / max(graph.grad_bytes, 1)


@dataclasses.dataclass(frozen=True)
class GridModels:
    """Collective models over each axis' ranks, and over the averaging groups."""

    axes: Mapping[str, Mapping[str, AlphaBeta]]  # axis -> collective -> model
    samples_all_reduce: AlphaBeta  # over dp x depth
    dp_all_reduce: AlphaBeta

    def time_ms(self, collective: GridCollective) -> float:
        return self.axes[collective.axis][collective.kind].time_us(collective.nbytes) / 1e3

    def cpu_ms(self, collective: GridCollective) -> float:
        return self.axes[collective.axis][collective.kind].cpu_us(collective.nbytes) / 1e3


def replay_grid(
    graph: IterationGraph,
    node_ms: Mapping[int, float],
    costs: GridCosts,
    models: GridModels,
    *,
    micro_batches: int = 1,
    compute_scale: float = 1.0,
) -> ReplayResult:
    """One iteration of ``graph`` (the data-parallel rank's micro-batch) on the grid.

    Long: one list-scheduling loop over the layers' compute and the grid's collectives on two
    streams, whose clocks every step shares.
    """
    stretch = max(0.0, compute_scale - 1.0)
    ends_forward = {v: k for k, v in costs.last_forward.items()}
    starts_forward = {v: k for k, v in costs.first_forward.items()}
    ends_backward = {v: k for k, v in costs.last_backward.items()}
    events: list[Event] = []
    clock = compute = comm = exposed = 0.0
    stream_free = 0.0

    def block(collective: GridCollective) -> None:
        nonlocal clock, comm, exposed
        ms = models.time_ms(collective) + stretch * models.cpu_ms(collective)
        events.append(Event.span("comm", collective.label, clock, clock + ms))
        clock += ms
        comm += ms
        exposed += ms

    def ms_of(node_id: int) -> float:
        return float(node_ms.get(node_id, 0.0)) / costs.divisor.get(node_id, 1)

    for _ in range(micro_batches):
        for node in graph.nodes:
            if node.kind != "compute":
                continue
            path = starts_forward.get(node.id)
            if path is not None:
                for c in costs.collectives.get(path, ()):
                    if c.phase == "forward" and c.before:
                        block(c)
            ms = ms_of(node.id)
            events.append(Event.span("compute", node.op, clock, clock + ms))
            clock += ms
            compute += ms
            if (path := ends_forward.get(node.id)) is not None:
                for c in costs.collectives.get(path, ()):
                    if c.phase == "forward" and not c.before:
                        block(c)
            if (path := ends_backward.get(node.id)) is None:
                continue
            weight_grad_ms = 0.5 * sum(ms_of(n) for n in costs.backward_nodes.get(path, ()))
            for c in costs.collectives.get(path, ()):
                if c.phase != "backward":
                    continue
                if c.overlap is None:
                    block(c)
                    continue
                cpu = models.cpu_ms(c) * compute_scale
                wire = models.time_ms(c)
                comm += wire
                clock += cpu
                compute += cpu
                if c.overlap == "weight_grad":
                    hidden = max(0.0, wire - weight_grad_ms - cpu)
                    events.append(Event.span("comm", c.label, clock - cpu, clock + hidden))
                    clock += hidden
                    exposed += hidden
                else:
                    start = max(stream_free, clock - cpu)
                    stream_free = start + wire
                    events.append(Event.span("comm", c.label, start, stream_free))
        if stream_free > clock:
            exposed += stream_free - clock
            clock = stream_free
    for name, model, nbytes in (
        ("all_reduce:dp_depth (whole parameters)", models.samples_all_reduce,
         costs.whole_grad_bytes),
        ("all_reduce:dp (weight shards)", models.dp_all_reduce, costs.shard_grad_bytes),
    ):  # fmt: skip
        ms = (model.time_us(nbytes) + stretch * model.cpu_us(nbytes)) / 1e3
        if ms > 0:
            events.append(Event.span("comm", name, clock, clock + ms))
            clock += ms
            comm += ms
            exposed += ms
    step_ms = sum(float(node_ms.get(n.id, 0.0)) for n in graph.nodes if n.kind == "optimizer")
    optimizer = step_ms * costs.optimizer_share(graph)
    events.append(Event.span("compute", "optimizer (shards)", clock, clock + optimizer))
    return ReplayResult(
        iteration_time_ms=clock + optimizer,
        compute_ms=compute + optimizer,
        exposed_comm_ms=exposed,
        comm_ms=comm,
        bubble_ms=0.0,
        timeline=tuple(events),
    )


def analytic_grid(
    graph: IterationGraph,
    node_ms: Mapping[int, float],
    costs: GridCosts,
    models: GridModels,
    *,
    micro_batches: int = 1,
) -> float:
    """The analytical iteration time (ms): compute shares plus every collective's alpha-beta
    time, summed (no overlap, no schedule)."""
    compute = sum(
        float(node_ms.get(n.id, 0.0)) / costs.divisor.get(n.id, 1)
        for n in graph.nodes
        if n.kind == "compute"
    )
    comm = sum(models.time_ms(c) for group in costs.collectives.values() for c in group)
    sync = (
        models.samples_all_reduce.time_us(costs.whole_grad_bytes)
        + models.dp_all_reduce.time_us(costs.shard_grad_bytes)
    ) / 1e3
    step_ms = sum(float(node_ms.get(n.id, 0.0)) for n in graph.nodes if n.kind == "optimizer")
    return (compute + comm) * micro_batches + sync + step_ms * costs.optimizer_share(graph)
