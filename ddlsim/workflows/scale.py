"""Predict and search large jobs on GPU clusters on paper (issue 21's path): capture one
tensor-parallel shard's block on fake tensors, price it with the GPU's measured op costs, and
lay it out over the cluster (:mod:`ddlsim.simulator.gpu.scale`)."""

import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any

from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.models import spec_experts
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.plans.feasibility import cluster_target, refusals
from ddlsim.plans.tp_plans import check_tensor_parallel
from ddlsim.profiler.shard import ShardGraph, capture_shard, layer_count
from ddlsim.search.scale_plans import (
    ScaleSearchResult,
    ScaleSpace,
    SpaceLimits,
    search_layouts,
)
from ddlsim.simulator.features import ModelGraph
from ddlsim.simulator.gpu.cost import LayoutCost, layout_graph, load_gpu_cost_model
from ddlsim.simulator.gpu.prediction import ModelDims, ScalePrediction
from ddlsim.simulator.gpu.roofline import GpuOpCosts
from ddlsim.simulator.gpu.scale import (
    check_sequence,
    check_world_size,
    micro_batch_size,
    predict_scale,
)
from ddlsim.simulator.gpu.shard_costs import ShardCosts, shard_costs


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ScaleRequest:
    """``model`` trained on ``cluster`` with ``plan``: ``global_batch`` sequences of ``seq_len``
    tokens per iteration."""

    model: ModelSpec
    cluster: GpuClusterSpec
    plan: ScalePlan
    global_batch: int
    seq_len: int


@functools.lru_cache(maxsize=64)
def _shard(spec_json: str, tp: int, micro_batch: int, seq_len: int, dtype: str) -> ShardGraph:
    return capture_shard(
        ModelSpec.from_dict(json.loads(spec_json)),
        tp=tp,
        micro_batch=micro_batch,
        seq_len=seq_len,
        dtype=dtype,
    )


@functools.lru_cache(maxsize=256)
def _costs(  # noqa: PLR0917 (lru_cache keys on positional arguments)
    spec_json: str,
    tp: int,
    micro_batch: int,
    seq_len: int,
    precision: str,
    compiled: bool,
    gpu_key: str,
    kernels: str = "pytorch",
) -> tuple[ShardCosts, ModelDims, GpuOpCosts]:
    dtype = "bf16" if precision == "fp8" else precision
    shard = _shard(spec_json, tp, micro_batch, seq_len, dtype)
    gpu = GpuClusterSpec.parse(gpu_key).gpu
    op_costs = GpuOpCosts(
        gpu,
        matmul_dtype="fp8" if precision == "fp8" else "bf16",
        cast_bytes=0.0 if kernels == "transformer_engine" else 5.0,
    )
    costs = shard_costs(shard.graph, shard.block, op_costs, compiled=compiled)
    fused = any("scaled_dot_product" in node.op for node in shard.graph.nodes)
    config = json.loads(spec_json).get("config", {})
    kv_heads = config.get("num_key_value_heads") or shard.heads
    dims = ModelDims(
        layers=shard.layers,
        hidden=shard.hidden,
        heads=shard.heads,
        vocab=shard.vocab,
        fused_attention=fused,
        kv_heads=int(kv_heads),
        dropout=drops_out(json.loads(spec_json)),
        label=ModelSpec.from_dict(json.loads(spec_json)).label,
        stack=shard.block.replace(r"\.\d+", ""),
    )
    return costs, dims, op_costs


# A transformers config's dropout on the blocks' outputs (the residual branches), by its name.
_HIDDEN_DROPOUT_KEYS = ("resid_pdrop", "hidden_dropout_prob", "hidden_dropout", "dropout")


def drops_out(spec: dict[str, Any]) -> bool:
    """Whether a model drops out on its blocks' outputs (their masks are kept for the
    backward): its transformers config's own value or its class's default; a model of another
    source is taken to."""
    if spec.get("source") != "transformers":
        return True
    import transformers

    model_class = getattr(transformers, str(spec.get("class")), None)
    config_class = getattr(model_class, "config_class", None)
    if config_class is None:
        return True
    config = config_class(**spec.get("config", {}))
    return any(float(getattr(config, key, 0.0) or 0.0) > 0 for key in _HIDDEN_DROPOUT_KEYS)


def shard_pricing(
    model: ModelSpec,
    cluster: GpuClusterSpec,
    *,
    tp: int,
    micro_batch: int,
    seq_len: int,
    precision: str,
    compiled: bool = False,
    kernels: str = "pytorch",
) -> tuple[ShardCosts, ModelDims, GpuOpCosts]:
    """The priced shard (cached per model, split, micro-batch, precision, compilation, kernel
    library and GPU); ``compiled``: the blocks' memory-bound ops run fused."""
    gpu_key = dataclasses.replace(cluster, nodes=1).to_json()
    spec_json = json.dumps(model.to_dict(), sort_keys=True)
    return _costs(spec_json, tp, micro_batch, seq_len, precision, compiled, gpu_key, kernels)


def predict_at_scale(
    request: ScaleRequest, *, replay: bool = True, cost: LayoutCost | None = None
) -> ScalePrediction:
    """One iteration of ``request`` on paper: the schedule replayed (``replay``; else its
    closed form) and, replayed, corrected by ``cost``'s model where it is a learned one
    (:mod:`ddlsim.simulator.gpu.cost`; ``None``: the replay alone).

    Raises:
        InvalidStrategyError: when the plan does not fit the cluster, model or batch.
        InvalidModelSpecError: when the model cannot be captured.
    """
    plan = request.plan
    check_world_size(plan, request.cluster)
    check_sequence(plan, request.seq_len)
    mbs = micro_batch_size(plan, request.global_batch)
    # A context-parallel rank runs its share of each sequence.
    costs, dims, op_costs = shard_pricing(
        request.model,
        request.cluster,
        tp=plan.tp,
        micro_batch=mbs,
        seq_len=request.seq_len // plan.cp,
        precision=plan.precision,
        compiled=plan.fused_kernels,
        kernels=plan.kernels,
    )
    prediction = predict_scale(
        costs,
        dims,
        plan,
        request.cluster,
        global_batch=request.global_batch,
        seq_len=request.seq_len,
        op_costs=op_costs,
        replay=replay,
    )
    if not replay or cost is None or not cost.learned:
        return prediction
    dtype = "bf16" if plan.precision == "fp8" else plan.precision
    shard_args = (
        json.dumps(request.model.to_dict(), sort_keys=True),
        plan.tp,
        mbs,
        request.seq_len // plan.cp,
        dtype,
    )

    def graph() -> tuple[ModelGraph, str]:
        shard = _shard(*shard_args)
        return layout_graph(shard.graph, op_costs), shard.block

    key = json.dumps([*shard_args, plan.precision, plan.kernels, request.cluster.gpu.name])
    return cost.correct(prediction, plan, key=key, graph=graph)


def layout_cost(choice: str | None, cluster: GpuClusterSpec) -> LayoutCost:
    """The cost that prices layouts on ``cluster``: ``--simulator``'s choice (``replay``, a
    checkpoint trained on GPU iterations; ``None``: the user's GPU checkpoint where one was
    trained over the cluster's GPU, else the replay alone).

    Raises:
        InvalidOptionError: a checkpoint of the CPU loop's or of another GPU's.
    """
    return LayoutCost(load_gpu_cost_model(choice, cluster.gpu))


def tp_options(model: ModelSpec, cluster: GpuClusterSpec) -> tuple[int, ...]:
    """The tensor-parallel degrees (powers of two inside a node) that split ``model`` evenly."""
    options = []
    tp = 1
    while tp <= cluster.gpus_per_node:
        try:
            check_tensor_parallel(model, tp)
        except InvalidStrategyError:
            pass
        else:
            options.append(tp)
        tp *= 2
    return tuple(options)


def check_memory_margin(memory_margin_gib: float, cluster: GpuClusterSpec) -> None:
    """Raises:
    InvalidOptionError: a margin below 0 or not below the GPU's memory, naming both.
    """
    margin = memory_margin_gib
    if (
        isinstance(margin, bool)
        or not isinstance(margin, (int, float))
        or not 0 <= margin < cluster.gpu.memory_gib
    ):
        raise InvalidOptionError(
            f"memory_margin_gib({margin!r}) must be a number from 0 to below the GPU's "
            f"{cluster.gpu.memory_gib:g} GiB"
        )


def scale_space(
    model: ModelSpec,
    cluster: GpuClusterSpec,
    *,
    global_batch: int,
    seq_len: int,
    precision: str = "bf16",
    compile: bool = False,
    allow_fsdp: bool = True,
    allow_async_tp: bool = False,
    kernels: str = "pytorch",
    limits: SpaceLimits | None = None,
) -> ScaleSpace:
    """The layouts of ``model`` on ``cluster`` a search chooses from (the job's precision,
    compilation and kernels fixed; ``limits``: what its framework offers)."""
    _, layers = layer_count(model)
    return ScaleSpace(
        gpus=cluster.world_size,
        gpus_per_node=cluster.gpus_per_node,
        layers=layers,
        tp_options=tp_options(model, cluster),
        global_batch=global_batch,
        precision=precision,
        compile=compile,
        allow_fsdp=allow_fsdp,
        allow_async_tp=allow_async_tp,
        seq_len=seq_len,
        kernels=kernels,
        limits=limits,
        experts=shape.experts if (shape := spec_experts(model)) is not None else 0,
    )


def search_at_scale(
    model: ModelSpec,
    cluster: GpuClusterSpec,
    *,
    global_batch: int,
    seq_len: int,
    precision: str = "bf16",
    compile: bool = False,
    allow_fsdp: bool = True,
    allow_async_tp: bool = False,
    kernels: str = "pytorch",
    limits: SpaceLimits | None = None,
    memory_margin_gib: float = 0.0,
    progress: Callable[[int], None] | None = None,
    target: str = "paper",
    cost: LayoutCost | None = None,
) -> ScaleSearchResult:
    """The fastest layout of ``model`` on ``cluster`` that fits its GPUs' memory with
    ``memory_margin_gib`` to spare (:mod:`ddlsim.search.scale_plans`); with ``target``
    ``cuda`` (a search for a run), only layouts this executor runs on those GPUs
    (:func:`runs_on`). The replayed layouts are ranked by ``cost``'s model (a learned one
    corrects them; the closed form that chooses which to replay is not corrected).

    Raises:
        InvalidOptionError: a negative margin, or one as large as the GPU's memory.
        InvalidModelSpecError: when the model cannot be captured.
    """
    check_memory_margin(memory_margin_gib, cluster)
    space = scale_space(
        model,
        cluster,
        global_batch=global_batch,
        seq_len=seq_len,
        precision=precision,
        compile=compile,
        allow_fsdp=allow_fsdp,
        allow_async_tp=allow_async_tp,
        kernels=kernels,
        limits=limits,
    )

    def evaluate(plan: ScalePlan, replay: bool) -> tuple[float, float, bool]:
        request = ScaleRequest(
            model=model, cluster=cluster, plan=plan, global_batch=global_batch, seq_len=seq_len
        )
        prediction = predict_at_scale(request, replay=replay, cost=cost)
        gib = prediction.memory.total_gib
        return prediction.iteration_s, gib, gib + memory_margin_gib <= cluster.gpu.memory_gib

    admit = runs_on(model, cluster, global_batch, seq_len, target)
    return search_layouts(space, evaluate, progress=progress, admit=admit)


def runs_on(
    model: ModelSpec, cluster: GpuClusterSpec, global_batch: int, seq_len: int, target: str
) -> Callable[[ScalePlan], bool] | None:
    """Which layouts a search for a run on ``target`` offers (``paper``: all, ``None``): those
    :func:`ddlsim.plans.feasibility.refusals` lets run with the job's batch and sequences.

    Raises:
        InvalidOptionError: an unknown target.
    """
    where = cluster_target(cluster, where=target, global_batch=global_batch, seq_len=seq_len)
    if where.where == "paper":
        return None
    job = model.with_inputs(batch_size=global_batch, seq_len=seq_len)
    return lambda plan: not refusals(job, plan.to_strategy(), where)
