"""The GPU path's cost through the cost-model interface: a layout's replayed schedule is the
replay a :class:`~ddlsim.simulator.cost_model.CostModel` corrects, as the GNN corrects the CPU
loop's replay.

A layout becomes a :class:`~ddlsim.simulator.features.StrategySample`: its graph is the priced
shard's (one block of one tensor-parallel shard at the micro-batch, each compute node at its
roofline time: :func:`layout_graph`), its replay the schedule's iteration time, its globals the
layout's (:func:`layout_globals`: the shares of compute, exposed communication and the bubble;
dp, tp, pp, micro-batches, FSDP, the schedule, fused blocks). The replay alone
(:class:`~ddlsim.simulator.cost_model.ReplayCostModel`) gives the schedule's time back
unchanged: the default, since no checkpoint trained on GPU iterations ships. A checkpoint
trained on a GPU's iterations (:func:`ddlsim.simulator.gpu.learned.train_gpu_cost_model`, its
meta's ``target`` ``gpu``) multiplies it by ``exp(correction)``, the predictor its held-out
evaluation chose; it corrects clusters of the GPU whose measured op costs it was trained over.
"""

import math
import re
from collections.abc import Callable
from pathlib import Path

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.graph.format import IterationGraph
from ddlsim.data.specs.gpu_cluster import AcceleratorSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.simulator.cost_model import (
    GPU_TARGET,
    CostModel,
    EncodedGraphs,
    ReplayCostModel,
    checkpoint_cost_model,
    target_of,
)
from ddlsim.simulator.default import data_dir
from ddlsim.simulator.features import GLOBAL_FEATURES, ModelGraph, StrategySample, model_graph
from ddlsim.simulator.gpu.prediction import ScalePrediction
from ddlsim.simulator.gpu.roofline import KERNEL_FLOOR_MS, GpuOpCosts
from ddlsim.simulator.train import load_checkpoint

_GLOBAL = {name: i for i, name in enumerate(GLOBAL_FEATURES)}


def user_gpu_checkpoint() -> Path:
    """Where ``ddlsim simulator train --gpu`` writes, and what the GPU path loads by default
    (when it exists and was trained over the cluster's GPU): :func:`data_dir`
    ``/simulator/gpu_cost_model.pt``."""
    return data_dir() / "simulator" / "gpu_cost_model.pt"


def load_gpu_cost_model(choice: str | None, gpu: AcceleratorSpec) -> CostModel:
    """The cost model that prices layouts on a cluster of ``gpu``: ``replay`` for the replayed
    schedule alone, a checkpoint path (trained on GPU iterations over ``gpu``'s op costs), or
    (``None``) the user's GPU checkpoint where one was trained over ``gpu``, else the replay.

    Raises:
        InvalidOptionError: ``analytic`` (the CPU loop's closed form), a file that is not a
            checkpoint, one of the CPU loop's or one of another GPU's.
    """
    if choice == "replay":
        return ReplayCostModel()
    if choice == "analytic":
        raise InvalidOptionError(
            "--simulator analytic is the CPU loop's closed form; a GPU cluster takes 'replay' "
            "or a checkpoint trained on GPU iterations"
        )
    if choice is None:
        path = user_gpu_checkpoint()
        if not path.is_file():
            return ReplayCostModel()
        network, meta = load_checkpoint(path)
        if target_of(meta) != GPU_TARGET or meta.get("measured") != gpu.measured:
            return ReplayCostModel()
        return checkpoint_cost_model(network, meta)
    network, meta = load_checkpoint(Path(choice))
    model = checkpoint_cost_model(network, meta)
    check_gpu_cost_model(model, gpu)
    return model


def roofline_node_ms(graph: IterationGraph, costs: GpuOpCosts) -> dict[int, float]:
    """The roofline's time of each compute and optimizer node (ms). Matmuls run in their
    operands' dtype (the graph's autocast decides it); an optimizer node is the step of its
    parameter, at least a kernel (the executor's AdamW loops over parameters)."""
    out: dict[int, float] = {}
    for node in graph.nodes:
        if node.kind == "compute":
            out[node.id] = costs.node_ms(node, in_block=False)
        elif node.kind == "optimizer":
            params = node.param_bytes // 4
            out[node.id] = max(KERNEL_FLOOR_MS, costs.optimizer_ms(params))
    return out


def layout_graph(graph: IterationGraph, costs: GpuOpCosts) -> ModelGraph:
    """A priced shard's graph as the cost model reads one: each node at its roofline time."""
    return model_graph(graph, roofline_node_ms(graph, costs))


def layout_globals(prediction: ScalePrediction, plan: ScalePlan) -> tuple[float, ...]:
    """The layout's globals, in :data:`GLOBAL_FEATURES`' order and meaning (what the GPU path
    does not model, as a bucket's link, stays 0)."""
    ms = prediction.iteration_s * 1e3
    parts = prediction.breakdown_ms
    exposed = parts.get("exposed_comm_node", 0.0) + parts.get("exposed_comm_network", 0.0)
    values = [0.0] * len(GLOBAL_FEATURES)
    shares = {
        "log_replay_ms": math.log(ms),
        "compute_share": (parts.get("compute", 0.0) + parts.get("recompute", 0.0)) / ms,
        "exposed_comm_share": exposed / ms,
        "comm_share": exposed / ms,
        "log2_dp": math.log2(plan.dp),
        "micro_batches": float(plan.micro_batches),
        "compiled_share": float(plan.fused_kernels),
        "bubble_share": parts.get("pipeline_bubble", 0.0) / ms,
        "log2_tp": math.log2(plan.tp),
        "log2_pp": math.log2(plan.pp),
        "fsdp": float(plan.fsdp),
        "schedule_1f1b": float(plan.pp > 1 and plan.pp_schedule == "1f1b"),
        "schedule_interleaved": float(plan.pp > 1 and plan.pp_schedule == "interleaved_1f1b"),
    }
    for name, value in shares.items():
        values[_GLOBAL[name]] = value
    return tuple(values)


def check_gpu_cost_model(cost_model: CostModel, gpu: AcceleratorSpec) -> None:
    """Whether ``cost_model`` may correct a cluster of ``gpu``: the replay alone always; a
    checkpoint only if trained on GPU iterations over ``gpu``'s measured op costs.

    Raises:
        InvalidOptionError: a checkpoint of the CPU loop's, or of another GPU's.
    """
    if cost_model.meta is None:
        return
    if target_of(cost_model.meta) != GPU_TARGET:
        raise InvalidOptionError(
            "the cost model checkpoint corrects the CPU loop's replay (trained on the emulated "
            "cluster's runs); a GPU cluster takes one trained on GPU iterations ('ddlsim "
            "simulator train --gpu') or 'replay'"
        )
    measured = cost_model.meta.get("measured")
    if measured != gpu.measured:
        raise InvalidOptionError(
            f"the cost model checkpoint was trained over the {measured!r} GPU's op costs; "
            f"cluster's GPU {gpu.name!r} is priced over {gpu.measured!r}'s; train one on its "
            "iterations or use 'replay'"
        )


class LayoutCost:
    """Layouts' times through ``cost_model`` (the replay alone by default): each shard's graph
    encoded once (by its key), then each layout's replay corrected. Not thread-safe."""

    def __init__(self, cost_model: CostModel | None = None) -> None:
        self.cost_model = cost_model or ReplayCostModel()
        self._graphs: dict[str, tuple[EncodedGraphs, tuple[int, ...]]] = {}

    @property
    def learned(self) -> bool:
        return self.cost_model.learned

    def correct(
        self,
        prediction: ScalePrediction,
        plan: ScalePlan,
        *,
        key: str,
        graph: Callable[[], tuple[ModelGraph, str]],
    ) -> ScalePrediction:
        """``prediction`` (a replayed schedule) as the cost model predicts it; ``graph`` makes
        the shard's graph and its block's pattern (called once a ``key``) where a learned
        model needs them; a layout's fused blocks are the block's rows."""
        if not self.cost_model.learned:
            return prediction
        if key not in self._graphs:
            made, block = graph()
            rows = tuple(
                row
                for row in sorted(made.compute_rows)
                if re.search(rf"(^|\.)(?:{block})(\.|$)", made.module_of_row[row])
            )
            self._graphs[key] = (self.cost_model.encode({key: made}), rows)
        encoded, block_rows = self._graphs[key]
        rows = block_rows if plan.fused_kernels else ()
        sample = StrategySample(
            model_key=key,
            buckets=(),
            bucket_rows=(),
            compiled_rows=rows,
            globals=layout_globals(prediction, plan),
            replay_ms=prediction.iteration_s * 1e3,
        )
        (ms,) = self.cost_model.predict(encoded, [sample])
        return prediction.corrected(ms / 1e3, self.cost_model.name)
