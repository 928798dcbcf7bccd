"""Replay: list-schedule a strategy-annotated ``IterationGraph`` on a compute and a comm stream.

The baseline cost model, after dPRO's replayer and DisCo's scheduler. Every compute and
optimizer node runs on the rank's one compute stream in the order the training loop issues it;
every collective runs on one communication stream in launch order; a node starts when its
stream is free and every node it depends on has finished. Node durations come from a kernel
profile (measured at the rank's micro-batch), collective durations from a latency-bandwidth
model (:class:`data.comm_model.AlphaBeta`).

Several iterations are unrolled so that what crosses iterations is scheduled as the executor
runs it: without DeAR the optimizer step waits for every bucket's all-reduce (DDP and the
executor's hooks both step once, after all of them); with DeAR a bucket's all-gather and
parameter update happen before the first module that uses the bucket in the next forward,
overlapping the all-gathers with that forward. The iteration time is the steady-state distance
between the starts of consecutive iterations.

Data parallelism with any bucket partition, DeAR and gradient accumulation over micro-batches
are replayed; FSDP, tensor and pipeline parallelism are refused (:class:`UnsupportedPlanError`).
"""

from collections.abc import Mapping, Sequence

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.format import GraphNode, IterationGraph
from ddlsim.simulator.cpu_load import CpuLoad
from ddlsim.simulator.experts import Blocking, ExpertSchedule
from ddlsim.simulator.runtime import RuntimeCosts
from ddlsim.simulator.timeline import Event, ReplayResult, UnsupportedPlanError

EPSILON_MS = 1e-6


def in_window(start_ms: float, begin_ms: float, end_ms: float) -> bool:
    """Whether an event starting at ``start_ms`` belongs to the iteration ``[begin, end)``: an
    event that starts as the iteration does (the last collective of the one before, launched
    as its compute ends) belongs to it, whatever rounding the two sums took."""
    return begin_ms - EPSILON_MS <= start_ms < end_ms - EPSILON_MS


def transfer_durations(
    profiled: IterationGraph, node_ms: Mapping[int, float], graph: IterationGraph
) -> dict[int, float]:
    """A kernel profile's per-node times, moved onto another graph of the same model.

    Graphs of one model and inputs under different strategies have the same compute nodes in
    the same order (only collectives differ): compute nodes map by position, optimizer nodes by
    parameter. Nodes the profile did not time get 0.

    Raises:
        InvalidGraphError-like ``InvalidOptionError``: the two graphs' compute ops differ.
    """
    source = [n for n in profiled.nodes if n.kind == "compute"]
    target = [n for n in graph.nodes if n.kind == "compute"]
    if [n.op for n in source] != [n.op for n in target]:
        raise InvalidOptionError(
            f"the profiled graph ({profiled.model.label}, {len(source)} compute nodes) is not "
            f"of the same model and inputs as the replayed one ({graph.model.label}, "
            f"{len(target)} compute nodes)"
        )
    out = {t.id: float(node_ms.get(s.id, 0.0)) for s, t in zip(source, target, strict=True)}
    by_param = {n.param: float(node_ms.get(n.id, 0.0)) for n in profiled.nodes_of("optimizer")}
    for node in graph.nodes_of("optimizer"):
        out[node.id] = by_param.get(node.param, 0.0)
    return out


def replay(
    graph: IterationGraph,
    node_ms: Mapping[int, float],
    comm: Mapping[str, AlphaBeta],
    *,
    iterations: int = 4,
    runtime: RuntimeCosts | None = None,
    experts: ExpertSchedule | None = None,
) -> ReplayResult:
    """Replay ``iterations`` training iterations of ``graph`` and read the steady state.

    Args:
        graph: captured with the strategy to replay (its collectives and buckets).
        node_ms: duration of each compute and optimizer node (ms), measured at the rank's
            micro-batch; missing nodes take 0.
        comm: the model of each collective the graph uses, over the data-parallel ranks.
        iterations: how many to unroll (>= 3: the first fills the pipeline of overlaps, the
            last may end early; the iteration time is read between the second and the last).
        runtime: the cost of the runtime's gradient copies (none charged by default).
        experts: what expert parallelism adds (its exchanges, the busiest rank's experts):
            :func:`simulator.experts.expert_schedule`; ``node_ms`` already scaled by it.

    Raises:
        UnsupportedPlanError: FSDP, tensor or pipeline parallelism.
        InvalidOptionError: ``iterations < 3`` or a collective without a model.
    """
    plan = graph.strategy.parallel
    if plan.fsdp or plan.tp > 1 or plan.pp > 1:
        raise UnsupportedPlanError(
            f"the replay schedules data parallelism only; this plan has fsdp({plan.fsdp}), "
            f"tp({plan.tp}), pp({plan.pp})"
        )
    if iterations < 3:
        raise InvalidOptionError(f"iterations({iterations}) must be >= 3")
    missing = sorted({n.op for n in graph.nodes_of("comm")} - set(comm))
    if missing:
        raise InvalidOptionError(
            f"no collective model for {', '.join(missing)}; given: {', '.join(sorted(comm))}"
        )
    return _Replayer(
        graph, node_ms, comm, iterations, runtime or RuntimeCosts(), experts=experts
    ).run()


class _Replayer:
    def __init__(
        self,
        graph: IterationGraph,
        node_ms: Mapping[int, float],
        comm: Mapping[str, AlphaBeta],
        iterations: int,
        runtime: RuntimeCosts,
        *,
        experts: ExpertSchedule | None = None,
    ) -> None:
        self.graph = graph
        self.runtime = runtime
        self.fusion = graph.strategy.tensor_fusion
        self.node_ms = node_ms
        self.comm = comm
        self.iterations = iterations
        self.micro_batches = graph.strategy.parallel.micro_batches
        self.dear = graph.strategy.tensor_fusion.dear
        self.preds = graph.predecessors()
        nodes = graph.nodes
        self.fwd_bwd = [n for n in nodes if n.kind == "compute"]
        self.ready = [n for n in nodes if n.kind == "grad_ready"]
        self.collectives = [n for n in nodes if n.kind == "comm"]
        self.optimizer = [n for n in nodes if n.kind == "optimizer"]
        self.first_use = _first_forward_use(graph) if self.dear else {}
        self.end: dict[tuple[int, int, int], float] = {}  # (iteration, micro-batch, node)
        self.free = {"compute": 0.0, "comm": 0.0}
        self.load = CpuLoad()
        # DeAR: the copy each bucket's first update waits for, by (iteration, bucket)
        self._land_ms: dict[tuple[int, int | None], float] = {}
        self.events: list[Event] = []
        self.experts = experts

    def run(self) -> ReplayResult:
        starts: list[float] = []
        deferred: list[GraphNode] = []  # DeAR: last iteration's updates, run in this forward
        for it in range(self.iterations):
            starts.append(self.free["compute"])
            for mb in range(self.micro_batches):
                last = mb == self.micro_batches - 1
                deferred = self._forward_backward(it, mb, deferred, with_comm=last)
            if self.dear:
                self._all_gathers(it)
                deferred = list(self.optimizer)
                self._land_ms = {
                    (it + 1, n.bucket): self.runtime.land_ms(self.fusion, n.grad_bytes)
                    for n in self.collectives
                    if n.op == "all_gather"
                }
            else:
                self._optimizer_after_all_reduces(it)
        begin, end = starts[1], starts[-1]
        iteration_ms = (end - begin) / (self.iterations - 2)
        # The timeline and busy times of one steady iteration: the second.
        window = [e for e in self.events if in_window(e.start_ms, begin, starts[2])]
        compute = sum(e.end_ms - e.start_ms for e in window if e.stream == "compute")
        comm_busy = sum(e.end_ms - e.start_ms for e in window if e.stream == "comm")
        return ReplayResult.overlapped(
            iteration_time_ms=iteration_ms, compute_ms=compute, comm_ms=comm_busy, events=window
        )

    # -- scheduling --------------------------------------------------------------------------

    def _deps_end(self, it: int, mb: int, node: GraphNode) -> float:
        return max((self.end.get((it, mb, p), 0.0) for p in self.preds[node.id]), default=0.0)

    def _run(
        self, stream: str, at: tuple[int, int], node: GraphNode, *, ms: float, ready: float
    ) -> None:
        """Run ``node`` of (iteration, micro-batch) ``at`` on ``stream`` once it is ready."""
        it, mb = at
        start = max(self.free[stream], ready)
        if stream == "comm":
            end = start + ms
            self.load.add(start, end, self._comm_cpu_ms(node))
        else:
            end = self.load.finish(start, ms)
        self.free[stream] = end
        self.end[(it, mb, node.id)] = end
        label = node.op if node.kind != "comm" else f"{node.op} bucket {node.bucket}"
        self.events.append(
            Event(
                node=node.id,
                iteration=it,
                micro_batch=mb,
                stream=stream,
                name=label,
                start_ms=start,
                end_ms=end,
            )
        )

    def _forward_backward(
        self, it: int, mb: int, deferred: list[GraphNode], *, with_comm: bool
    ) -> list[GraphNode]:
        pending = list(deferred)
        comm_of_ready = self._launch_points() if with_comm else {}
        for node in self.graph.nodes:
            if node.kind == "compute":
                if pending and node.phase == "forward":
                    pending = self._updates_before(it, node, pending)
                self._run(
                    "compute",
                    (it, mb),
                    node,
                    ms=self._ms(node),
                    ready=self._deps_end(it, mb, node),
                )
            elif node.kind == "grad_ready":
                self.end[(it, mb, node.id)] = self._deps_end(it, mb, node)
            if self.experts is not None:
                for exchange in self.experts.after.get(node.id, ()):
                    self._blocking((it, mb), exchange)
            if node.id in comm_of_ready:
                for collective in comm_of_ready[node.id]:
                    ready = self._deps_end(it, mb, collective)
                    copy_ms = self.runtime.launch_ms(self.fusion, collective.grad_bytes)
                    if copy_ms > 0:  # the runtime copies the bucket's gradients first
                        ready = self._span(
                            (it, mb), f"copy bucket {collective.bucket}", ready, copy_ms
                        )
                    self._run(
                        "comm", (it, mb), collective, ms=self._comm_ms(collective), ready=ready
                    )
        # Updates no forward module asked for (parameters used only in backward) run last.
        for update in pending:
            self._update(it, update)
        return []

    def _launch_points(self) -> dict[int, list[GraphNode]]:
        """The collectives launched during backward, keyed by the node after which they go."""
        points: dict[int, list[GraphNode]] = {}
        for node in self.collectives:
            if self.dear and node.op == "all_gather":
                continue
            points.setdefault(max(self.preds[node.id]), []).append(node)
        return points

    def _updates_before(
        self, it: int, node: GraphNode, pending: list[GraphNode]
    ) -> list[GraphNode]:
        """DeAR: run the deferred updates of every bucket ``node``'s module uses first."""
        left = []
        for update in pending:
            if self.first_use.get(update.id) == node.id:
                self._update(it, update)
            else:
                left.append(update)
        return left

    def _update(self, it: int, update: GraphNode) -> None:
        # The update of iteration it-1's gradients, waiting for its bucket's all-gather; the
        # bucket's first update copies the gathered buffer back into its gradients.
        mb = self.micro_batches - 1
        ready = max(self.end.get((it - 1, mb, p), 0.0) for p in self.preds[update.id])
        bucket_ms = self._land_ms.pop((it, update.bucket), 0.0)
        if bucket_ms > 0:
            ready = self._span((it - 1, mb), f"copy bucket {update.bucket}", ready, bucket_ms)
        self._run("compute", (it - 1, mb), update, ms=self._ms(update), ready=ready)

    def _all_gathers(self, it: int) -> None:
        mb = self.micro_batches - 1
        gathers = [n for n in self.collectives if n.op == "all_gather"]
        # The executor queues them first-layers-first: the reverse of the launch order.
        launch = {n.bucket: i for i, n in enumerate(self.collectives) if n.op != "all_gather"}
        for node in sorted(gathers, key=lambda n: -launch.get(n.bucket, 0)):
            self._run(
                "comm", (it, mb), node, ms=self._comm_ms(node), ready=self._deps_end(it, mb, node)
            )

    def _optimizer_after_all_reduces(self, it: int) -> None:
        mb = self.micro_batches - 1
        # One optimizer step after every bucket's collective (DDP and the hooks alike); the
        # runtime waits for each in launch order and copies it back into the gradients.
        barrier = max((self.end[(it, mb, n.id)] for n in self.collectives), default=0.0)
        if self.experts is not None:
            self.free["compute"] = max(self.free["compute"], barrier)
            for exchange in self.experts.before_step:
                barrier = self._blocking((it, mb), exchange)
        for node in self.collectives:
            copy_ms = self.runtime.land_ms(self.fusion, node.grad_bytes)
            if copy_ms > 0:
                ready = self.end[(it, mb, node.id)]
                self._span((it, mb), f"copy bucket {node.bucket} back", ready, copy_ms)
        for node in self.optimizer:
            ready = max(barrier, self._deps_end(it, mb, node))
            self._run("compute", (it, mb), node, ms=self._ms(node), ready=ready)

    def _blocking(self, at: tuple[int, int], exchange: Blocking) -> float:
        """A collective the rank waits for (expert parallelism's exchanges, on their own group
        beside DDP's buckets): compute resumes when it ends. Beside a bucket in flight the two
        share the link: the exchange takes up to its own time again, and pushes the bucket's
        end by its own time."""
        if exchange.stream == "compute":
            return self._span(at, exchange.name, self.free["compute"], exchange.ms)
        it, mb = at
        start = self.free["compute"]
        shared = min(exchange.ms, max(0.0, self.free["comm"] - start))
        end = start + exchange.ms + shared
        if shared > 0:
            self.free["comm"] += exchange.ms
        self.free["compute"] = end
        self.events.append(
            Event(node=-1, iteration=it, micro_batch=mb, stream="exchange", name=exchange.name,
                  start_ms=start, end_ms=end)
        )  # fmt: skip
        return end

    # -- costs -------------------------------------------------------------------------------

    def _span(self, at: tuple[int, int], name: str, ready: float, ms: float) -> float:
        """Run ``ms`` of the runtime's own compute (no graph node) once ``ready``; its end."""
        it, mb = at
        start = max(self.free["compute"], ready)
        end = self.load.finish(start, ms)
        self.free["compute"] = end
        self.events.append(
            Event(
                node=-1,
                iteration=it,
                micro_batch=mb,
                stream="compute",
                name=name,
                start_ms=start,
                end_ms=end,
            )
        )
        return end

    def _ms(self, node: GraphNode) -> float:
        return float(self.node_ms.get(node.id, 0.0))

    def _comm_ms(self, node: GraphNode) -> float:
        return self.comm[node.op].time_us(node.grad_bytes) / 1e3

    def _comm_cpu_ms(self, node: GraphNode) -> float:
        return self.comm[node.op].cpu_us(node.grad_bytes) / 1e3


def _first_forward_use(graph: IterationGraph) -> dict[int, int]:
    """For each optimizer node, the first forward node of a module that owns a parameter of its
    bucket: the executor waits for a bucket's all-gather, and updates the whole bucket, in the
    forward pre-hook of the first module that uses any of the bucket's parameters."""
    param_use = first_forward_use_of_params(graph)
    by_bucket: dict[int | None, int] = {}
    for node in graph.nodes_of("optimizer"):
        use = param_use.get(node.param or "")
        if use is not None:
            by_bucket[node.bucket] = min(use, by_bucket.get(node.bucket, use))
    return {
        node.id: by_bucket[node.bucket]
        for node in graph.nodes_of("optimizer")
        if node.bucket in by_bucket
    }


def first_forward_use_of_params(graph: IterationGraph) -> dict[str, int]:
    """Each parameter's first forward node: the first of its module's, or, for a module without
    ops of its own (its children do the work), of its children's. Parameters of modules that
    run no forward op are left out."""
    first: dict[str, int] = {}
    for node in graph.nodes:
        if node.kind == "compute" and node.phase == "forward":
            first.setdefault(node.module, node.id)
    out: dict[str, int] = {}
    for param in graph.params:
        module = param.module
        found = [i for m, i in first.items() if m == module or m.startswith(f"{module}.")]
        if found:
            out[param.name] = min(found)
    return out


def comm_models_for_link(
    world_size: int, bandwidth_gbps: float, *, alpha_us: float = 0.0, ops: Sequence[str] = ()
) -> dict[str, AlphaBeta]:
    """Collective models at line rate (a link's nominal bandwidth, no measured fit)."""
    names = ops or ("all_reduce", "reduce_scatter", "all_gather")
    return {
        name: AlphaBeta(
            collective=name, world_size=world_size, alpha_us=alpha_us, busbw_gbps=bandwidth_gbps
        )
        for name in names
    }
