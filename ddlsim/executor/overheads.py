"""What the FSDP2 and DTensor runtimes add to a rank's compute, measured once in one process.

A kernel profile times the model's own ops; FSDP2 adds per group the all-gather's copy-in and
copy-out, the reshard and its hooks, and DTensor adds its dispatch to every op on a split layer
and to every optimizer op on a split parameter. Both are measured where nothing else is in
the way: one process, a world of one rank (gloo), the model trained eagerly, then with every
block ``fully_shard``-ed as the executor does (one group a block), then split by its family's
tensor-parallel plan over a one-rank mesh. The differences, divided among what causes them,
are what the replay charges (:mod:`simulator.fsdp`, :mod:`simulator.tensor_parallel`):

- FSDP: forward and backward time, split into a cost per group and one per byte of the group's
  parameters (the copies into and out of its all-gather and reduce-scatter buffers): the model
  is sharded twice, one group a block (and the root) and the root alone, which move the same
  bytes in a different number of groups; the optimizer's extra time per parameter;
- tensor parallelism: forward and backward time over the split modules, per split module; the
  optimizer's extra time per split parameter.

Times are single-threaded medians (a rank computes on one core) of ``iterations`` steps after
``warmup``.
"""

import statistics
import time
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from ddlsim.cluster.allocator import use_rank_allocator
from ddlsim.cluster.groups import mesh as device_mesh
from ddlsim.cluster.groups import world_of_one
from ddlsim.data.errors import InvalidOptionError, InvalidStrategyError
from ddlsim.data.models import build_model, make_batch
from ddlsim.data.specs.model import ModelSpec
from ddlsim.executor.context import disable_dropout, local_loss, make_optimizer
from ddlsim.executor.tensor_parallel import apply_tensor_parallel
from ddlsim.plans.stages import default_groups
from ddlsim.plans.tp_plans import tp_plan


def _time_steps(
    models: dict[str, nn.Module], batch: dict[str, torch.Tensor], iterations: int, warmup: int
) -> dict[str, tuple[float, float]]:
    """Median forward+backward and optimizer-step times (us) of each of ``models`` on
    ``batch``, their steps taken in turns so that a slow spell of the machine hits all."""
    optimizers = {name: make_optimizer("adamw", m.parameters()) for name, m in models.items()}
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in models}
    for i in range(warmup + iterations):
        for name, model in models.items():
            optimizers[name].zero_grad(set_to_none=True)
            begin = time.perf_counter()
            local_loss(model, batch).backward()
            middle = time.perf_counter()
            optimizers[name].step()
            end = time.perf_counter()
            if i >= warmup:
                times[name][0].append((middle - begin) * 1e6)
                times[name][1].append((end - middle) * 1e6)
    return {
        name: (statistics.median(compute), statistics.median(step))
        for name, (compute, step) in times.items()
    }


def measure_plan_overheads(
    spec: ModelSpec, *, iterations: int = 10, warmup: int = 3
) -> dict[str, Any]:
    """FSDP2's and DTensor's costs on ``spec`` (see the module's docstring), in microseconds.

    Raises:
        InvalidOptionError: ``spec``'s family has no tensor-parallel plan, counts below 1
            (warm-up 0 allowed), or a process group already set up here.
    """
    try:
        plan = tp_plan(spec)
    except InvalidStrategyError as exc:
        raise InvalidOptionError(str(exc)) from None
    if iterations < 1 or warmup < 0:
        raise InvalidOptionError(
            f"iterations({iterations}) must be >= 1 and warmup({warmup}) >= 0"
        )
    use_rank_allocator()  # timed as a rank runs (profiler.allocator)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    def fresh() -> nn.Module:
        model = build_model(spec, seed=0)
        disable_dropout(model)
        return model

    try:
        with world_of_one():
            mesh = device_mesh("cpu", (1,))
            plain = fresh()
            batch = make_batch(spec, plain, seed=0)
            params = sum(1 for p in plain.parameters() if p.requires_grad)
            param_bytes = sum(
                p.numel() * p.element_size() for p in plain.parameters() if p.requires_grad
            )
            sharded = fresh()
            groups = default_groups(sharded)
            for group in groups:
                fully_shard([sharded.get_submodule(path) for path in group], mesh=mesh)
            fully_shard(sharded, mesh=mesh)
            root_only = fresh()
            fully_shard(root_only, mesh=mesh)
            split = fresh()
            styles = apply_tensor_parallel(split, plan, mesh, 1)
            split_params = sum(1 for p in split.parameters() if isinstance(p, DTensor))
            times = _time_steps(
                {"eager": plain, "fsdp": sharded, "root": root_only, "tp": split},
                batch,
                iterations,
                warmup,
            )
    finally:
        torch.set_num_threads(threads)

    def per(extra: float, count: int) -> float:
        return max(0.0, extra) / max(count, 1)

    (base_compute, base_step), (fsdp_compute, fsdp_step) = times["eager"], times["fsdp"]
    root_compute, (tp_compute, tp_step) = times["root"][0], times["tp"]
    # len(groups) + 1 groups and one group move the same bytes: the difference is the groups'.
    per_group = per(fsdp_compute - root_compute, len(groups))

    return {
        "model": spec.label,
        "eager_us": base_compute,
        "optimizer_us": base_step,
        "fsdp_groups": len(groups) + 1,
        "fsdp_us_per_group": per_group,
        "fsdp_us_per_byte": per(root_compute - base_compute - per_group, param_bytes),
        "fsdp_step_us_per_param": per(fsdp_step - base_step, params),
        "tp_modules": len(styles),
        "tp_us_per_module": per(tp_compute - base_compute, len(styles)),
        "tp_step_us_per_param": per(tp_step - base_step, split_params),
    }
