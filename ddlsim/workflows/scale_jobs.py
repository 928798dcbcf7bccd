"""The GPU-cluster path (:mod:`ddlsim.workflows.scale`) as the service runs it: a prediction
stored with the model and the layout it priced, and a search, queued as a job, whose ranked
layouts are each priced in full.

A prediction's figures are :meth:`ScalePrediction.to_json` key for key, but for two: memory
as ``{"total_gib", "parts_gib": {part: GiB}}``, and the breakdown (``breakdown_ms``) with the
simulator's own parts first in its order (:data:`~ddlsim.simulator.gpu.scale.BREAKDOWN_KEYS`:
compute, recompute, exposed communication over NVLink and over the network, the pipeline's
bubble, the optimizer), then any other part as given.
"""

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.scale_plan import PRECISIONS
from ddlsim.data.specs.strategy import KERNELS
from ddlsim.data.store import (
    ClusterPredictionRecord,
    Store,
    add_cluster_prediction,
    add_model_spec,
    add_strategy,
)
from ddlsim.plans.feasibility import check, check_priceable, cluster_target
from ddlsim.search.scale_plans import SpaceLimits
from ddlsim.simulator.gpu.prediction import BREAKDOWN_KEYS, ScalePrediction
from ddlsim.workflows.requests import Progress, no_progress
from ddlsim.workflows.scale import (
    ScaleRequest,
    check_memory_margin,
    layout_cost,
    predict_at_scale,
    search_at_scale,
)

SCALE_SIMULATOR_VERSION = "gpu-scale-2"
"""What stored cluster predictions were priced with (bump it when the GPU path's figures
change meaning)."""
DEFAULT_TOP = 10


def scale_version(predictor: str) -> str:
    """The version a GPU prediction carries: the GPU path's, after the learned predictor
    that corrected it (``gnn+gpu-scale-2``) where one did."""
    if predictor == "replay":
        return SCALE_SIMULATOR_VERSION
    return f"{predictor}+{SCALE_SIMULATOR_VERSION}"


MAX_TOP = 50
_REPORT_EVERY_S = 0.5


def ordered_breakdown(breakdown: Mapping[str, float]) -> dict[str, float]:
    """``breakdown`` with the simulator's known parts first, in their order, the others after,
    as given."""
    known = [key for key in BREAKDOWN_KEYS if key in breakdown]
    rest = [key for key in breakdown if key not in BREAKDOWN_KEYS]
    return {key: float(breakdown[key]) for key in known + rest}


def figures(prediction: ScalePrediction) -> dict[str, Any]:
    """The prediction's JSON (see the module) for the API and the store."""
    raw = dict(prediction.to_json())
    memory = dict(raw.pop("memory"))
    breakdown = raw.pop("breakdown_ms")
    total = memory.pop("total_gib")
    return {
        **raw,
        "memory": {
            "total_gib": total,
            "parts_gib": {key.removesuffix("_gib"): value for key, value in memory.items()},
        },
        "breakdown_ms": ordered_breakdown(breakdown),
    }


def scale_request_checked(request: ScaleRequest) -> ScaleRequest:
    """``request``, refused before any capture when the model cannot be priced per layer or
    the layout does not fit the cluster or the batch.

    Raises:
        InvalidStrategyError: naming the mismatch (``dp * tp * pp`` against the cluster's GPUs,
            ``global_batch`` against ``dp * micro_batches``, the model's family).
    """
    target = cluster_target(
        request.cluster, global_batch=request.global_batch, seq_len=request.seq_len
    )
    check(request.model, request.plan.to_strategy(), target)
    return request


def predict_and_store(request: ScaleRequest, store: Store) -> ClusterPredictionRecord:
    """Price ``request`` (:func:`predict_at_scale`) and store it with its model spec and
    layout in one transaction; the stored record (with its id).

    Raises:
        InvalidStrategyError, InvalidModelSpecError: as :func:`predict_at_scale`.
    """
    scale_request_checked(request)
    prediction = predict_at_scale(request, cost=layout_cost(None, request.cluster))
    plan = request.plan
    with store.transaction() as session:
        record = ClusterPredictionRecord(
            model=request.model.label,
            model_spec_hash=add_model_spec(session, spec=request.model),
            strategy_hash=add_strategy(session, strategy=plan.to_strategy()),
            strategy=plan.to_dict(),
            cluster=request.cluster.to_dict(),
            global_batch=request.global_batch,
            seq_len=request.seq_len,
            iteration_s=prediction.iteration_s,
            prediction={"layout": plan.label(), **figures(prediction)},
            simulator_version=scale_version(prediction.predictor),
        )
        prediction_id = add_cluster_prediction(session, prediction=record)
    return store.cluster_prediction(prediction_id=prediction_id)


def prediction_json(record: ClusterPredictionRecord) -> dict[str, Any]:
    """A stored cluster prediction as the API answers it."""
    cluster = record.cluster
    return {
        "id": record.id,
        "created_at": record.created_at.isoformat() if record.created_at else None,
        "model": record.model,
        "model_spec_hash": record.model_spec_hash,
        "cluster": cluster,
        "world_size": int(cluster["nodes"]) * int(cluster["gpus_per_node"]),
        "strategy": record.strategy,
        "global_batch": record.global_batch,
        "seq_len": record.seq_len,
        "simulator_version": record.simulator_version,
        **record.prediction,
    }


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LayoutSearchRequest:
    """Search the fastest layout of ``model`` on ``cluster`` for ``global_batch`` sequences of
    ``seq_len`` tokens (:func:`search_at_scale`, its defaults the command line's; ``kernels``
    ``transformer_engine`` prices Transformer Engine's fused kernels), and price the ``top``
    layouts in full.

    Raises:
        InvalidOptionError, InvalidStrategyError: naming the bad value.
    """

    model: ModelSpec
    cluster: GpuClusterSpec
    global_batch: int
    seq_len: int
    precision: str = "bf16"
    compile: bool = False
    allow_fsdp: bool = True
    allow_async_tp: bool = False
    kernels: str = "pytorch"
    top: int = DEFAULT_TOP
    # What the job's framework offers the search (SpaceLimits' keys), where less than all.
    search_space: Mapping[str, Any] | None = None
    # GiB a layout must leave free on each GPU to be offered (beyond the model's reserve).
    memory_margin_gib: float = 0.0
    # paper: every layout priced; cuda: only what the executor runs on those GPUs.
    target: str = "paper"

    def __post_init__(self) -> None:
        check_priceable(self.model)
        if self.search_space is not None:
            self.limits()
        for name in ("global_batch", "seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidOptionError(f"{name}({value!r}) must be an integer >= 1")
        if self.precision not in PRECISIONS:
            raise InvalidStrategyError(
                f"precision({self.precision!r}) is not priced on GPU clusters; allowed: "
                f"{', '.join(PRECISIONS)}"
            )
        if self.kernels not in KERNELS:
            raise InvalidStrategyError(
                f"kernels({self.kernels!r}) is not one of {', '.join(KERNELS)}"
            )
        if not 1 <= self.top <= MAX_TOP:
            raise InvalidOptionError(f"top({self.top}) must be between 1 and {MAX_TOP}")
        check_memory_margin(self.memory_margin_gib, self.cluster)
        if self.target not in ("paper", "cuda"):
            raise InvalidOptionError(f"target({self.target!r}) is not one of paper, cuda")

    def limits(self) -> SpaceLimits | None:
        """The search space's limits (:class:`SpaceLimits`), ``None`` for everything.

        Raises:
            InvalidStrategyError: naming an unknown key or value.
        """
        return None if self.search_space is None else SpaceLimits.from_dict(self.search_space)

    def to_json(self) -> dict[str, Any]:
        """The request as the job queue stores it (the REST API's field names)."""
        return {
            "model": self.model.to_dict(),
            "cluster": self.cluster.to_dict(),
            "global_batch": self.global_batch,
            "seq_len": self.seq_len,
            "precision": self.precision,
            "compile": self.compile,
            "allow_fsdp": self.allow_fsdp,
            "allow_async_tp": self.allow_async_tp,
            "kernels": self.kernels,
            "top": self.top,
            **({"search_space": dict(self.search_space)} if self.search_space else {}),
            **({"memory_margin_gib": self.memory_margin_gib} if self.memory_margin_gib else {}),
            **({"target": self.target} if self.target != "paper" else {}),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "LayoutSearchRequest":
        """A request stored by :meth:`to_json`.

        Raises:
            InvalidOptionError: a key that is not a search option; the specs' own errors.
        """
        given = dict(raw)
        allowed = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(given) - allowed)
        if unknown:
            raise InvalidOptionError(
                f"unknown cluster search option(s) {unknown}; allowed: {sorted(allowed)}"
            )
        model = ModelSpec.from_dict(given.pop("model"))
        cluster = GpuClusterSpec.from_dict(given.pop("cluster"))
        return cls(model=model, cluster=cluster, **given)


def search_cluster(
    request: LayoutSearchRequest, progress: Progress = no_progress
) -> dict[str, Any]:
    """Search ``request``'s layouts and price the best ``top`` in full; the job's result:
    what was searched, how many layouts were priced and refused, and ``layouts``, fastest
    first, each its strategy JSON, label, whether its schedule was replayed, and its
    :func:`figures`.

    Raises:
        InvalidModelSpecError: when the model cannot be captured.
    """
    cluster = request.cluster
    last_report = [time.monotonic()]

    def priced(evaluated: int) -> None:
        now = time.monotonic()
        if now - last_report[0] >= _REPORT_EVERY_S:
            last_report[0] = now
            progress(None, f"{evaluated} layouts priced")

    progress(0.0, f"capturing {request.model.label}'s block")
    cost = layout_cost(None, cluster)
    result = search_at_scale(
        request.model,
        cluster,
        global_batch=request.global_batch,
        seq_len=request.seq_len,
        precision=request.precision,
        compile=request.compile,
        allow_fsdp=request.allow_fsdp,
        allow_async_tp=request.allow_async_tp,
        kernels=request.kernels,
        limits=request.limits(),
        memory_margin_gib=request.memory_margin_gib,
        progress=priced,
        target=request.target,
        cost=cost,
    )
    top = result.ranked[: request.top]
    layouts = []
    for index, ranked in enumerate(top):
        progress(0.9 + 0.1 * index / max(1, len(top)), f"pricing layout {index + 1} in full")
        scale = ScaleRequest(
            model=request.model,
            cluster=cluster,
            plan=ranked.plan,
            global_batch=request.global_batch,
            seq_len=request.seq_len,
        )
        prediction = predict_at_scale(scale, replay=ranked.replayed, cost=cost)
        layouts.append(
            {
                "rank": index + 1,
                "layout": ranked.plan.label(),
                "strategy": ranked.plan.to_dict(),
                "replayed": ranked.replayed,
                **figures(prediction),
            }
        )
    return {
        "model": request.model.label,
        "cluster": cluster.to_dict(),
        "world_size": cluster.world_size,
        "global_batch": request.global_batch,
        "seq_len": request.seq_len,
        "precision": request.precision,
        "compile": request.compile,
        "evaluated": result.evaluated,
        "refused_memory": result.refused_memory,
        "failed": result.failed,
        "search_s": round(result.seconds, 3),
        "simulator_version": scale_version(cost.cost_model.name),
        "layouts": layouts,
    }
