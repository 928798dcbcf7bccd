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
from typing import NamedTuple

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.strategy import Bucket, Strategy, TensorFusionPlan
from ddlsim.simulator.cpu_load import CpuLoad
from ddlsim.simulator.replay import first_forward_use_of_params, in_window
from ddlsim.simulator.runtime import RuntimeCosts, copy_passes
from ddlsim.simulator.timeline import IterationTimes, ReplayResult

# the most bucket groups a replay remembers (a search over contiguous buckets of 300 gradients
# meets 45,150)
MAX_KNOWN_GROUPS = 65_536
ITERATIONS = 4  # as simulator.replay.replay unrolls: the steady state is read from 2nd to last


class BucketTiming(NamedTuple):
    """One bucket in launch order: its bytes and, in ms from the iteration's start, when its
    last gradient is ready and when its (first) collective starts and ends (a named tuple: a
    search builds millions)."""

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

    Thread safety: may be shared; all it changes after construction is a cache of the bucket
    groups it has priced, whose entries do not depend on which thread fills them.
    """

    def __init__(
        self,
        graph: IterationGraph,
        node_ms: Mapping[int, float],
        runtime: RuntimeCosts | None = None,
    ) -> None:
        self.graph = graph
        self.node_ms = dict(node_ms)
        self.runtime = runtime or RuntimeCosts()
        preds = graph.predecessors()
        end: dict[int, float] = {}
        begin: dict[int, float] = {}
        clock = 0.0
        self.ready_ms: dict[str, float] = {}
        self.ready_position: dict[str, int] = {}
        # DeAR: where each forward node starts in the micro-batch (updates go before them).
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
        # what a search's buckets have in common: each group of gradients it has priced
        self._groups: dict[tuple[str, ...], tuple[int, tuple[tuple[str, ...], int, float]]] = {}
        # name -> (ready position, ready ms, name, bytes): sorts into ready order
        self._grad = {
            name: (self.ready_position[name], self.ready_ms[name], name, nbytes)
            for name, nbytes in self.grads
        }

    def buckets(self, strategy: Strategy) -> list[Bucket]:
        """The strategy's buckets in launch order (as capture places their collectives), each
        indexed by its place in that order."""
        return [
            Bucket(index=i, params=params, grad_bytes=nbytes)
            for i, (params, nbytes, _) in enumerate(self._launched(strategy.tensor_fusion))
        ]

    def _launched(self, fusion: TensorFusionPlan) -> list[tuple[tuple[str, ...], int, float]]:
        """The buckets in launch order: each one's parameters in ready order, bytes, and when
        its last gradient is ready in the micro-batch (ms).

        Explicit buckets that name every gradient once are ordered here in one pass over their
        names (what a search prices by the thousand); anything else goes through
        :meth:`TensorFusionPlan.assign`, which orders the same way and names what is wrong.
        """
        groups = fusion.buckets
        if groups is not None and sum(map(len, groups)) == len(self.grads):
            known = self._groups
            keyed = []
            try:
                for group in groups:
                    facts = known.get(group)
                    if facts is None:
                        facts = self._group(group)
                        if len(known) < MAX_KNOWN_GROUPS:
                            known[group] = facts
                    keyed.append(facts)
            except KeyError:
                pass  # a name that is not a gradient: assign says which
            else:
                # the plan's groups are not empty and share no name (TensorFusionPlan checks),
                # so as many names as gradients, all known, are a partition of them
                keyed.sort()
                return [facts[1] for facts in keyed]
        buckets = fusion.assign(self.grads)
        last = {b.index: max(self.ready_position[p] for p in b.params) for b in buckets}
        order = sorted(range(len(buckets)), key=lambda i: (last[buckets[i].index], i))
        return [
            (
                buckets[i].params,
                buckets[i].grad_bytes,
                max(self.ready_ms[p] for p in buckets[i].params),
            )
            for i in order
        ]

    def _group(self, group: tuple[str, ...]) -> tuple[int, tuple[tuple[str, ...], int, float]]:
        """A bucket's last ready position, and its parameters in ready order, bytes and last
        ready ms (KeyError for a name that is not a gradient)."""
        entries = sorted([self._grad[name] for name in group])
        positions, ready, params, sizes = zip(*entries, strict=True)
        return positions[-1], (params, sum(sizes), max(ready))

    def summary(
        self, strategy: Strategy, comm: Mapping[str, AlphaBeta], *, micro_batches: int = 1
    ) -> ReplaySummary:
        """The replayed iteration under ``strategy``."""
        timings, compute_end, load = self._timings(strategy, comm, micro_batches)
        if strategy.tensor_fusion.dear:
            return self._dear(strategy, comm, micro_batches, tuple(timings))
        comm_end = timings[-1].end_ms if timings else 0.0
        fusion = strategy.tensor_fusion
        # After backward, each bucket is waited for in launch order and copied back into the
        # gradients as it lands (overlapping the later buckets' collectives); then one step.
        clock, after = compute_end, 0.0
        _, passes = copy_passes(fusion)
        alpha_us, us_per_byte = self.runtime.copy_alpha_us, self.runtime.copy_us_per_byte
        for timing in timings:
            start = max(clock, timing.end_ms)
            if passes > 0 and timing.grad_bytes > 0:
                clock = load.finish(
                    start, passes * (alpha_us + us_per_byte * timing.grad_bytes) / 1e3
                )
            else:
                clock = start
            after += clock - start
        iteration = max(clock, comm_end) + self.optimizer_ms
        compute = compute_end + after + self.optimizer_ms
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
        schedules it node by node (see the module's docstring).

        Long: one list-scheduling loop whose streams and pending all-gathers every step reads
        and writes.
        """
        # the buckets as _timings launched them; launch order is also the order in which they
        # are assigned (their indices)
        launched = assigned = [
            Bucket(index=i, params=t.params, grad_bytes=t.grad_bytes)
            for i, t in enumerate(timings)
        ]
        fusion = strategy.tensor_fusion
        # A bucket's update starts with copying its gathered buffer back into the gradients.
        update = {
            b.index: sum(self.update_ms.get(p, 0.0) for p in b.params)
            + self.runtime.land_ms(fusion, b.grad_bytes)
            for b in assigned
        }
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
        # Where each bucket's reduce-scatter is launched: as its last gradient is ready, at that
        # offset of the last micro-batch's compute.
        ready_at = [
            (max(self.ready_ms[p] for p in bucket.params), bucket.index) for bucket in launched
        ]
        load = CpuLoad()
        gathered: dict[int, float] = {}  # the previous iteration's all-gather ends
        comm_free = 0.0
        clock = 0.0
        starts: list[float] = []
        comm_events: list[tuple[float, float]] = []  # (start, end) on the comm stream
        by_index = {b.index: b for b in launched}
        busy = [0.0] * ITERATIONS  # compute stream's busy time, stretched by the load

        def run(it: int, start: float, work: float) -> float:
            end = load.finish(start, work)
            busy[it] += end - start
            return end

        for it in range(ITERATIONS):
            starts.append(clock)
            scattered: dict[int, float] = {}
            for mb in range(micro_batches):
                # Offsets in this micro-batch's compute where something else happens: the
                # first waits for last iteration's updates before their forward nodes, the
                # last launches the reduce-scatters.
                marks: list[tuple[float, int, int]] = []  # (offset, 0 update / 1 scatter, key)
                if mb == 0 and gathered:
                    marks += [(self.begin_ms[node], 0, node) for node in points]
                if mb == micro_batches - 1:
                    marks += [(at, 1, index) for at, index in ready_at]
                done = 0.0
                for offset, what, key in sorted(marks):
                    clock = run(it, clock, offset - done)
                    done = offset
                    if what == 0:
                        for index in at_point[key]:
                            clock = run(it, max(clock, gathered[index]), update[index])
                        continue
                    nbytes = by_index[key].grad_bytes
                    clock = run(it, clock, self.runtime.launch_ms(fusion, nbytes))
                    start = max(comm_free, clock)
                    comm_free = start + scatter.time_us(nbytes) / 1e3
                    load.add(start, comm_free, scatter.cpu_us(nbytes) / 1e3)
                    scattered[key] = comm_free
                    comm_events.append((start, comm_free))
                clock = run(it, clock, mb_ms - done)
                if mb == 0:
                    for index in leftover if gathered else ():
                        clock = run(it, max(clock, gathered[index]), update[index])
            gathered = {}
            for bucket in reversed(launched):
                start = max(comm_free, scattered[bucket.index])
                comm_free = start + gather.time_us(bucket.grad_bytes) / 1e3
                load.add(start, comm_free, gather.cpu_us(bucket.grad_bytes) / 1e3)
                gathered[bucket.index] = comm_free
                comm_events.append((start, comm_free))
        iteration = (starts[-1] - starts[1]) / (ITERATIONS - 2)
        compute = busy[1]
        window = (starts[1], starts[2])
        comm_busy = sum(e - b for b, e in comm_events if in_window(b, *window))
        return ReplaySummary(
            iteration_time_ms=iteration,
            compute_ms=compute,
            exposed_comm_ms=max(0.0, iteration - compute),
            comm_ms=comm_busy,
            buckets=timings,
        )

    def _timings(
        self, strategy: Strategy, comm: Mapping[str, AlphaBeta], micro_batches: int
    ) -> tuple[list[BucketTiming], float, CpuLoad]:
        """The buckets' collectives of an iteration whose compute runs back to back from 0,
        slowed by the collectives in flight (:class:`CpuLoad`), when that compute ends, and
        the load."""
        fusion = strategy.tensor_fusion
        op = "reduce_scatter" if fusion.dear else "all_reduce"
        model = comm[op]
        offset = (micro_batches - 1) * self.microbatch_ms
        load = CpuLoad()
        clock = work = free = 0.0
        out = []
        # The runtime copies a bucket's gradients before launching its collective.
        passes, _ = copy_passes(fusion)
        alpha_us, us_per_byte = self.runtime.copy_alpha_us, self.runtime.copy_us_per_byte
        bucket_us = self.runtime.bucket_us(fusion)
        # model.time_us and model.cpu_us, term by term
        alpha, factor, bytes_per_us, cpu_alpha, cpu_per_byte = model.terms()
        for params, nbytes, last_ready in self._launched(fusion):
            ready_work = offset + last_ready
            if ready_work > work:
                clock = load.finish(clock, ready_work - work)
                work = ready_work
            if nbytes > 0:
                launch_us = passes * (alpha_us + us_per_byte * nbytes) + bucket_us
                if launch_us > 0:
                    clock = load.finish(clock, launch_us / 1e3)
                start = max(free, clock)
                free = start + (alpha + factor * nbytes / bytes_per_us) / 1e3
                load.add(start, free, (cpu_alpha + cpu_per_byte * nbytes) / 1e3)
            else:
                start = free = max(free, clock)
            out.append(BucketTiming(nbytes, params, clock, start, free))
        return out, load.finish(clock, micro_batches * self.microbatch_ms - work), load
