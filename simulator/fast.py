"""The replay of a data-parallel iteration in closed form, for many bucket partitions at once.

Without DeAR, a strategy changes nothing on the compute stream: forward and backward run back
to back for every micro-batch, then the optimizer steps once every collective has finished.
Only the communication stream depends on the buckets: bucket ``b`` is launched when its last
gradient is ready (``ready_b``) and the stream is FIFO, so it ends at
``end_b = max(end_{b-1}, ready_b) + comm_b``, and the iteration takes
``max(M * T_microbatch, end_last) + T_optimizer``. :class:`DataParallelReplay` computes the
gradient-ready times once per (graph, durations) and then prices a partition in O(buckets),
equal to :func:`simulator.replay.replay` (the tests check it) at a thousandth of its cost.
DeAR's all-gathers interleave with the next forward, which this form does not cover: those
strategies go through the full replay (:meth:`DataParallelReplay.summary` does so itself).
"""

import dataclasses
from collections.abc import Mapping

from data.comm_model import AlphaBeta
from data.graph.annotate import with_strategy
from data.graph.format import IterationGraph
from data.specs.strategy import Bucket, Strategy
from simulator.replay import ReplayResult, replay, transfer_durations


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
class ReplaySummary:
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

    def breakdown(self) -> dict[str, float]:
        return {
            "compute_ms": self.compute_ms,
            "exposed_comm_ms": self.exposed_comm_ms,
            "bubble_ms": self.bubble_ms,
            "comm_ms": self.comm_ms,
        }


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
        clock = 0.0
        self.ready_ms: dict[str, float] = {}
        self.ready_position: dict[str, int] = {}
        for node in graph.nodes:
            if node.kind == "compute":
                clock += float(self.node_ms.get(node.id, 0.0))
                end[node.id] = clock
            elif node.kind == "grad_ready" and node.param is not None:
                at = max((end.get(p, 0.0) for p in preds[node.id]), default=0.0)
                end[node.id] = at
                self.ready_ms[node.param] = at
                self.ready_position[node.param] = len(self.ready_position)
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
        """The replayed iteration under ``strategy`` (DeAR through the full replay)."""
        timings = self._timings(strategy, comm, micro_batches)
        if strategy.tensor_fusion.dear:
            graph = with_strategy(self.graph, strategy)
            durations = transfer_durations(self.graph, self.node_ms, graph)
            result = replay(graph, durations, comm)
            return ReplaySummary(
                iteration_time_ms=result.iteration_time_ms,
                compute_ms=result.compute_ms,
                exposed_comm_ms=result.exposed_comm_ms,
                comm_ms=result.comm_ms,
                buckets=tuple(timings),
            )
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
