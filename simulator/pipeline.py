"""Replay of a pipeline-parallel iteration (GPipe and 1F1B) with its bubbles.

The stages are the executor's (:mod:`data.stages`): the model's stack of blocks cut so that the
blocks' forward FLOPs balance, read here from the graph (the FLOPs of a block's forward nodes).
Every forward and backward node of the rank's micro-batch graph belongs to one stage: a block's
nodes to the stage that holds the block, the nodes before the first block (embeddings) to the
first stage and those after the last block (head, loss) to the last; backward nodes follow the
forward node whose autograd node ran them. Later stages also run the prefix forward again (the
executor's stages run the model's own forward up to their blocks and discard it).

Each stage is one compute stream running its micro-batches in its schedule's order: GPipe runs
every forward, then every backward; 1F1B runs ``stages - stage`` forwards, then alternates one
backward and one forward, then the remaining backwards (``torch.distributed.pipelining``'s
order). A forward waits for the previous stage's forward of the same micro-batch and the
activation's transfer (the send/recv model); a backward waits for the next stage's backward and
the gradient's transfer. After its last backward each stage all-reduces its gradients over its
data-parallel group and steps its optimizer. The iteration ends when the slowest stage does;
``bubble_ms`` is the time the busiest stage's compute stream idles waiting for other stages.
"""

import dataclasses
from collections.abc import Mapping

from data.comm_model import AlphaBeta
from data.graph.format import GraphNode, IterationGraph
from data.stages import balanced_cuts
from simulator.replay import Event, ReplayResult, UnsupportedPlanError


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StageCosts:
    """One stage's work per micro-batch (ms) and what it sends and synchronises (bytes)."""

    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    activation_bytes: int
    grad_bytes: int


def stage_costs(
    graph: IterationGraph, node_ms: Mapping[int, float], blocks: tuple[str, ...], stages: int
) -> list[StageCosts]:
    """Cut ``graph``'s model into ``stages`` along ``blocks`` (module paths in order) and sum
    each stage's durations.

    Raises:
        UnsupportedPlanError: fewer blocks than stages, or a block without forward nodes.
    """
    if len(blocks) < stages:
        raise UnsupportedPlanError(
            f"{stages} pipeline stages need as many blocks; {graph.model.label} has {len(blocks)}"
        )
    block_of = _block_index(graph, blocks)
    forward = [n for n in graph.nodes if n.kind == "compute" and n.phase == "forward"]
    flops = [0.0] * len(blocks)
    for node in forward:
        if (b := block_of.get(node.id)) is not None:
            flops[b] += node.flops
    spans = balanced_cuts(flops, stages)
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
    for node in graph.nodes:
        duration = float(node_ms.get(node.id, 0.0))
        if node.kind == "compute" and node.phase == "forward":
            ms[stage[node.id]]["fwd"] += duration
        elif node.kind == "compute":
            owner = stage.get(node.forward_id) if node.forward_id is not None else None
            ms[owner if owner is not None else stages - 1]["bwd"] += duration
    param_stage = _param_stages(graph, stage, stages)
    grad_bytes = [0] * stages
    for node in graph.nodes:
        if node.kind == "grad_ready" and node.param is not None:
            grad_bytes[param_stage.get(node.param, stages - 1)] += node.grad_bytes
        elif node.kind == "optimizer" and node.param is not None:
            ms[param_stage.get(node.param, stages - 1)]["opt"] += float(node_ms.get(node.id, 0.0))
    boundary = [
        _last_output_bytes(graph, [i for i in in_blocks if stage[i] == s]) for s in range(stages)
    ]
    return [
        StageCosts(
            forward_ms=ms[s]["fwd"] + (prefix_ms if s > 0 else 0.0),
            backward_ms=ms[s]["bwd"],
            optimizer_ms=ms[s]["opt"],
            activation_bytes=boundary[s],
            grad_bytes=grad_bytes[s],
        )
        for s in range(stages)
    ]


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


def _param_stages(graph: IterationGraph, stage: Mapping[int, int], stages: int) -> dict[str, int]:
    """Each parameter's stage: the stage of the first forward node of its module."""
    first_stage: dict[str, int] = {}
    for node in graph.nodes:
        if node.id in stage:
            first_stage.setdefault(node.module, stage[node.id])
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


def schedule_order(
    schedule: str, stage: int, stages: int, micro_batches: int
) -> list[tuple[str, int]]:
    """The (``"F"``/``"B"``, micro-batch) order one stage runs.

    Raises:
        UnsupportedPlanError: a schedule other than ``gpipe`` and ``1f1b``.
    """
    forwards = [("F", m) for m in range(micro_batches)]
    backwards = [("B", m) for m in range(micro_batches)]
    if schedule == "gpipe":
        return forwards + backwards
    if schedule != "1f1b":
        raise UnsupportedPlanError(
            f"the replay schedules pipelines with gpipe and 1f1b; pp_schedule {schedule!r} is "
            "not supported yet"
        )
    warmup = min(micro_batches, stages - stage)
    order = forwards[:warmup]
    f, b = warmup, 0
    while b < micro_batches:
        order.append(backwards[b])
        b += 1
        if f < micro_batches:
            order.append(forwards[f])
            f += 1
    return order


def replay_pipeline(
    costs: list[StageCosts],
    *,
    schedule: str,
    micro_batches: int,
    p2p: AlphaBeta,
    all_reduce: AlphaBeta,
) -> ReplayResult:
    """Schedule one iteration of the stages' micro-batches (see the module docstring).

    Args:
        p2p: one transfer between neighbouring stages (the send/recv fit).
        all_reduce: the data-parallel group's all-reduce (``world_size`` 1: none).
    """
    stages = len(costs)
    orders = [schedule_order(schedule, s, stages, micro_batches) for s in range(stages)]
    end: dict[tuple[str, int, int], float] = {}
    free = [0.0] * stages
    position = [0] * stages
    events: list[Event] = []
    busy = [0.0] * stages
    # Round-robin over stages, each running its next op once its inputs have arrived.
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(stages):
            if position[s] == len(orders[s]):
                continue
            kind, m = orders[s][position[s]]
            ready = _ready(kind, s, m=m, stages=stages, end=end, costs=costs, p2p=p2p)
            if ready is None:
                continue
            start = max(free[s], ready)
            duration = costs[s].forward_ms if kind == "F" else costs[s].backward_ms
            end[(kind, s, m)] = start + duration
            free[s] = start + duration
            busy[s] += duration
            label = f"stage {s} {'forward' if kind == 'F' else 'backward'} {m}"
            events.append(_event(s, m, label, start=start, end=start + duration))
            position[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise UnsupportedPlanError("pipeline schedule deadlocked (inconsistent order)")
    finish = []
    comm_total = 0.0
    for s in range(stages):
        sync_ms = all_reduce.time_us(costs[s].grad_bytes) / 1e3
        comm_total += sync_ms
        step_start = free[s] + sync_ms
        finish.append(step_start + costs[s].optimizer_ms)
        busy[s] += costs[s].optimizer_ms
        sync = f"stage {s} gradient all-reduce"
        events.append(_event(s, -1, sync, start=free[s], end=step_start, stream="comm"))
        events.append(_event(s, -1, f"stage {s} optimizer", start=step_start, end=finish[-1]))
    iteration = max(finish)
    critical = max(range(stages), key=lambda s: busy[s])
    sync_critical = all_reduce.time_us(costs[critical].grad_bytes) / 1e3
    return ReplayResult(
        iteration_time_ms=iteration,
        compute_ms=busy[critical],
        exposed_comm_ms=sync_critical,
        comm_ms=comm_total,
        bubble_ms=max(0.0, iteration - busy[critical] - sync_critical),
        timeline=tuple(sorted(events, key=lambda e: (e.start_ms, e.stream))),
    )


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
