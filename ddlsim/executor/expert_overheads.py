"""What expert parallelism's own bookkeeping costs a rank's compute, per experts layer, measured
in one process: beside its exchanges, the executor's expert-parallel forward
(:mod:`ddlsim.executor.experts`) counts each expert's token copies, reads the counts back,
regroups the tokens that arrived, puts the outputs back in arrival order (the all-to-all
dispatcher), or builds the group's partial outputs (the all-gather one), and its autograd
functions do the same backward. On the small tensors of a rank's micro-batch these are many
short ops, which the captured iteration (the single-process experts' forward) does not have.

They are measured where nothing else is in the way: a world of one rank (gloo), the model's
forward and backward run with the captured experts' forward and with the expert-parallel one (a
group of one rank: its exchanges are copies), in turns; the difference a layer is the cost. A
layer's copies over one rank's group cost a little of what an exchange costs, so the figure
errs on the high side by that.

Times are single-threaded medians (a rank computes on one core) of ``iterations`` passes after
``warmup``.
"""

import dataclasses
import statistics
import time

import torch
import torch.distributed as dist

from ddlsim.cluster.allocator import use_rank_allocator
from ddlsim.cluster.groups import world_of_one
from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.models import build_model, make_batch
from ddlsim.data.moe import experts_modules
from ddlsim.data.specs.model import ModelSpec
from ddlsim.executor.context import disable_dropout
from ddlsim.executor.experts import ExpertGroups, shard_experts


@dataclasses.dataclass(frozen=True, slots=True)
class ExpertOverheads:
    """The expert-parallel forward's and backward's own compute a layer, ms, beyond the
    captured experts' (never below 0)."""

    forward_ms: float
    backward_ms: float


def measure_expert_overheads(
    spec: ModelSpec, dispatcher: str, *, iterations: int = 20, warmup: int = 3
) -> ExpertOverheads:
    """The overheads of ``dispatcher`` a layer of ``spec``'s experts at its inputs' batch (the
    rank's micro-batch), see the module's docstring.

    Raises:
        InvalidOptionError: counts below 1 (warm-up 0 allowed), a model without routed experts,
            or a process group already set up here.
    """
    if iterations < 1 or warmup < 0:
        raise InvalidOptionError(
            f"iterations({iterations}) must be >= 1 and warmup({warmup}) >= 0"
        )
    use_rank_allocator()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with world_of_one():
            models = {"captured": build_model(spec, seed=0), "split": build_model(spec, seed=0)}
            layers = len(experts_modules(models["split"]))
            if not layers:
                raise InvalidOptionError(f"{spec.label} has no routed experts to measure")
            group = ExpertGroups(ep=1, ep_rank=0, ep_group=dist.group.WORLD, edp=1, edp_group=None)
            shard_experts(models["split"], group, dispatcher)
            batch = make_batch(spec, models["captured"], seed=0)
            times: dict[tuple[str, str], list[float]] = {
                (label, phase): [] for label in models for phase in ("forward", "backward")
            }
            for model in models.values():
                disable_dropout(model)
            for i in range(warmup + iterations):
                for label, model in models.items():
                    model.zero_grad(set_to_none=True)
                    begin = time.perf_counter()
                    loss = model(**batch).loss
                    middle = time.perf_counter()
                    loss.backward()
                    end = time.perf_counter()
                    if i >= warmup:
                        times[(label, "forward")].append((middle - begin) * 1e3)
                        times[(label, "backward")].append((end - middle) * 1e3)
    finally:
        torch.set_num_threads(threads)
    median = {key: statistics.median(values) for key, values in times.items()}
    return ExpertOverheads(
        forward_ms=max(0.0, median[("split", "forward")] - median[("captured", "forward")])
        / layers,
        backward_ms=max(0.0, median[("split", "backward")] - median[("captured", "backward")])
        / layers,
    )
