"""The replay of a data-parallel iteration in closed form, for many bucket partitions at once.

Without DeAR, a strategy changes nothing on the compute stream: forward and backward run back
to back for every micro-batch, then the optimizer steps once every collective has finished.
Only the communication stream depends on the buckets: bucket ``b`` is launched when its last
gradient is ready (``ready_b``) and the stream is FIFO, so it ends at
``end_b = max(end_{b-1}, ready_b) + comm_b``, and the iteration takes
``max(M * T_microbatch, end_last) + T_optimizer``. :class:`DataParallelReplay` computes the
gradient-ready times once per (graph, durations) and then prices a partition in O(buckets),
equal to :func:`simulator.replay.replay` (the tests check it) at a thousandth of its cost.

With DeAR the iterations are coupled: bucket ``b``'s reduce-scatter goes at ``ready_b``, its
all-gather after the last reduce-scatter (first layers first), and its parameter update waits for
that all-gather in the next iteration's forward, just before the first module that uses the
bucket. The forward is then a few segments between those insertion points, each update
``start = max(clock, gather_end_b)``; four iterations of that, bucket by bucket, give the same
steady state as the full replay in O(iterations x buckets).
"""

import dataclasses
from collections.abc import Mapping

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.strategy import Bucket, Strategy
from ddlsim.simulator.replay import (
    IterationTimes,
    ReplayResult,
    first_forward_use_of_params,
    in_window,
)

ITERATIONS = 4  # as simulator.replay.replay unrolls: the steady state is read from 2nd to last


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BucketTiming:
    """One bucket in launch order: its bytes and, in ms from the iteration's start, when its
    last gradient is ready and when its (first) collective starts and ends."""

    grad_bytes: int
    params: tuple[str, ...]
    ready_ms: float
    start_ms: float
    end_ms: float


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ReplaySummary(IterationTimes):
    """What the simulator needs of a replayed iteration (see :class:`ReplayResult`)."""

    iteration_time_ms: float
    compute_ms: float
    exposed_comm_ms: float
    comm_ms: float
    buckets: tuple[BucketTiming, ...]
    bubble_ms: float = 0.0

    @classmethod
    def of(cls, result: ReplayResult) -> "ReplaySummary":
        """A full replay's times (no bucket timings: FSDP, tensor and pipeline plans)."""
        return cls(
            iteration_time_ms=result.iteration_time_ms,
            compute_ms=result.compute_ms,
            exposed_comm_ms=result.exposed_comm_ms,
            comm_ms=result.comm_ms,
            buckets=(),
            bubble_ms=result.bubble_ms,
        )


class DataParallelReplay:
    """Replays one data-parallel rank of ``graph``'s model under any bucket partition.

    Args:
        graph: the rank's micro-batch graph, under any strategy (only its compute, gradient-
            ready and optimizer nodes are read).
        node_ms: the duration of each compute and optimizer node of ``graph`` (ms).

    Thread safety: read-only after construction.
    """

    def __init__(self, graph: IterationGraph, node_ms: Mapping[int, float]) -> None:
        self.graph = graph
        self.node_ms = dict(node_ms)
        preds = graph.predecessors()
        end: dict[int, float] = {}
        begin: dict[int, float] = {}
        clock = 0.0
        self.ready_ms: dict[str, float] = {}
        self.ready_position: dict[str, int] = {}
        # DeAR: the compute node whose end makes each gradient ready, and where each forward
        # node starts in the micro-batch (updates are inserted before forward nodes).
        self.ready_node: dict[str, int] = {}
        for node in graph.nodes:
            if node.kind == "compute":
                begin[node.id] = clock
                clock += float(self.node_ms.get(node.id, 0.0))
                end[node.id] = clock
            elif node.kind == "grad_ready" and node.param is not None:
                at = max((end.get(p, 0.0) for p in preds[node.id]), default=0.0)
                end[node.id] = at
                self.ready_ms[node.param] = at
                self.ready_position[node.param] = len(self.ready_position)
                self.ready_node[node.param] = max(
                    (p for p in preds[node.id] if p in end), key=lambda p: end[p], default=-1
                )
        self.begin_ms = begin
        self.first_use = first_forward_use_of_params(graph)
        self.update_ms = {
            n.param: float(self.node_ms.get(n.id, 0.0))
            for n in graph.nodes_of("optimizer")
            if n.param is not None
        }
        self.microbatch_ms = clock
        self.optimizer_ms = sum(
            float(self.node_ms.get(n.id, 0.0)) for n in graph.nodes if n.kind == "optimizer"
        )
        sizes = {p.name: p.nbytes for p in graph.params}
        self.grads = [(name, sizes[name]) for name in graph.grad_ready_order]

    def buckets(self, strategy: Strategy) -> list[Bucket]:
        """The strategy's buckets in launch order (as capture places their collectives)."""
        buckets = strategy.tensor_fusion.assign(self.grads)
        last = {b.index: max(self.ready_position[p] for p in b.params) for b in buckets}
        order = sorted(range(len(buckets)), key=lambda i: (last[buckets[i].index], i))
        return [buckets[i] for i in order]

    def summary(
        self, strategy: Strategy, comm: Mapping[str, AlphaBeta], *, micro_batches: int = 1
    ) -> ReplaySummary:
        """The replayed iteration under ``strategy``."""
        timings = self._timings(strategy, comm, micro_batches)
        if strategy.tensor_fusion.dear:
            return self._dear(strategy, comm, micro_batches, tuple(timings))
        compute_end = micro_batches * self.microbatch_ms
        comm_end = timings[-1].end_ms if timings else 0.0
        iteration = max(compute_end, comm_end) + self.optimizer_ms
        compute = compute_end + self.optimizer_ms
        return ReplaySummary(
            iteration_time_ms=iteration,
            compute_ms=compute,
            exposed_comm_ms=max(0.0, iteration - compute),
            comm_ms=sum(t.end_ms - t.start_ms for t in timings),
            buckets=tuple(timings),
        )

    def _dear(
        self,
        strategy: Strategy,
        comm: Mapping[str, AlphaBeta],
        micro_batches: int,
        timings: tuple[BucketTiming, ...],
    ) -> ReplaySummary:
        """DeAR's steady state, scheduled bucket by bucket as :func:`simulator.replay.replay`
        schedules it node by node (see the module's docstring)."""
        assigned = strategy.tensor_fusion.assign(self.grads)
        launched = self.buckets(strategy)
        update = {b.index: sum(self.update_ms.get(p, 0.0) for p in b.params) for b in assigned}
        # Each bucket's update goes before its first forward use, at that node's offset in the
        # micro-batch; buckets nothing in the forward uses update after the first micro-batch.
        uses = {
            b.index: min((self.first_use[p] for p in b.params if p in self.first_use), default=-1)
            for b in assigned
        }
        points = sorted({u for u in uses.values() if u >= 0})
        at_point = {u: [b.index for b in assigned if uses[b.index] == u] for u in points}
        leftover = [b.index for b in assigned if uses[b.index] < 0]
        scatter, gather = comm["reduce_scatter"], comm["all_gather"]
        mb_ms = self.microbatch_ms
        gathered: dict[int, float] = {}  # the previous iteration's all-gather ends
        comm_free = 0.0
        clock = 0.0
        starts: list[float] = []
        comm_events: list[tuple[float, float]] = []  # (start, end) on the comm stream
        for _ in range(ITERATIONS):
            starts.append(clock)
            # The first micro-batch: the forward, stretched by the updates it waits for.
            offset = 0.0
            shifts: list[tuple[int, float]] = []  # (forward node, delay of nodes from it on)
            mb_start = clock
            for node in points if gathered else ():
                clock += self.begin_ms[node] - offset
                offset = self.begin_ms[node]
                for index in at_point[node]:
                    clock = max(clock, gathered[index]) + update[index]
                shifts.append((node, clock - mb_start - offset))
            clock += mb_ms - offset
            last_start, last_shifts = mb_start, shifts
            for index in leftover if gathered else ():
                clock = max(clock, gathered[index]) + update[index]
            for _ in range(1, micro_batches):
                last_start, last_shifts = clock, []
                clock += mb_ms
            # The last micro-batch's backward launches the reduce-scatters, FIFO.
            scattered: dict[int, float] = {}
            for bucket in launched:
                ready = max(
                    last_start + self.ready_ms[p] + _delay(last_shifts, self.ready_node[p])
                    for p in bucket.params
                )
                start = max(comm_free, ready)
                comm_free = start + scatter.time_us(bucket.grad_bytes) / 1e3
                scattered[bucket.index] = comm_free
                comm_events.append((start, comm_free))
            gathered = {}
            for bucket in reversed(launched):
                start = max(comm_free, scattered[bucket.index])
                comm_free = start + gather.time_us(bucket.grad_bytes) / 1e3
                gathered[bucket.index] = comm_free
                comm_events.append((start, comm_free))
        iteration = (starts[-1] - starts[1]) / (ITERATIONS - 2)
        compute = micro_batches * mb_ms + sum(update.values())
        window = (starts[1], starts[2])
        busy = sum(e - b for b, e in comm_events if in_window(b, *window))
        return ReplaySummary(
            iteration_time_ms=iteration,
            compute_ms=compute,
            exposed_comm_ms=max(0.0, iteration - compute),
            comm_ms=busy,
            buckets=timings,
        )

    def _timings(
        self, strategy: Strategy, comm: Mapping[str, AlphaBeta], micro_batches: int
    ) -> list[BucketTiming]:
        op = "reduce_scatter" if strategy.tensor_fusion.dear else "all_reduce"
        model = comm[op]
        offset = (micro_batches - 1) * self.microbatch_ms
        free = 0.0
        out = []
        for bucket in self.buckets(strategy):
            ready = offset + max(self.ready_ms[p] for p in bucket.params)
            start = max(free, ready)
            free = start + model.time_us(bucket.grad_bytes) / 1e3
            out.append(
                BucketTiming(
                    grad_bytes=bucket.grad_bytes,
                    params=bucket.params,
                    ready_ms=ready,
                    start_ms=start,
                    end_ms=free,
                )
            )
        return out


def _delay(shifts: list[tuple[int, float]], node: int) -> float:
    """How late compute node ``node`` runs: the delay of the last insertion point before it
    (updates go before their forward node, so a node at a point is delayed by that point)."""
    delay = 0.0
    for point, shift in shifts:
        if point > node:
            break
        delay = shift
    return delay
