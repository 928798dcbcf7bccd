"""Synchronising a stage's gradients over the ranks that hold the same weights, after the
pipeline: an all-reduce, or a reduce-scatter and (after the sharded step) an all-gather of the
updated weights, in Megatron-Core's buckets, each paying NCCL's latency; beside the last
micro-batch's backward and the next iteration's first forward (:mod:`.overlap`)."""

from ddlsim.data.specs.scale_plan import ScalePlan
from ddlsim.simulator.gpu.nccl import Group, NcclModel
from ddlsim.simulator.gpu.overlap import Exposed, exposed_ms

# Megatron-Core's gradient buckets (DistributedDataParallelConfig.bucket_size's default).
BUCKET_PARAMS = 40_000_000
BUCKET_PARAMS_PER_RANK = 1_000_000


def gradient_sync(
    plan: ScalePlan,
    nccl: NcclModel,
    group: Group,
    *,
    params: int,
    dtype_bytes: int,
    last_backward_ms: float,
    first_forward_ms: float,
) -> Exposed:
    """What synchronising the gradients adds after the pipeline: an all-reduce over the ranks
    holding the same weights, or a reduce-scatter and (after the sharded step) an all-gather of
    the updated weights; bucket by bucket beside the last micro-batch's backward, the gather
    beside the next iteration's first forward. FSDP's are in the blocks' times."""
    if plan.fsdp or group.size == 1:
        return Exposed()
    buckets = gradient_buckets(params, group.size)
    nbytes = params * dtype_bytes / buckets
    network = group.nodes > 1
    if plan.distributed_optimizer or plan.zero:
        reduce_ms = buckets * nccl.time_us("reduce_scatter", nbytes, group) / 1e3
        gather_ms = buckets * nccl.time_us("all_gather", nbytes, group) / 1e3
        return Exposed.at(
            network,
            exposed_ms(last_backward_ms, reduce_ms) + exposed_ms(first_forward_ms, gather_ms),
        )
    reduce_ms = buckets * nccl.time_us("all_reduce", nbytes, group) / 1e3
    return Exposed.at(network, exposed_ms(last_backward_ms, reduce_ms))


def gradient_buckets(params: int, ranks: int) -> int:
    """How many buckets a stage's gradients are reduced in: Megatron-Core's default bucket of
    ``max(40M, 1M x ranks)`` parameters (its DDP config), each bucket one collective that pays
    NCCL's latency over the ``ranks``."""
    bucket = max(BUCKET_PARAMS, BUCKET_PARAMS_PER_RANK * ranks)
    return max(1, -(-params // bucket))
