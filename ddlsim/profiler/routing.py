"""How a mixture of experts' routers spread a run's tokens over the expert-parallel ranks.

Expert parallelism is as fast as its busiest rank: every all-to-all of a layer waits for the
rank that received the most token copies, and that rank's experts compute longest. The router
decides how many each rank gets, so the replay takes the imbalance from the router itself: the
model the executor builds (same seed, same synthetic batch, the same data-parallel and
micro-batch slices) is run forward once, and each layer's top-k choices are counted by the
expert-parallel rank that holds the chosen expert.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from ddlsim.data.models import build_model, make_batch
from ddlsim.data.moe import experts_modules
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.specs.strategy import ParallelPlan


@dataclasses.dataclass(frozen=True)
class RoutingLoad:
    """Per routed-experts module (by its path): the busiest expert-parallel rank's token copies
    over the mean rank's (1.0: perfectly balanced), averaged over the run's micro-batches, the
    busiest of the expert-parallel groups taken in each."""

    imbalance: Mapping[str, float]

    def of(self, module: str) -> float:
        return float(self.imbalance.get(module, 1.0))

    def to_json(self) -> dict[str, float]:
        return dict(self.imbalance)


def routing_load(
    spec: ModelSpec, plan: ParallelPlan, world_size: int, *, seed: int = 0
) -> RoutingLoad:
    """The routers' load on ``plan.ep`` ranks in the executor's first iteration of ``spec`` on
    ``world_size`` data-parallel ranks (seed ``seed``, dropout off as the executor runs).

    Raises:
        InvalidStrategyError: the batch does not split into the plan's ranks and micro-batches.
    """
    dp = plan.resolve_dp(world_size)
    model = build_model(spec, seed=seed)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    batch = make_batch(spec, model, seed=seed)
    experts = experts_modules(model)
    choices: dict[str, list[torch.Tensor]] = {path: [] for path in experts}
    hooks = [
        module.register_forward_pre_hook(_recorder(choices[path]))
        for path, module in experts.items()
    ]
    slices = _slices(batch, dp * plan.micro_batches)
    try:
        with torch.no_grad():
            for part in slices:
                model(**part)
    finally:
        for hook in hooks:
            hook.remove()
    imbalance = {
        path: _imbalance(found, experts=_count(experts[path]), plan=plan, dp=dp)
        for path, found in choices.items()
    }
    return RoutingLoad(imbalance=imbalance)


def _count(module: torch.nn.Module) -> int:
    experts: Any = module
    return int(experts.num_experts)


def _recorder(into: list[torch.Tensor]) -> Any:
    def record(_module: Any, args: tuple[Any, ...]) -> None:
        into.append(args[1].reshape(-1).clone())  # top_k_index of (hidden, index, weights)

    return record


def _slices(batch: Mapping[str, torch.Tensor], parts: int) -> list[dict[str, torch.Tensor]]:
    """Rank-major: the ``micro_batches`` slices of data-parallel rank 0, then of rank 1, ...
    (``dp * micro_batches`` equal slices of the batch in order, as the executor splits it)."""
    (size,) = {int(t.shape[0]) for t in batch.values()}
    step = max(1, size // parts)
    return [{k: t[i * step : (i + 1) * step] for k, t in batch.items()} for i in range(parts)]


def _imbalance(found: list[torch.Tensor], *, experts: int, plan: ParallelPlan, dp: int) -> float:
    """``found``: each (rank, micro-batch)'s chosen experts, rank-major."""
    ep, micro = plan.ep, plan.micro_batches
    if ep <= 1 or not found:
        return 1.0
    local = experts // ep
    ratios = []
    for mb in range(micro):
        worst = 1.0
        for group in range(dp // ep):
            ranks = range(group * ep, (group + 1) * ep)
            counts = torch.stack(
                [torch.bincount(found[r * micro + mb], minlength=experts) for r in ranks]
            ).sum(0)
            load = counts.view(ep, local).sum(1).double()
            worst = max(worst, float(load.max() / load.mean()))
        ratios.append(worst)
    return sum(ratios) / len(ratios)
