"""Mixture-of-experts parallelism in a :class:`~ddlsim.data.specs.parallel.ParallelPlan`: how
a job's ranks split the experts, folded onto the ranks that split attention (Megatron-Core's
"MoE parallel folding").

Attention's ranks are ``tp x cp x dp`` a pipeline stage; the experts' are ``etp x ep x edp`` of
the same ranks: ``ep`` ranks hold disjoint experts (each ``num_experts / ep`` of them) and
exchange tokens (the dispatcher), ``etp`` ranks split each expert's matrices as tensor
parallelism splits a dense MLP, and the expert-data-parallel size ``edp = tp x cp x dp / (ep x
etp)`` replicates each expert shard (its gradients are reduced over those ranks).

``dispatcher`` says how tokens reach their experts: ``all_to_all`` sends each token only to the
ranks of its top-k experts (counts exchanged first, then uneven all-to-alls, forward and
backward); ``all_gather`` gathers every token on every expert-parallel rank, each computes its
own experts' share and the outputs are reduce-scattered back; ``flex`` is Megatron-Core's flex
dispatcher (DeepEP's or HybridEP's kernels): a token crosses to each other node holding one of
its experts once and fans out over NVLink there (priced on GPU clusters, not run here).
``capacity_factor`` caps the
tokens an expert takes to that multiple of an even share, the rest dropped (``None``:
dropless, every token computed). ``ep_overlap`` runs one micro-batch's dispatch and combine
beside another's compute (Megatron-Core's ``overlap_moe_expert_parallel_comm`` with delayed
weight gradients, its combined 1F1B schedule): priced on GPU clusters, not run here.
"""

from typing import Any

from ddlsim.data.errors import InvalidStrategyError
from ddlsim.data.specs._serde import expect_int

DISPATCHERS: tuple[str, ...] = ("all_to_all", "all_gather", "flex")
EXPERT_DEFAULTS: dict[str, Any] = {
    "ep": 1,
    "etp": 1,
    "dispatcher": "all_to_all",
    "capacity_factor": None,
    "ep_overlap": False,
}
"""The experts' fields and their defaults (a strategy's JSON leaves a default out)."""


def check_experts(plan: Any) -> None:
    """The experts' fields alone: sizes, the dispatcher, the capacity factor.

    Raises:
        InvalidStrategyError: naming the bad value and what is allowed.
    """
    expect_int(plan.ep, "parallel.ep", InvalidStrategyError)
    expect_int(plan.etp, "parallel.etp", InvalidStrategyError)
    if plan.dispatcher not in DISPATCHERS:
        raise InvalidStrategyError(
            f"parallel.dispatcher {plan.dispatcher!r} is not one of {', '.join(DISPATCHERS)}"
        )
    factor = plan.capacity_factor
    if factor is not None and (
        isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0
    ):
        raise InvalidStrategyError(
            f"parallel.capacity_factor must be a number > 0 (or null: dropless), got {factor!r}"
        )
    if not isinstance(plan.ep_overlap, bool):
        raise InvalidStrategyError(
            f"parallel.ep_overlap must be true or false, got {plan.ep_overlap!r}"
        )
    if plan.ep_overlap and plan.ep == 1:
        raise InvalidStrategyError(
            "parallel.ep_overlap overlaps the experts' dispatch with compute; it needs ep > 1"
        )
    if (plan.ep > 1 or plan.etp > 1) and (plan.grid or plan.per_layer or plan.stages):
        raise InvalidStrategyError(
            f"parallel.ep({plan.ep}) and etp({plan.etp}) fold onto Megatron's 1-D layouts; they "
            "do not combine with parallel.grid, layers, vocab or stages"
        )


def expert_data_parallel(plan: Any, dp: int) -> int:
    """``edp``: how many ranks hold each expert shard, with ``dp`` data-parallel ranks.

    Raises:
        InvalidStrategyError: ``ep * etp`` does not divide ``tp * cp * dp``.
    """
    ranks = plan.tp * plan.cp * dp
    experts = plan.ep * plan.etp
    if ranks % experts:
        raise InvalidStrategyError(
            f"parallel.ep({plan.ep}) * etp({plan.etp}) = {experts} does not divide the ranks "
            f"a pipeline stage has, tp({plan.tp}) * cp({plan.cp}) * dp({dp}) = {ranks}: the "
            "experts' ranks fold onto attention's"
        )
    return ranks // experts


def expert_features(plan: Any) -> list[str]:
    """The experts' part of a plan's label (``ep4 etp2 all_gather cf1.25``)."""
    parts = [f"{key}{getattr(plan, key)}" for key in ("ep", "etp") if getattr(plan, key) > 1]
    if parts and plan.dispatcher != "all_to_all":
        parts.append(plan.dispatcher)
    if plan.capacity_factor is not None:
        parts.append(f"cf{plan.capacity_factor:g}")
    if plan.ep_overlap:
        parts.append("ep-overlap")
    return parts
