"""From the GPU-cluster requests' bodies to the tools' objects: the model, the cluster (by name
or as a spec), the layout, the batch, each refusal a 4xx naming the body's field, the bad value
and what is allowed.

The model is built on fake tensors, one block of it, so the service's size limits for models
it builds (:mod:`ddlsim.data.limits`) do not apply: a 1T-parameter GPT is a normal request.
The cluster's size is bounded instead (:data:`MAX_CLUSTER_GPUS`).
"""

import re
from collections.abc import Callable
from typing import Any, TypeVar

from ddlsim.data.errors import (
    DdlsimError,
    InvalidClusterError,
    InvalidModelSpecError,
    one_line,
)
from ddlsim.data.models import check_model_spec
from ddlsim.data.specs.gpu_cluster import GpuClusterSpec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.data.store import Store
from ddlsim.plans.feasibility import check_priceable
from ddlsim.service.api.errors import BadRequestError
from ddlsim.service.api.inputs import finite, resolve
from ddlsim.simulator.gpu.scale import check_world_size
from ddlsim.workflows.clusters import named_cluster

T = TypeVar("T")

MAX_CLUSTER_GPUS = 1 << 17
"""The most GPUs a cluster of a request may have (131,072)."""
# A refusal's message starts with the option it names: "global_batch(10) is not divisible".
_NAMED = re.compile(r"^(\w+)\(")
# The iteration's batch is the global batch of a cluster request (the plans' word for it).
_BATCH_FIELDS = {
    "global_batch": "body.global_batch",
    "batch_size": "body.global_batch",
    "seq_len": "body.seq_len",
}


def refused(build: Callable[[], T], *, field: str) -> T:
    """``build()``, its refusal a 422 on ``field`` (on ``body.global_batch`` or
    ``body.seq_len`` where the message starts with one of them, on ``body.model`` for a model
    that cannot be built, on ``body.cluster`` for a bad cluster).

    Raises:
        BadRequestError: 422 with the refusal's message.
    """
    try:
        return build()
    except DdlsimError as exc:
        named = _NAMED.match(str(exc))
        if named is not None and named.group(1) in _BATCH_FIELDS:
            field = _BATCH_FIELDS[named.group(1)]
        elif isinstance(exc, InvalidModelSpecError):
            field = "body.model"
        elif isinstance(exc, InvalidClusterError):
            field = "body.cluster"
        raise BadRequestError(one_line(exc, limit=2000), field=field, status=422) from None


def cluster_model(store: Store, ref: Any) -> ModelSpec:
    """The body's model: a zoo or registered model's name, or a spec object (its class one the
    tools may build), of a family the GPU path can split per layer."""
    field = "body.model"
    if isinstance(ref, str):
        spec = resolve(store, ref, field=field)
    elif isinstance(ref, dict):
        finite(ref, field=field)
        spec = refused(lambda: ModelSpec.from_dict(ref), field=field)
        refused(lambda: check_model_spec(spec), field=field)
    else:
        raise BadRequestError(
            f"a model is a name or a spec object, got {type(ref).__name__}",
            field=field,
            status=422,
        )
    refused(lambda: check_priceable(spec), field=field)
    return spec


def cluster_of(store: Store, ref: Any) -> GpuClusterSpec:
    """The body's cluster: ``NAME[:NODES]`` (a preset or a stored profile; a string is never
    read as a path) or a spec object, of at most :data:`MAX_CLUSTER_GPUS` GPUs."""
    field = "body.cluster"
    if isinstance(ref, str):
        cluster = refused(lambda: named_cluster(ref, store), field=field)
    elif isinstance(ref, dict):
        finite(ref, field=field)
        if "world_size" in ref:
            raise BadRequestError(
                f"cluster {ref!r} names world_size: an emulated cluster of this machine, which "
                "POST /v1/predictions predicts (world_size, bandwidth); a GPU cluster here is a "
                "preset's name or an object naming preset or gpu",
                field=field,
                status=422,
            )
        cluster = refused(lambda: GpuClusterSpec.from_dict(ref), field=field)
    else:
        raise BadRequestError(
            f"a cluster is a name (NAME[:NODES]) or a spec object, got {type(ref).__name__}",
            field=field,
            status=422,
        )
    if cluster.world_size > MAX_CLUSTER_GPUS:
        raise BadRequestError(
            f"cluster {cluster.name!r}: {cluster.nodes} nodes x {cluster.gpus_per_node} GPUs = "
            f"{cluster.world_size} GPUs, over the {MAX_CLUSTER_GPUS} a request may price",
            field=field,
            status=422,
        )
    return cluster


def plan_of(raw: dict[str, Any], cluster: GpuClusterSpec) -> ScalePlan:
    """The body's strategy as the GPU path prices it (``ScalePlan.from_strategy``: dp from
    the cluster's size when left out, precision bf16), its ``dp * tp * pp`` the cluster's
    GPUs."""
    field = "body.strategy"
    finite(raw, field=field)
    plan = refused(lambda: ScalePlan.from_dict(raw, cluster.world_size), field=field)
    refused(lambda: check_world_size(plan, cluster), field=field)
    return plan


def batch_of(spec: ModelSpec, global_batch: int | None, seq_len: int | None) -> tuple[int, int]:
    """The iteration's sequences and their length: the body's, else the model's own."""
    length = seq_len or spec.inputs.seq_len
    if length is None:
        raise BadRequestError(
            f"seq_len is needed: {spec.label}'s spec gives no sequence length",
            field="body.seq_len",
            status=422,
        )
    return global_batch or spec.inputs.batch_size, length
