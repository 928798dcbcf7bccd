"""What the learned cost model sees: a model's graph once, and each strategy as a few tokens.

A strategy changes which gradients travel together, not the ops, so the model is read in two
parts. :func:`model_graph` turns the rank's compute graph (forward, backward, gradient-ready
and optimizer nodes) into a PyG ``Data`` once per model and micro-batch; its node features are
the graph format's (:func:`data.graph.pyg.node_features`) plus each op's profiled duration,
which may be missing (``known`` = 0): the encoder then has to estimate it from the op and its
neighbours, which is how durations of ops never profiled are predicted. :func:`strategy_sample`
turns one (strategy, cluster) into bucket tokens (bytes, when the replay has the bucket ready,
starting and finished), the rows of the graph nodes each bucket and each compiled block covers,
and global features, among them the replay's own iteration time and breakdown and the parallel
plan (tensor and pipeline degrees, FSDP, the pipeline's schedule and bubble): the learned model
corrects the replay rather than starting from nothing. FSDP, tensor and pipeline plans have no
bucket tokens; their replay's breakdown and the plan say what the head needs.
"""

import dataclasses
import functools
import itertools
import math
from collections.abc import Mapping, Sequence

import torch
from torch_geometric.data import Data

from ddlsim.data.comm_model import AlphaBeta
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.graph.pyg import FEATURE_NAMES, node_features
from ddlsim.data.specs.strategy import Strategy
from ddlsim.simulator.calibration import risk_kind
from ddlsim.simulator.dp_replay import ReplaySummary

NODE_FEATURES: tuple[str, ...] = (*FEATURE_NAMES, "log1p_duration_us", "duration_known")
EDGE_TYPES: tuple[str, ...] = ("data", "data_reversed", "program_order", "program_reversed")
BUCKET_FEATURES: tuple[str, ...] = (
    "log1p_bytes",
    "ready_share",
    "start_share",
    "end_share",
    "comm_share",
    "position",
)
GLOBAL_FEATURES: tuple[str, ...] = (
    "log_replay_ms",
    "compute_share",
    "exposed_comm_share",
    "comm_share",
    "log2_dp",
    "log1p_busbw_gbps",
    "log1p_alpha_ms",
    "micro_batches",
    "dear",
    "hooks",
    "log1p_buckets",
    "compiled_share",
    "log1p_grad_mb",
    "log2_compute_scale",
    "bubble_share",
    "log2_tp",
    "log2_pp",
    "fsdp",
    "schedule_1f1b",
    "schedule_interleaved",
    "log2_grid_rows",
    "log2_grid_cols",
    "log2_grid_depth",
    "grid_overlap",
)


# the most buckets a ModelGraph remembers the rows of
MAX_KNOWN_BUCKETS = 65_536


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelGraph:
    """One rank's compute graph as the encoder reads it.

    Shapes:
        data.x: ``[num_nodes, len(NODE_FEATURES)]``; data.edge_index: ``[2, num_edges]``;
        data.edge_attr: ``[num_edges, len(EDGE_TYPES)]``; data.duration: ``[num_nodes]``
        (log1p of the profiled µs, 0 where unknown); data.timed: ``[num_nodes]`` bool (compute
        and optimizer nodes with a profiled time, the targets of the duration head).
    """

    data: Data
    grad_rows: dict[str, int]
    module_of_row: tuple[str, ...]
    compute_ms_of_row: tuple[float, ...]
    compute_rows: frozenset[int] = frozenset()

    def rows_of(self, params: tuple[str, ...]) -> tuple[int, ...]:
        """The rows of ``params``' gradient-ready nodes (those the graph has), remembered: a
        search prices the same buckets many times."""
        rows = self._rows_of_params.get(params)
        if rows is None:
            rows = tuple(self.grad_rows[p] for p in params if p in self.grad_rows)
            if len(self._rows_of_params) < MAX_KNOWN_BUCKETS:
                self._rows_of_params[params] = rows
        return rows

    @functools.cached_property
    def _rows_of_params(self) -> dict[tuple[str, ...], tuple[int, ...]]:
        return {}

    @functools.cached_property
    def total_compute_ms(self) -> float:
        """The compute of all rows (1 where there is none: it divides)."""
        return sum(self.compute_ms_of_row) or 1.0


def model_graph(graph: IterationGraph, node_ms: Mapping[int, float] | None) -> ModelGraph:
    """``graph`` without its collectives, with ``node_ms`` (ms) as features where given."""
    nodes = [n for n in graph.nodes if n.kind != "comm"]
    row = {n.id: i for i, n in enumerate(nodes)}
    x = node_features(nodes)
    duration_of: list[float] = []
    timed_of: list[bool] = []
    compute_ms = []
    for node in nodes:
        ms = node_ms.get(node.id) if node_ms is not None else None
        compute_ms.append(float(ms or 0.0) if node.kind == "compute" else 0.0)
        if ms is not None and node.kind in ("compute", "optimizer"):
            duration_of.append(math.log1p(max(ms, 0.0) * 1e3))
            timed_of.append(True)
        else:
            duration_of.append(0.0)
            timed_of.append(False)
    durations = torch.tensor(duration_of, dtype=torch.float32)
    timed = torch.tensor(timed_of, dtype=torch.bool)
    extra = torch.stack([durations, timed.float()], dim=1)
    src, dst, kinds = [], [], []
    for a, b in graph.edges:
        if a in row and b in row:
            src += [row[a], row[b]]
            dst += [row[b], row[a]]
            kinds += [0, 1]
    compute_rows = [row[n.id] for n in nodes if n.kind == "compute"]
    for a, b in itertools.pairwise(compute_rows):
        src += [a, b]
        dst += [b, a]
        kinds += [2, 3]
    edge_attr = torch.nn.functional.one_hot(
        torch.tensor(kinds, dtype=torch.long), len(EDGE_TYPES)
    ).float()
    data = Data(
        x=torch.cat([x, extra], dim=1),
        edge_index=torch.tensor([src, dst], dtype=torch.long),
        edge_attr=edge_attr,
        duration=durations,
        timed=timed,
        num_nodes=len(nodes),
    )
    grad_rows = {n.param: row[n.id] for n in nodes if n.kind == "grad_ready" and n.param}
    return ModelGraph(
        data=data,
        grad_rows=grad_rows,
        module_of_row=tuple(n.module for n in nodes),
        compute_ms_of_row=tuple(compute_ms),
        compute_rows=frozenset(compute_rows),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class StrategySample:
    """One (model, strategy, cluster) for the strategy head.

    Rows of plain floats (the model stacks a batch's into one tensor; one tensor a sample
    would cost a search more than the replay does):
        buckets: ``num_buckets`` rows of ``len(BUCKET_FEATURES)``; globals:
        ``len(GLOBAL_FEATURES)`` values.
    """

    model_key: str
    buckets: tuple[tuple[float, ...], ...]
    bucket_rows: tuple[tuple[int, ...], ...]
    compiled_rows: tuple[int, ...]
    globals: tuple[float, ...]
    replay_ms: float
    measured_ms: float | None = None
    group: str = ""
    family: str = ""
    kind: str = ""
    risk_kind: str = ""
    # The measured median's 95 % interval, half its width over the median (0.01: ±1 %), where
    # the run recorded one (cpu-v3): how far the label itself is known.
    label_noise: float | None = None
    # DDP's defaults: the run the group's speed-ups are measured against.
    reference: bool = False


def _is_inside(module: str, blocks: Sequence[str]) -> bool:
    return any(module == b or module.startswith(f"{b}.") for b in blocks)


BLOCK_FEATURES: tuple[str, ...] = ("log1p_eager_us", "log1p_nodes", "log2_compute_scale")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockSample:
    """One block of a model graph, compiled: its compute rows (forward and backward), their
    eager time in the kernel profile, and the measured compiled/eager time ratio where known.

    Shapes:
        features: ``[len(BLOCK_FEATURES)]``.
    """

    model_key: str
    block: str
    rows: tuple[int, ...]
    eager_ms: float
    features: torch.Tensor
    measured_ratio: float | None = None
    family: str = ""


def block_sample(
    *,
    model_key: str,
    graph: ModelGraph,
    block: str,
    measured_ratio: float | None = None,
    family: str = "",
    compute_scale: float = 1.0,
) -> BlockSample | None:
    """``block`` of ``graph`` as the fused-block head reads it; ``None`` when no compute node of
    the graph belongs to it."""
    rows = tuple(
        i for i in sorted(graph.compute_rows) if _is_inside(graph.module_of_row[i], [block])
    )
    if not rows:
        return None
    eager_ms = sum(graph.compute_ms_of_row[i] for i in rows)
    features = [math.log1p(eager_ms * 1e3), math.log1p(len(rows)), math.log2(compute_scale)]
    return BlockSample(
        model_key=model_key,
        block=block,
        rows=rows,
        eager_ms=eager_ms,
        features=torch.tensor(features, dtype=torch.float32),
        measured_ratio=measured_ratio,
        family=family,
    )


def strategy_sample(
    *,
    model_key: str,
    graph: ModelGraph,
    strategy: Strategy,
    summary: ReplaySummary,
    comm: Mapping[str, AlphaBeta],
    dp: int,
    measured_ms: float | None = None,
    group: str = "",
    family: str = "",
    compute_scale: float = 1.0,
    label_noise: float | None = None,
    reference: bool = False,
) -> StrategySample:
    """The tokens and global features of ``strategy`` replayed as ``summary``.

    Long: the bucket tokens and the global features are written field by field in
    ``GLOBAL_FEATURES``' order.
    """
    iteration = max(summary.iteration_time_ms, 1e-6)
    rows = []
    bucket_rows = []
    count = max(len(summary.buckets), 1)
    for position, bucket in enumerate(summary.buckets):
        rows.append(
            (
                math.log1p(bucket.grad_bytes / 2**20),
                bucket.ready_ms / iteration,
                bucket.start_ms / iteration,
                bucket.end_ms / iteration,
                (bucket.end_ms - bucket.start_ms) / iteration,
                position / count,
            )
        )
        bucket_rows.append(graph.rows_of(bucket.params))
    blocks = strategy.op_fusion.compiled
    compiled_rows = (
        tuple(i for i, module in enumerate(graph.module_of_row) if _is_inside(module, blocks))
        if blocks
        else ()
    )
    compiled_share = (
        sum(graph.compute_ms_of_row[i] for i in compiled_rows) / graph.total_compute_ms
        if compiled_rows
        else 0.0
    )
    fusion = strategy.tensor_fusion
    plan = strategy.parallel
    hooks = fusion.buckets is not None or fusion.dear or fusion.implementation == "hooks"
    all_reduce = comm["all_reduce"]
    globals_ = (
        math.log(iteration),
        summary.compute_ms / iteration,
        summary.exposed_comm_ms / iteration,
        summary.comm_ms / iteration,
        math.log2(dp),
        math.log1p(all_reduce.busbw_gbps),
        math.log1p(all_reduce.alpha_us / 1e3),
        float(plan.micro_batches),
        float(fusion.dear),
        float(hooks),
        math.log1p(len(summary.buckets)),
        compiled_share,
        math.log1p(sum(b.grad_bytes for b in summary.buckets) / 2**20),
        math.log2(compute_scale),
        summary.bubble_ms / iteration,
        math.log2(plan.tp),
        math.log2(plan.pp),
        float(plan.fsdp),
        float(plan.pp > 1 and plan.pp_schedule in ("1f1b", "eager_1f1b")),
        float(plan.pp > 1 and plan.pp_schedule == "interleaved_1f1b"),
        *(math.log2(size) for size in plan.grid_axes.values()),
        float(bool(plan.grid) and plan.grid_overlap),
    )
    return StrategySample(
        model_key=model_key,
        buckets=tuple(rows),
        bucket_rows=tuple(bucket_rows),
        compiled_rows=compiled_rows,
        globals=globals_,
        replay_ms=summary.iteration_time_ms,
        measured_ms=measured_ms,
        group=group,
        family=family,
        kind=strategy.kind,
        risk_kind=risk_kind(strategy),
        label_noise=label_noise,
        reference=reference,
    )
