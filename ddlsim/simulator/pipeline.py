"""Replay of a pipeline-parallel iteration (GPipe, 1F1B, eager 1F1B, interleaved 1F1B) with its
bubbles.

The stages are the executor's (:mod:`plans.stages`): the model's stack of blocks cut so that the
blocks' forward FLOPs balance, read here from the graph (the FLOPs of a block's forward nodes).
Every forward and backward node of the rank's micro-batch graph belongs to one stage: a block's
nodes to the stage that holds the block, the nodes before the first block (embeddings) to the
first stage and those after the last block (head, loss) to the last; backward nodes follow the
forward node whose autograd node ran them. Later stages also run the prefix forward again (the
executor's stages run the model's own forward up to their blocks and discard it).

Each rank is one compute stream running its stages' micro-batches in its schedule's order:
GPipe runs every forward, then every backward; 1F1B runs ``stages - stage`` forwards, then
alternates one backward and one forward, then the remaining backwards; eager 1F1B warms up with
``2 * (stages - stage) - 1`` forwards instead (:func:`plans.stages.warmup_forwards`); interleaved
1F1B gives each rank two stages (``s`` and ``s + pp``) and orders them as
:func:`.pipeline_orders.interleaved_order` says (the executor's orders:
``torch.distributed.pipelining``'s, and eager 1F1B's on its runtime). A forward waits for the
previous stage's forward of the same micro-batch and the activation's transfer (the send/recv
model); a backward waits for the next stage's backward and the gradient's transfer. After its last
backward each rank all-reduces its stages' gradients over its data-parallel group and steps
its optimizer. The iteration ends when the slowest rank does; ``bubble_ms`` is the time the
busiest rank's compute stream idles waiting for others.
"""

import dataclasses
from collections.abc import Mapping

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import GraphNode, IterationGraph
from ddlsim.plans.stages import balanced_cuts
from ddlsim.simulator.pipeline_orders import rank_orders
from ddlsim.simulator.timeline import Event, ReplayResult, UnsupportedPlanError


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StageCosts:
    """One stage's work per micro-batch (ms) and what it sends and synchronises (bytes)."""

    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    activation_bytes: int
    grad_bytes: int
    # Parameters held by several modules (tied embeddings) that this stage uses: their names
    # and gradient bytes.
    tied: tuple[tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TensorStage:
    """How a ``tp`` stage (``ParallelPlan.stages``) changes its costs: it runs ``ranks`` times
    the rank's micro-batch, its ``sharded`` nodes (and their backward) split ``ranks`` ways and
    the others whole; ``split_params`` are stepped ``1 / ranks`` and not all-reduced;
    ``forward_extra_ms`` and ``backward_extra_ms`` (its tensor-parallel collectives and the
    resharding of its output, a micro-batch) are added to its compute."""

    ranks: int
    sharded: frozenset[int]
    split_params: frozenset[str]
    forward_extra_ms: float
    backward_extra_ms: float


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ShardedStages:
    """FSDP beside the pipeline, as the executor runs it (ZeRO-2 style): each stage's
    parameters sharded over its ``dp`` ranks, gathered as its first forward of the step runs
    (``first_bytes``, the model's other parameters and the first block's, before it can start;
    ``rest_bytes``, its other blocks', each prefetched beside the block before it) and kept
    gathered through every micro-batch; its gradients reduce-scattered once, after its last
    backward (``reduce_bytes``), and the optimizer stepping ``1 / dp`` of them. ``hooks_ms``
    is FSDP's own work a stage and step (the measured runtime costs), half before the first
    forward and half after the last backward."""

    all_gather: AlphaBeta
    reduce_scatter: AlphaBeta
    dp: int
    first_bytes: tuple[int, ...]
    rest_bytes: tuple[int, ...]
    reduce_bytes: tuple[int, ...]
    hooks_ms: tuple[float, ...]

    def first_forward_extra_ms(self, stage: int, forward_ms: float) -> float:
        """What the stage's first forward of the step adds: the first gather, exposed, and the
        rest where it outlasts the forward it is prefetched beside."""
        first = self.all_gather.time_us(self.first_bytes[stage]) / 1e3
        rest = (
            self.all_gather.time_us(self.rest_bytes[stage]) / 1e3 if self.rest_bytes[stage] else 0
        )
        return first + max(0.0, rest - forward_ms) + self.hooks_ms[stage] / 2

    def reduce_ms(self, stage: int) -> float:
        return (
            self.reduce_scatter.time_us(self.reduce_bytes[stage]) / 1e3 + self.hooks_ms[stage] / 2
        )


def stage_spans(
    graph: IterationGraph, blocks: tuple[str, ...], stages: int
) -> list[tuple[int, int]]:
    """The blocks each stage holds (``[start, end)`` into ``blocks``), cut as the executor cuts
    them: their forward FLOPs balanced.

    Raises:
        UnsupportedPlanError: fewer blocks than stages.
    """
    if len(blocks) < stages:
        raise UnsupportedPlanError(
            f"{stages} pipeline stages need as many blocks; {graph.model.label} has {len(blocks)}"
        )
    block_of = _block_index(graph, blocks)
    flops = [0.0] * len(blocks)
    for node in graph.nodes:
        forward = node.kind == "compute" and node.phase == "forward"
        if forward and (b := block_of.get(node.id)) is not None:
            flops[b] += node.flops
    return balanced_cuts(flops, stages)


def stage_costs(
    graph: IterationGraph,
    node_ms: Mapping[int, float],
    blocks: tuple[str, ...],
    stages: int,
    tied: Mapping[str, tuple[str, ...]] | None = None,
    *,
    tensor: Mapping[int, TensorStage] | None = None,
) -> list[StageCosts]:
    """Cut ``graph``'s model into ``stages`` along ``blocks`` (module paths in order) and sum
    each stage's durations.

    ``tied`` names the parameters held by several modules (:func:`plans.stages.tied_parameters`):
    every stage that runs one of those modules uses the parameter, gets a gradient for it and
    steps it. ``tensor`` gives the ``tp`` stages' changes by stage index.

    Raises:
        UnsupportedPlanError: fewer blocks than stages, or a block without forward nodes.

    Long: the cut, the stages' sums and the tied parameters' shares come from one pass over the
    graph's nodes.
    """
    tensor = tensor or {}
    spans = stage_spans(graph, blocks, stages)
    block_of = _block_index(graph, blocks)
    forward = [n for n in graph.nodes if n.kind == "compute" and n.phase == "forward"]
    stage_of_block = {b: s for s, (lo, hi) in enumerate(spans) for b in range(lo, hi)}
    in_blocks = [n.id for n in forward if n.id in block_of]
    if not in_blocks:
        raise UnsupportedPlanError(f"no forward op of {graph.model.label} lies in its blocks")
    first = min(in_blocks)
    stage: dict[int, int] = {}
    for node in forward:
        if node.id in block_of:
            stage[node.id] = stage_of_block[block_of[node.id]]
        else:
            stage[node.id] = 0 if node.id < first else stages - 1
    ms = [{"fwd": 0.0, "bwd": 0.0, "opt": 0.0} for _ in range(stages)]
    prefix_ms = sum(float(node_ms.get(n.id, 0.0)) for n in forward if n.id < first)

    def scaled(node: GraphNode, owner: int, key: int) -> float:
        duration = float(node_ms.get(node.id, 0.0))
        split = tensor.get(owner)
        if split is None:
            return duration
        # ranks x the samples; the sharded ops split ranks ways, the others whole
        return duration if key in split.sharded else duration * split.ranks

    for node in graph.nodes:
        if node.kind == "compute" and node.phase == "forward":
            ms[stage[node.id]]["fwd"] += scaled(node, stage[node.id], node.id)
        elif node.kind == "compute":
            owner = stage.get(node.forward_id) if node.forward_id is not None else None
            owner = owner if owner is not None else stages - 1
            ms[owner]["bwd"] += scaled(node, owner, node.forward_id or node.id)
    for index, split in tensor.items():
        ms[index]["fwd"] += split.forward_extra_ms
        ms[index]["bwd"] += split.backward_extra_ms
    module_stage = _module_stages(graph, stage)
    param_stage = _param_stages(graph, module_stage, stages)
    grad_bytes = [0] * stages
    for node in graph.nodes:
        owner = param_stage.get(node.param, stages - 1) if node.param is not None else None
        held = tensor.get(owner) if owner is not None else None
        shards = held.ranks if held is not None and node.param in held.split_params else 1
        if node.kind == "grad_ready" and owner is not None and shards == 1:
            grad_bytes[owner] += node.grad_bytes  # a split stage's shards are not all-reduced
        elif node.kind == "optimizer" and owner is not None:
            ms[owner]["opt"] += float(node_ms.get(node.id, 0.0)) / shards
    boundary = [
        _last_output_bytes(graph, [i for i in in_blocks if stage[i] == s]) for s in range(stages)
    ]
    shared: list[list[tuple[str, int]]] = [[] for _ in range(stages)]
    nbytes = {p.name: p.nbytes for p in graph.params}
    step_ms = {
        n.param: float(node_ms.get(n.id, 0.0))
        for n in graph.nodes
        if n.kind == "optimizer" and n.param is not None
    }
    for name, modules in (tied or {}).items():
        if name not in nbytes:
            continue
        users = {
            s
            for module in modules
            for m, s in module_stage.items()
            if m == module or m.startswith(f"{module}.")
        }
        own = param_stage.get(name, stages - 1)
        for s in sorted(users | {own}):
            shared[s].append((name, nbytes[name]))
            if s != own:  # the own stage's step is counted with its parameters
                ms[s]["opt"] += step_ms.get(name, 0.0)
    return [
        StageCosts(
            # later stages rerun the prefix, a tp stage on its ranks' samples together
            forward_ms=ms[s]["fwd"]
            + (prefix_ms * (tensor[s].ranks if s in tensor else 1) if s > 0 else 0.0),
            backward_ms=ms[s]["bwd"],
            optimizer_ms=ms[s]["opt"],
            activation_bytes=boundary[s],
            grad_bytes=grad_bytes[s],
            tied=tuple(shared[s]),
        )
        for s in range(stages)
    ]


def _module_stages(graph: IterationGraph, stage: Mapping[int, int]) -> dict[str, int]:
    """Each module's stages' first: the stage of the module's first forward node."""
    out: dict[str, int] = {}
    for node in graph.nodes:
        if node.id in stage:
            out.setdefault(node.module, stage[node.id])
    return out


def _block_index(graph: IterationGraph, blocks: tuple[str, ...]) -> dict[int, int]:
    index = {path: i for i, path in enumerate(blocks)}
    out = {}
    for node in graph.nodes:
        if node.kind != "compute":
            continue
        for path, i in index.items():
            if node.module == path or node.module.startswith(f"{path}."):
                out[node.id] = i
                break
    return out


def _param_stages(
    graph: IterationGraph, first_stage: Mapping[str, int], stages: int
) -> dict[str, int]:
    """Each parameter's stage: the stage of its module's first forward node (``first_stage``,
    :func:`_module_stages`)."""
    out = {}
    for param in graph.params:
        found = [
            s
            for m, s in first_stage.items()
            if m == param.module or m.startswith(f"{param.module}.")
        ]
        out[param.name] = min(found) if found else stages - 1
    return out


def _last_output_bytes(graph: IterationGraph, ids: list[int]) -> int:
    """The bytes of the hidden state a stage hands on: the output of its last forward op."""
    if not ids:
        return 0
    node: GraphNode = graph.nodes[max(ids)]
    return sum(t.nbytes for t in node.outputs[:1])


def replay_pipeline(
    costs: list[StageCosts],
    *,
    schedule: str,
    micro_batches: int,
    p2p: AlphaBeta,
    all_reduce: AlphaBeta,
    ranks: int | None = None,
    tied_all_reduce: AlphaBeta | None = None,
    sharded: ShardedStages | None = None,
) -> ReplayResult:
    """Schedule one iteration of the stages' micro-batches (see the module docstring).

    Args:
        costs: every stage's costs, in pipeline order (``ranks * 2`` of them for interleaved
            1F1B: stage ``s`` runs on rank ``s % ranks``).
        p2p: one transfer between neighbouring stages (the send/recv fit).
        all_reduce: the data-parallel group's all-reduce (``world_size`` 1: none).
        ranks: pipeline ranks (default: one a stage).
        tied_all_reduce: the pipeline group's all-reduce, which sums the gradients of
            parameters used on several ranks (tied embeddings) once every rank's backward is
            done, before the data-parallel all-reduce; ``None``: those are not priced.
        sharded: FSDP beside the pipeline (:class:`ShardedStages`): the stages' gathers in
            their first forward, their reduce-scatters in place of the all-reduce, the
            optimizer over a shard.

    Long: one list-scheduling loop over the ranks' orders whose stage clocks and transfers every
    step shares.
    """
    stages = len(costs)
    ranks = ranks or stages
    orders = rank_orders(schedule, ranks, stages, micro_batches)
    end: dict[tuple[str, int, int], float] = {}
    free = [0.0] * ranks
    position = [0] * ranks
    events: list[Event] = []
    busy = [0.0] * ranks
    # Round-robin over ranks, each running its next op once its inputs have arrived.
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(ranks):
            if position[r] == len(orders[r]):
                continue
            kind, s, m = orders[r][position[r]]
            ready = _ready(kind, s, m=m, stages=stages, end=end, costs=costs, p2p=p2p)
            if ready is None:
                continue
            start = max(free[r], ready)
            duration = costs[s].forward_ms if kind == "F" else costs[s].backward_ms
            if sharded is not None and kind == "F" and m == 0:
                duration += sharded.first_forward_extra_ms(s, costs[s].forward_ms)
            end[(kind, s, m)] = start + duration
            free[r] = start + duration
            busy[r] += duration
            label = f"stage {s} {'forward' if kind == 'F' else 'backward'} {m}"
            events.append(_event(r, m, label, start=start, end=start + duration))
            position[r] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise UnsupportedPlanError("pipeline schedule deadlocked (inconsistent order)")
    finish = []
    comm_total = 0.0
    synced = []
    tied_bytes = _tied_bytes(costs, ranks)
    tied_ms = 0.0
    if tied_bytes and tied_all_reduce is not None:
        # Every pipeline rank joins the sum, so it starts when the last backward ends; sharded,
        # each rank sums its shard.
        tied_ms = tied_all_reduce.time_us(tied_bytes // (sharded.dp if sharded else 1)) / 1e3
        last = max(free)
        for r in range(ranks):
            name = f"rank {r} tied gradient all-reduce"
            events.append(_event(r, -1, name, start=free[r], end=last + tied_ms, stream="comm"))
        free = [last + tied_ms] * ranks
    for r in range(ranks):
        own = range(r, stages, ranks)
        if sharded is not None:
            sync_ms = sum(sharded.reduce_ms(s) for s in own)
        else:
            sync_ms = all_reduce.time_us(sum(costs[s].grad_bytes for s in own)) / 1e3
        synced.append(sync_ms + tied_ms)
        comm_total += sync_ms + tied_ms
        step_start = free[r] + sync_ms
        optimizer_ms = sum(costs[s].optimizer_ms for s in own) / (sharded.dp if sharded else 1)
        finish.append(step_start + optimizer_ms)
        busy[r] += optimizer_ms
        sync = f"rank {r} gradient {'reduce-scatter' if sharded else 'all-reduce'}"
        events.append(_event(r, -1, sync, start=free[r], end=step_start, stream="comm"))
        events.append(_event(r, -1, f"rank {r} optimizer", start=step_start, end=finish[-1]))
    iteration = max(finish)
    critical = max(range(ranks), key=lambda r: busy[r])
    return ReplayResult(
        iteration_time_ms=iteration,
        compute_ms=busy[critical],
        exposed_comm_ms=synced[critical],
        comm_ms=comm_total,
        bubble_ms=max(0.0, iteration - busy[critical] - synced[critical]),
        timeline=tuple(sorted(events, key=lambda e: (e.start_ms, e.stream))),
    )


def _tied_bytes(costs: list[StageCosts], ranks: int) -> int:
    """The bytes of the gradients the pipeline group sums: tied parameters used by stages on
    more than one rank (two stages of one rank share the module, and its gradient)."""
    users: dict[str, set[int]] = {}
    nbytes: dict[str, int] = {}
    for s, cost in enumerate(costs):
        for name, size in cost.tied:
            users.setdefault(name, set()).add(s % ranks)
            nbytes[name] = size
    return sum(nbytes[name] for name, on in users.items() if len(on) > 1)


def _ready(
    kind: str,
    s: int,
    *,
    m: int,
    stages: int,
    end: Mapping[tuple[str, int, int], float],
    costs: list[StageCosts],
    p2p: AlphaBeta,
) -> float | None:
    """When op (kind, stage, micro-batch) has its inputs, or ``None`` if not yet known."""
    if kind == "F":
        if s == 0:
            return 0.0
        upstream = end.get(("F", s - 1, m))
        return (
            None
            if upstream is None
            else upstream + p2p.time_us(costs[s - 1].activation_bytes) / 1e3
        )
    own = end.get(("F", s, m))
    if own is None:
        return None
    if s == stages - 1:
        return own
    downstream = end.get(("B", s + 1, m))
    if downstream is None:
        return None
    return max(own, downstream + p2p.time_us(costs[s].activation_bytes) / 1e3)


def _event(
    s: int, m: int, name: str, *, start: float, end: float, stream: str = "compute"
) -> Event:
    return Event(
        node=-1,
        iteration=0,
        micro_batch=m,
        stream=f"{stream} {s}" if stream == "comm" else f"compute {s}",
        name=name,
        start_ms=start,
        end_ms=end,
    )
