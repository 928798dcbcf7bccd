"""Expert parallelism in the replay: what a layer of experts split over ``ep`` ranks adds to a
data-parallel iteration, as the executor runs it (``executor/experts.py``).

Each routed-experts layer exchanges its tokens with the other ranks of its expert-parallel group
in forward and again in backward. The exchanges are synchronous (the layer cannot go on without
the tokens), so the rank's compute waits for each; they share the rank's link with DDP's
buckets in flight, so each waits for the link as well. By ``parallel.dispatcher``:

- ``all_to_all``: forward, the counts (a few bytes each expert), the token copies (dispatch) and
  the outputs back (combine); backward, the combine's gradient and the dispatch's.
- ``all_gather``: forward, the group's tokens, expert choices and router weights gathered, the
  partial outputs reduce-scattered back; backward, the reverse of each.

The busiest rank paces every exchange and computes longest: the router's measured imbalance
(:class:`ddlsim.profiler.routing.RoutingLoad`) scales the exchanged token copies and the
experts' compute. The experts' parameters are out of DDP's buckets (the graph's annotation
leaves them out); each rank steps ``1 / ep`` of them, after an all-reduce of their gradients over
the expert-data-parallel group (``edp`` ranks holding the same experts) once backward ends.
"""

import dataclasses
import math
from collections.abc import Mapping

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import GraphNode, IterationGraph
from ddlsim.data.models import build_config
from ddlsim.data.moe import ExpertsShape, expert_param_names, experts_shape
from ddlsim.data.specs.strategy import ParallelPlan

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
_INDEX_BYTES = 8  # int64 expert choices and counts
_WEIGHT_BYTES = 4  # fp32 router weights
# The collectives expert parallelism runs: the exchanges over an expert-parallel group, then the
# experts' gradients over an expert-data-parallel group.
EXPERT_OPS: tuple[str, ...] = ("all_to_all", "all_gather", "reduce_scatter", "all_reduce")


@dataclasses.dataclass(frozen=True, slots=True)
class Blocking:
    """What the rank waits for: a collective (``stream`` "exchange") or its own bookkeeping
    around one (``compute``); its label and duration (ms)."""

    name: str
    ms: float
    stream: str = "exchange"


@dataclasses.dataclass(frozen=True)
class ExpertMeasures:
    """What was measured of a plan's experts on this machine: the routers' imbalance by
    experts module (:func:`ddlsim.profiler.routing.routing_load`) and the expert-parallel
    forward's and backward's own compute a layer, ms
    (:func:`ddlsim.executor.expert_overheads.measure_expert_overheads`)."""

    imbalance: Mapping[str, float] = dataclasses.field(default_factory=dict)
    forward_ms: float = 0.0
    backward_ms: float = 0.0

    def scaled(self, compute_scale: float) -> "ExpertMeasures":
        """The same with its compute at ``compute_scale`` of the profile's speed."""
        return dataclasses.replace(
            self,
            forward_ms=self.forward_ms * compute_scale,
            backward_ms=self.backward_ms * compute_scale,
        )


@dataclasses.dataclass(frozen=True)
class ExpertSchedule:
    """What expert parallelism adds to the replay of a graph.

    ``after``: compute node id -> the collectives the rank runs and waits for right after it
    (every micro-batch); ``before_step``: those after backward's buckets, before the optimizer
    (once an iteration); ``scale``: node id -> factor on its profiled time (the busiest rank's
    experts, and ``1 / ep`` of the experts' optimizer steps)."""

    after: Mapping[int, tuple[Blocking, ...]]
    before_step: tuple[Blocking, ...]
    scale: Mapping[int, float]

    def scaled(self, node_ms: Mapping[int, float]) -> dict[int, float]:
        return {i: ms * self.scale.get(i, 1.0) for i, ms in node_ms.items()}


@dataclasses.dataclass(frozen=True)
class _Layer:
    """One routed-experts module's nodes in one phase and what it exchanges."""

    phase: str
    nodes: list[GraphNode]  # the experts' compute: first to last grouped matmul
    before: int  # the node after which the first exchange goes
    last: int  # the last grouped matmul
    pairs: int  # token copies on this rank (tokens x top-k)
    row_bytes: int  # one token's hidden state


def expert_schedule(
    graph: IterationGraph,
    measures: ExpertMeasures,
    *,
    ep_comm: Mapping[str, AlphaBeta],
    edp_comm: Mapping[str, AlphaBeta] | None,
    burst_bytes: int = 0,
) -> ExpertSchedule:
    """The schedule of ``graph``'s plan (``parallel.ep > 1``) with ``ep_comm`` the collectives
    over an expert-parallel group (``all_to_all``, ``all_gather``, ``reduce_scatter``) and
    ``edp_comm`` over an expert-data-parallel group (``None`` when ``edp`` is 1);
    ``measures``: the busiest rank's token copies over the mean by experts module, and the
    bookkeeping a layer costs (run right after the layer's first exchanges); ``burst_bytes``:
    what an emulated link lets through at once after an idle moment (the exchanges come
    between stretches of compute that refill it), 0 for a link without a token bucket."""
    imbalance = measures.imbalance
    plan = graph.strategy.parallel
    config = build_config(graph.model)
    shape = experts_shape(config)
    assert shape is not None and plan.ep > 1
    experts = expert_param_names(graph.params, config)
    paths = sorted({p.module for p in graph.params if p.name in experts})
    row_width = int(config.hidden_size)
    after: dict[int, list[Blocking]] = {}
    scale: dict[int, float] = {}
    for (path, phase), inside in _layer_nodes(graph, paths).items():
        factor = max(1.0, imbalance.get(path, 1.0))
        layer = _layer(graph, inside, phase, row_width)
        if layer is not None:
            for node in layer.nodes:
                scale[node.id] = factor
            first, last = _exchanges(layer, factor, shape, plan, _Link(ep_comm, burst_bytes))
            own = measures.forward_ms if phase == "forward" else measures.backward_ms
            if own > 0:
                first.append(Blocking(f"experts' bookkeeping ({phase})", own, "compute"))
            after.setdefault(layer.before, []).extend(first)
            after.setdefault(layer.last, []).extend(last)
    for node in graph.nodes_of("optimizer"):
        if node.param in experts:
            scale[node.id] = 1.0 / plan.ep
    before_step: tuple[Blocking, ...] = ()
    if edp_comm is not None:
        nbytes = sum(p.nbytes for p in graph.params if p.name in experts) // plan.ep
        ms = edp_comm["all_reduce"].time_us(nbytes) / 1e3
        before_step = (Blocking("experts' gradients all_reduce (edp)", ms),)
    return ExpertSchedule(
        after={k: tuple(v) for k, v in after.items()}, before_step=before_step, scale=scale
    )


def _layer_nodes(graph: IterationGraph, paths: list[str]) -> dict[tuple[str, str], list[int]]:
    """The compute nodes of each experts module (``paths``) by phase, in graph order: one pass
    over the graph."""
    found: dict[tuple[str, str], list[int]] = {
        (path, phase): [] for path in paths for phase in ("forward", "backward")
    }
    owner = {path: path for path in paths}
    for i, node in enumerate(graph.nodes):
        if node.kind != "compute" or node.phase not in ("forward", "backward"):
            continue
        module = node.module
        while module and module not in owner:  # the module or one of its parents
            module = module.rpartition(".")[0]
        if module:
            found[(owner[module], node.phase)].append(i)
    return found


def _layer(graph: IterationGraph, inside: list[int], phase: str, hidden: int) -> _Layer | None:
    grouped = [i for i in inside if "grouped_mm" in graph.nodes[i].op]
    if not grouped:
        return None
    first, last = grouped[0], grouped[-1]
    tokens = graph.nodes[first].inputs[0]  # [token copies, width], as the tokens' dtype
    return _Layer(
        phase=phase,
        nodes=[graph.nodes[i] for i in range(first, last + 1) if graph.nodes[i].kind == "compute"],
        before=graph.nodes[first - 1].id,
        last=graph.nodes[last].id,
        pairs=int(tokens.shape[0]),
        row_bytes=hidden * _DTYPE_BYTES.get(tokens.dtype, 4),
    )


@dataclasses.dataclass(frozen=True)
class _Link:
    """The collectives' models over a group, and the link's burst."""

    comm: Mapping[str, AlphaBeta]
    burst_bytes: int

    def ms(self, op: str, nbytes: float) -> float:
        """``op`` over ``nbytes``, the first ``burst_bytes`` on the wire free of the rate."""
        alpha_us, factor, per_us, _, _ = self.comm[op].terms()
        if nbytes <= 0 or per_us <= 0:
            return 0.0
        return (alpha_us + max(0.0, factor * nbytes - self.burst_bytes) / per_us) / 1e3


def _exchanges(
    layer: _Layer, factor: float, shape: ExpertsShape, plan: ParallelPlan, link: _Link
) -> tuple[list[Blocking], list[Blocking]]:
    """The collectives before the layer's experts and after them, in its phase."""
    ep, phase = plan.ep, layer.phase
    busiest = math.ceil(layer.pairs * factor) * layer.row_bytes

    def run(op: str, label: str, nbytes: int) -> Blocking:
        return Blocking(f"{op} {label} ({phase})", link.ms(op, nbytes))

    if plan.dispatcher == "all_to_all":
        if phase == "forward":
            counts = run("all_to_all", "counts", _INDEX_BYTES * shape.experts)
            return [counts, run("all_to_all", "dispatch", busiest)], [
                run("all_to_all", "combine", busiest)
            ]
        return [run("all_to_all", "combine", busiest)], [run("all_to_all", "dispatch", busiest)]
    tokens = layer.pairs // shape.top_k
    gathered = ep * tokens * layer.row_bytes
    choices = ep * layer.pairs
    if phase == "forward":
        return [
            run("all_gather", "tokens", gathered),
            run("all_gather", "choices", choices * _INDEX_BYTES),
            run("all_gather", "weights", choices * _WEIGHT_BYTES),
        ], [run("reduce_scatter", "outputs", gathered)]
    return [run("all_gather", "outputs", gathered)], [
        run("reduce_scatter", "tokens", gathered),
        run("reduce_scatter", "weights", choices * _WEIGHT_BYTES),
    ]
