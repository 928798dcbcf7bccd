"""Replay of an FSDP2 iteration: parameters all-gathered per group, gradients reduce-scattered.

As the executor applies it (``fully_shard`` per group, then the root with what is left), every
group's parameters are all-gathered before its forward and, resharded after forward, again
before its backward; its gradients are reduce-scattered after its backward. The root keeps its
parameters (embeddings, head) gathered from its forward to the end of backward. FSDP2 prefetches
one group ahead: the next group's all-gather is issued when the current group starts computing,
so it overlaps that group's compute; reduce-scatters are issued when a group's backward ends and
overlap the backward of the groups before it. Collectives run in issue order on one
communication stream; compute waits only for the all-gather of the group it is about to run.
With gradient accumulation the all-gathers repeat every micro-batch and only the last one
reduce-scatters. The optimizer then updates this rank's shard: ``1 / dp`` of each step.
"""

from collections.abc import Mapping, Sequence

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import IterationGraph
from ddlsim.simulator.cpu_load import CpuLoad
from ddlsim.simulator.runtime import RuntimeCosts
from ddlsim.simulator.timeline import Event, ReplayResult

ROOT = -1


def group_of_nodes(graph: IterationGraph, groups: Sequence[Sequence[str]]) -> dict[int, int]:
    """The FSDP group (index into ``groups``, :data:`ROOT` for the root) of every compute node:
    the group of its module; a backward node's, that of the forward node it belongs to."""
    paths = [(path, i) for i, group in enumerate(groups) for path in group]

    def of_module(module: str) -> int:
        for path, i in paths:
            if module == path or module.startswith(f"{path}."):
                return i
        return ROOT

    out: dict[int, int] = {}
    for node in graph.nodes:
        if node.kind != "compute":
            continue
        if node.phase == "backward" and node.forward_id is not None and node.forward_id in out:
            out[node.id] = out[node.forward_id]
        else:
            out[node.id] = of_module(node.module)
    return out


def _group_bytes(graph: IterationGraph, groups: Sequence[Sequence[str]]) -> dict[int, int]:
    paths = [(path, i) for i, group in enumerate(groups) for path in group]
    out: dict[int, int] = {}
    for param in graph.params:
        owner = next(
            (
                i
                for path, i in paths
                if param.module == path or param.module.startswith(f"{path}.")
            ),
            ROOT,
        )
        out[owner] = out.get(owner, 0) + param.nbytes
    return out


def replay_fsdp(
    graph: IterationGraph,
    node_ms: Mapping[int, float],
    groups: Sequence[Sequence[str]],
    *,
    all_gather: AlphaBeta,
    reduce_scatter: AlphaBeta,
    dp: int,
    micro_batches: int = 1,
    runtime: RuntimeCosts | None = None,
) -> ReplayResult:
    """One FSDP iteration of ``graph`` (the rank's micro-batch) on ``dp`` ranks; ``runtime``'s
    FSDP costs (per group and per byte of its parameters) are charged half as each group
    starts its forward, half as it starts its backward, and per parameter to the optimizer.

    Long: one list-scheduling loop over the groups' gathers, compute and reduce-scatters whose
    streams every step shares.
    """
    costs = runtime or RuntimeCosts()
    member = group_of_nodes(graph, groups)
    nbytes = _group_bytes(graph, groups)
    compute = [n for n in graph.nodes if n.kind == "compute"]
    clock = 0.0  # compute stream
    comm_free = 0.0
    events: list[Event] = []
    busy = 0.0
    comm_busy = 0.0
    load = CpuLoad()

    def collective(op: AlphaBeta, group: int, issued: float, label: str) -> float:
        nonlocal comm_free, comm_busy
        start = max(comm_free, issued)
        comm_free = start + op.time_us(nbytes.get(group, 0)) / 1e3
        load.add(start, comm_free, op.cpu_us(nbytes.get(group, 0)) / 1e3)
        comm_busy += comm_free - start
        events.append(Event.span("comm", label, start, comm_free))
        return comm_free

    scatter_end = 0.0
    scattered: set[int] = set()
    for mb in range(micro_batches):
        last = mb == micro_batches - 1
        gathered: dict[tuple[str, int], float] = {}
        for phase in ("forward", "backward"):
            nodes = [n for n in compute if n.phase == phase]
            order = list(dict.fromkeys(member[n.id] for n in nodes))
            # The root is gathered once per micro-batch, before its forward, and kept.
            needs = [g for g in order if g != ROOT or phase == "forward"]
            issued = clock
            pending = list(needs)
            if pending:
                g = pending.pop(0)
                gathered[(phase, g)] = collective(all_gather, g, issued, f"all_gather {g}")
            current = None
            charged: set[int] = set()  # the groups whose FSDP cost this phase has paid
            for i, node in enumerate(nodes):
                g = member[node.id]
                if g != current:
                    current = g
                    if (phase, g) in gathered:
                        clock = max(clock, gathered[(phase, g)])
                    # FSDP's hooks, copies and reshard for this group: half each phase, once
                    # (the root's nodes come in several runs: around the blocks, before and after)
                    group_ms = (
                        (costs.fsdp_us_per_group + costs.fsdp_us_per_byte * nbytes.get(g, 0)) / 2e3
                        if g not in charged
                        else 0.0
                    )
                    charged.add(g)
                    if group_ms > 0:
                        end = load.finish(clock, group_ms)
                        events.append(Event.span("compute", f"fsdp group {g}", clock, end))
                        busy += end - clock
                        clock = end
                    # prefetch the next group as this one starts
                    if pending:
                        nxt = pending.pop(0)
                        gathered[(phase, nxt)] = collective(
                            all_gather, nxt, clock, f"all_gather {nxt}"
                        )
                end = load.finish(clock, float(node_ms.get(node.id, 0.0)))
                events.append(Event.span("compute", node.op, clock, end))
                busy += end - clock
                clock = end
                ends_group = i + 1 == len(nodes) or member[nodes[i + 1].id] != g
                if phase == "backward" and last and ends_group and g not in scattered | {ROOT}:
                    scattered.add(g)
                    scatter_end = collective(reduce_scatter, g, clock, f"reduce_scatter {g}")
        if last:
            scatter_end = collective(reduce_scatter, ROOT, clock, "reduce_scatter root")
    step = max(clock, scatter_end)
    optimizer_ms = (
        sum(float(node_ms.get(n.id, 0.0)) for n in graph.nodes if n.kind == "optimizer")
        / max(dp, 1)
        + costs.fsdp_step_us_per_param * len(graph.params) / 1e3
    )
    events.append(Event.span("compute", "optimizer (shard)", step, step + optimizer_ms))
    iteration = step + optimizer_ms
    compute_ms = busy + optimizer_ms
    return ReplayResult.overlapped(
        iteration_time_ms=iteration, compute_ms=compute_ms, comm_ms=comm_busy, events=events
    )
