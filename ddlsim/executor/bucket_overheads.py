"""What each gradient bucket costs a rank's compute beyond its copies, measured once in one
process: the executor's post-accumulate-grad hooks (flatten, launch, wait, copy back: a few
dispatcher calls and a handoff to gloo's thread a bucket) and ``DistributedDataParallel``'s
reducer with its comm hook.

The copies scale with the bucket's bytes and are priced apart (:mod:`simulator.runtime`); what
is left is a fixed cost a bucket, which a partition of many small buckets pays many times. It
is measured where nothing else is in the way: a world of one rank (gloo), the model trained by
the executor's own trainers with the gradients in one bucket and with one bucket a parameter,
their steps taken in turns. The difference over the extra buckets is the cost a bucket; the
same bytes are copied either way.

Times are single-threaded medians (a rank computes on one core) of ``iterations`` steps after
``warmup``.
"""

import statistics
import time
from typing import Any

import torch
from torch import nn

from ddlsim.cluster.allocator import use_rank_allocator
from ddlsim.cluster.groups import world_of_one
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.models import build_model, make_batch
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import Bucket, Strategy
from ddlsim.executor.context import RankContext, disable_dropout
from ddlsim.executor.data_parallel import BucketTrainer, DDPTrainer

MANY_SMALL_PARAMETERS = ModelSpec.from_dict(
    {
        "name": "mlp-128-params",
        "source": "reference",
        "class": "MLP",
        "config": {"in_features": 16, "hidden_sizes": [16] * 63, "num_classes": 10},
        "inputs": {"batch_size": 4},
    }
)
"""The model a bucket's cost is measured on by default: 128 parameters and next to no compute,
so that a hundred more buckets stand out of a step's noise (on a model whose step is 100 ms,
the noise of 1 % is 50 us a bucket over 20 buckets)."""

ONE_BUCKET_MB = 1e6
"""A cap no model here reaches: DDP puts every gradient in one bucket."""
TINY_CAP_MB = 1e-6
"""A cap every gradient exceeds: DDP gives each its own bucket."""


def _context(spec: ModelSpec, strategy: Strategy, batch: dict[str, torch.Tensor]) -> RankContext:
    return RankContext(
        rank=0,
        world_size=1,
        dp=1,
        tp=1,
        pp=1,
        spec=spec,
        strategy=strategy,
        seed=0,
        device=torch.device("cpu"),
        global_batch=batch,
        mesh=None,
    )


def _model(spec: ModelSpec) -> nn.Module:
    model = build_model(spec, seed=0)
    disable_dropout(model)
    return model


def _buckets(model: nn.Module, groups: list[list[str]]) -> list[Bucket]:
    params = dict(model.named_parameters())
    return [
        Bucket(
            index=i,
            params=tuple(names),
            grad_bytes=sum(params[n].numel() * params[n].element_size() for n in names),
        )
        for i, names in enumerate(groups)
    ]


def measure_bucket_overheads(
    spec: ModelSpec, *, iterations: int = 20, warmup: int = 3
) -> dict[str, Any]:
    """The fixed cost a gradient bucket adds to a rank's step, in microseconds, under the
    executor's hooks (``hooks_us_per_bucket``) and under DDP (``ddp_us_per_bucket``), with the
    step times and bucket counts it comes from (see the module's docstring).

    Raises:
        InvalidOptionError: counts below 1 (warm-up 0 allowed), a model with fewer than two
            trained parameters, or a process group already set up here.
    """
    if iterations < 1 or warmup < 0:
        raise InvalidOptionError(
            f"iterations({iterations}) must be >= 1 and warmup({warmup}) >= 0"
        )
    use_rank_allocator()  # timed as a rank runs (profiler.allocator)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with world_of_one():
            shape = _model(spec)
            batch = make_batch(spec, shape, seed=0)
            # Ready order is roughly the reverse of definition order; in a world of one rank the
            # order only decides when each launch happens, not what it costs.
            names = [n for n, p in reversed(list(shape.named_parameters())) if p.requires_grad]
            if len(names) < 2:
                raise InvalidOptionError(
                    f"{spec.label} has {len(names)} trained parameter(s): at least 2 are needed "
                    "to compare one bucket with many"
                )
            trainers: dict[str, Any] = {}
            counts: dict[str, int] = {}
            for label, groups in (("hooks_one", [names]), ("hooks_many", [[n] for n in names])):
                hooks = Strategy.from_dict(
                    {"tensor_fusion": {"buckets": groups, "implementation": "hooks"}}
                )
                model = _model(spec)
                buckets = _buckets(model, groups)
                trainers[label] = BucketTrainer(_context(spec, hooks, batch), model, buckets)
                counts[label] = len(groups)
            for label, cap in (("ddp_one", ONE_BUCKET_MB), ("ddp_many", TINY_CAP_MB)):
                ddp = Strategy.from_dict(
                    {
                        "tensor_fusion": {
                            "bucket_cap_mb": cap,
                            "first_bucket_cap_mb": cap,
                            "implementation": "ddp",
                        }
                    }
                )
                trainers[label] = DDPTrainer(_context(spec, ddp, batch), _model(spec))
            times: dict[str, list[float]] = {label: [] for label in trainers}
            for i in range(warmup + iterations):
                for label, trainer in trainers.items():
                    begin = time.perf_counter()
                    trainer.step()
                    elapsed_us = (time.perf_counter() - begin) * 1e6
                    if i >= warmup:
                        times[label].append(elapsed_us)
            for label in ("ddp_one", "ddp_many"):
                counts[label] = len(trainers[label].launched)
    finally:
        torch.set_num_threads(threads)
    medians = {label: statistics.median(values) for label, values in times.items()}

    def per_bucket(kind: str) -> float:
        extra = counts[f"{kind}_many"] - counts[f"{kind}_one"]
        if extra <= 0:
            return 0.0
        return max(0.0, medians[f"{kind}_many"] - medians[f"{kind}_one"]) / extra

    return {
        "model": spec.label,
        "hooks_us_per_bucket": per_bucket("hooks"),
        "ddp_us_per_bucket": per_bucket("ddp"),
        "step_us": medians,
        "buckets": counts,
        "iterations": iterations,
    }
