"""Profiler events attributed to graph nodes (:mod:`.kernels`' mapping and measured passes).

The mapping pass runs one iteration under a dispatch mode that wraps every op in a marker
``ddlsim#<position>``; the measured passes run without it. Their event sequences are aligned by
name (:func:`align`), so each measured event inherits the op position, and so the graph node,
of the marker that enclosed it in the mapping pass (:func:`attribute`).
"""

import difflib
from collections.abc import Iterator, Sequence

from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from ddlsim.data.graph.format import IterationGraph

MARK = "ddlsim#"
ITERATION = "ddlsim::iteration"
# Events the mapping pass adds by running a dispatch mode; the measured pass has none.
MODE_EVENTS = frozenset({"PythonDispatchMode", "PythonTLSSnapshot"})


def host_events(events: Sequence[FunctionEvent]) -> list[FunctionEvent]:
    """The host-side events of every thread in start order (outer before inner).

    Every thread, because on CUDA the autograd engine runs backward on a thread of its own
    while the training thread waits (on the CPU backward runs on the training thread). With
    CUDA the profiler also lists each ``record_function`` range a second time, as a
    device-side annotation over the kernels it launched; only the host-side one is kept.
    """
    return sorted(
        (e for e in events if e.device_type == DeviceType.CPU),
        key=lambda e: (e.time_range.start, -e.time_range.end),
    )


def _ops_between(events: list[FunctionEvent], start: float, end: float) -> list[FunctionEvent]:
    return [
        e
        for e in events
        if start <= e.time_range.start
        and e.time_range.end <= end
        and not e.name.startswith((MARK, ITERATION))
        and e.name not in MODE_EVENTS
    ]


def _is_redirect(event: FunctionEvent) -> bool:
    """The dispatcher's record of an op that the mapping mode took over: the op is recorded
    again inside the mode's marker, and the measured pass has it once."""
    return any(
        child.name in MODE_EVENTS or child.name.startswith(MARK) for child in event.cpu_children
    )


def mapping_reference(
    events: list[FunctionEvent], start: float, end: float
) -> tuple[list[str], list[int | None]]:
    """Names of the mapping pass's events in ``[start, end]`` as the measured pass will show
    them, and for each the op position of the marker enclosing it (``None`` outside ops)."""
    names: list[str] = []
    labels: list[int | None] = []
    open_markers: list[tuple[float, int]] = []
    for event in events:
        if not (start <= event.time_range.start and event.time_range.end <= end):
            continue
        while open_markers and open_markers[-1][0] <= event.time_range.start:
            open_markers.pop()
        if event.name.startswith(MARK):
            open_markers.append((event.time_range.end, int(event.name[len(MARK) :])))
            continue
        if event.name.startswith(ITERATION) or event.name in MODE_EVENTS:
            continue
        if _is_redirect(event):
            continue
        inside = open_markers and event.time_range.end <= open_markers[-1][0]
        names.append(event.name)
        labels.append(open_markers[-1][1] if inside else None)
    return names, labels


def align(reference: Sequence[str], other: Sequence[str]) -> dict[int, int]:
    """Positions in ``other`` matched to positions in ``reference`` (identical names)."""
    if list(reference) == list(other):
        return {i: i for i in range(len(other))}
    matcher = difflib.SequenceMatcher(a=list(reference), b=list(other), autojunk=False)
    mapping: dict[int, int] = {}
    for block in matcher.get_matching_blocks():
        for offset in range(block.size):
            mapping[block.b + offset] = block.a + offset
    return mapping


def iterations(events: list[FunctionEvent]) -> Iterator[tuple[float, float]]:
    for event in events:
        if event.name == ITERATION:
            yield event.time_range.start, event.time_range.end


def graph_node_of_op(graph: IterationGraph, ops: list[str]) -> dict[int, int]:
    """Graph node id of each op position seen by the mapping pass (aligned by op name)."""
    compute = graph.nodes_of("compute")
    mapping = align([n.op for n in compute], ops)
    return {position: compute[index].id for position, index in mapping.items()}


def attribute(
    mapping_events: Sequence[FunctionEvent],
    profiled: Sequence[Sequence[FunctionEvent]],
    node_of_op: dict[int, int],
    graph: IterationGraph,
    device: str,
) -> tuple[dict[int, list[float]], list[float], float]:
    """Per-node durations (ms) of each profiled iteration, the iterations' own durations, and
    the fraction of profiled events matched to the mapping pass."""
    mapped = host_events(mapping_events)
    (map_start, map_end), *_ = iterations(mapped)
    reference, labels = mapping_reference(mapped, map_start, map_end)
    optimizer_nodes = graph.nodes_of("optimizer")
    optimizer_bytes = sum(n.param_bytes for n in optimizer_nodes) or 1

    per_node: dict[int, list[float]] = {}
    iteration_ms: list[float] = []
    matched_total = 0
    seen_total = 0
    for events in profiled:
        timeline = host_events(events)
        ((start, end),) = iterations(timeline)
        ops = _ops_between(timeline, start, end)
        match = align(reference, [e.name for e in ops])
        matched_total += len(match)
        seen_total += len(ops)
        node_end: dict[int, float] = {}
        node_device: dict[int, float] = {}
        for position, event in enumerate(ops):
            ref = match.get(position)
            op = labels[ref] if ref is not None else None
            node = node_of_op.get(op) if op is not None else None
            if node is None:
                continue
            covered = node_end.get(node)
            if covered is None or event.time_range.start >= covered:  # outermost event of node
                node_device[node] = node_device.get(node, 0.0) + event.device_time_total
            node_end[node] = max(covered or 0.0, event.time_range.end)
        durations: dict[int, float] = {}
        last_end = max(node_end.values(), default=start)
        if device == "cuda":
            durations = {node: us / 1e3 for node, us in node_device.items()}
            # The optimizer step: the kernels launched after the last graph op.
            tail_ms = _outermost_device_us(ops, last_end) / 1e3
        else:
            previous = start
            for node, finished in sorted(node_end.items(), key=lambda kv: kv[1]):
                durations[node] = (finished - previous) / 1e3
                previous = finished
            tail_ms = (end - last_end) / 1e3
        for opt_node in optimizer_nodes:
            durations[opt_node.id] = tail_ms * opt_node.param_bytes / optimizer_bytes
        for node, ms in durations.items():
            per_node.setdefault(node, []).append(ms)
        iteration_ms.append((end - start) / 1e3)
    return per_node, iteration_ms, matched_total / max(seen_total, 1)


def _outermost_device_us(ops: Sequence[FunctionEvent], after: float) -> float:
    """Device time (us) of the kernels launched by host events starting at or after ``after``,
    each counted once (through its outermost event)."""
    total = 0.0
    covered = after
    for event in ops:
        if event.time_range.start >= covered:
            total += event.device_time_total
            covered = event.time_range.end
    return total
