"""The strategies the dataset measures: pools of data-parallel and parallel plans per model.

A model's pool is what its run groups pick from (:func:`~.plan.plan_jobs`); :func:`plan_kind`
names the kind of plan a strategy is, so that a plan can cover every kind some pool holds.
"""

import random
from collections.abc import Callable, Sequence
from typing import Any

from ddlsim.data.specs.strategy import Strategy
from ddlsim.simulator.calibration import risk_kind


def strategy_pool(
    grad_order: Sequence[str], blocks: Sequence[str], *, seed: int = 0
) -> list[Strategy]:
    """Twenty data-parallel strategies besides DDP's defaults, for a model whose gradients
    become ready in ``grad_order`` and whose repeated blocks are ``blocks``: DDP's own bucket
    caps, the executor's hook buckets (caps, one bucket, a random contiguous partition, a
    non-contiguous grouping), DeAR, gradient accumulation, and compiled blocks with several of
    these."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(grad_order)), k=min(2, len(grad_order) - 1)))
    contiguous = [
        list(grad_order[a:b]) for a, b in zip([0, *cuts], [*cuts, len(grad_order)], strict=True)
    ]
    interleaved = [list(grad_order[0::2]), list(grad_order[1::2])]
    half = list(blocks[: max(1, len(blocks) // 2)])
    raw: list[dict[str, Any]] = [
        {"tensor_fusion": {"bucket_cap_mb": 1}},
        {"tensor_fusion": {"bucket_cap_mb": 4}},
        {"tensor_fusion": {"bucket_caps_mb": [0.5, 2, 8]}},
        {"tensor_fusion": {"bucket_caps_mb": [65536], "implementation": "hooks"}},
        {"tensor_fusion": {"bucket_cap_mb": 0.25, "implementation": "hooks"}},
        {"tensor_fusion": {"bucket_cap_mb": 1, "implementation": "hooks"}},
        {"tensor_fusion": {"bucket_cap_mb": 4, "implementation": "hooks"}},
        {"tensor_fusion": {"buckets": contiguous}},
        {"tensor_fusion": {"buckets": [b for b in interleaved if b]}},
        {"tensor_fusion": {"bucket_cap_mb": 1, "dear": True}},
        {"tensor_fusion": {"bucket_cap_mb": 4, "dear": True}},
        {"tensor_fusion": {"bucket_caps_mb": [65536], "dear": True}},
        {"parallel": {"micro_batches": 2}},
        {
            "parallel": {"micro_batches": 2},
            "tensor_fusion": {"bucket_cap_mb": 1, "implementation": "hooks"},
        },
        {"parallel": {"micro_batches": 2}, "tensor_fusion": {"bucket_cap_mb": 4, "dear": True}},
        {"tensor_fusion": {"bucket_cap_mb": 0.5}},
        {"op_fusion": {"compiled": list(blocks)}},
        {
            "op_fusion": {"compiled": list(blocks)},
            "tensor_fusion": {"bucket_cap_mb": 1, "implementation": "hooks"},
        },
        {"op_fusion": {"compiled": half}, "tensor_fusion": {"bucket_cap_mb": 4}},
        {
            "op_fusion": {"compiled": list(blocks)},
            "tensor_fusion": {"bucket_cap_mb": 4, "dear": True},
        },
    ]
    if not blocks:
        raw = [r for r in raw if "op_fusion" not in r]
    return [Strategy.from_dict(r) for r in raw]


def parallel_pool() -> list[Strategy]:
    """Parallel plans for the dataset (before any model or world size rules some out): FSDP2
    with and without gradient accumulation, tensor parallelism over 2 and 4 ranks, GPipe and
    1F1B pipelines over 2 stages, and 1F1B over 4. On 4 ranks, the 2-way plans run with 2-way
    data parallelism beside them."""
    raw: list[dict[str, Any]] = [
        {"parallel": {"fsdp": True}},
        {"parallel": {"tp": 2}},
        {"parallel": {"pp": 2, "micro_batches": 2, "pp_schedule": "gpipe"}},
        {"parallel": {"fsdp": True, "micro_batches": 2}},
        {"parallel": {"pp": 2, "micro_batches": 4, "pp_schedule": "1f1b"}},
        {"parallel": {"tp": 4}},
        {"parallel": {"pp": 4, "micro_batches": 4, "pp_schedule": "1f1b"}},
        {"parallel": {"tp": 2, "micro_batches": 2}},
    ]
    return [Strategy.from_dict(r) for r in raw]


def interleaved_pool() -> list[Strategy]:
    """Interleaved 1F1B pipelines (two stages a rank) over 2 ranks, with 2 and 4 micro-batches
    (the pipeline plans of :func:`parallel_pool` run one stage a rank)."""
    return [
        Strategy.from_dict({"parallel": {"pp": 2, "micro_batches": m, "pp_schedule": s}})
        for m, s in ((4, "interleaved_1f1b"), (2, "interleaved_1f1b"))
    ]


def layers_pool(blocks: int) -> list[Strategy]:
    """Per-layer placements for a model of ``blocks`` repeated blocks, over 2 and 4
    tensor-parallel ranks: the first half of the blocks split and the rest batch-split with the
    vocabulary whole, every block batch-split with the vocabulary split, the first half whole
    and the rest batch-split, and the first half batch-split and the rest split with the
    vocabulary whole; and two-stage pipelines whose first stage is tensor-parallel
    (``parallel.stages``). None for a model with fewer than two blocks."""
    if blocks < 2:
        return []
    half = blocks // 2

    def layers(first: str, rest: str) -> list[str]:
        return [first] * half + [rest] * (blocks - half)

    raw = [
        (layers("tp", "batch"), "replicate"),
        (layers("batch", "batch"), "split"),
        (layers("replicate", "batch"), "split"),
        (layers("batch", "tp"), "replicate"),
    ]
    placed_pool = [
        Strategy.from_dict({"parallel": {"tp": tp, "layers": placed, "vocab": vocab}})
        for tp in (2, 4)
        for placed, vocab in raw
    ]
    # A tensor-parallel first stage resharded into a batch-split second one (4 ranks).
    staged = [
        Strategy.from_dict(
            {
                "parallel": {
                    "pp": 2,
                    "micro_batches": m,
                    "pp_schedule": s,
                    "stages": ["tp", "batch"],
                }
            }
        )
        for s, m in (("1f1b", 2), ("gpipe", 2), ("eager_1f1b", 4))
    ]
    return placed_pool + staged


def grid_pool() -> list[Strategy]:
    """Grid tensor parallelism (``parallel.grid``): every rows x cols x depth of 2 and 4 ranks
    with overlap, and the 4-rank grids that split two axes or more without it (the model's
    heads and widths decide which it takes)."""
    shapes = [
        (rows, cols, depth)
        for rows in (1, 2, 4)
        for cols in (1, 2, 4)
        for depth in (1, 2, 4)
        if rows * cols * depth in (2, 4)
    ]
    pool = [Strategy.from_dict({"parallel": {"grid": list(shape)}}) for shape in shapes]
    pool += [
        Strategy.from_dict({"parallel": {"grid": list(shape), "grid_overlap": False}})
        for shape in shapes
        if rows_cols_depth_split(shape) >= 2
    ]
    return pool


def rows_cols_depth_split(shape: Sequence[int]) -> int:
    """How many of a grid's axes split (are above 1)."""
    return sum(1 for size in shape if size > 1)


def mixed_pool(data_parallel: Sequence[Strategy], parallel: Sequence[Strategy]) -> list[Strategy]:
    """Two data-parallel strategies, then a parallel plan, in turn (the rest of the longer
    pool at the end), so that consecutive picks from it mix kinds."""
    out: list[Strategy] = []
    for index in range(max(len(data_parallel), 2 * len(parallel)) // 2 + 1):
        out.extend(data_parallel[2 * index : 2 * index + 2])
        out.extend(parallel[index : index + 1])
    return out


def plan_kind(strategy: Strategy) -> str:
    """The kind of plan a strategy is, as the dataset covers them: ``risk_kind`` (tensor
    parallelism, FSDP, compiled blocks, DeAR, the executor's hooks, DDP's reducer), pipelines by
    schedule, and gradient accumulation apart."""
    kind = risk_kind(strategy)
    plan = strategy.parallel
    if kind == "pipeline":
        return f"pipeline:{plan.pp_schedule}"
    return f"{kind}:accumulation" if plan.micro_batches > 1 else kind


# What a strategy uses, by name: a later session that measured one of these again replaces the
# runs that use it (``ddlsim simulator dataset add-session --replace``).
FEATURES: dict[str, Callable[[Strategy], bool]] = {
    "dear": lambda s: s.tensor_fusion.dear,
    "hooks": lambda s: (
        s.tensor_fusion.buckets is not None or s.tensor_fusion.implementation == "hooks"
    ),
    "compiled": lambda s: bool(s.op_fusion.compiled),
    "fsdp": lambda s: s.parallel.fsdp,
    "tensor": lambda s: s.parallel.tp > 1 and not s.parallel.grid,
    "grid": lambda s: bool(s.parallel.grid),
    "layers": lambda s: s.parallel.per_layer,
    "pipeline": lambda s: s.parallel.pp > 1,
    "stages": lambda s: "tp" in s.parallel.stages,
}
